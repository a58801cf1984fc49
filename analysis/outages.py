"""Outages: the spans in which the server refused or reset connections before answering. Pure: records in, spans out.

A request refused at connect (or reset or closed before any byte of the answer) says the server was not there,
nothing about how fast it serves. A run that met a dead server is a finding about its availability; without these
lines its error rate (99.97 % in a run whose server was SIGKILLed mid-step) would read as a verdict on performance.

The same test tells the closed-loop users when to back off (locustfiles/openai_user.py: `next_backoff`), so the
client's behaviour and the diagnosis agree on what a refusal is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from .sse import CONNECTION_ERROR, CUT_OFF

# The closed loop's backoff after a refusal: the first wait, doubled after each further refusal, up to the cap.
BACKOFF_MIN_S = 0.01
BACKOFF_MAX_S = 1.0
# A span is an outage when it holds at least this many refused attempts and lasts at least OUTAGE_MIN_S from its
# first to its last refusal, or runs to the end of the run (no answer after it, however short). 1 s is the backoff
# cap: a user only waits that long after 7 refusals in a row (10 + 20 + ... + 640 ms = 1.27 s), so a shorter span
# is a blip (a full accept queue under a burst, a restart's few milliseconds) that the error counts already show.
# Three attempts: one or two refusals are too few to call a span of anything.
OUTAGE_MIN_S = 1.0
OUTAGE_MIN_ATTEMPTS = 3


def refused(error_type: str | None, http_status: int | None) -> bool:
    """A refusal = a connection error before the status line of an answer (refused, reset or closed at once)."""
    return error_type == CONNECTION_ERROR and http_status is None


def next_backoff(previous_s: float, was_refused: bool) -> float:
    """The closed-loop wait before the next request: 0 after any answer; after a refusal min(2 x previous, 1 s),
    10 ms the first time."""
    if not was_refused:
        return 0.0
    return BACKOFF_MIN_S if previous_s <= 0 else min(previous_s * 2, BACKOFF_MAX_S)


@dataclass
class Outage:
    start_s: float  # first refused attempt, seconds after the run's start (when its refusal was seen)
    end_s: float  # last refused attempt, seconds after the run's start
    to_end: bool  # no answer came after it: the server was still unreachable when the run (or its records) ended
    attempts: int  # refused attempts in the span, all users together
    refused: int  # of which refused at connect (ConnectionRefusedError); the rest were reset or closed
    users: int | None  # the most users of the steps the span fell in (closed loop); None in an open loop
    open_loop: bool  # requests sent on a schedule (--rates): not backed off

    def to_dict(self) -> dict:
        return asdict(self)

    def text(self, ended: bool = True) -> str:
        """One sentence for the diagnosis; `ended` False for a run still in progress."""
        if self.refused == self.attempts:
            what = "refused connections"
        elif self.refused == 0:
            what = "reset connections before answering"
        else:
            what = "refused or reset connections"
        until = ("the end of the run" if ended else "the last record so far") if self.to_end else f"{self.end_s:.1f} s"
        if self.open_loop:
            how = "sent on schedule, not backed off"
        elif self.users is not None:
            how = f"{self.users} user{'s' if self.users != 1 else ''} backing off"
        else:
            how = "users backing off"
        return (
            f"The server {what} from {self.start_s:.1f} s to {until} ({self.attempts} attempts, {how}): its failed "
            "requests say the server was down, not how it performs."
        )


def find_outages(records: pd.DataFrame, started_at: float | None = None) -> list[Outage]:
    """Spans of refused attempts (refused()) across all users with no answer in between (an answer = any record with
    an HTTP status, errors included), kept when >= OUTAGE_MIN_ATTEMPTS attempts and >= OUTAGE_MIN_S long or running
    to the end; times are when each outcome was seen (start_time + duration_s), from `started_at` (else the first
    record). Cut-off requests and timeouts without an answer neither count nor break a span."""
    needed = {"start_time", "error_type", "http_status"}
    if records is None or len(records) == 0 or not needed <= set(records.columns):
        return []
    # Only the columns read here: `records` may still carry the per-chunk lists (most of a long run's data).
    wanted = ["start_time", "duration_s", "error_type", "http_status", "error", "users", "intended_start_time"]
    df = records[[c for c in wanted if c in records.columns]]
    df = df[df["error_type"] != CUT_OFF]
    answered = df["http_status"].notna().to_numpy()
    is_refused = ((df["error_type"] == CONNECTION_ERROR).to_numpy()) & ~answered
    if not is_refused.any():
        return []
    start = df["start_time"].to_numpy(dtype=float)
    duration = df["duration_s"].to_numpy(dtype=float) if "duration_s" in df.columns else np.zeros(len(df))
    seen = start + np.nan_to_num(duration, nan=0.0)
    keep = answered | is_refused
    order = np.argsort(seen[keep], kind="stable")
    seen, answered, is_refused = seen[keep][order], answered[keep][order], is_refused[keep][order]
    kept = df[keep].iloc[order]
    # Every answer begins a new group: refusals sharing a group had no answer between them.
    group = np.cumsum(answered)
    last_group = group[-1] if len(group) else 0
    t0 = float(started_at) if started_at else float(np.nanmin(start))
    errors = kept["error"].astype("string").fillna("") if "error" in kept.columns else None
    users = kept["users"] if "users" in kept.columns else None
    intended = kept["intended_start_time"] if "intended_start_time" in kept.columns else None
    # Refusals in time order carry non-decreasing groups: each group is one contiguous run of `idx`, found in one
    # pass (a run with many scattered blips has as many groups; none is scanned more than once).
    idx = np.flatnonzero(is_refused)
    groups, begins, counts = np.unique(group[idx], return_index=True, return_counts=True)
    out = []
    for g, begin, count in zip(groups, begins, counts):
        rows = idx[begin : begin + count]
        first, last = float(seen[rows[0]]), float(seen[rows[-1]])
        to_end = bool(g == last_group)
        if count < OUTAGE_MIN_ATTEMPTS or (last - first < OUTAGE_MIN_S and not to_end):
            continue
        n_refused = int(count) if errors is None else int(errors.iloc[rows].str.contains("refused", case=False).sum())
        open_loop = intended is not None and bool(intended.iloc[rows].notna().any())
        peak = None if users is None or open_loop else users.iloc[rows].max()
        out.append(
            Outage(
                start_s=first - t0,
                end_s=last - t0,
                to_end=to_end,
                attempts=int(count),
                refused=n_refused,
                users=None if peak is None or pd.isna(peak) else int(peak),
                open_loop=open_loop,
            )
        )
    return out


def outage_lines(outages: list[Outage], ended: bool = True) -> list[str]:
    """The diagnosis's sentence per outage."""
    return [o.text(ended) for o in outages]
