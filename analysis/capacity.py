"""Capacity search (`--find-capacity users|rate`): the highest load that meets every `--slo` objective.

The search, probe by probe (each probe is a step of the run, with its own warm-up):
- Probes start at --start-users (or --start-rate) and double while every objective passes, the throughput still
  grows and --max-users (or --max-rate) is not reached.
- Then they bisect between the highest passing and the lowest failing probe until the two are within
  --capacity-resolution of the passing one (never finer than 1 user).
- A probe passes an objective when its 95 % interval lies at or under the limit, fails it when the interval lies
  above, and is `uncertain` when the interval straddles the limit. The search treats an uncertain probe as not
  passing (the capacity is a load shown to meet the SLOs) and the result says "uncertain between A and B".
  Where a statistic has too few samples for an interval (a p95 of 30 requests), it is judged on its value, and the
  check says so.

Pure: numpy, pandas, scipy; no Locust. The live side (locustfiles/shape.py) feeds `ProbeRecords` and asks
`next_load`; the end of the run (analysis/finish.py) judges every probe again on the complete records with the same
functions (`probes_of_run`) and builds the result (`result`) that the console, summary.json, summary.md and the
report print.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from .adaptive import MAX_DURATION, RUN_STOPPED
from .glossary import percentile_never
from .slo import STATISTICS, Objective, parse_slo, request_values
from .sse import CUT_OFF
from .thresholds import KNEE_GAIN
from .uncertainty import (
    Interval,
    batch_count,
    quantile_interval,
    rate_interval,
    t_interval,
    wilson_interval,
)

USERS, RATE = "users", "rate"
MODES = (USERS, RATE)
DEFAULT_RESOLUTION = "10%"
DEFAULT_START_USERS = 1
DEFAULT_START_RATE = "1"

PASS, FAIL, UNCERTAIN = "pass", "fail", "uncertain"
# Why the search stopped doubling (the result's `limit`).
LIMIT_SLO = "slo"  # an objective broke (or could not be shown to hold): bisected down to the resolution
LIMIT_THROUGHPUT = "throughput"  # the last doubling added no throughput: the server is saturated
LIMIT_MAX = "max_load"  # --max-users / --max-rate reached with every objective met
FEW = "too few samples for an interval: judged on its value"


def parse_resolution(text: str) -> float:
    """'10%' or '0.1' -> 0.1 (relative, above 0 and below 1); raises ValueError with a one-line fix."""
    text = str(text).strip()
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ValueError(
            f"--capacity-resolution {text!r} is not a percentage; use e.g. --capacity-resolution 10%"
        ) from None
    if not 0 < value < 1:
        raise ValueError(f"--capacity-resolution {text!r} must be above 0 and below 100%; use e.g. 10%")
    return value


def parse_load(text: str, name: str) -> float | None:
    """A positive number of requests/s (--start-rate, --max-rate); '' -> None; ValueError naming the option."""
    text = str(text).strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name} {text!r} is not a number of requests/s; use e.g. {name} 2") from None
    if not value > 0 or math.isinf(value):
        raise ValueError(f"{name} {text!r} must be a positive number of requests/s; use e.g. {name} 2")
    return value


@dataclass(frozen=True)
class Check:
    """One objective at one probe: its value, its 95 % interval (NaN bounds when there is none) and the verdict."""

    objective: str
    threshold: float
    value: float
    low: float
    high: float
    verdict: str  # PASS, FAIL or UNCERTAIN
    note: str | None = None

    def to_dict(self) -> dict:
        # NaN and inf (a TTFO statistic of requests never answered) as null: summary.json is strict JSON.
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}

    def text(self, objective: Objective) -> str:
        """'ttft_p95 was 812 ms (CI 790-840 ms)'."""
        ci = "" if math.isnan(self.low) else f" (CI {_range(objective, self.low, self.high)})"
        few = " (too few samples for an interval)" if self.note == FEW else ""
        return f"{self.objective} was {_fmt(objective, self.value)}{ci}{few}"


def _fmt(o: Objective, v: float) -> str:
    if v is None or math.isnan(v):
        return "no data"
    if v == math.inf:
        return "no answer"  # a TTFO statistic reached by requests that never got an answer token
    if o.metric == "error_rate":
        return f"{v:.2%}"
    if v >= 10:
        return f"{v:.2f} s"
    # Whole milliseconds from 10 ms up; below, two digits: an ITL limit of 0.5 ms must not read "0 ms".
    return f"{v * 1000:.0f} ms" if v >= 0.01 else f"{v * 1000:.2g} ms"


def _range(o: Objective, low: float, high: float) -> str:
    """'790-840 ms' (the unit once, when both bounds share it)."""
    lo, hi = _fmt(o, low), _fmt(o, high)
    unit = lo.rpartition(" ")[2] if " " in lo else ""
    if unit and hi.endswith(f" {unit}"):
        return f"{lo.rpartition(' ')[0]}-{hi}"
    return f"{lo}-{hi}"


def objective_interval(o: Objective, ok: pd.DataFrame, failed: int, itl: np.ndarray | None = None) -> Interval:
    """The objective's statistic over the probe's measured requests with its 95 % interval: order statistics for a
    percentile, a t-interval for a mean, Wilson for the error rate (the step table's estimators)."""
    if o.metric == "error_rate":
        return wilson_interval(failed, len(ok) + failed)
    if o.metric == "itl":
        values = itl if itl is not None else np.array([], dtype=float)
    else:
        values = request_values(ok, o.metric)  # TTFO: +inf never answered (the interval's bounds reach it too)
    q = STATISTICS[o.statistic]
    if q is None:
        return t_interval(values)
    with np.errstate(invalid="ignore"):  # numpy's interpolation at a TTFO never answered (inf): its value unused
        ci = quantile_interval(values, q / 100)
    # The step table's exact percentile (glossary.percentile), so the probe's value is steps.csv's.
    return Interval(percentile_never(values, q), ci.low, ci.high, ci.n, ci.note)


def check(o: Objective, ci: Interval) -> Check:
    """PASS when the interval's high <= the limit, FAIL when its low > the limit, else UNCERTAIN; without an
    interval, the value decides (noted); without a value, FAIL (no data is not a pass)."""
    if math.isnan(ci.value):
        return Check(o.name, o.threshold, ci.value, ci.low, ci.high, FAIL, "no data")
    if math.isnan(ci.low) or math.isnan(ci.high):
        return Check(o.name, o.threshold, ci.value, ci.low, ci.high, PASS if ci.value <= o.threshold else FAIL, FEW)
    if ci.high <= o.threshold:
        verdict = PASS
    elif ci.low > o.threshold:
        verdict = FAIL
    else:
        verdict = UNCERTAIN
    return Check(o.name, o.threshold, ci.value, ci.low, ci.high, verdict)


def probe_verdict(checks: Sequence[Check]) -> str:
    """FAIL when any objective fails, else UNCERTAIN when any straddles its limit, else PASS."""
    verdicts = {c.verdict for c in checks}
    return FAIL if FAIL in verdicts else UNCERTAIN if UNCERTAIN in verdicts else PASS


def check_probe(ok: pd.DataFrame, failed: int, objectives: Sequence[Objective]) -> list[Check]:
    """Every objective checked on one probe's measured requests (ok ones, and the count of failed ones)."""
    itl = None
    if any(o.metric == "itl" for o in objectives):
        from .steps import itl_samples  # the per-chunk lists are needed only here

        itl = itl_samples(ok)
    return [check(o, objective_interval(o, ok, failed, itl)) for o in objectives]


@dataclass
class Probe:
    """One probe of the search: a step, its load, its verdict on each objective and its aggregate tok/s."""

    probe: int  # 1-based: the order the probes ran in
    step: int
    load: float  # users, or requests/s
    verdict: str
    checks: list[Check] = field(default_factory=list)
    tok_s: float = math.nan
    tok_s_low: float = math.nan
    tok_s_high: float = math.nan
    requests: int = 0
    interrupted: bool = False  # the run was stopped during this probe, before it was judged

    @property
    def passed(self) -> bool:
        return self.verdict == PASS

    @property
    def counted(self) -> bool:
        """A probe stopped before it was judged counts only on what its data showed: a pass, or a fail on values
        (not "no data", not an interval that straddles its limit): a probe Ctrl-C cut 0.1 s in would otherwise
        read as the capacity's first failing load."""
        if not self.interrupted or self.verdict == PASS:
            return True
        return self.verdict == FAIL and all(_measured(c.value) for c in self.checks if c.verdict != PASS)

    def to_dict(self, mode: str) -> dict:
        key = "users" if mode == USERS else "rate_rps"
        out = {"probe": self.probe, "step": self.step, key: _load(self.load, mode), "passed": self.passed,
               "verdict": self.verdict, "requests": self.requests}  # fmt: skip
        if self.interrupted:
            out["interrupted"] = True
            out["counted"] = self.counted
        out["objectives"] = {c.objective: c.to_dict() for c in self.checks}
        for name in ("tok_s", "tok_s_low", "tok_s_high"):
            v = getattr(self, name)
            out[f"aggregate_{name}"] = None if math.isnan(v) else v
        return out


def _measured(value: float | None) -> bool:
    return value is not None and not math.isnan(value)


def _load(value: float, mode: str) -> float | int:
    return round(value) if mode == USERS else float(value)


def load_text(value: float, mode: str) -> str:
    """'12 users' or '37.5 req/s'."""
    if mode == USERS:
        return f"{round(value)} user{'' if round(value) == 1 else 's'}"
    return f"{value:g} req/s"


def _stopped_growing(previous: Probe, last: Probe) -> bool:
    """The doubling from `previous` to `last` added no throughput: even last's interval high is within KNEE_GAIN
    of previous's interval low (their values without intervals). A wide interval never stops the search, and a
    previous probe that read high by chance does not either: stopping too early would report too low a capacity,
    while one more probe only costs its length."""
    if math.isnan(previous.tok_s) or math.isnan(last.tok_s):
        return False
    high = last.tok_s if math.isnan(last.tok_s_high) else last.tok_s_high
    low = previous.tok_s if math.isnan(previous.tok_s_low) else previous.tok_s_low
    return high < low * (1 + KNEE_GAIN)


def next_load(
    mode: str, probes: Sequence[Probe], start: float, maximum: float | None, resolution: float
) -> tuple[float | None, str | None]:
    """(the next probe's load, None), or (None, why the search is over: LIMIT_SLO, LIMIT_THROUGHPUT, LIMIT_MAX).

    Doubling while every probe so far passed; then bisecting between the highest passing load below the lowest
    failing (or uncertain) one and that one, until they are within max(resolution * passing load, 1 user)."""
    if not probes:
        return (min(start, maximum) if maximum is not None else start), None
    failing = [p for p in probes if not p.passed]
    if not failing:
        last = probes[-1]
        if len(probes) >= 2 and _stopped_growing(probes[-2], last):
            return None, LIMIT_THROUGHPUT
        if maximum is not None and last.load >= maximum:
            return None, LIMIT_MAX
        doubled = 2 * last.load
        return (min(doubled, maximum) if maximum is not None else doubled), None
    hi = min(p.load for p in failing)
    below = [p.load for p in probes if p.passed and p.load < hi]
    if not below:
        return None, LIMIT_SLO  # even the lowest load probed breaks an objective
    lo = max(below)
    step = max(resolution * lo, 1.0 if mode == USERS else 0.0)
    if hi - lo <= step:
        return None, LIMIT_SLO
    mid = (lo + hi) / 2
    mid = float(math.floor(mid)) if mode == USERS else float(f"{mid:.3g}")
    if not lo < mid < hi:
        return None, LIMIT_SLO
    return mid, None


class ProbeRecords:
    """The running probe's measured requests on the controller (ok ones with their latencies, and the failed
    count), and every ok completion since the probe began (its window's aggregate tok/s counts those of any step).
    Fed by `llm_request` (a local runner) or `llm_worker_records` (a master)."""

    def __init__(self, itl: bool = False) -> None:
        self.active = False
        self.itl = itl  # keep the per-chunk lists (an ITL objective)
        self.reset(-1)

    def reset(self, step: int) -> None:
        self.step = step
        self.rows: list[dict] = []
        self.failed = 0
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.tokens: list[float] = []

    _FIELDS = ("step", "warmup", "start_time", "status", "error_type", "ttft_s", "tpot_s", "e2e_s", "output_tokens")

    def add(self, r: dict) -> None:
        if r.get("error_type") == CUT_OFF:
            return
        ok = r.get("status") == "ok"
        if ok and r.get("e2e_s") is not None:
            self.starts.append(float(r["start_time"]))
            self.ends.append(float(r["start_time"]) + float(r["e2e_s"]))
            self.tokens.append(float(r.get("output_tokens") or 0))
        if r.get("step") != self.step or r.get("warmup"):
            return
        if not ok:
            self.failed += 1
            return
        row = {k: r.get(k) for k in self._FIELDS}
        if self.itl:
            row["chunk_offsets_s"], row["chunk_tokens"] = r.get("chunk_offsets_s") or [], r.get("chunk_tokens") or []
        self.rows.append(row)

    def add_rows(self, rows: list[dict]) -> None:
        """Records as dicts (locustfiles/recordbus.py), with their per-chunk lists when `itl` asked for them."""
        if not self.active:
            return
        for r in rows:
            try:
                self.add(r)
            except (KeyError, TypeError, ValueError):
                continue  # not a record of this suite's: the merge at the end reports unreadable lines

    def judge(self, probe: int, load: float, objectives: Sequence[Objective], window_start: float, now: float) -> Probe:
        """The probe as measured so far: each objective checked, and the window's aggregate tok/s interval."""
        ok = pd.DataFrame(
            self.rows, columns=[*self._FIELDS, *(("chunk_offsets_s", "chunk_tokens") if self.itl else ())]
        )
        e2e = pd.to_numeric(ok["e2e_s"], errors="coerce")
        median = float(e2e.median()) if e2e.notna().any() else None
        agg = rate_interval(
            self.starts, self.ends, self.tokens, window_start, now, batch_count(now - window_start, median)
        )
        return make_probe(probe, self.step, load, check_probe(ok, self.failed, objectives), agg, len(ok) + self.failed)


def make_probe(probe: int, step: int, load: float, checks: list[Check], tok_s: Interval, requests: int) -> Probe:
    return Probe(probe, step, load, probe_verdict(checks), checks, tok_s.value, tok_s.low, tok_s.high, requests)


def probes_of_run(
    records: pd.DataFrame, timeline: list[dict], table: pd.DataFrame, mode: str, spec: str
) -> list[Probe]:
    """Every step of a capacity run judged again on its complete records (the requests that finished after the
    live decision included), in the order the probes ran; tok/s and its interval from steps.csv."""
    from .steps import measured_masks

    objectives = parse_slo(spec)
    measured, cut, _stop = measured_masks(records, timeline)
    rows = {int(r["step"]): r for r in table.to_dict(orient="records")}
    out = []
    for n, entry in enumerate(sorted(timeline, key=lambda t: int(t["step"])), start=1):
        s = int(entry["step"])
        in_step = (records["step"] == s) & measured & ~cut
        ok = records[in_step & (records["status"] == "ok")]
        failed = int((in_step & (records["status"] != "ok")).sum())
        row = rows.get(s, {})
        load = float(entry["rate_rps"]) if mode == RATE else float(entry["users"])
        tok = Interval(*(float(row.get(c, math.nan)) for c in ("aggregate_tok_s", "aggregate_tok_s_ci_low",
                                                                  "aggregate_tok_s_ci_high")))  # fmt: skip
        probe = make_probe(n, s, load, check_probe(ok, failed, objectives), tok, len(ok) + failed)
        probe.interrupted = entry.get("end_reason") == RUN_STOPPED and not entry.get("probe_check")
        out.append(probe)
    return out


def result(
    mode: str,
    probes: Sequence[Probe],
    spec: str,
    table: pd.DataFrame,
    binding: dict[int, str],
    limit: str | None,
    resolution: float | None = None,
) -> dict:
    """summary.json's `capacity`: the highest passing load below the lowest failing one, the first failing probe
    with the objectives it broke (or could not be shown to meet), what binds there, whether it is uncertain, and
    every probe in order; `line` is the console's sentence."""
    objectives = parse_slo(spec)
    key = "max_users" if mode == USERS else "max_rate_rps"
    counted = [p for p in probes if p.counted]
    failing = [p for p in counted if not p.passed]
    hi = min((p.load for p in failing), default=math.inf)
    passing = [p for p in counted if p.passed and p.load < hi]
    best = max(passing, key=lambda p: p.load) if passing else None
    first_failing = min((p for p in failing if best is None or p.load > best.load), key=lambda p: p.load, default=None)
    if limit is None:  # rebuilt from the files of a run that stopped before the search ended
        limit = LIMIT_SLO if first_failing is not None else None
    at = first_failing if first_failing is not None else best
    rows = {int(r["step"]): r for r in table.to_dict(orient="records")}
    out: dict = {
        "mode": mode,
        key: None if best is None else _load(best.load, mode),
        "objectives": {o.name: o.threshold for o in objectives},
        "limit": limit,
        "first_failing": None,
        "binding": None,
        "uncertain": bool(first_failing is not None and first_failing.verdict == UNCERTAIN),
        # The bracket [capacity, first failing] within --capacity-resolution (never finer than 1 user); None
        # without a bracket (nothing passed, or nothing failed).
        "resolution_met": None
        if best is None or first_failing is None or resolution is None
        else bool(first_failing.load - best.load <= max(resolution * best.load, 1.0 if mode == USERS else 0.0)),
        "probes": [p.to_dict(mode) for p in probes],
    }
    if first_failing is not None:
        broke = [c for c in first_failing.checks if c.verdict != PASS]
        out["first_failing"] = {
            ("users" if mode == USERS else "rate_rps"): _load(first_failing.load, mode),
            "step": first_failing.step,
            "verdict": first_failing.verdict,
            "objectives": {c.objective: c.to_dict() for c in broke},
            # max_duration: an --step-duration auto probe that ran out of time (the hint then names the maximum)
            "end_reason": _text_or_none(rows.get(first_failing.step, {}).get("end_reason")),
        }
    if at is not None:
        out["binding"] = _binding(at, rows.get(at.step, {}), binding)
    out["line"] = capacity_line(out, mode, best, first_failing, objectives)
    return out


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _binding(probe: Probe, row: dict, binding: dict[int, str]) -> dict:
    """What binds at the probe: the diagnosis's resource there (analysis.diagnosis.binding_resource: the server's
    own limit before a flagged load generator), with the server's numbers that show it; `load_generator_bound`
    says the generator was flagged too."""
    from .diagnosis import binding_resource
    from .glossary import flagged

    resource = binding.get(probe.step) or binding_resource(pd.Series(row))
    generator = flagged(row.get("generator_bound"))
    facts = {k: (None if v is None or (isinstance(v, float) and math.isnan(v)) else v)
             for k in ("kv_cache_usage_max", "waiting_mean", "waiting_max", "preemptions", "running_max")
             for v in [row.get(k)]}  # fmt: skip
    return {"step": probe.step, "resource": resource, **facts, "load_generator_bound": generator}


def _binding_text(b: dict | None) -> str:
    if not b:
        return ""
    parts = []
    if b.get("kv_cache_usage_max") is not None:
        parts.append(f"{b['kv_cache_usage_max'] * 100:.0f} % KV cache used")
    if b.get("waiting_max") is not None:
        parts.append(f"up to {b['waiting_max']:.0f} request{'' if b['waiting_max'] == 1 else 's'} waiting")
    if b.get("preemptions"):
        parts.append(f"{b['preemptions']:.0f} preempted")
    text = f"what binds there: {b['resource']}" + (f" ({', '.join(parts)})" if parts else "")
    if b.get("load_generator_bound") and not b["resource"].startswith("the load generator"):
        text += "; the load generator was flagged there too (its latencies may read high)"
    return text


def capacity_line(
    out: dict, mode: str, best: Probe | None, first_failing: Probe | None, objectives: Sequence[Objective]
) -> str:
    """'Capacity: 12 users, the highest load meeting ttft_p95<=500ms; at 16 users ttft_p95 was 812 ms (CI
    790-840 ms); what binds there: KV cache (100 % KV cache used, up to 9 requests waiting)'."""
    by_name = {o.name: o for o in objectives}
    spec = " and ".join(f"{o.name}<={_fmt(o, o.threshold).replace(' ', '')}" for o in objectives)
    binding = _binding_text(out.get("binding"))
    if best is None:
        probe = first_failing
        broke = "; ".join(c.text(by_name[c.objective]) for c in probe.checks if c.verdict != PASS) if probe else ""
        at = load_text(probe.load, mode) if probe else "the first probe"
        return f"Capacity: none: even {at} breaks {spec}: {broke}" + (f"; {binding}" if binding else "")
    head = f"Capacity: {load_text(best.load, mode)}, the highest load meeting {spec}"
    if first_failing is None:
        why = {
            LIMIT_THROUGHPUT: "throughput stopped growing there (more load only waits), with every objective met",
            LIMIT_MAX: f"the search's maximum ({'--max-users' if mode == USERS else '--max-rate'}), with every "
            "objective met",
        }.get(out.get("limit"), "every probe met every objective")
        return f"{head}; {why}" + (f"; {binding}" if binding else "")
    broke = [c for c in first_failing.checks if c.verdict != PASS]
    said = "; ".join(c.text(by_name[c.objective]) for c in broke)
    if out["uncertain"]:
        lines = f"Capacity: uncertain between {load_text(best.load, mode)} and {load_text(first_failing.load, mode)}"
        # A probe already adaptive that straddled its limit until --max-step-duration needs a longer maximum.
        ran_out = (out.get("first_failing") or {}).get("end_reason") == MAX_DURATION
        hint = "raise --max-step-duration" if ran_out else "--step-duration auto"
        return (f"{lines}: {load_text(best.load, mode)} meets {spec}; at {load_text(first_failing.load, mode)} {said}, "
                f"too close to its limit to tell (lengthen the probes: {hint})") + (
            f"; {binding}" if binding else "")  # fmt: skip
    return f"{head}; at {load_text(first_failing.load, mode)} {said}" + (f"; {binding}" if binding else "")
