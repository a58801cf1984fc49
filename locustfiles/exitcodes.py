"""The exit codes of a run (documented in the generated reference): a pipeline's gate reads them."""

EXIT_OK = 0
EXIT_ERRORS = 1  # failed requests above --max-error-rate, a broken --slo (headless), no capacity found
EXIT_CRASH = 2  # the tool itself failed (an unhandled exception): never mistaken for a verdict on the server
EXIT_SETUP_ERROR = 3  # bad input found before any load was sent
# A file of the run directory could not be written (disk full, quota, file size limit, read-only, I/O error): the
# run was stopped at once; the records kept are complete, `python -m analysis report` builds the rest once there is
# room. Not 2: the suite did what it should; not 1: it is no verdict on the server.
EXIT_WRITE_FAILED = 4
# Every worker went missing (no heartbeat for --heartbeat-timeout) and Locust stopped the run before its plan ended:
# the records that arrived are merged, the results cover the steps that ran. Not 1: no verdict on the server.
EXIT_WORKERS_LOST = 5
