"""The repository's docker-compose.yml, parsed."""

from __future__ import annotations

import yaml

from tests.helpers.paths import ROOT

COMPOSE = ROOT / "docker-compose.yml"


def load() -> dict:
    return yaml.safe_load(COMPOSE.read_text())
