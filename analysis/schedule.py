"""Open-loop (--rates) runs: the arrival times, the per-step schedule columns and the "behind schedule" verdict.

In an open-loop run each request has an intended send time drawn from an arrival process (constant, Poisson or
gamma at the step's rate), whatever the server is doing; a closed loop sends the next request only when the previous one
ended, so a slow server slows the load down and its queueing never shows in the latencies (coordinated omission).
Pure: no Locust, no network.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

import pandas as pd

from . import glossary
from .glossary import flagged, mean, percentile  # noqa: F401 (flagged: re-exported)
from .thresholds import CPU_BOUND, LAG_CEILING_S, LAG_FLOOR_S, LAG_SHARE

ARRIVALS = ("poisson", "constant", "gamma")
GAMMA = "gamma"
DEFAULT_ARRIVAL = "poisson"

# The open-loop columns of steps.csv, in order; the verdict's bounds are in analysis/thresholds.py.
OPEN_LOOP_COLUMNS = glossary.names(glossary.OPEN_LOOP)


def parse_rates(text: str) -> list[float]:
    """'1,2,4.5' -> [1.0, 2.0, 4.5] requests/s; raises ValueError with a one-line fix."""
    try:
        rates = [float(part) for part in str(text).replace(" ", "").split(",") if part]
    except ValueError:
        raise ValueError(f"--rates {text!r} is not a list of requests/s; use e.g. --rates 1,2,4,8") from None
    if not rates or any(not math.isfinite(r) or r <= 0 for r in rates):
        raise ValueError(f"--rates {text!r} needs one or more positive requests/s; use e.g. --rates 1,2,4,8")
    return rates


def check_burstiness(burstiness: float | str) -> float:
    """--burstiness as a float: the gamma shape, a positive finite number; raises ValueError with a one-line fix."""
    try:
        value = float(burstiness)
    except (TypeError, ValueError):
        raise ValueError(
            f"--burstiness {burstiness!r} is not a number; use e.g. --burstiness 0.5 (1 = Poisson)"
        ) from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"--burstiness {burstiness} must be a positive finite number (the gamma shape: 1 = Poisson, below 1 "
            "burstier, above 1 smoother); use e.g. --burstiness 0.5"
        )
    return value


def arrival_times(
    rate_rps: float, arrival: str, seed: int | str, rank: int = 0, processes: int = 1, burstiness: float = 1.0
) -> Iterator[float]:
    """Intended send times (s after the step's start) of one process's share of a step at rate_rps (all processes).

    constant: t_k = (k + rank / processes) / (rate_rps / processes): each process evenly spaced, the processes
    interleaved, so that together they send every 1 / rate_rps seconds.
    poisson: t_k = t_(k-1) + Exp(rate_rps / processes), from random.Random(f"{seed}:{rank}"): independent
    Poisson processes add up to one at rate_rps, and the same seed gives the same times in every run.
    gamma: T_j = T_(j-1) + Gamma(shape=burstiness, scale=1 / (rate_rps * burstiness)) (mean gap 1 / rate_rps,
    coefficient of variation 1 / sqrt(burstiness)), one full-rate stream from random.Random(f"{seed}:0") drawn
    alike by every process; this process sends the T_j with j % processes == rank.
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
    if arrival == GAMMA:
        yield from _gamma_times(rate_rps, check_burstiness(burstiness), seed, rank, processes)
        return
    rng = random.Random(f"{seed}:{rank}")  # str seeds hash with sha512: the same on every platform and run
    t = 0.0
    while True:
        t += rng.expovariate(share)
        yield t


def _gamma_times(rate_rps: float, burstiness: float, seed: int | str, rank: int, processes: int) -> Iterator[float]:
    """The gamma stream's arrivals j with j % processes == rank (see arrival_times)."""
    # As vLLM's `bench serve --burstiness` (vllm-project/vllm, vllm/benchmarks/serve.py, get_request):
    #     theta = 1.0 / (current_request_rate * burstiness)
    #     delay_ts.append(np.random.gamma(shape=burstiness, scale=theta))
    # without its final rescaling of a finite list of delays to last exactly n / rate (this stream has no end).
    theta = 1.0 / (rate_rps * burstiness)
    # Unlike Poisson streams, independent gamma streams do not add up to a gamma stream: the gaps of the sum of N
    # renewal streams at rate / N tend to Poisson's as N grows (CV towards 1, whatever the shape: B = 0.25's
    # bursts smoothed, CV 1.75 at N = 4; B = 4's regularity lost, CV 0.80 at N = 4), so N processes drawing their
    # own would not send the arrivals asked for. Every process draws the same full-rate stream from the same seed
    # and keeps every N-th arrival: together they send exactly that stream (the cost, N times the draws, is a few
    # microseconds per request). The seed string is the one of rank 0's Poisson stream, and gammavariate(1, theta)
    # is expovariate(1 / theta) (random.py), so burstiness 1 in one process gives --arrival poisson's times.
    rng = random.Random(f"{seed}:0")
    draw = rng.gammavariate
    t = 0.0
    for _ in range(rank):
        t += draw(burstiness, theta)
    while True:
        t += draw(burstiness, theta)
        yield t
        for _ in range(processes - 1):
            t += draw(burstiness, theta)


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


def open_loop_columns(sent: pd.DataFrame, ok: pd.DataFrame, sent_in_window: int, window_s: float, rate) -> dict:
    """One row's open-loop columns: `sent` = the step's requests after its warm-up (any outcome), `ok` = its ok
    requests, `sent_in_window` = requests whose send stamp lies in the measured window."""
    rate = None if rate is None or pd.isna(rate) else float(rate)
    has_lag = "schedule_lag_s" in sent.columns
    lag = sent["schedule_lag_s"].astype(float) if has_lag else pd.Series(dtype=float)
    ok_lag = ok["schedule_lag_s"].astype(float) if has_lag else pd.Series(math.nan, index=ok.index)
    ttft_intended = ok["ttft_s"].astype(float) + ok_lag
    e2e_intended = ok["e2e_s"].astype(float) + ok_lag
    lag_p99 = percentile(lag, 99)
    return {
        "rate_rps": math.nan if rate is None else rate,
        "achieved_rps": sent_in_window / window_s if window_s > 0 and math.isfinite(window_s) else math.nan,
        "schedule_lag_p50_s": percentile(lag, 50),
        "schedule_lag_p99_s": lag_p99,
        "schedule_lag_max_s": float(lag.max()) if lag.notna().any() else math.nan,
        "ttft_intended_p50_s": percentile(ttft_intended, 50),
        "ttft_intended_p95_s": percentile(ttft_intended, 95),
        "ttft_intended_p99_s": percentile(ttft_intended, 99),
        "ttft_intended_mean_s": mean(ttft_intended),
        "e2e_intended_mean_s": mean(e2e_intended),
        "schedule_behind": is_behind(lag_p99, rate),
    }


def rate_label(rate: float) -> str:
    return f"{rate:g} req/s"


def format_open_loop(table: pd.DataFrame) -> list[str]:
    """The console's open-loop section (rate runs only): intended and achieved rate, schedule lag, TTFT from the
    actual and from the intended send time, the verdict; [] for a closed-loop run."""
    if not is_rate_run(table):
        return []
    return ["", *glossary.console_table(table, glossary.OPEN_LOOP)]


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
