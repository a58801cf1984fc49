"""Open-loop (--rates) runs: the arrival times, the per-step schedule columns and the "behind schedule" verdict.

In an open-loop run each request has an intended send time drawn from an arrival process (constant or Poisson at
the step's rate), whatever the server is doing; a closed loop sends the next request only when the previous one
ended, so a slow server slows the load down and its queueing never shows in the latencies (coordinated omission).
Pure: no Locust, no network.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

import numpy as np
import pandas as pd

from analysis.generator import CPU_BOUND

ARRIVALS = ("poisson", "constant")
DEFAULT_ARRIVAL = "poisson"

# The verdict "behind schedule": the step's schedule lag p99 over lag_bound_s(rate) =
# min(LAG_CEILING_S, max(LAG_FLOOR_S, LAG_SHARE / rate)).
# - 10 % of the mean time between two arrivals: a request that is later than that no longer arrives where the
#   arrival process put it (requests bunch up), so the server is not offered the intended pattern.
# - Never below 5 ms: the lag holds gevent's timer resolution (libev waits in whole milliseconds: a wait ends
#   0-1 ms late), the event loop's own jitter (p99 up to the 2 ms generator-bound limit), Locust's task dispatch and
#   the connect made before the send stamp (~0.1-1 ms on loopback): 1-3 ms at p50 in runs against the fake server.
#   A higher rate must not flag on those.
# - Never above 50 ms: a lag that large is of the order of a TTFT, whatever the rate; it hides server latency.
LAG_SHARE = 0.10
LAG_FLOOR_S = 0.005
LAG_CEILING_S = 0.05

OPEN_LOOP_COLUMNS = [
    "rate_rps",
    "achieved_rps",
    "schedule_lag_p50_s",
    "schedule_lag_p99_s",
    "schedule_lag_max_s",
    "ttft_intended_p50_s",
    "ttft_intended_p95_s",
    "ttft_intended_p99_s",
    "ttft_intended_mean_s",
    "e2e_intended_mean_s",
    "schedule_behind",
]


def parse_rates(text: str) -> list[float]:
    """'1,2,4.5' -> [1.0, 2.0, 4.5] requests/s; raises ValueError with a one-line fix."""
    try:
        rates = [float(part) for part in str(text).replace(" ", "").split(",") if part]
    except ValueError:
        raise ValueError(f"--rates {text!r} is not a list of requests/s; use e.g. --rates 1,2,4,8") from None
    if not rates or any(not math.isfinite(r) or r <= 0 for r in rates):
        raise ValueError(f"--rates {text!r} needs one or more positive requests/s; use e.g. --rates 1,2,4,8")
    return rates


def arrival_times(rate_rps: float, arrival: str, seed: int | str, rank: int = 0, processes: int = 1) -> Iterator[float]:
    """Intended send times (s after the step's start) of one process's share of a step at rate_rps (all processes).

    constant: t_k = (k + rank / processes) / (rate_rps / processes): each process evenly spaced, the processes
    interleaved, so that together they send every 1 / rate_rps seconds.
    poisson: t_k = t_(k-1) + Exp(rate_rps / processes), from random.Random(f"{seed}:{rank}"): independent
    Poisson processes add up to one at rate_rps, and the same seed gives the same times in every run.
    """
    if arrival not in ARRIVALS:
        raise ValueError(f"--arrival {arrival!r} must be one of {', '.join(ARRIVALS)}")
    processes = max(int(processes), 1)
    share = rate_rps / processes
    if arrival == "constant":
        phase = rank / processes
        k = 0
        while True:
            yield (k + phase) / share
            k += 1
    rng = random.Random(f"{seed}:{rank}")  # str seeds hash with sha512: the same on every platform and run
    t = 0.0
    while True:
        t += rng.expovariate(share)
        yield t


def lag_bound_s(rate_rps: float) -> float:
    """Lag bound = min(LAG_CEILING_S, max(LAG_FLOOR_S, LAG_SHARE / rate_rps))."""
    return min(LAG_CEILING_S, max(LAG_FLOOR_S, LAG_SHARE / rate_rps))


def is_behind(lag_p99_s: float | None, rate_rps: float | None) -> bool | None:
    """Behind schedule = schedule_lag_p99_s > lag_bound_s(rate_rps); None in closed loop or without samples."""
    if rate_rps is None or lag_p99_s is None or pd.isna(rate_rps) or pd.isna(lag_p99_s):
        return None
    return bool(lag_p99_s > lag_bound_s(float(rate_rps)))


def is_rate_run(table: pd.DataFrame) -> bool:
    """Every step of the table is a rate step (--rates)."""
    return "rate_rps" in table.columns and len(table) > 0 and bool(table["rate_rps"].notna().all())


def _pct(values: pd.Series, q: float) -> float:
    arr = values.to_numpy(dtype=float)
    arr = arr[~np.isnan(arr)]
    return float(np.percentile(arr, q)) if arr.size else math.nan


def _mean(values: pd.Series) -> float:
    values = values.dropna()
    return float(values.mean()) if len(values) else math.nan


def open_loop_columns(sent: pd.DataFrame, ok: pd.DataFrame, sent_in_window: int, window_s: float, rate) -> dict:
    """One row's open-loop columns: `sent` = the step's requests after its warm-up (any outcome), `ok` = its ok
    requests, `sent_in_window` = requests whose send stamp lies in the measured window."""
    rate = None if rate is None or pd.isna(rate) else float(rate)
    has_lag = "schedule_lag_s" in sent.columns
    lag = sent["schedule_lag_s"].astype(float) if has_lag else pd.Series(dtype=float)
    ok_lag = ok["schedule_lag_s"].astype(float) if has_lag else pd.Series(math.nan, index=ok.index)
    ttft_intended = ok["ttft_s"].astype(float) + ok_lag
    e2e_intended = ok["e2e_s"].astype(float) + ok_lag
    lag_p99 = _pct(lag, 99)
    return {
        "rate_rps": math.nan if rate is None else rate,
        "achieved_rps": sent_in_window / window_s if window_s > 0 and math.isfinite(window_s) else math.nan,
        "schedule_lag_p50_s": _pct(lag, 50),
        "schedule_lag_p99_s": lag_p99,
        "schedule_lag_max_s": float(lag.max()) if lag.notna().any() else math.nan,
        "ttft_intended_p50_s": _pct(ttft_intended, 50),
        "ttft_intended_p95_s": _pct(ttft_intended, 95),
        "ttft_intended_p99_s": _pct(ttft_intended, 99),
        "ttft_intended_mean_s": _mean(ttft_intended),
        "e2e_intended_mean_s": _mean(e2e_intended),
        "schedule_behind": is_behind(lag_p99, rate),
    }


def flagged(value) -> bool:
    """True only for a step flagged behind schedule (False, None and NaN are not)."""
    return value is not None and not pd.isna(value) and bool(value)


def rate_label(rate: float) -> str:
    return f"{rate:g} req/s"


def format_open_loop(table: pd.DataFrame) -> list[str]:
    """The console's open-loop section (rate runs only): intended and achieved rate, schedule lag, TTFT from the
    actual and from the intended send time, the verdict; [] for a closed-loop run."""
    if not is_rate_run(table):
        return []
    ms = lambda v: "-" if pd.isna(v) else f"{v * 1000:.1f}"  # noqa: E731
    head = [
        "step", "rate req/s", "achieved", "lag p50", "p99", "max", "TTFT p99", "TTFT@intended p50", "p99",
        "E2E mean", "E2E@intended mean", "schedule",
    ]  # fmt: skip
    rows = [
        [
            str(r.step),
            f"{r.rate_rps:g}",
            "-" if pd.isna(r.achieved_rps) else f"{r.achieved_rps:.2f}",
            ms(r.schedule_lag_p50_s),
            ms(r.schedule_lag_p99_s),
            ms(r.schedule_lag_max_s),
            ms(r.ttft_p99_s),
            ms(r.ttft_intended_p50_s),
            ms(r.ttft_intended_p99_s),
            ms(r.e2e_mean_s),
            ms(r.e2e_intended_mean_s),
            "-"
            if r.schedule_behind is None or pd.isna(r.schedule_behind)
            else ("BEHIND" if r.schedule_behind else "ok"),
        ]
        for r in table.itertuples(index=False)
    ]
    w = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    out = [
        "",
        "Open loop (times in ms; lag = actual - intended send time; @intended: latency + lag; BEHIND: lag p99 over "
        f"min({LAG_CEILING_S * 1000:.0f} ms, max({LAG_FLOOR_S * 1000:.0f} ms, {LAG_SHARE:.0%} of 1/rate)))",
    ]
    out += ["  ".join(c.rjust(x) for c, x in zip(cells, w)) for cells in [head, *rows]]
    return out


def _ms(v) -> str:
    return "-" if v is None or pd.isna(v) else f"{v * 1000:.0f} ms"


def behind_line(row: pd.Series) -> str:
    """The diagnosis sentence of a step flagged behind schedule, with its likely cause: a load process short of CPU
    (it cannot send as fast as scheduled), else no free user (the pool was busy with the server's slow requests).
    An event-loop lag alone (generator-bound by lag, not CPU) delays a send by milliseconds, not by a backlog."""
    rate = float(row["rate_rps"])
    achieved = row.get("achieved_rps")
    sent = "an unknown number" if achieved is None or pd.isna(achieved) else f"{achieved:.2f}"
    figures = (
        f"schedule lag p99 {_ms(row['schedule_lag_p99_s'])}, max {_ms(row['schedule_lag_max_s'])}, over the "
        f"{_ms(lag_bound_s(rate))} bound; {sent} of {rate:g} req/s sent"
    )
    cpu = row.get("generator_cpu_max")
    if cpu is not None and not pd.isna(cpu) and cpu > CPU_BOUND:
        cause = (
            f"a load process ran at {cpu:.0%} CPU, over the {CPU_BOUND:.0%} bound: the load generator itself could "
            "not send as fast as scheduled; add worker processes"
        )
    else:
        cause = (
            f"no user of the pool ({int(row['users'])}, --max-users) was free at the intended times, because the "
            "server was slow to finish earlier requests: its queueing makes the latencies from the intended send "
            f"time grow (TTFT p99 {_ms(row.get('ttft_intended_p99_s'))} from the intended send time, "
            f"{_ms(row.get('ttft_p99_s'))} from the actual one), which a closed loop would hide (coordinated "
            "omission); the intended-time latencies are what arrivals at this rate would see. Raise --max-users to "
            "offer the full rate"
        )
    return (
        f"At {rate_label(rate)}, offered load not delivered: the client could not keep the schedule "
        f"({figures}); {cause}."
    )
