"""Reasoning and tool calls measured: the parser's split of vLLM 0.32's exact chunks (reasoning, answer, tool calls,
a chunk with both, the role chunk, with and without continuous usage), the record formulas, steps.csv's reasoning
columns with known values, the console and the report showing them only when something reasoned, the SLO gate's
ttfo objectives, and requests without an answer token among many not giving a confidently wrong TTFO.

The chunks are written out as vLLM 0.32 serializes them (entrypoints/openai/chat_completion/serving.py,
chat_completion_stream_generator: pydantic's model_dump_json(exclude_unset=True) of ChatCompletionStreamResponse;
DeltaMessage fields role, content, reasoning, tool_calls; the engine parsers (parser/engine/parser_engine.py) set
only the fields they have, both content and reasoning in the chunk that closes the thought; hermes' tool calls
first carry id, type and function.name, then function.arguments pieces)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from vllm_loadtest.analysis import glossary as g
from vllm_loadtest.analysis.batch import BATCH_COLUMNS
from vllm_loadtest.analysis.capacity import FAIL, PASS, UNCERTAIN, check, objective_interval
from vllm_loadtest.analysis.energy import ENERGY_COLUMNS
from vllm_loadtest.analysis.gpu import GPU_COLUMNS
from vllm_loadtest.analysis.lora import LORA_COLUMNS
from vllm_loadtest.analysis.reasoning import REASONING_COLUMNS, console_lines, reasoning_row
from vllm_loadtest.analysis.report import TTFT_TTFO, reasoning_html
from vllm_loadtest.analysis.run import compute_table
from vllm_loadtest.analysis.slo import judge_steps, parse_slo, verdict, verdict_lines
from vllm_loadtest.analysis.spec_decode import SPEC_COLUMNS
from vllm_loadtest.analysis.sse import StreamParser, parse_stream
from vllm_loadtest.analysis.steps import format_table, step_table

pytestmark = pytest.mark.unit

HEAD = '{"id":"chatcmpl-4d3c","object":"chat.completion.chunk","created":1764600000,"model":"qwen3"'


def usage(done: int, reasoning: int | None = None, prompt: int = 12) -> str:
    details = "null" if reasoning is None else f'{{"reasoning_tokens":{reasoning}}}'
    return (f'"usage":{{"prompt_tokens":{prompt},"total_tokens":{prompt + done},"completion_tokens":{done},'
            f'"completion_tokens_details":{details}}}')  # fmt: skip


def role(continuous: bool = True) -> bytes:
    u = "," + usage(0, 0) if continuous else ""
    return (HEAD + ',"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
            f'"finish_reason":null}}]{u},"prompt_token_ids":null,"prompt_text":null}}').encode()  # fmt: skip


def token(delta: str, done: int | None = None, reasoning: int | None = None, finish: str | None = None) -> bytes:
    """A token chunk: `delta` the JSON of its delta; with `done`, continuous usage (completion_tokens so far)."""
    end = f'"finish_reason":"{finish}","stop_reason":null' if finish else '"finish_reason":null'
    u = "" if done is None else "," + usage(done, reasoning)
    return (HEAD + f',"choices":[{{"index":0,"delta":{delta},"logprobs":null,{end},"token_ids":null}}]{u}}}').encode()


def final_usage(done: int, reasoning: int | None) -> bytes:
    details = "" if reasoning is None else f',"completion_tokens_details":{{"reasoning_tokens":{reasoning}}}'
    tail = f'"completion_tokens":{done}{details}}},"system_fingerprint":"vllm-0.32.0-3f2a9c1e"}}'
    return (HEAD + f',"choices":[],"usage":{{"prompt_tokens":12,"total_tokens":{12 + done},' + tail).encode()


def stream(chunks: list[bytes], start: float = 0.1, gap: float = 0.01) -> list[tuple[float, bytes]]:
    """Each chunk as the client reads it (a data line and its blank separator), one arrival per chunk, then [DONE]."""
    out, t = [], start
    for c in chunks:
        out += [(t, b"data: " + c + b"\n"), (t, b"\n")]
        t += gap
    return [*out, (t, b"data: [DONE]\n"), (t, b"\n")]


# --- the parser --------------------------------------------------------------------------------------------------


def test_reasoning_then_answer_with_continuous_usage_is_split_exactly():
    # <think> alone makes no chunk (the parser returns None for a lone start token): the first reasoning chunk
    # carries it (2 tokens); likewise </think> goes into the first answer chunk.
    chunks = [
        role(),
        token('{"reasoning":"Okay, the user"}', 2, 1),
        token('{"reasoning":" asks"}', 3, 2),
        token('{"reasoning":" 2+2."}', 4, 3),
        token('{"content":"4"}', 6, 3),
        token('{"content":"."}', 7, 3, finish="stop"),
        final_usage(7, 3),
    ]
    p = parse_stream(stream(chunks))
    assert p.error_type is None and p.done and p.finish_reason == "stop"
    assert p.chunk_tokens == [2, 1, 1, 2, 1] and p.output_tokens == 7
    assert p.token_offsets_s[0] == pytest.approx(0.11)  # TTFT: the first reasoning chunk (the role chunk has none)
    assert p.first_output_offset_s == pytest.approx(0.14)  # TTFO: the first answer chunk
    assert p.reasoning_chunk_tokens == 4 and p.reasoning_tokens == 4  # continuous usage: the chunks' own counts
    assert p.usage_reasoning_tokens == 3  # the server's count leaves <think> and </think> out
    assert p.tool_call_chunks == 0


def test_reasoning_content_is_reasoning_too_older_vllm_and_sglang_shapes():
    older = [token('{"reasoning_content":"Hmm"}', 1), token('{"reasoning_content":" so"}', 2),
             token('{"content":"Yes"}', 3, finish="stop")]  # fmt: skip
    p = parse_stream(stream(older))
    assert p.reasoning_tokens == 2 and p.first_output_offset_s == pytest.approx(0.12)
    # SGLang sends every field, the unused ones null (and an empty content beside the reasoning).
    sglang = [
        token('{"role":null,"content":"","reasoning_content":"Hmm","tool_calls":null}', 1),
        token('{"role":null,"content":null,"reasoning_content":" so","tool_calls":null}', 2),
        token('{"role":null,"content":"Yes","reasoning_content":null,"tool_calls":null}', 3, finish="stop"),
    ]
    p = parse_stream(stream(sglang))
    assert p.reasoning_tokens == 2 and p.first_output_offset_s == pytest.approx(0.12)


def test_a_chunk_with_both_the_end_of_the_thought_and_the_answer_is_the_answers_first_chunk():
    # One engine step brought 3 tokens: " 4." (reasoning), </think>, "Four" (answer): {"content", "reasoning"} both.
    chunks = [token('{"reasoning":"2+2 is"}', 2), token('{"content":"Four","reasoning":" 4."}', 5),
              token('{"content":"."}', 6, finish="stop")]  # fmt: skip
    p = parse_stream(stream(chunks))
    assert p.first_output_offset_s == pytest.approx(0.11)
    assert p.reasoning_tokens == 2  # the mixed chunk's 3 tokens are the answer's
    assert g.answer_tokens(p.output_tokens, p.reasoning_tokens) == 4
    # With the server's running reasoning count on every chunk (vLLM 0.32 with a reasoning parser): split exactly.
    chunks = [token('{"reasoning":"2+2 is"}', 2, 2), token('{"content":"Four","reasoning":" 4."}', 5, 3),
              token('{"content":"."}', 6, 3, finish="stop")]  # fmt: skip
    p = parse_stream(stream(chunks))
    assert p.reasoning_tokens == 3 and p.first_output_offset_s == pytest.approx(0.11)  # " 4." was reasoning
    chunks[1] = token('{"content":"Four","reasoning":" 4."}', 5, 9)  # a count beyond the chunk: all but one at most
    assert parse_stream(stream(chunks)).reasoning_chunk_tokens == 4
    # vLLM's older basic parsers pass content=None explicitly when nothing follows </think>: present as null.
    p = parse_stream(stream([token('{"reasoning":"a"}', 1), token('{"content":null,"reasoning":" b"}', 3)]))
    assert p.reasoning_tokens == 3 and p.first_output_offset_s is None


def test_streamed_tool_calls_as_hermes_streams_them():
    call = '{"tool_calls":[{"id":"chatcmpl-tool-9f1c2b3a4d5e6f70","type":"function","index":0,"function":{"name":"get_weather"}}]}'  # noqa: E501
    chunks = [
        role(),
        token('{"reasoning":"Need the weather."}', 3, 3),
        token('{"content":null,' + call[1:], 5, 3),
        token('{"content":null,"tool_calls":[{"index":0,"function":{"arguments":"{\\"city\\": \\""}}]}', 6, 3),
        token('{"content":null,"tool_calls":[{"index":0,"function":{"arguments":"Paris"}}]}', 7, 3),
        token('{"content":null,"tool_calls":[{"index":0,"function":{"arguments":"\\"}"}}]}', 8, 3, "tool_calls"),
        final_usage(8, 3),
    ]
    p = parse_stream(stream(chunks))
    assert p.finish_reason == "tool_calls" and p.tool_call_chunks == 4
    assert p.reasoning_tokens == 3 and p.first_output_offset_s == pytest.approx(0.12)  # the call's first chunk
    # tool_choice="required" (tool_parsers/streaming.py): no content field, name null after the first piece.
    required = [
        token(
            '{"tool_calls":[{"id":"chatcmpl-tool-1","type":"function","index":0,"function":'
            '{"name":"get_weather","arguments":""}}]}',
            1,
        ),
        token('{"tool_calls":[{"index":0,"function":{"name":null,"arguments":"{}"}}]}', 2, finish="stop"),
    ]
    p = parse_stream(stream(required))  # fmt: skip
    assert p.tool_call_chunks == 2 and p.first_output_offset_s == pytest.approx(0.1) and p.reasoning_tokens == 0


def test_without_continuous_usage_the_server_count_wins_else_one_per_chunk():
    chunks = [role(False), token('{"reasoning":"a"}'), token('{"reasoning":" b"}'), token('{"content":"c"}'),
              token('{"content":"d"}', finish="stop")]  # fmt: skip
    p = parse_stream(stream([*chunks, final_usage(6, 3)]))
    assert p.chunk_tokens == [1, 1, 1, 1] and p.output_tokens == 6 and not p.continuous_usage
    assert p.reasoning_chunk_tokens == 2 and p.reasoning_tokens == 3  # the server's own count
    assert p.first_output_offset_s == pytest.approx(0.13)  # the role-only first chunk carries no token
    p = parse_stream(stream(chunks))  # no usage at all: both counted from chunks
    assert p.reasoning_tokens == 2 and p.output_tokens == 4 and p.output_tokens_estimated


def test_chunks_without_text_count_with_their_field_or_the_chunk_before():
    chunks = [
        token('{"reasoning":""}', 1),  # a held-back partial character inside the thought
        token('{"reasoning":"x"}', 2),
        token("{}", 3),  # no field (vLLM: a lone </think> on a chunk it must send): with the chunk before
        token('{"content":""}', 4),  # an empty answer-phase delta: the answer has begun
        token('{"content":"y"}', 5, finish="stop"),
    ]
    p = parse_stream(stream(chunks))
    assert p.reasoning_tokens == 3 and p.first_output_offset_s == pytest.approx(0.13)


def test_a_thought_that_never_closes_has_no_first_output():
    chunks = [role(), *(token('{"reasoning":" hmm"}', i, i) for i in range(1, 5)), token("{}", 5, 4, "length")]
    p = parse_stream(stream(chunks))
    assert p.reasoning_tokens == 5 and p.output_tokens == 5 and p.first_output_offset_s is None
    assert g.answer_tpot_s(0.15, p.first_output_offset_s, p.output_tokens, p.reasoning_tokens) is None


def test_completions_and_plain_chat_are_all_answer():
    text = b'{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" a"}]}'
    p = parse_stream(stream([text, text]))
    assert p.first_output_offset_s == p.token_offsets_s[0] and p.reasoning_tokens == 0
    p = parse_stream(stream([role(False), token('{"content":"hi"}'), token('{"content":"!"}', finish="stop")]))
    assert p.first_output_offset_s == p.token_offsets_s[0] == pytest.approx(0.11) and p.reasoning_tokens == 0


def test_keep_text_keeps_the_answer_not_the_thought_nor_the_tool_call():
    parser = StreamParser(keep_text=True)
    chunks = [role(), token('{"reasoning":"think"}', 1), token('{"content":"Hel","reasoning":"."}', 3),
              token('{"content":"lo"}', 4)]  # fmt: skip
    for offset, line in stream(chunks):
        parser.feed(offset, line)
    assert parser.text() == "Hello" and parser.result.reasoning_tokens == 1


# --- the record formulas -----------------------------------------------------------------------------------------


def test_record_formulas_with_known_values():
    assert g.answer_tokens(30, 10) == 20 and g.answer_tokens(None, 3) is None and g.answer_tokens(5, None) is None
    assert g.answer_tpot_s(2.0, 1.05, 30, 10) == pytest.approx(0.95 / 19)
    assert g.answer_tpot_s(2.0, 1.05, 11, 10) is None and g.answer_tpot_s(2.0, None, 30, 10) is None
    assert g.reasoning_time_s(0.05, 1.05) == pytest.approx(1.0) and g.reasoning_time_s(0.05, None) is None
    assert g.reasoning_share([10, 0, None], [30, 10, 50]) == pytest.approx(10 / 40)
    assert math.isnan(g.reasoning_share([], []))
    # TTFT and TPOT keep their meaning: over every token, thinking included.
    assert g.tpot_s(2.0, 0.05, 30) == pytest.approx(1.95 / 29)


def test_percentile_never_ranks_inf_above_everything():
    assert g.percentile_never([1.0, 2.0, 3.0], 50) == g.percentile([1.0, 2.0, 3.0], 50) == 2.0
    assert g.percentile_never([1.0, 2.0, math.inf], 50) == 2.0
    assert g.percentile_never([1.0, 2.0, math.inf], 75) == math.inf  # between 2 and inf
    assert g.percentile_never([1.0, 3.0, math.inf, math.inf], 100 / 3) == pytest.approx(3.0)  # exactly at x_(2)
    assert g.percentile_never([math.inf], 50) == math.inf and math.isnan(g.percentile_never([math.nan], 50))
    frame = pd.DataFrame({"ttfo_s": [0.5, None, None], "reasoning_tokens": [3, 7, None]})
    assert list(g.ttfo_values(frame)[:2]) == [0.5, math.inf] and math.isnan(g.ttfo_values(frame)[2])
    assert np.isnan(g.ttfo_values(pd.DataFrame({"ttft_s": [0.1]}))).all()  # records from before TTFO: unknown


# --- steps.csv, the console, the report ----------------------------------------------------------------------------


def records(n: int, ttfo, reasoning, step: int = 0, output: int = 20, tools: int = 0, start: float = 100.0):
    """n ok requests of one step: TTFT 50 ms, TTFO ttfo(i) (None: no answer token), reasoning(i) tokens."""
    rows = []
    for i in range(n):
        t, r = ttfo(i), reasoning(i)
        e2e = (t or 0.5) + 0.2
        rows.append(dict(
            request_id=f"{step}-{i}", step=step, users=4, warmup=False, status="ok", error_type=None,
            start_time=start + i * 0.1, duration_s=e2e, ttft_s=0.05, e2e_s=e2e, tpot_s=(e2e - 0.05) / (output - 1),
            output_tokens=output, chunk_offsets_s=[0.05, e2e], chunk_tokens=[1, output - 1], ttfo_s=t,
            reasoning_tokens=r, tool_call_chunks=tools, answer_tpot_s=g.answer_tpot_s(e2e, t, output, r),
        ))  # fmt: skip
    return rows


TIMELINE = [{"step": 0, "users": 4, "start_time": 99.0, "measure_start": 100.0, "end_time": 200.0}]


def test_the_reasoning_columns_with_known_values():
    # 40 requests: TTFO 0.30 .. 0.69 s, 8 reasoning tokens of 20; 4 of them reasoned for all 20 and never answered.
    rows = records(40, lambda i: None if i >= 36 else 0.30 + 0.01 * i, lambda i: 20 if i >= 36 else 8)
    table = step_table(pd.DataFrame(rows), TIMELINE)
    row = table.iloc[0]
    ttfo = np.array([0.30 + 0.01 * i for i in range(36)] + [math.inf] * 4)
    assert row["ttfo_p50_s"] == pytest.approx(np.percentile(ttfo[:36], 50 * 39 / 35))  # rank 19.5 of the 40
    assert row["ttfo_p50_s"] == pytest.approx(0.495) and row["ttfo_p95_s"] == math.inf  # rank 37.05 > 35
    assert row["no_answer_requests"] == 4 and row["reasoning_share"] == pytest.approx((36 * 8 + 80) / 800)
    assert row["reasoning_tokens_mean"] == pytest.approx((36 * 8 + 80) / 40)
    assert row["answer_tpot_p50_s"] == pytest.approx(0.2 / 11)  # (e2e - ttfo) / (20 - 8 - 1)
    assert row["tool_call_requests"] == 0 and row["ttft_p50_s"] == pytest.approx(0.05)
    assert row["ttfo_p50_s_ci_low"] < 0.495 < row["ttfo_p50_s_ci_high"] < math.inf
    assert math.isnan(row["ttfo_p95_s_ci_low"])  # 40 < 200 samples: no interval for p95
    # The reasoning section, then issue 19's embeddings section, last.
    tail = REASONING_COLUMNS + BATCH_COLUMNS
    assert list(table.columns[-len(tail) :]) == tail
    # steps.csv: the reasoning section after every earlier one, why each step ended included.
    full = compute_table(pd.DataFrame(rows), TIMELINE, None, None)
    tail += GPU_COLUMNS + ENERGY_COLUMNS + LORA_COLUMNS + SPEC_COLUMNS  # GPU (20), energy and LoRA (35), last
    assert list(full.columns[-len(tail) - 2 : -len(tail)]) == ["end_reason", "probe"]


def test_the_console_and_the_report_show_reasoning_only_when_something_reasoned():
    plain = step_table(pd.DataFrame(records(30, lambda i: 0.05, lambda i: 0)), TIMELINE)
    assert not g.applies(plain, g.REASONING) and console_lines(plain) == [] and reasoning_html(plain) == ""
    assert "Reasoning" not in format_table(plain) and "TTFO" not in format_table(plain)
    assert plain.iloc[0]["ttfo_p50_s"] == plain.iloc[0]["ttft_p50_s"]  # written all the same: TTFO = TTFT
    old = plain.drop(columns=REASONING_COLUMNS)  # a steps.csv from before: nothing shown, no error
    assert not g.applies(old, g.REASONING) and console_lines(old) == []

    rows = records(30, lambda i: None if i == 29 else 1.0 + 0.01 * i, lambda i: 24 if i == 29 else 12, output=24)
    table = step_table(pd.DataFrame(rows), TIMELINE)
    text = format_table(table)
    lines = console_lines(table)
    assert g.applies(table, g.REASONING) and text.endswith("\n".join(lines[1:]))
    head = lines[2].split()
    assert head[: head.index("reasoning")] == ["step", "users", "Requests", "ok", "TTFT", "p50", "TTFO", "p50",
                                               "TTFT", "p95", "TTFO", "p95", "TTFT", "p99", "TTFO", "p99"]  # fmt: skip
    cells = lines[3].split()
    assert cells[:6] == ["0", "4", "30", "50.0", "1145.0", "50.0~"]  # TTFT p95 of 30: too few for an interval
    # TTFO p95 (rank 27.55 of 0..29) is the answered requests'; p99's rank (28.71) reaches the never-answered one.
    assert cells[6:10] == ["1275.5~", "50.0~", "no", "answer"]
    assert "No answer token in 1 of 30 ok requests of step 0 (4 users)" in lines[-1]
    page = reasoning_html(table)
    assert TTFT_TTFO in page and "no answer token in 1 of 30" in page
    assert "TTFT counts the first token of any kind, thinking included" in TTFT_TTFO


def test_a_step_where_no_request_answered_reads_no_answer_not_empty_nor_zero():
    rows = records(30, lambda i: None, lambda i: 20)
    row = step_table(pd.DataFrame(rows), TIMELINE).iloc[0]
    assert row["ttfo_p50_s"] == row["ttfo_p99_s"] == math.inf and row["no_answer_requests"] == 30
    assert row["ttfo_p50_s_ci_low"] == math.inf and row["reasoning_share"] == 1.0
    column = g.STEP_TABLE["ttfo_p50_s"]
    assert column.show(row["ttfo_p50_s"]) == "no answer" and column.show(row["ttfo_p50_s"], web=True) == "no answer"
    assert g.STEP_TABLE["ttft_p50_s"].show(0.05) == "50.0"


def test_the_web_ui_row_shows_ttfo_beside_ttft_and_no_answer():
    from vllm_loadtest.locustfiles.webui import COLUMNS, _row

    keys = [k for k, _ in COLUMNS]
    assert keys[keys.index("ttft_p99_ms") + 1 : keys.index("ttft_p99_ms") + 4] == [
        "ttfo_p50_ms", "ttfo_p95_ms", "reasoning_share"]  # fmt: skip
    row = _row("whole run", {"step": "all", "ttft_p50_s": 0.02, "ttfo_p50_s": 1.25, "ttfo_p95_s": math.inf,
                             "reasoning_share": 0.4}, {})  # fmt: skip
    assert row["ttft_p50_ms"] == "20.0" and row["ttfo_p50_ms"] == "1250.0" and row["ttfo_p95_ms"] == "no answer"
    assert row["reasoning_share"] == "40%"


def test_tool_calls_alone_show_the_section_too():
    rows = records(20, lambda i: 0.05, lambda i: 0, tools=5)
    table = step_table(pd.DataFrame(rows), TIMELINE)
    assert table.iloc[0]["tool_call_requests"] == 20 and g.applies(table, g.REASONING)


# --- the SLO gate ------------------------------------------------------------------------------------------------


def test_ttfo_objectives_parse_and_judge_never_answered_requests_as_failing():
    objectives = parse_slo("ttfo_p95=2s,ttfo_p50=800ms,ttft_p95=100ms")
    assert [(o.metric, o.statistic, o.threshold) for o in objectives[:2]] == [
        ("ttfo", "p95", 2.0),
        ("ttfo", "p50", 0.8),
    ]
    # Step 0: every request answered within 0.3 .. 0.69 s; step 1: 3 of 40 never answered (7.5 % > 5 %).
    rows = records(40, lambda i: 0.30 + 0.01 * i, lambda i: 8)
    rows += records(40, lambda i: None if i < 3 else 0.30 + 0.01 * i, lambda i: 8, step=1, start=300.0)
    timeline = [*TIMELINE, {"step": 1, "users": 4, "start_time": 299.0, "measure_start": 300.0, "end_time": 400.0}]
    judged = judge_steps(pd.DataFrame(rows), timeline, objectives)
    assert judged.iloc[0]["ttfo_p95"] == pytest.approx(np.percentile([0.30 + 0.01 * i for i in range(40)], 95))
    assert judged.iloc[0]["ttfo_p95_met"] and judged.iloc[0]["goodput"] == 1.0
    assert judged.iloc[1]["ttfo_p95"] == math.inf and not judged.iloc[1]["ttfo_p95_met"]
    assert judged.iloc[1]["ttfo_p95_no_answer"] and not judged.iloc[0]["ttfo_p95_no_answer"]
    assert judged.iloc[1]["goodput"] == pytest.approx(37 / 40)  # a request never answered meets no ttfo objective
    result = verdict(judged, objectives)
    assert not result["passed"] and result["steps"][1]["ttfo_p95"] is None  # strict JSON: inf as null
    broken = [b for b in result["broken"] if b["objective"] == "ttfo_p95"]
    assert broken == [{"step": 1, "users": 4, "objective": "ttfo_p95", "value": None, "no_answer": True}]
    assert "Step 1 (4 users): ttfo_p95 <= 2000.0 ms (no answer) not met." in verdict_lines(result, objectives)
    # A step where nothing answered fails (it is not "no data").
    judged = judge_steps(pd.DataFrame(records(20, lambda i: None, lambda i: 20)), TIMELINE, parse_slo("ttfo_p50=5s"))
    assert not judged.iloc[0]["meets_all"] and judged.iloc[0]["ttfo_p50"] == math.inf


def test_disturbed_data_a_few_never_answered_requests_do_not_give_a_confidently_wrong_ttfo():
    rng = np.random.default_rng(7)
    n = 1200
    waits = rng.normal(1.0, 0.05, n)  # the users' real waits for an answer
    never = set(rng.choice(n, 18, replace=False).tolist())  # 1.5 %: their thoughts never closed
    rows = records(n, lambda i: None if i in never else float(waits[i]), lambda i: 20 if i in never else 10)
    ok = pd.DataFrame(rows)
    row = reasoning_row(ok)
    answered = np.array([waits[i] for i in range(n) if i not in never])
    # p50 and p95: the answered requests' waits as they rank among all, inside their intervals; finite.
    assert row["ttfo_p50_s_ci_low"] <= np.percentile(answered, 50) <= row["ttfo_p50_s_ci_high"]
    assert math.isfinite(row["ttfo_p95_s"]) and math.isfinite(row["ttfo_p95_s_ci_high"])
    # p99 (the 12 slowest of 1200) lies among the 18 never answered: no finite value, and the interval says "at
    # least this long, maybe never", not a confident finite bound.
    assert row["ttfo_p99_s"] == math.inf and row["ttfo_p99_s_ci_high"] == math.inf
    assert math.isfinite(row["ttfo_p99_s_ci_low"]) and row["ttfo_p99_s_ci_low"] > np.percentile(answered, 95)
    # Leaving them out would state a confident finite p99 for a step where 1.5 % never got an answer.
    dropped = reasoning_row(ok.dropna(subset=["ttfo_s"]))
    assert math.isfinite(dropped["ttfo_p99_s"]) and math.isfinite(dropped["ttfo_p99_s_ci_high"])
    # A capacity probe on it: ttfo_p99=2s is not shown to hold (its interval reaches the never answered: uncertain,
    # never a pass), ttfo_p95=2s passes, and a limit at the step's own p95 is uncertain, judged on its interval as
    # TTFT would be. With 3 % never answered the whole p99 interval is "never": it fails.
    (p99,) = parse_slo("ttfo_p99=2s")
    assert check(p99, objective_interval(p99, ok, 0)).verdict == UNCERTAIN
    worse = ok.assign(ttfo_s=[None if i < 36 else t for i, t in enumerate(ok["ttfo_s"])])
    assert check(p99, objective_interval(p99, worse, 0)).verdict == FAIL
    (p95,) = parse_slo("ttfo_p95=2s")
    assert check(p95, objective_interval(p95, ok, 0)).verdict == PASS
    (tight,) = parse_slo(f"ttfo_p95={row['ttfo_p95_s'] * 1000:.1f}ms")
    assert check(tight, objective_interval(tight, ok, 0)).verdict == UNCERTAIN
