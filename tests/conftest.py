"""Shared fixtures (the fake streaming server, the embedded real vLLM) and the test kinds every test declares.

Kinds, registered in pyproject.toml: `unit` (this process only, with in-process fakes or a fake server
subprocess), `e2e` (real Locust processes), `vllm` (the embedded real vLLM server), `browser` (Chromium). Every
test carries at least one (a module's `pytestmark` or the test's own mark; `vllm` is added to any test that uses
the `vllm_server` fixture); `unit` goes with none of the others. Collection stops with the list of tests that carry
none, and a test that starts a Locust process without `e2e`, or Chromium without `browser`, fails.
`serial` marks the tests that measure timing or load the machine: they never run beside others. `make test` runs
only `e2e` tests under pytest-xdist (its workers are not patched for gevent: tests/helpers/monkey.py).
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests import browser as browser_mod
from tests.helpers import monkey  # noqa: F401 - first: it patches the standard library for gevent (as Locust does)
from tests.helpers.inprocess import parse_options, run_in_process  # noqa: F401 - for test modules written before
from tests.helpers.paths import FIXTURES, ROOT  # noqa: F401 - tests/helpers existed; new ones import from there
from tests.helpers.servers import FakeServer

KINDS = ("unit", "e2e", "vllm", "browser")
# A command line that runs Locust: `python -m locust ...` or a shell command holding one (test_compose's).
LOCUST_COMMAND = re.compile(r"(^|\s)-m locust(\s|$)|(^|[\s/])locust -f\s")


KIND_PROBLEM = pytest.StashKey[str]()


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: every collected test is checked, and a vllm mark counts
def pytest_collection_modifyitems(config, items):
    problems = []
    for item in items:
        if "vllm_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.vllm)
        kinds = {m.name for m in item.iter_markers()} & set(KINDS)
        if not kinds:
            problems.append((item, f"no kind ({' / '.join(KINDS)}): {item.nodeid}"))
        elif "unit" in kinds and len(kinds) > 1:
            problems.append((item, f"unit together with another kind ({', '.join(sorted(kinds))}): {item.nodeid}"))
    if not problems:
        return
    hint = "add e.g. `pytestmark = pytest.mark.unit` to the module or @pytest.mark.e2e to the test (tests/conftest.py)"
    if hasattr(config, "workerinput"):
        # A pytest-xdist worker: an error here would crash the worker; each such test errors at its setup instead.
        for item, problem in problems:
            item.stash[KIND_PROBLEM] = f"{problem}; {hint}"
        return
    raise pytest.UsageError(f"tests without the right kind marks; {hint}:\n  " + "\n  ".join(p for _, p in problems))


@pytest.fixture(autouse=True)
def _kind_is_what_the_test_does(request, monkeypatch):
    """A test that starts a Locust process must be `e2e`; one that launches Chromium must be `browser`."""
    if KIND_PROBLEM in request.node.stash:
        pytest.fail(request.node.stash[KIND_PROBLEM], pytrace=False)
    kinds = {m.name for m in request.node.iter_markers()} & set(KINDS)
    if "e2e" not in kinds:
        original = subprocess.Popen.__init__

        def no_locust(self, args, *a, **kw):
            command = args if isinstance(args, str) else " ".join(map(str, args))
            if LOCUST_COMMAND.search(command):
                pytest.fail(f"{request.node.nodeid} starts a Locust process but is not marked e2e", pytrace=False)
            original(self, args, *a, **kw)

        monkeypatch.setattr(subprocess.Popen, "__init__", no_locust)
    if "browser" not in kinds:

        def no_chromium():
            pytest.fail(f"{request.node.nodeid} launches Chromium but is not marked browser", pytrace=False)

        monkeypatch.setattr(browser_mod, "require_chromium", no_chromium)


@pytest.fixture
def fake_server():
    """Factory: fake_server('--ttft-ms', '50', ...) starts a server that is always stopped afterwards."""
    servers: list[FakeServer] = []

    def start(*args: str) -> FakeServer:
        server = FakeServer(list(args))
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def vllm_server():
    """One real vLLM (CPU build, tiny model) for the whole session; installed on first use, always stopped."""
    from vllm_loadtest.embedded_vllm import EmbeddedVLLM, ServerSettings

    # max_num_seqs above what the 128-block cache holds, so the cache, not the batch-size cap, binds under load.
    server = EmbeddedVLLM(ServerSettings(num_blocks=128, block_size=32, max_model_len=512, max_num_seqs=64))
    server.start()
    try:
        yield server
    finally:
        server.stop()
