"""Per-turn results (analysis/turns.py) and the server's cached tokens per request: the parser reads
usage.prompt_tokens_details.cached_tokens from vLLM's and SGLang's final usage, the per-turn table on records with
known answers (the step table's measured rules, the hit rate over the requests that carry it, missing never 0),
the end of a hand-written conversation run (turns.csv, the console, summary.json, the report) and the fake server's
simulated prefix cache."""

from __future__ import annotations

import json
import math
import urllib.request

import numpy as np
import orjson
import pandas as pd
import pytest
from vllm_loadtest.analysis import glossary as g
from vllm_loadtest.analysis import servers
from vllm_loadtest.analysis.finish import finish_run
from vllm_loadtest.analysis.records import RecordWriter, RequestRecord
from vllm_loadtest.analysis.sse import parse_stream
from vllm_loadtest.analysis.turns import TURN_COLUMNS, format_turns, ratio_interval, turn_table
from vllm_loadtest.analysis.uncertainty import quantile_interval

from tests.helpers.paths import ROOT
from tests.helpers.records import TIMELINE, frame, rec

pytestmark = pytest.mark.unit


def lines(*objs) -> list[tuple[float, bytes]]:
    out = [(0.1 + i * 0.01, b"data: " + orjson.dumps(o) + b"\n") for i, o in enumerate(objs)]
    return [*out, (1.0, b"data: [DONE]\n")]


def token(text: str, cumulative: int | None = None, finish: str | None = None, chat: bool = True) -> dict:
    choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
    obj = {"id": "x", "choices": [{**choice, "finish_reason": finish}]}
    if cumulative is not None:  # continuous usage: vLLM sends no prompt_tokens_details there
        obj["usage"] = {"prompt_tokens": 40, "completion_tokens": cumulative, "total_tokens": 40 + cumulative}
    return obj


def final_usage(details: object = "absent") -> dict:
    usage = {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42}
    if details != "absent":
        usage["prompt_tokens_details"] = details
    return {"id": "x", "object": "chat.completion.chunk", "choices": [], "usage": usage}


# --- the parser ---------------------------------------------------------------------------------------------


def test_vllm_final_usage_gives_the_cached_prompt_tokens_with_or_without_continuous_usage():
    # vLLM 0.32 with --enable-prompt-tokens-details: {"cached_tokens": N} in the final usage chunk only.
    parsed = parse_stream(lines(token("a"), token("b", finish="length"), final_usage({"cached_tokens": 32})))
    assert parsed.cached_prompt_tokens == 32 and parsed.prompt_tokens == 40 and parsed.output_tokens == 2
    continuous = parse_stream(lines(token("a", 1), token("b", 2, "length"), final_usage({"cached_tokens": 0})))
    assert continuous.cached_prompt_tokens == 0 and continuous.chunk_tokens == [1, 1]  # 0 is a value, not missing


def test_no_cached_tokens_is_none_never_zero():
    assert parse_stream(lines(token("a", 1), token("b", 2, "length"), final_usage())).cached_prompt_tokens is None
    assert parse_stream(lines(token("a"), token("b", finish="stop"))).cached_prompt_tokens is None  # no usage
    # vLLM's chat serving may build details with only created_cache_tokens (None cached: dropped by exclude_none).
    assert parse_stream(lines(token("a"), final_usage({"created_cache_tokens": 5}))).cached_prompt_tokens is None
    assert parse_stream(lines(token("a"), final_usage(None))).cached_prompt_tokens is None


def test_sglang_shape_continuous_chunks_with_null_details_then_the_final_usage():
    """SGLang dumps its models without exclude_none: continuous-usage chunks say prompt_tokens_details: null and
    the final usage carries {"cached_tokens": N, "image_tokens": null, ...} (--enable-cache-report)."""
    chunks = [token("a", 1), token("b", 2, "stop")]
    for c in chunks:
        c["usage"]["prompt_tokens_details"] = None
    end = final_usage({"cached_tokens": 24, "image_tokens": None, "audio_tokens": None})
    assert parse_stream(lines(*chunks, end)).cached_prompt_tokens == 24
    assert servers.get("sglang").cached_tokens_zero_omitted and not servers.get("vllm").cached_tokens_zero_omitted


def test_a_server_whose_last_token_chunk_holds_the_usage():
    last = token("b", finish="stop")
    last["usage"] = {"prompt_tokens": 40, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 16}}
    assert parse_stream(lines(token("a"), last)).cached_prompt_tokens == 16


# --- the per-turn table -------------------------------------------------------------------------------------


def conversation_records(extra: list[dict] | None = None) -> pd.DataFrame:
    """Three turns in step 0 (measured from 2 s): turn 1 three ok (and one warm-up), turn 2 two ok, one failed and
    one cut off, turn 3 one ok without cached tokens."""
    rows = []

    def add(i, start, turn, ttft, prompt, history, cached, **kw):
        r = rec(i, 0, 4, start, ttft, 5, 0.01, **kw)
        r.update(session_id=f"s{i % 3}", turn=turn, prompt_tokens=prompt, history_tokens=history,
                 cached_prompt_tokens=cached)  # fmt: skip
        rows.append(r)

    add(0, 1.0, 1, 0.5, 999, 0, 999, warmup=True)  # warm-up: not measured
    add(1, 3.0, 1, 0.1, 100, 0, 0)
    add(2, 3.1, 1, 0.2, 120, 0, 32)
    add(3, 3.2, 1, 0.3, 80, 0, None)  # no cached tokens: left out of the hit rate, still a request
    add(4, 5.0, 2, 0.15, 200, 150, 128)
    add(5, 5.1, 2, 0.25, 220, 160, 192)
    add(6, 5.2, 2, 0.0, None, 170, None, status="error", error_type="http_500", duration=0.01)
    add(7, 9.5, 2, 0.0, None, 180, None, status="error", error_type="cut_off", duration=0.01)
    add(8, 7.0, 3, 0.4, 300, 250, None)
    rows += extra or []
    return frame(rows)


def test_one_row_per_turn_with_the_step_tables_measured_requests_and_exact_values():
    table = turn_table(conversation_records(), TIMELINE)
    assert list(table.columns) == TURN_COLUMNS == g.names(g.TURNS)
    assert table["turn"].tolist() == [1, 2, 3]
    one, two, three = table.to_dict(orient="records")
    assert (one["requests"], one["errors"], two["requests"], two["errors"], three["requests"]) == (3, 0, 2, 1, 1)
    assert one["prompt_tokens_mean"] == 100 and two["prompt_tokens_mean"] == 210 and three["prompt_tokens_mean"] == 300
    assert one["history_tokens_mean"] == 0 and two["history_tokens_mean"] == 155
    assert one["ttft_p50_s"] == pytest.approx(0.2) and one["ttft_p95_s"] == pytest.approx(0.29)
    assert two["ttft_p50_s"] == pytest.approx(0.2) and two["ttft_p95_s"] == pytest.approx(0.245)
    assert one["tpot_p50_s"] == pytest.approx(0.01)
    assert one["prefix_cache_hit_rate"] == pytest.approx(32 / 220) and one["prefix_cache_requests"] == 2
    assert two["prefix_cache_hit_rate"] == pytest.approx(320 / 420) and two["prefix_cache_requests"] == 2
    # Two requests: the interval exists but is wide, clipped to [0, 1].
    assert (one["prefix_cache_hit_rate_ci_low"], one["prefix_cache_hit_rate_ci_high"]) == (0.0, 1.0)
    # No request of turn 3 carries cached tokens: missing, never 0.
    assert math.isnan(three["prefix_cache_hit_rate"]) and three["prefix_cache_requests"] == 0
    assert math.isnan(three["prefix_cache_hit_rate_ci_low"])
    # Three requests are too few for any percentile's interval: marked, bounds empty.
    assert one["few_samples"] == "ttft_p50_s ttft_p95_s tpot_p50_s" and math.isnan(one["ttft_p50_s_ci_low"])


def test_intervals_are_the_order_statistics_of_the_turns_requests():
    ttfts = np.linspace(0.1, 0.5, 40)
    rows = []
    for i, ttft in enumerate(ttfts):
        r = rec(100 + i, 1, 8, 12.0 + i * 0.1, float(ttft), 4, 0.02)
        r.update(turn=1, prompt_tokens=64, history_tokens=0, cached_prompt_tokens=32 if i % 2 else 16)
        rows.append(r)
    (row,) = turn_table(frame(rows), TIMELINE).to_dict(orient="records")
    ci = quantile_interval(ttfts, 0.5)
    assert (row["ttft_p50_s"], row["ttft_p50_s_ci_low"], row["ttft_p50_s_ci_high"]) == (ci.value, ci.low, ci.high)
    assert row["few_samples"] == "ttft_p95_s"  # 40 < 200: p95 has no interval; p50 and TPOT p50 do
    assert row["prefix_cache_hit_rate"] == pytest.approx(24 / 64)
    hit = ratio_interval(np.where(np.arange(40) % 2, 32, 16), np.full(40, 64))
    assert (row["prefix_cache_hit_rate_ci_low"], row["prefix_cache_hit_rate_ci_high"]) == (hit.low, hit.high)
    assert row["prefix_cache_hit_rate_ci_low"] < 24 / 64 < row["prefix_cache_hit_rate_ci_high"]


def test_ratio_interval_known_values():
    ci = ratio_interval([4, 5, 6], [10, 10, 10])
    half = 4.302652729911275 * 1.0 / (math.sqrt(3) * 10)  # t(2, 0.975) * sd(c - R p) / (sqrt(n) * mean(p))
    assert ci.value == pytest.approx(0.5)
    assert (ci.low, ci.high) == (pytest.approx(0.5 - half), pytest.approx(0.5 + half))
    assert ratio_interval([1, 2, 3], [10, 10, 10]).low == 0.0  # clipped
    assert math.isnan(ratio_interval([5], [10]).low) and ratio_interval([5], [10]).value == 0.5
    assert math.isnan(ratio_interval([], []).value) and math.isnan(ratio_interval([0], [0]).value)


def test_the_hit_rates_interval_covers_the_true_rate_on_noisy_requests():
    """Prompts of varying length, each request's cached share noisy around a true rate of 0.6 (whole 16-token
    blocks, as a server counts them): the 95 % interval holds the true rate about 95 % of the time, not far less."""
    rng = np.random.default_rng(17)
    covered, runs = 0, 400
    for _ in range(runs):
        prompt = rng.integers(50, 400, size=30)
        cached = np.clip(rng.normal(0.6, 0.15, size=30), 0, 1) * prompt // 16 * 16
        truth = 0.6 * prompt.sum() - 7.5 * 30  # the whole-block floor loses 7.5 tokens a request on average
        ci = ratio_interval(cached, prompt)
        covered += ci.low <= truth / prompt.sum() <= ci.high
    assert 0.90 <= covered / runs <= 0.99, covered / runs


def test_sglang_leaves_out_a_zero_so_an_answer_with_usage_and_without_it_had_none_cached():
    records = conversation_records()
    assert turn_table(records, TIMELINE)["prefix_cache_hit_rate"].iloc[0] == pytest.approx(32 / 220)
    table = turn_table(records, TIMELINE, zero_omitted=True)
    assert table["prefix_cache_hit_rate"].iloc[0] == pytest.approx(32 / 300)  # request 3 (80 tokens) had 0 cached
    assert table["prefix_cache_hit_rate"].iloc[2] == 0 and table["prefix_cache_requests"].iloc[2] == 1
    nothing = records.assign(cached_prompt_tokens=None)
    assert turn_table(nothing, TIMELINE, zero_omitted=True)["prefix_cache_hit_rate"].isna().all()  # never sent


def test_a_single_turn_run_has_no_turn_table():
    rows = [rec(i, 0, 1, 3.0 + i, 0.1, 4, 0.01) for i in range(3)]
    table = turn_table(frame(rows), TIMELINE)
    assert table.empty and list(table.columns) == TURN_COLUMNS


def test_the_console_table_is_the_glossarys_with_few_sample_marks():
    text = format_turns(turn_table(conversation_records(), TIMELINE))
    title, header, *rows = text.splitlines()
    assert title == g.SECTIONS[g.TURNS].title and title.startswith("Per turn")
    assert header.split() == ["turn", "reqs", "errors", "prompt", "tok", "history", "tok", "TTFT", "p50", "p95",
                              "TPOT", "p50", "prefix", "hits"]  # fmt: skip
    assert rows[0].split() == ["1", "3", "0", "100", "0", "200.0~", "290.0~", "10.0~", "15%"]
    assert rows[2].split()[-1] == "-"  # turn 3: no cached tokens sent


# --- the end of a conversation run --------------------------------------------------------------------------

T0 = 1_800_000_000.0


def write_conversation_run(run_dir, turns: int = 3, sessions: int = 8, cached: bool = True):
    """A finished conversation run directory written by hand: `sessions` conversations of `turns` turns, each turn
    100 tokens longer, the server's cache holding every earlier turn (cached = previous prompt + answer)."""
    writer = RecordWriter(run_dir / "records" / "local.jsonl")
    for s in range(sessions):
        history = 0
        for k in range(1, turns + 1):
            prompt = 100 * k + 20 * (k - 1)
            start = T0 + 2.0 + s * 0.5 + (k - 1) * 2.0
            writer.write(RequestRecord(
                request_id=f"r{s}-{k}", worker="w", step=0, users=sessions, warmup=False, start_time=start,
                endpoint="chat", model="m", ttft_s=0.01 * k, e2e_s=0.01 * k + 0.19, tpot_s=0.01, duration_s=0.21,
                output_tokens=20, output_tokens_estimated=False, prompt_tokens=prompt, chunks=20,
                finish_reason="length", chunk_offsets_s=[0.01 * k + 0.01 * i for i in range(20)], chunk_tokens=[1] * 20,
                session_id=f"s{s}", turn=k, history_tokens=history, cached_prompt_tokens=history if cached else None,
            ))  # fmt: skip
            history = prompt + 20
    writer.close()
    timeline = [{"step": 0, "users": sessions, "start_time": T0, "measure_start": T0 + 1, "end_time": T0 + 20}]
    run = {"started_at": T0, "finished_at": T0 + 20, "timeline": timeline, "options": {"turns": str(turns)}}
    (run_dir / "run.json").write_text(json.dumps(run))
    return run_dir


def test_the_end_of_a_conversation_run_writes_turns_csv_the_console_table_summary_and_report(tmp_path):
    console: list[str] = []
    outcome = finish_run(write_conversation_run(tmp_path), echo=console.append)
    turns = pd.read_csv(tmp_path / "turns.csv")
    assert list(turns.columns) == TURN_COLUMNS and turns["turn"].tolist() == [1, 2, 3]
    assert turns["requests"].tolist() == [8, 8, 8] and turns["prompt_tokens_mean"].tolist() == [100, 220, 340]
    assert turns["history_tokens_mean"].tolist() == [0, 120, 240]
    assert turns["prefix_cache_hit_rate"].tolist() == pytest.approx([0, 120 / 220, 240 / 340])
    assert outcome.files["turns.csv"] == tmp_path / "turns.csv"
    text = "\n".join(console)
    assert text.index("Batching curve") < text.index("Per turn") < text.index("Diagnosis:")
    assert format_turns(outcome.turns) in text and str(tmp_path / "turns.csv") in text
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [t["turn"] for t in summary["turns"]] == [1, 2, 3]
    assert summary["turns"][0]["ttft_p95_s_ci_low"] is None  # NaN -> null: missing stays missing
    page = (tmp_path / "report.html").read_text()
    section = page[page.index("<h2>Per turn</h2>") :]
    assert "Prefix-cache hit rate per turn" in section and "<table class='turns'>" in section
    assert ">TTFT p95 (ms)</th>" in section and "<td>55%</td>" in section  # 120 / 220


def test_without_cached_tokens_the_report_says_why_and_a_single_turn_run_has_no_turns(tmp_path):
    outcome = finish_run(write_conversation_run(tmp_path / "a", cached=False))
    assert outcome.turns["prefix_cache_hit_rate"].isna().all()
    page = (tmp_path / "a" / "report.html").read_text()
    assert "Prefix-cache hit rate: not available" in page and "Prefix-cache hit rate per turn" not in page
    single = write_conversation_run(tmp_path / "b", turns=1)
    rows = [json.loads(line) for line in (single / "records" / "local.jsonl").read_text().splitlines()]
    (single / "records" / "local.jsonl").write_text(
        "".join(json.dumps({**r, "turn": None, "session_id": None, "history_tokens": None}) + "\n" for r in rows)
    )
    outcome = finish_run(single)
    assert outcome.turns is None and not (single / "turns.csv").exists()
    assert "turns" not in json.loads((single / "summary.json").read_text())
    assert "<h2>Per turn</h2>" not in (single / "report.html").read_text()


def test_docs_describe_turns_csv():
    assert "## turns.csv: per turn" in ROOT.joinpath("docs", "reference", "metrics.md").read_text(encoding="utf-8")
    for page in ("reference/run-directory.md", "how-to/shape-the-workload.md"):
        assert "turns.csv" in ROOT.joinpath("docs", page).read_text(encoding="utf-8"), page


# --- the fake server's prefix cache -------------------------------------------------------------------------


def chat(url: str, messages: list[dict], max_tokens: int = 4) -> tuple[str, dict]:
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    request = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=10) as r:
        parsed = [json.loads(line[6:]) for line in r.read().decode().splitlines() if line.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in parsed if c["choices"])
    return text, parsed[-1]["usage"]


def test_the_fake_servers_prefix_cache_hits_the_conversation_so_far_in_whole_blocks(fake_server):
    server = fake_server("--ttft-ms", "1", "--itl-ms", "1", "--prefix-cache", "4")
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one two three four five"}]
    usages = []
    for _ in range(3):
        text, usage = chat(server.url, messages)
        usages.append(usage)
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "and then what"}]
    prompts = [u["prompt_tokens"] for u in usages]
    assert prompts == [17, 30, 43]  # BOS, 3 template tokens a message, the words, the generation prompt
    # Turn k resends turn k-1's prompt and its 4-token answer: all of it cached, in whole 4-token blocks.
    assert [u["prompt_tokens_details"]["cached_tokens"] for u in usages] == [0, 20, 32]
    assert [(p + 4) // 4 * 4 for p in prompts[:2]] == [20, 32]
    _, usage = chat(server.url, [{"role": "user", "content": "unrelated"}])
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert f'vllm:prefix_cache_queries_total{{engine="0",model_name="fake-model"}} {sum(prompts) + 8}' in metrics
    assert 'vllm:prefix_cache_hits_total{engine="0",model_name="fake-model"} 52' in metrics


def test_without_prefix_cache_the_fake_server_sends_no_cached_tokens(fake_server):
    server = fake_server("--ttft-ms", "1", "--itl-ms", "1")
    _, usage = chat(server.url, [{"role": "user", "content": "hello"}])
    assert "prompt_tokens_details" not in usage
