"""Gevent's patching of the standard library for the test process (Locust does it when it is imported): import this
module before anything imports Locust, as tests/conftest.py does."""

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    # A pytest-xdist worker waits for its next test on events that a real thread sets: there gevent must leave
    # threads (and their queues) alone, or the worker blocks forever on its first wait.
    from gevent import monkey, queue

    monkey.patch_all(thread=False, queue=False)
    os.environ["LOCUST_SKIP_MONKEY_PATCH"] = "1"
    try:
        import locust
        import urllib3
    finally:
        del os.environ["LOCUST_SKIP_MONKEY_PATCH"]  # the Locust processes the tests start patch as usual
    urllib3.connectionpool.ConnectionPool.QueueCls = queue.LifoQueue  # what Locust's own patching also does
else:
    import locust  # noqa: F401
