"""Shared fixtures (the fake streaming server, the embedded real vLLM) and the test kinds every test declares.

Kinds, the tiers of tests/README.md, registered in pyproject.toml: `unit` (this process only, with in-process fakes
or a fake server subprocess), `contract` (real Locust processes), `vllm` (the embedded real vLLM servers),
`browser` (Chromium). Every
test carries at least one (a module's `pytestmark` or the test's own mark; `vllm` is added to any test that uses
an embedded server's fixture); `unit` goes with none of the others. Collection stops with the list of tests that
carry none, and a test that starts a Locust process without `contract`, or Chromium without `browser`, fails.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests import browser as browser_mod
from tests.helpers import monkey  # noqa: F401 - first: it patches the standard library for gevent (as Locust does)
from tests.helpers.fleet import SERVER_FIXTURES, Fleet, group_of, needed
from tests.helpers.inprocess import parse_options, run_in_process  # noqa: F401 - for test modules written before
from tests.helpers.paths import FIXTURES, ROOT  # noqa: F401 - tests/helpers existed; new ones import from there
from tests.helpers.servers import FakeServer

KINDS = ("unit", "contract", "vllm", "browser")
# A command line that runs Locust: `python -m locust ...` or a shell command holding one (test_compose's).
LOCUST_COMMAND = re.compile(r"(^|\s)-m locust(\s|$)|(^|[\s/])locust -f\s")


KIND_PROBLEM = pytest.StashKey[str]()
SERVERS_NEEDED = pytest.StashKey[list]()  # the embedded servers the selected tests use (started together)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: every collected test is checked, and a vllm mark counts
def pytest_collection_modifyitems(config, items):
    problems = []
    for item in items:
        if set(SERVER_FIXTURES) & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.vllm)
        if item.get_closest_marker("vllm"):
            # One worker runs every vllm test of a group: its servers start once, together, before any measures.
            item.add_marker(pytest.mark.xdist_group(group_of(getattr(item, "fixturenames", ()))))
        kinds = {m.name for m in item.iter_markers()} & set(KINDS)
        if not kinds:
            problems.append((item, f"no kind ({' / '.join(KINDS)}): {item.nodeid}"))
        elif "unit" in kinds and len(kinds) > 1:
            problems.append((item, f"unit together with another kind ({', '.join(sorted(kinds))}): {item.nodeid}"))
    if not problems:
        return
    hint = "add e.g. `pytestmark = pytest.mark.unit` to the module or @pytest.mark.contract to the test (conftest.py)"
    if hasattr(config, "workerinput"):
        # A pytest-xdist worker: an error here would crash the worker; each such test errors at its setup instead.
        for item, problem in problems:
            item.stash[KIND_PROBLEM] = f"{problem}; {hint}"
        return
    raise pytest.UsageError(f"tests without the right kind marks; {hint}:\n  " + "\n  ".join(p for _, p in problems))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker sends the collected node ids to the controller
def pytest_collection_finish(session):
    """Note the servers the selected tests use; make pytest-xdist's loadgroup work on pytest 9: xdist 3.8 appends
    "@group" to `item._nodeid`, but pytest 9 reads the node id from `item._id`, so each test was scheduled alone
    and several workers started a vLLM."""
    session.config.stash[SERVERS_NEEDED] = needed(getattr(item, "fixturenames", ()) for item in session.items)
    try:
        from _pytest.nodeid import coerce_node_id
    except ImportError:  # pytest < 9 reads `_nodeid` itself
        return
    for item in session.items:
        suffixed = item.__dict__.get("_nodeid")
        if suffixed and suffixed != item.nodeid:
            item._id = coerce_node_id(suffixed)


@pytest.fixture(autouse=True)
def _kind_is_what_the_test_does(request, monkeypatch):
    """A test that starts a Locust process must be `contract`; one that launches Chromium must be `browser`."""
    if KIND_PROBLEM in request.node.stash:
        pytest.fail(request.node.stash[KIND_PROBLEM], pytrace=False)
    kinds = {m.name for m in request.node.iter_markers()} & set(KINDS)
    if "contract" not in kinds:
        original = subprocess.Popen.__init__

        def no_locust(self, args, *a, **kw):
            command = args if isinstance(args, str) else " ".join(map(str, args))
            if LOCUST_COMMAND.search(command):
                pytest.fail(f"{request.node.nodeid} starts a Locust process but is not marked contract", pytrace=False)
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
def fleet(pytestconfig):
    """The session's embedded real vLLM servers (tests/helpers/fleet.py): every one the selected tests use starts at
    the first one's use; always stopped."""
    servers = Fleet(pytestconfig.stash.get(SERVERS_NEEDED, []))
    try:
        yield servers
    finally:
        servers.stop()


def server_fixture(name: str):
    """A session fixture yielding the fleet's server `name` (its settings: tests/helpers/fleet.py's SERVERS)."""

    def server(fleet):
        return fleet.get(name)

    server.__doc__ = f"The embedded vLLM {name!r} of tests/helpers/fleet.py, started on first use."
    return pytest.fixture(scope="session", name=name)(server)


vllm_server = server_fixture("vllm_server")
vllm_server_b = server_fixture("vllm_server_b")
reasoning_vllm = server_fixture("reasoning_vllm")
embed_vllm = server_fixture("embed_vllm")
vision_vllm = server_fixture("vision_vllm")
rerank_vllm = server_fixture("rerank_vllm")
lora_vllm = server_fixture("lora_vllm")
spec_vllm = server_fixture("spec_vllm")
