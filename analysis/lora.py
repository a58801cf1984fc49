"""Model mixes (--lora-mix, issue 35): the per-model rows of a run whose requests asked for several models (the base
model and LoRA adapters), and vLLM's adapters running and waiting (vllm:lora_requests_info) per step.

models.csv has one row per step and model. Each row is what the step table's own functions (analysis/steps.py:
step_table) say of the model's records alone, so its requests, tok/s and percentiles and their intervals are
computed as steps.csv's; the share counts the step's requests sent after its warm-up, any outcome, with its Wilson
interval (the model is drawn independently of when a request is sent, so the count is binomial). Pure: no I/O but
the caller's.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from . import glossary
from .glossary.models import LORA, MODELS
from .server_metrics import server_rows
from .servers import CANONICAL
from .steps import FEW_MARK, TOO_FEW, measured_column, run_row, step_table, timeline_from_records
from .trials import plan_groups
from .uncertainty import quantile_interval, wilson_interval

MODELS_FILE = "models.csv"
MODEL_COLUMNS = glossary.names(MODELS)
LORA_COLUMNS = glossary.names(LORA)
LORA_INFO = CANONICAL["lora_info"]
# (column, the request column it is a percentile of, q): each with an order-statistic interval.
QUANTILES = (("ttft_p50_s", "ttft_s", 0.50), ("ttft_p99_s", "ttft_s", 0.99), ("tpot_p50_s", "tpot_s", 0.50),
             ("tpot_p99_s", "tpot_s", 0.99))  # fmt: skip


def models_of(records: pd.DataFrame) -> list[str]:
    """The models the records asked for, sorted."""
    if "model" not in records.columns:
        return []
    return sorted(str(m) for m in records["model"].dropna().unique())


def has_mix(records: pd.DataFrame, run: dict) -> bool:
    """The run drew its models from a mix (run.json's lora_mix), or its records ask for more than one model."""
    return bool(run.get("lora_mix")) or len(models_of(records)) > 1


def mix_weights(run: dict) -> dict[str, float]:
    """The mix's normalised weights by model, from run.json's lora_mix; {} without it."""
    mix = run.get("lora_mix") or {}
    return {str(m["name"]): float(m["weight"]) for m in mix.get("models") or [] if "name" in m and "weight" in m}


def lora_states(metrics: pd.DataFrame | None) -> pd.DataFrame:
    """One row per scrape that carries vllm:lora_requests_info: its time, the adapters running and waiting (tuples of
    names) and max_lora. vLLM sets the current label set to the time at each log and keeps the earlier sets, so a
    scrape's state is its set with the largest value."""
    out = pd.DataFrame({"timestamp": [], "running": [], "waiting": [], "max_lora": []})
    if metrics is None or not len(metrics):
        return out
    rows = server_rows(metrics)
    rows = rows[(rows["metric"] == LORA_INFO) & rows["value"].notna()]
    if not len(rows):
        return out
    latest = rows.loc[rows.groupby("timestamp")["value"].idxmax()]
    states = []
    for t, text in zip(latest["timestamp"], latest["labels"]):
        labels = json.loads(text)
        max_lora = pd.to_numeric(labels.get("max_lora"), errors="coerce")
        states.append({"timestamp": float(t), "running": _names(labels.get("running_lora_adapters")),
                       "waiting": _names(labels.get("waiting_lora_adapters")), "max_lora": max_lora})  # fmt: skip
    return pd.DataFrame(states).sort_values("timestamp", ignore_index=True)


def _names(text: object) -> tuple[str, ...]:
    return tuple(n.strip() for n in str(text or "").split(",") if n.strip())


def _in_window(states: pd.DataFrame, step: dict, stop_time: float) -> pd.DataFrame:
    start = float(step["measure_start"])
    end = float(step["end_time"]) if step.get("end_time") is not None else stop_time
    return states[(states["timestamp"] >= start) & (states["timestamp"] <= end)]


def lora_step_table(metrics: pd.DataFrame | None, timeline: list[dict], records: pd.DataFrame) -> pd.DataFrame:
    """steps.csv's LoRA section: per step the models its requests asked for (when more than one), the most adapters
    running and waiting at once and max_lora, over the scrapes inside its measured window; empty (NaN) without them."""
    states = lora_states(metrics)
    sent = records[~records["warmup"].astype(bool)] if "model" in records.columns else records.iloc[:0]
    models = sent.groupby("step")["model"].nunique() if "model" in sent.columns else pd.Series(dtype=int)
    rows = []
    for step in timeline:
        if "step" not in step:
            continue
        inside = _in_window(states, step, math.inf)
        empty = not len(inside)
        asked = int(models.get(int(step["step"]), 0))
        rows.append({
            "step": int(step["step"]),
            "lora_models": asked if asked > 1 else math.nan,
            "lora_running_max": math.nan if empty else max(map(len, inside["running"])),
            "lora_waiting_max": math.nan if empty else max(map(len, inside["waiting"])),
            "lora_max_loras": math.nan if empty else float(inside["max_lora"].max()),
        })  # fmt: skip
    table = pd.DataFrame(rows, columns=["step", *LORA_COLUMNS])
    return table.astype({c: "Int64" for c in LORA_COLUMNS}) if len(table) else table


def _adapter_shares(inside: pd.DataFrame, model: str, named: set[str]) -> tuple[float, float]:
    """(running, waiting) share of the window's scrapes naming the model; NaN without scrapes or for a model no
    scrape of the run names (the base model: vLLM lists only adapters)."""
    if not len(inside) or model not in named:
        return math.nan, math.nan
    running = float(np.mean([model in r for r in inside["running"]]))
    waiting = float(np.mean([model in w for w in inside["waiting"]]))
    return running, waiting


def _quantile_columns(ok: pd.DataFrame) -> dict:
    """The percentiles with their order-statistic intervals, and the columns with too few samples for one."""
    row: dict = {}
    few = []
    for column, metric, q in QUANTILES:
        ci = quantile_interval(pd.to_numeric(ok[metric], errors="coerce").to_numpy(float), q)
        row[column], row[f"{column}_ci_low"], row[f"{column}_ci_high"] = ci.value, ci.low, ci.high
        if ci.note == TOO_FEW:
            few.append(column)
    row["few_samples"] = " ".join(few) or None
    return row


def model_table(records: pd.DataFrame, timeline: list[dict], run: dict, metrics: pd.DataFrame | None = None):
    """models.csv: one row per step and model (see the module's docstring)."""
    if not len(records) or not has_mix(records, run):
        return pd.DataFrame(columns=MODEL_COLUMNS)
    timeline = [t for t in (timeline or timeline_from_records(records)) if "step" in t]
    weights = mix_weights(run)
    counted = pd.Series(measured_column(records, timeline), index=records.index)
    sent = ~records["warmup"].astype(bool)
    states = lora_states(metrics)
    named = {n for names in (*states["running"], *states["waiting"]) for n in names}
    stop_time = max((float(t["end_time"]) for t in timeline if t.get("end_time") is not None), default=math.inf)
    step_sent = records.loc[sent, "step"].value_counts()
    model_sent = records.loc[sent].groupby(["step", "model"]).size()
    ok_all = records[counted & (records["status"] == "ok")]
    oks = dict(tuple(ok_all.groupby(["step", "model"])))  # one pass over the records, not one per step and model
    rows = []
    for model in [*weights, *(m for m in models_of(records) if m not in weights)]:
        table = step_table(records[records["model"] == model], timeline).set_index("step")  # this model's
        for entries in plan_groups(timeline):  # a step, or with --repeat a plan step over its trials
            step, runs = entries[0], [int(t["step"]) for t in entries]
            s = int(step.get("plan_step", step["step"]))
            n = sum(int(step_sent.get(r, 0)) for r in runs)
            k = sum(int(model_sent.get((r, model), 0)) for r in runs)
            share = wilson_interval(k, n)
            core = table.loc[s]
            ok = pd.concat([oks.get((r, model), ok_all.iloc[:0]) for r in runs])
            windows = pd.concat([_in_window(states, t, stop_time) for t in entries])
            running, waiting = _adapter_shares(windows, model, named)
            rows.append({
                "step": s, "users": int(step["users"]), "rate_rps": step.get("rate_rps"), "model": model,
                "sent": k, "step_sent": n, "share": share.value, "share_low": share.low, "share_high": share.high,
                "expected_share": weights.get(model, math.nan), "requests": core["requests"],
                "errors": core["errors"], "aggregate_tok_s": core["aggregate_tok_s"],
                "aggregate_tok_s_ci_low": core["aggregate_tok_s_ci_low"],
                "aggregate_tok_s_ci_high": core["aggregate_tok_s_ci_high"], **_quantile_columns(ok),
                "lora_running_share": running, "lora_waiting_share": waiting,
            })  # fmt: skip
    return pd.DataFrame(rows, columns=MODEL_COLUMNS).sort_values("step", kind="stable", ignore_index=True)


def run_models(records: pd.DataFrame, timeline: list[dict], run: dict) -> list[dict] | None:
    """summary.json's per_model: each model over the whole measured run (every step's requests sent after its
    warm-up for the share; tok/s over the sum of the windows, without an interval, as the step table's run row);
    None without a mix."""
    if not len(records) or not has_mix(records, run):
        return None
    timeline = [t for t in (timeline or timeline_from_records(records)) if "step" in t]
    weights = mix_weights(run)
    counted = pd.Series(measured_column(records, timeline), index=records.index)
    sent = ~records["warmup"].astype(bool) & records["step"].isin([int(t["step"]) for t in timeline])
    out = []
    for model in [*weights, *(m for m in models_of(records) if m not in weights)]:
        mine = records["model"] == model
        share = wilson_interval(int((mine & sent).sum()), int(sent.sum()))
        whole = run_row(records[mine], timeline)
        ok = records[mine & counted & (records["status"] == "ok")]
        out.append({
            "model": model, "weight": weights.get(model), "sent": int((mine & sent).sum()), "run_sent": int(sent.sum()),
            "share": share.value, "share_low": share.low, "share_high": share.high,
            "requests": int(whole["requests"]), "errors": int(whole["errors"]),
            "aggregate_tok_s": whole["aggregate_tok_s"], **_quantile_columns(ok),
        })  # fmt: skip
    return json.loads(pd.DataFrame(out).to_json(orient="records"))  # NaN -> null: missing stays missing


def format_models(table: pd.DataFrame) -> str:
    """The console's per-model table (only when the run asked for more than one model): share [low high] against
    the expected share, tok/s ± its half-width, percentiles in ms, ~ where too few samples give no interval."""
    if len(models_of(table)) < 2:
        return ""
    rows = glossary.console_rows(table, MODELS)
    shown = [c.name for c, _ in glossary.SECTIONS[MODELS].shown()]
    for cells, r in zip(rows[1:], table.to_dict(orient="records")):
        low, high = r.get("aggregate_tok_s_ci_low"), r.get("aggregate_tok_s_ci_high")
        if "aggregate_tok_s" in shown and not (pd.isna(low) or pd.isna(high)):
            cells[shown.index("aggregate_tok_s")] += f" ±{(high - low) / 2:.1f}"
        few = r.get("few_samples")
        for name in few.split() if isinstance(few, str) else ():
            if name in shown and cells[shown.index(name)] != "-":
                cells[shown.index(name)] += FEW_MARK
    return "\n".join([glossary.SECTIONS[MODELS].title, *glossary.aligned(rows)])
