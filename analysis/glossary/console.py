"""The console's tables, laid out from the declared columns."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ..thresholds import (
    CPU_BOUND,
    LAG_BOUND_S,
    LAG_CEILING_S,
    LAG_FLOOR_S,
    LAG_SHARE,
)
from .columns import EMBEDDINGS, GENERATOR, OPEN_LOOP, REASONING, RERANK, SERVER, STEP, TURNS, Column
from .energy import ENERGY
from .models import MODELS
from .registry import STEP_TABLE, columns
from .spec_decode import SPEC

# --- the console's tables ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Section:
    """A console table: its title line, the columns repeated at its left, and its columns when their order there
    is not the written order (a column of another section is headed by its label there)."""

    key: str
    title: str
    lead: tuple[str, ...] = ()
    console: tuple[str, ...] | None = None

    def shown(self) -> list[tuple[Column, str]]:
        """(column, header) of its console table."""
        if self.console is None:
            cols = [STEP_TABLE[n] for n in self.lead] + [c for c in columns(self.key) if c.header]
        else:
            cols = [STEP_TABLE[n] for n in self.lead + self.console]
        return [(c, c.header if c.section == self.key or c.name in self.lead else c.label) for c in cols]


SECTIONS = {
    STEP: Section(
        STEP,
        "Batching curve (latencies in ms; TTFT/TPOT/ITL exact percentiles of raw records; ± the half-width of the 95 % "
        "interval; ~ too few samples for a percentile's interval)",
    ),
    SERVER: Section(
        SERVER,
        "Server (vLLM /metrics over each step's measured window; times in ms; a p99 its histogram buckets cannot pin "
        "down shows the bounds they allow, e.g. < 300)",
        ("step", "users"),
    ),
    GENERATOR: Section(
        GENERATOR,
        "Load generator (self-checks over each step's measured window; lag in ms; BOUND: lag p99 over "
        f"{LAG_BOUND_S * 1000:.0f} ms or a process over {CPU_BOUND:.0%} CPU)",
        ("step", "users"),
        (
            "users_achieved_mean",
            "generator_processes",
            "generator_lag_p50_s",
            "generator_lag_p99_s",
            "generator_lag_max_s",
            "generator_cpu_max",
            "generator_bound",
        ),
    ),
    TURNS: Section(
        TURNS,
        "Per turn (every conversation's k-th request; latencies in ms, exact percentiles; ~ too few samples for a "
        "percentile's interval; prefix hits: cached prompt tokens / prompt tokens, from the server's usage)",
    ),
    MODELS: Section(
        MODELS,
        "Per model (--lora-mix; share of each step's requests sent after its warm-up, [low high] its 95 % Wilson "
        "interval, expected: the mix's weight; tok/s ± the half-width of its 95 % interval; latencies in ms, exact "
        "percentiles; ~ too few samples for a percentile's interval)",
    ),
    REASONING: Section(
        REASONING,
        "Reasoning (latencies in ms; TTFT: the first token of any kind, thinking included; TTFO: the first answer or "
        "tool-call token, what the user waits for; the gap is the time spent reasoning; no answer: requests that "
        "never got an answer token reach that percentile; ~ too few samples for a percentile's interval)",
        ("step", "users"),
        (
            "requests",
            "ttft_p50_s",
            "ttfo_p50_s",
            "ttft_p95_s",
            "ttfo_p95_s",
            "ttft_p99_s",
            "ttfo_p99_s",
            "reasoning_share",
            "reasoning_tokens_mean",
            "answer_tpot_p50_s",
            "no_answer_requests",
            "tool_call_requests",
        ),
    ),
    EMBEDDINGS: Section(
        EMBEDDINGS,
        "Embeddings (inputs/s and prompt tok/s over each step's measured window, ± the half-width of the 95 % "
        "interval; E2E: send to the body's last byte, exact percentiles in ms; ~ too few samples for a percentile's "
        "interval)",
        ("step", "users", "requests", "errors"),
        ("inputs_per_s", "prompt_tok_s", "e2e_p50_s", "e2e_p95_s", "e2e_p99_s"),
    ),
    RERANK: Section(
        RERANK,
        "Rerank (documents/s and prompt tok/s over each step's measured window, ± the half-width of the 95 % "
        "interval; E2E: send to the body's last byte, exact percentiles in ms; ~ too few samples for a percentile's "
        "interval)",
        ("step", "users", "requests", "errors"),
        ("documents_per_s", "prompt_tok_s", "e2e_p50_s", "e2e_p95_s", "e2e_p99_s"),
    ),
    ENERGY: Section(
        ENERGY,
        "Energy (the GPUs' energy counters over each step's measured window, summed over the GPUs; J/token: per "
        "output token completed in the window, J/request: per request completed in it; W/GPU: mean power from the "
        "energy, beside the GPU table's power readings)",
        ("step", "users"),
    ),
    SPEC: Section(
        SPEC,
        "Speculative decoding (the server's draft counters over each step's measured window: accepted / draft tokens, "
        "1 + accepted / drafts; the client's tokens per token-carrying chunk; ± the half-width of the 95 % interval)",
        ("step", "users"),
    ),
    OPEN_LOOP: Section(
        OPEN_LOOP,
        "Open loop (times in ms; lag = actual - intended send time; @intended: latency + lag; BEHIND: lag p99 over "
        f"min({LAG_CEILING_S * 1000:.0f} ms, max({LAG_FLOOR_S * 1000:.0f} ms, {LAG_SHARE:.0%} of 1/rate)))",
        ("step",),
        (
            "rate_rps",
            "achieved_rps",
            "schedule_lag_p50_s",
            "schedule_lag_p99_s",
            "schedule_lag_max_s",
            "ttft_p99_s",
            "ttft_intended_p50_s",
            "ttft_intended_p99_s",
            "e2e_mean_s",
            "e2e_intended_mean_s",
            "schedule_behind",
        ),
    ),
}


def aligned(rows: list[list[str]]) -> list[str]:
    """Rows of cells right-aligned in columns two spaces apart (the first row is the header)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]


def console_rows(table: pd.DataFrame, section: str) -> list[list[str]]:
    """A section's console table as cells: the header row, then one row per step (a column the table lacks: -)."""
    shown = SECTIONS[section].shown()
    rows = [[header for _, header in shown]]
    for r in table.to_dict(orient="records"):
        rows.append([c.cell(r) for c, _ in shown])
    return rows


def console_table(table: pd.DataFrame, section: str) -> list[str]:
    """A section's console table: its title line, its header and one line per step."""
    return [SECTIONS[section].title, *aligned(console_rows(table, section))]
