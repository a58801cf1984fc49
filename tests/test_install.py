"""The suite installs like a tool: `pip install .` into a fresh virtual environment (no editable install) puts it
under one namespace, and its console script runs a load test and rebuilds a report, from outside the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

pytestmark = pytest.mark.contract
# The installed tool only: no checkout on the path (a developer's PYTHONPATH would put its copies first).
CLEAN_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv holding a wheel of the checkout. Its dependencies come from this test's own environment
    (a path entry, not a reinstall: the registries may be slow, and the point is the package's own layout)."""
    tmp = tmp_path_factory.mktemp("install")
    wheels = tmp / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = wheels.glob("vllm_loadtest-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    # Only the dependencies' folder: .pth files there (this checkout's editable install) are not processed, and
    # --ignore-installed below keeps pip from taking its dist-info for this package.
    (purelib(python) / "test-deps.pth").write_text(f"{purelib(Path(sys.executable))}\n")
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--ignore-installed", str(wheel)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    return venv


def purelib(python: Path) -> Path:
    """The site-packages folder of the interpreter `python`."""
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip())


def test_the_wheel_installs_one_namespace_and_its_console_script_runs_and_reports(installed, fake_server, tmp_path):
    python = installed / "bin" / "python"
    site_dir = purelib(python)
    for generic in ("analysis", "locustfiles", "embedded_vllm"):
        assert not (site_dir / generic).exists(), f"{generic} installed as a top-level package"
    assert (site_dir / "vllm_loadtest" / "analysis" / "steps.py").is_file()
    where = subprocess.run(
        [str(python), "-c", "import vllm_loadtest.analysis.steps as s, vllm_loadtest.locustfiles.plugin as p; "
         "print(s.__file__); print(p.__file__)"],
        cwd=tmp_path, env=CLEAN_ENV, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert all(path.startswith(str(site_dir)) for path in where), where  # not the checkout's copies

    script = installed / "bin" / "vllm-loadtest"
    # Issue 34's front door, from outside the checkout: the suite's help with its defaults, its version.
    shown = subprocess.run([str(script), "--help"], cwd=tmp_path, env=CLEAN_ENV, capture_output=True, text=True)
    assert shown.returncode == 0 and shown.stdout.startswith("usage: vllm-loadtest"), shown.stderr[-2000:]
    flat = " ".join(shown.stdout.split())
    for flag in ("--steps X", "--slo X", "--find-capacity {,users,rate}", "--endpoint {chat,completions"):
        assert flag in flat, flag
    assert "(default: 1,2,4,8,16,32,64)" in flat and "(default: completions)" in flat
    version = subprocess.run([str(script), "--version"], cwd=tmp_path, env=CLEAN_ENV, capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("vllm-loadtest 0.") and "Locust" in version.stdout

    server = fake_server("--ttft-ms", "10", "--itl-ms", "2")
    run_dir = tmp_path / "run"
    run = subprocess.run(
        [str(script), "run", "--headless", "--host", server.url, "--steps", "2", "--step-duration", "5s",
         "--max-tokens", "8", "--run-dir", str(run_dir)],
        cwd=tmp_path, env=CLEAN_ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for name in ("requests.parquet", "steps.csv", "summary.json", "report.html"):
        assert (run_dir / name).is_file(), name
    assert "Batching curve" in run.stdout
    assert (run.stdout + run.stderr).count("Aggregated") <= 1  # Locust's table at most once (here: never)

    (run_dir / "report.html").unlink()
    report = subprocess.run(
        [str(script), "report", str(run_dir)], cwd=tmp_path, env=CLEAN_ENV, capture_output=True, text=True, timeout=120
    )
    assert report.returncode == 0, report.stderr[-3000:]
    assert "Batching curve" in report.stdout and (run_dir / "report.html").is_file()
