"""steps.csv's across-trial section (--repeat N, issue 35): per plan step its trials' count, and for throughput and
the latency percentiles the mean of the trials' own values with a t-interval over them. Appended last, and only by
a run with --repeat N > 1: a run without it writes steps.csv byte for byte as before."""

from __future__ import annotations

from .columns import CI, Column

TRIALS = "trials"  # steps.csv: across-trial figures (--repeat), last

# (step column, its label): the per-trial values the across-trial interval is taken over (trials.csv's columns).
TRIAL_METRICS = (
    ("aggregate_tok_s", "Aggregate tok/s"),
    ("ttft_p50_s", "TTFT p50"),
    ("ttft_p95_s", "TTFT p95"),
    ("ttft_p99_s", "TTFT p99"),
    ("tpot_p50_s", "TPOT p50"),
    ("tpot_p95_s", "TPOT p95"),
    ("tpot_p99_s", "TPOT p99"),
    ("e2e_p99_s", "E2E p99"),
)
_TRIAL_VALUES = "the step's trials' own values (each trial's row of trials.csv, over that trial's window alone)"
_T_INTERVAL = (
    "mean ± t(0.975, N - 1) * s / sqrt(N) over the N trial values (s: their sample standard deviation), the lower "
    "bound clipped at 0; empty below "
    "2 trials with a value. For N = 2 and 3 it always contains every trial's value; for N >= 4 it need not "
    "(the _min/_max columns give the spread)"
)


def _fmt(name: str) -> str:
    return "num1" if name.endswith("tok_s") else "ms1"


def _unit(name: str) -> str:
    return "tok/s" if name.endswith("tok_s") else "s"


TRIAL_COLUMNS = [
    Column("trials", TRIALS, "count", "Trials of this step pooled in the row (--repeat N): its steps.csv columns are "
           "computed over the requests of all of them together; empty without --repeat.", "trials with a timeline "
           "entry of this plan step", label="Trials", header="trials", fmt="int", shows="value"),
    *[c for name, label in TRIAL_METRICS for c in (
        Column(f"{name}_trials_mean", TRIALS, _unit(name), f"Mean over {_TRIAL_VALUES} of {name}.",
               f"mean({name} of each trial)", label=f"{label} across trials", fmt=_fmt(name)),
        Column(f"{name}_trials_ci_low", TRIALS, _unit(name), f"Lower bound of the across-trial {CI} of {name}: how "
               "far the step's value moves between trials a whole plan apart (slow drift the within-step interval "
               "cannot see).", _T_INTERVAL, label=f"{label} across-trial CI low", fmt=_fmt(name)),
        Column(f"{name}_trials_ci_high", TRIALS, _unit(name), f"Upper bound of the across-trial {CI} of {name}.",
               _T_INTERVAL, label=f"{label} across-trial CI high", fmt=_fmt(name)),
    )],
    Column("aggregate_tok_s_trials_min", TRIALS, "tok/s", "The lowest of the trials' own aggregate tok/s.",
           "min(aggregate_tok_s of each trial)", label="Tok/s lowest trial", fmt="num1"),
    Column("aggregate_tok_s_trials_max", TRIALS, "tok/s", "The highest of the trials' own aggregate tok/s.",
           "max(aggregate_tok_s of each trial)", label="Tok/s highest trial", fmt="num1"),
    Column("trials_disagree", TRIALS, "flag", "The step's trials disagree beyond their within-step intervals: two "
           "of its trials' aggregate tok/s intervals (each over its own window) do not overlap, so the drift "
           "between trials is larger than a step's own interval admits; read the across-trial interval.",
           "some trials i, j with ci_high_i < ci_low_j (aggregate_tok_s); empty when fewer than 2 trials have an "
           "interval", label="Trials disagree", fmt="flag", flag="DISAGREE"),
]  # fmt: skip
