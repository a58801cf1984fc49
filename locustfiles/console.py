"""The headless console is the suite's: one line per step as it ends (analysis/progress.py: always the same columns),
then the step table and the verdict last. Locust's request table, which it prints every few seconds and once more
at the end, and its ramp-up log lines only with Locust's --print-stats: a run's numbers are the suite's, and its
last lines on screen are the verdict, not Locust's bucketed percentiles."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..analysis import progress

STATS_LOGGER = "locust.stats_logger"  # Locust's periodic and final request tables


class StepLines:
    """Prints each step's line once it has ended, from the records the controller's bus delivered until then."""

    def __init__(self, echo: Callable[[str], None] = print) -> None:
        self.echo = echo
        self.steps = progress.Steps()
        self.headed = False

    def start(self, **_kw) -> None:
        self.steps = progress.Steps()
        self.headed = False

    def add_rows(self, rows: list[dict]) -> None:
        self.steps.add_rows(rows)

    def timeline(self, timeline: list[dict], **_kw) -> None:
        for step in timeline:
            if step.get("end_time") is None or step.get("step") in self.steps.shown:
                continue
            row = progress.step_row(self.steps, step)
            self.steps.shown_step(step)
            if row is not None:
                if not self.headed:
                    self.headed = True
                    self.echo(progress.header(self.steps.kind))
                self.echo(progress.line(self.steps.kind, row))
            if row is None or not row["requests"]:
                self.echo(
                    f"step {step['step']}: no request completed in it ({step.get('users')} users); a server that "
                    "takes requests but never finishes them? --read-timeout bounds the wait for each line"
                )


def register(environment, ctx) -> StepLines | None:
    """A headless controller's console: the step lines, and Locust's tables only with --print-stats."""
    options = environment.parsed_options
    if options is None or not ctx.is_controller or not options.headless:
        return None
    if not options.print_stats:
        options.only_summary = True  # read by Locust right after the init event: no periodic table
        if str(options.loglevel).upper() == "INFO":  # its ramp-up lines: the step lines say which step runs
            logging.getLogger("locust.runners").setLevel(logging.WARNING)

        def quiet(**_kw) -> None:
            logging.getLogger(STATS_LOGGER).disabled = True  # the final table comes after `quitting`

        environment.events.quitting.add_listener(quiet)
    lines = StepLines(echo=lambda text: print(text, flush=True))
    ctx.bus.subscribe(lines.add_rows)
    ctx.run_events.started.add_listener(lines.start)
    ctx.run_events.timeline.add_listener(lines.timeline)
    return lines
