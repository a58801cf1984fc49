"""Analysis of a load-test run: the raw records, the server's metrics, the step table, the report."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("vllm-loadtest")
except PackageNotFoundError:  # run from a source tree without installing (the compose image sets PYTHONPATH)
    __version__ = "unknown"
