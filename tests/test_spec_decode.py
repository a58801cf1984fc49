"""Speculative decoding (issue 35): the server's counters per step (acceptance rate, mean acceptance length, per
position) on synthetic scrapes with known answers, a counter reset, a server without the counters (empty, never 0),
vLLM's exact text format, and the client's tokens per chunk."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from vllm_loadtest.analysis import glossary
from vllm_loadtest.analysis.prometheus_text import parse_samples
from vllm_loadtest.analysis.records import SCHEMA
from vllm_loadtest.analysis.server_metrics import SERVER_SOURCE, UP
from vllm_loadtest.analysis.spec_decode import (
    ACCEPTED,
    DRAFT_TOKENS,
    DRAFTS,
    PER_POSITION,
    SPEC_COLUMNS,
    chunk_stats,
    console_lines,
    spec_table,
    totals_line,
)
from vllm_loadtest.analysis.sse import parse_stream

from tests.helpers.paths import FIXTURES

pytestmark = pytest.mark.unit

LABELS = {"engine": "0", "model_name": "tiny"}


def frame(scrapes: list[tuple[float, list[tuple[str, dict, float]]]]) -> pd.DataFrame:
    """metrics.parquet's frame of these scrapes (each a time and its samples), as merge_scrapes writes it."""
    rows = []
    for t, samples in scrapes:
        rows.append((t, UP, "{}", 1.0, SERVER_SOURCE))
        rows += [(t, name, json.dumps(lab, sort_keys=True), v, SERVER_SOURCE) for name, lab, v in samples]
    return pd.DataFrame(rows, columns=["timestamp", "metric", "labels", "value", "source"])


def spec(drafts: float, accepted_per_pos: list[float], k: int = 3) -> list[tuple[str, dict, float]]:
    """The counters of a server with k speculative tokens: drafts x k draft tokens, accepted per position."""
    out = [(DRAFTS, LABELS, drafts), (DRAFT_TOKENS, LABELS, drafts * k), (ACCEPTED, LABELS, sum(accepted_per_pos))]
    out += [(PER_POSITION, {**LABELS, "position": str(p)}, a) for p, a in enumerate(accepted_per_pos)]
    return out


TIMELINE = [
    {"step": 0, "users": 1, "measure_start": 10.0, "end_time": 20.0},
    {"step": 1, "users": 2, "measure_start": 20.0, "end_time": 30.0},
]
NO_RECORDS = pd.DataFrame(columns=SCHEMA.names)


def test_real_vllm_counters_keep_their_canonical_names():
    # vLLM 0.32's CPU build with ngram speculation (3 tokens) after three greedy requests: the tiny random model repeats
    # one token, so every draft token was accepted; some drafts were shorter than 3 (43 drafts, 120 draft tokens).
    samples = parse_samples((FIXTURES / "vllm-0.32-cpu-spec-decode-metrics.txt").read_text())
    names = {name for name, _, _ in samples}
    assert {DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POSITION} <= names
    assert not any(name.endswith("_created") for name in names)
    metrics = frame([(9.0, []), (15.0, samples)])  # the counters appear after a scrape without them: all new
    table, summary = spec_table(metrics, TIMELINE[:1], NO_RECORDS)
    row = table.iloc[0]
    assert (row["spec_drafts"], row["spec_draft_tokens"], row["spec_accepted_tokens"]) == (43, 120, 120)
    assert row["spec_acceptance_rate"] == 1.0
    assert row["spec_acceptance_length_mean"] == pytest.approx(1 + 120 / 43)
    assert summary["acceptance_rate_per_position"] == pytest.approx([43 / 43, 40 / 43, 37 / 43])


def test_a_real_speculating_stream_gives_the_tokens_of_each_chunk():
    # The same server's stream of 64 tokens with continuous usage: each chunk the accepted drafts and the bonus token.
    lines = (FIXTURES / "vllm-0.32-cpu-spec-decode.sse").read_bytes().splitlines()
    parsed = parse_stream((i * 0.01, line) for i, line in enumerate(lines) if line)
    assert parsed.chunk_tokens == [1, 1, 2, 3, *[4] * 14, 1]
    assert parsed.output_tokens == 64 and not parsed.output_tokens_estimated
    ok = pd.DataFrame({"status": ["ok"], "chunk_tokens": [parsed.chunk_tokens], "chunks": [19],
                       "output_tokens": [64], "output_tokens_estimated": [False]})  # fmt: skip
    stats = chunk_stats(ok)
    assert stats["tokens_per_chunk_mean"] == pytest.approx(64 / 19)
    assert stats["multi_token_chunk_share"] == pytest.approx(16 / 19)
    assert glossary.tokens_per_chunk(64, 19, False) == pytest.approx(64 / 19)


def test_per_step_increase_rate_length_and_positions_are_exact():
    # Each scrape interval: 10 drafts of 3 tokens, 15 accepted (10, 5, 0 at positions 0, 1, 2); two per step.
    metrics = frame([(10.0, spec(100, [50, 20, 5])), (15.0, spec(110, [60, 25, 5])), (20.0, spec(120, [70, 30, 5])),
                     (25.0, spec(130, [80, 35, 5])), (30.0, spec(140, [90, 40, 5]))])  # fmt: skip
    table, summary = spec_table(metrics, TIMELINE, NO_RECORDS)
    assert list(table.columns) == ["step", *SPEC_COLUMNS]
    first, second = table.to_dict(orient="records")
    assert (first["spec_drafts"], first["spec_draft_tokens"], first["spec_accepted_tokens"]) == (20, 60, 30)
    assert first["spec_acceptance_rate"] == 0.5 and first["spec_acceptance_length_mean"] == 2.5
    assert (second["spec_drafts"], second["spec_accepted_tokens"]) == (20, 30)
    # Every scrape interval accepted exactly half its draft tokens: the interval is the value itself.
    assert first["spec_acceptance_rate_ci_low"] == first["spec_acceptance_rate_ci_high"] == 0.5
    assert summary["steps"][0]["acceptance_rate_per_position"] == [1.0, 0.5, 0.0]
    assert summary["drafts"] == 40 and summary["accepted_tokens"] == 60 and summary["draft_tokens"] == 120
    assert summary["acceptance_rate"] == 0.5 and summary["acceptance_length_mean"] == 2.5
    assert summary["acceptance_rate_per_position"] == pytest.approx([1.0, 0.5, 0.0])


def test_the_interval_widens_with_the_scrape_intervals_spread():
    # 10 draft tokens each: 2 then 8 accepted (rate 0.5 over the window; the intervals disagree).
    metrics = frame([(10.0, spec(0, [0, 0], k=2)), (15.0, spec(5, [2, 0], k=2)), (20.0, spec(10, [7, 3], k=2))])
    row = spec_table(metrics, TIMELINE[:1], NO_RECORDS)[0].iloc[0]
    assert row["spec_acceptance_rate"] == 0.5
    assert 0.0 <= row["spec_acceptance_rate_ci_low"] < 0.5 < row["spec_acceptance_rate_ci_high"] <= 1.0


def test_a_counter_reset_inside_a_window_counts_from_zero():
    # The server restarts between 15 and 18: its counters start again from 0 and reach 4 drafts by 20.
    metrics = frame([(10.0, spec(100, [50, 20, 5])), (15.0, spec(106, [56, 23, 5])), (18.0, spec(2, [2, 1, 0])),
                     (20.0, spec(4, [4, 2, 0]))])  # fmt: skip
    table, summary = spec_table(metrics, TIMELINE[:1], NO_RECORDS)
    row = table.iloc[0]
    assert row["spec_drafts"] == 6 + 2 + 2
    assert row["spec_accepted_tokens"] == 9 + 3 + 3
    assert row["spec_acceptance_rate"] == pytest.approx(15 / 30)
    assert summary["acceptance_rate_per_position"] == pytest.approx([10 / 10, 5 / 10, 0.0])


def test_a_server_without_the_counters_leaves_the_server_columns_empty_never_zero():
    metrics = frame([(10.0, [("vllm:num_requests_running", LABELS, 1.0)]),
                     (20.0, [("vllm:num_requests_running", LABELS, 1.0)])])  # fmt: skip
    for m in (metrics, None):
        table, summary = spec_table(m, TIMELINE[:1], NO_RECORDS)
        server = [c for c in SPEC_COLUMNS if c.startswith("spec_")]
        assert table[server].isna().all().all()
        assert summary["drafts"] is None and summary["acceptance_rate"] is None and summary["steps"] == []
        assert summary["acceptance_rate_per_position"] == []
        assert not glossary.applies(table, glossary.SPEC)
        assert console_lines(table, summary) == [] and totals_line(summary) is None


def test_a_window_without_drafts_has_zero_drafts_and_no_rate():
    metrics = frame([(10.0, spec(100, [50, 20, 5])), (20.0, spec(100, [50, 20, 5]))])
    table, _ = spec_table(metrics, TIMELINE[:1], NO_RECORDS)
    row = table.iloc[0]
    assert row["spec_drafts"] == 0 and math.isnan(row["spec_acceptance_rate"])
    assert math.isnan(row["spec_acceptance_length_mean"])
    assert glossary.applies(table, glossary.SPEC)  # the server exports them: the section shows


def ok_requests(chunk_lists: list[list[int]], usage: list[int | None]) -> pd.DataFrame:
    """Ok requests with these chunks' token counts; usage None: the server sent none (counted from the chunks)."""
    return pd.DataFrame({
        "status": "ok",
        "chunk_tokens": chunk_lists,
        "chunks": [len(c) for c in chunk_lists],
        "output_tokens": [sum(c) if u is None else u for c, u in zip(chunk_lists, usage)],
        "output_tokens_estimated": [u is None for u in usage],
    })  # fmt: skip


def test_tokens_per_chunk_with_continuous_usage():
    ok = ok_requests([[1, 3, 3, 3], [1, 3, 2]], [10, 6])
    stats = chunk_stats(ok)
    assert stats["tokens_per_chunk_mean"] == pytest.approx(16 / 7)
    assert stats["multi_token_chunk_share"] == pytest.approx(5 / 7)
    assert stats["tokens_per_chunk_p99"] == pytest.approx(np.percentile([1, 3, 3, 3, 1, 3, 2], 99))
    assert stats["tokens_per_chunk_mean_ci_low"] < 16 / 7 < stats["tokens_per_chunk_mean_ci_high"]


def test_tokens_per_chunk_without_continuous_usage_and_without_usage():
    # Final usage only: each chunk counted as one token; 10 tokens in 4 chunks is a mean, but per chunk unknown.
    stats = chunk_stats(ok_requests([[1, 1, 1, 1]], [10]))
    assert stats["tokens_per_chunk_mean"] == 2.5 and math.isnan(stats["multi_token_chunk_share"])
    # Usage equal to the chunks: every chunk carried exactly one token.
    stats = chunk_stats(ok_requests([[1, 1, 1]], [3]))
    assert stats["tokens_per_chunk_mean"] == 1.0 and stats["multi_token_chunk_share"] == 0.0
    # No usage at all: the count is the chunks', so nothing is known.
    stats = chunk_stats(ok_requests([[1, 1, 1]], [None]))
    assert all(math.isnan(v) for v in stats.values())


def test_the_request_column_formula():
    assert glossary.tokens_per_chunk(10, 4, False) == 2.5
    assert glossary.tokens_per_chunk(10, 4, True) is None
    assert glossary.tokens_per_chunk(None, 0, None) is None and glossary.tokens_per_chunk(5, 0, False) is None


def test_console_shows_the_table_and_the_totals_when_the_server_speculates():
    metrics = frame([(10.0, spec(100, [50, 20, 5])), (15.0, spec(110, [60, 25, 5])), (20.0, spec(120, [70, 30, 5]))])
    table, summary = spec_table(metrics, TIMELINE[:1], NO_RECORDS)
    table.insert(1, "users", [1])
    lines = console_lines(table, summary)
    assert lines[1].startswith("Speculative decoding")
    assert "50.0% ±0.0%" in lines[3] and "2.50" in lines[3]  # every scrape interval at 0.5: no spread
    assert "acceptance rate 50.0% (30 of 60 draft tokens)" in lines[-1]
    assert "per position: 1.000, 0.500, 0.000" in lines[-1]


def test_the_embedded_server_speculates_only_when_asked(capsys, monkeypatch):
    import json as json_mod
    from pathlib import Path

    from vllm_loadtest.embedded_vllm import EmbeddedVLLM, ServerSettings
    from vllm_loadtest.embedded_vllm import __main__ as cli

    def command(settings: ServerSettings) -> list[str]:
        server = EmbeddedVLLM(settings, cache=Path("/nonexistent"))
        server.python, server.model_dir = Path("python"), Path("model")
        return server.command()

    plain = command(ServerSettings(port=1))
    assert "--speculative-config" not in plain
    ngram = command(ServerSettings(port=1, speculative="ngram"))
    assert ngram[len(plain)] == "--speculative-config"
    assert json_mod.loads(ngram[len(plain) + 1]) == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 2,
    }  # fmt: skip
    monkeypatch.setattr(cli, "EmbeddedVLLM", None)  # nothing may start
    assert cli.main(["serve", "--speculative", "ngram", "--embed"]) == 3
    err = capsys.readouterr().err.strip()
    assert "--speculative ngram" in err and len(err.splitlines()) == 1
