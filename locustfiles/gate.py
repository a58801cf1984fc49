"""The run's verdict as an exit code (a pipeline's gate): --slo objectives and --max-error-rate, declared here, and
the `quitting` listener that turns the finished run's outcome (analysis.finish.Outcome) into the process's code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import locust

from .declare import option
from .exitcodes import EXIT_CRASH, EXIT_ERRORS, EXIT_OK


@dataclass(frozen=True)
class GateOptions:
    """What makes a headless run fail: objectives and an error budget."""

    GROUP: ClassVar[str] = "SLO and capacity"

    slo: str = option(
        "--slo",
        "",
        "Service-level objectives every step must meet, e.g. "
        "ttft_p95=500ms,tpot_p95=50ms,e2e_p99=20s,error_rate=1%% (a reasoning model: ttfo_p95=2s, the first "
        "answer token): goodput per step, summary.md, and exit code 1 in headless mode when one is broken",
    )
    max_error_rate: str = option(
        "--max-error-rate",
        "0",
        "Exit code 1 when failed requests exceed this share of all measured requests (e.g. 1%% or 0.01). "
        "Default 0: any failed request fails the run",
    )


def exit_code(environment, outcome, is_controller: bool) -> int | None:
    """0 ok, 1 errors over --max-error-rate, a broken --slo or no request completed (the last two headless), 2 the
    tool crashed; with --find-capacity, 0 when a capacity was found, 1 when even the first probe broke an objective.
    None: already decided (3 bad input, 4 a failed write, 5 every worker lost, set where they happened), or a worker
    (the master's code is the run's)."""
    if environment.process_exit_code is not None or not is_controller:
        return None
    if locust.log.unhandled_greenlet_exception or environment.runner.exceptions:
        return EXIT_CRASH  # an exception escaped the suite's own code (Locust logs it with its traceback): a bug
    if outcome is None:
        return None
    # A broken SLO fails a headless run (a pipeline's gate); in the web UI it is shown, not an exit code.
    headless = environment.parsed_options.headless
    if outcome.capacity is not None:
        # A capacity search breaks objectives (and may fail requests) beyond the capacity on purpose: its verdict is
        # whether any load met them all.
        return EXIT_OK if outcome.capacity_found or not headless else EXIT_ERRORS
    failed = outcome.errors_over_limit or (headless and (outcome.slo_failed or outcome.nothing_completed))
    return EXIT_ERRORS if failed else EXIT_OK


def register(environment, ctx) -> None:
    """The exit code, decided as the process quits from the run context's last outcome."""

    def on_quitting(environment, **_kw) -> None:
        code = exit_code(environment, ctx.settle(), ctx.is_controller)
        if code is not None:
            environment.process_exit_code = code

    environment.events.quitting.add_listener(on_quitting)
