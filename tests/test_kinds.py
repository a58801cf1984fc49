"""The test kinds (tests/conftest.py): a test without one, or with `unit` and another, stops the collection; a test
that starts a Locust process must be `contract`, one that launches Chromium `browser`; `vllm_server` makes a test
`vllm`."""

import subprocess
import sys
import textwrap

import pytest

from tests.helpers.paths import ROOT

pytestmark = pytest.mark.unit


def pytest_on(tmp_path, source: str, *args: str) -> subprocess.CompletedProcess:
    """pytest, with the suite's configuration and conftest as a plugin, on one test file made of `source`."""
    path = tmp_path / "test_sample.py"
    path.write_text(textwrap.dedent(source))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
         "-p", "tests.conftest", "-p", "no:cacheprovider", "-q", str(path), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_test_without_a_kind_or_with_unit_and_another_stops_the_collection(tmp_path):
    proc = pytest_on(
        tmp_path,
        """
        import pytest

        def test_no_kind():
            pass

        @pytest.mark.unit
        @pytest.mark.contract
        def test_unit_and_contract():
            pass

        @pytest.mark.unit
        def test_fine():
            pass
        """,
    )
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert "no kind (unit / contract / vllm / browser): test_sample.py::test_no_kind" in proc.stderr
    assert "unit together with another kind (contract, unit): test_sample.py::test_unit_and_contract" in proc.stderr
    assert "test_fine" not in proc.stderr


def test_what_a_test_does_must_match_its_kind(tmp_path):
    proc = pytest_on(
        tmp_path,
        """
        import subprocess

        import pytest

        from tests.browser import chromium

        @pytest.mark.unit
        def test_unit_starting_locust():
            subprocess.run(["true", "-m", "locust"])

        @pytest.mark.contract
        def test_contract_starting_locust():
            assert subprocess.run(["true", "-m", "locust"]).returncode == 0

        @pytest.mark.contract
        def test_contract_launching_chromium():
            with chromium():
                pass

        def test_on_the_real_vllm(vllm_server):
            pass
        """,
        "-m",
        "not vllm",
    )
    out = proc.stdout
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED, out + proc.stderr
    assert "test_sample.py::test_unit_starting_locust starts a Locust process but is not marked contract" in out
    assert "test_sample.py::test_contract_launching_chromium launches Chromium but is not marked browser" in out
    assert "2 failed, 1 passed, 1 deselected" in out  # the vllm_server test is vllm: deselected, never started
