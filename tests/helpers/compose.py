"""The repository's docker-compose.yml, parsed, and the Compose client that validates it where one is installed."""

from __future__ import annotations

import shutil
import subprocess

import yaml

from tests.helpers.paths import ROOT

COMPOSE = ROOT / "docker-compose.yml"
# Where no client can be installed (`make compose` needs root or sudo), the `config` checks skip with this reason.
NO_CLIENT = (
    "no Compose client (docker compose plugin or docker-compose): `make compose` installs Debian's docker-compose, "
    "which needs root or sudo"
)


def load() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def client() -> list[str] | None:
    """The Compose command that answers `version`: Docker's plugin first, else Debian's docker-compose; None."""
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) and subprocess.run([*cmd, "version"], capture_output=True).returncode == 0:
            return cmd
    return None


def config(profile: str, **env: str) -> subprocess.CompletedProcess:
    """`config` of docker-compose.yml as Compose resolves it for one profile (variables from env and .env)."""
    return subprocess.run(
        [*client(), "config"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin:/usr/local/bin", "COMPOSE_PROFILES": profile, **env},
    )
