"""Gevent's patching of the standard library for the test process (Locust does it when it is imported): import this
module before anything imports Locust, as tests/conftest.py does.

A pytest-xdist worker gets no patching at all: it waits for its next test on events that a real thread sets, which
a patched `threading` breaks (the worker blocks forever), and a half-patched process (threads left alone) hangs in
tests that mix real threads or Playwright with gevent. `make test` runs every test in a worker: a test whose
greenlets must run while it waits yields to gevent itself (tests/helpers/runs.py's `wait_until(sleep=gevent.sleep)`).
"""

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    given = "LOCUST_SKIP_MONKEY_PATCH" in os.environ
    os.environ.setdefault("LOCUST_SKIP_MONKEY_PATCH", "1")
    try:
        import locust
    finally:
        if not given:
            del os.environ["LOCUST_SKIP_MONKEY_PATCH"]  # the Locust processes the tests start patch as usual
else:
    import locust  # noqa: F401
