"""--images end to end: real Locust runs on the chat endpoint against the fake server, which decodes every image it
receives (Pillow) and keeps each one's size, format and pixel hash in /truth. Every request carries N decodable
images of the requested size; without --image-reuse no image is sent twice, with it every request sends the same
set; the same --seed sends the same images; conversation turns carry them too; records' images and prompt tokens
(the server counts one token per 28x28 patch) match; summary.json holds the settings."""

from __future__ import annotations

import json
from collections import Counter

import pandas as pd
import pytest

from tests.helpers.runs import locust, short_run

pytestmark = pytest.mark.contract

TEXT_FAST = ("--ttft-ms", "5", "--itl-ms", "2")


def run(server, run_dir, *args: str, report: bool = False) -> tuple[pd.DataFrame, dict]:
    """A short chat run with images; its ok records and the server's truth for them."""
    proc = short_run(server.url, run_dir, "--endpoint", "chat", *([] if report else ["--no-report"]), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = pd.read_parquet(run_dir / "requests.parquet")
    ok = records[records["status"] == "ok"]
    truth = server.get("/truth")
    assert len(ok) >= 20 and set(ok["request_id"]) <= set(truth), (len(ok), len(truth))
    return ok, {r: truth[r] for r in ok["request_id"]}


def hashes(truth: dict) -> list[str]:
    return [im["pixels"] for t in truth.values() for im in t["images"]]


def test_every_request_carries_n_distinct_decodable_images_reproducible_by_seed(fake_server, tmp_path):
    server = fake_server(*TEXT_FAST)
    ok, truth = run(server, tmp_path / "a", "--images", "2:120x90", "--seed", "11", report=True)
    for t in truth.values():
        assert [(im["width"], im["height"], im["format"]) for im in t["images"]] == [(120, 90, "png")] * 2
    seen = hashes(truth)
    assert len(set(seen)) == len(seen) == 2 * len(ok)  # never the same image twice: the server's cache misses
    assert (ok["images"] == 2).all()
    # The record's prompt tokens are the server's usage: the text's plus 2 x ceil(120/28) x ceil(90/28) = 40.
    assert (ok["prompt_tokens"] == [truth[r]["prompt_tokens"] + 40 for r in ok["request_id"]]).all()
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["images"] == {"count": 2, "width": 120, "height": 90, "format": "png", "reuse": False}
    report = (tmp_path / "a" / "report.html").read_text()
    assert "Images: 2 per request, 120x90 PNG" in report and "distinct per request" in report

    # The same --seed: each user's k-th request sends the same images as before (the runs' lengths differ a little).
    _, again = run(server, tmp_path / "b", "--images", "2:120x90", "--seed", "11")
    common = set(hashes(again)) & set(seen)
    assert len(common) >= 0.8 * min(len(seen), len(hashes(again))), (len(common), len(seen))
    _, other = run(server, tmp_path / "c", "--images", "2:120x90", "--seed", "12")
    assert not set(hashes(other)) & (set(seen) | set(hashes(again)))


def test_image_reuse_sends_the_same_jpeg_images_in_every_request_and_turns_carry_them(fake_server, tmp_path):
    server = fake_server(*TEXT_FAST)
    # max_tokens drawn per request: the body is serialized per request, then its images spliced in.
    ok, truth = run(
        server, tmp_path / "a", "--images", "3:64x40", "--image-reuse", "--image-format", "jpeg",
        "--dataset", "synthetic:16", "--max-tokens-dist", "uniform:2:6",
    )  # fmt: skip
    assert ok["max_tokens"].nunique() > 1
    sets = Counter(tuple(im["pixels"] for im in t["images"]) for t in truth.values())
    assert len(sets) == 1 and len(next(iter(sets))) == 3 and len(set(next(iter(sets)))) == 3, sets
    assert all(im["format"] == "jpeg" and (im["width"], im["height"]) == (64, 40) for t in truth.values()
               for im in t["images"])  # fmt: skip
    assert (ok["images"] == 3).all()

    # Conversations: every turn's request carries its images on its last user message; the history stays text.
    ok, truth = run(server, tmp_path / "b", "--images", "1:32x32", "--turns", "3", "--think-time", "0")
    assert set(ok["turn"]) == {1, 2, 3}
    assert all(len(t["images"]) == 1 and t["images"][0]["width"] == 32 for t in truth.values())
    later = [t for r, t in truth.items() if ok.set_index("request_id").loc[r, "turn"] > 1]
    assert later and all(t["messages"] > 1 for t in later)


def test_a_trace_replays_rows_carry_their_images(fake_server, tmp_path):
    server = fake_server(*TEXT_FAST)
    trace = tmp_path / "trace.jsonl"
    rows = [{"timestamp": 1000 + 40 * i, "input_length": 24, "output_length": 4, "hash_ids": [i]} for i in range(20)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = locust(
        "--host", server.url, "--endpoint", "chat", "--trace", str(trace), "--trace-block-tokens", "16",
        "--step-warmup", "0s", "--images", "1:48x48", "--no-report", "--run-dir", str(tmp_path / "r"), timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    ok = pd.read_parquet(tmp_path / "r" / "requests.parquet").query("status == 'ok'")
    assert len(ok) == len(rows) and (ok["images"] == 1).all()
    truth = server.get("/truth")
    assert all([(im["width"], im["height"]) for im in truth[r]["images"]] == [(48, 48)] for r in ok["request_id"])
    assert len({truth[r]["images"][0]["pixels"] for r in ok["request_id"]}) == len(rows)


def test_images_on_the_completions_endpoint_stop_the_run_with_one_line_exit_3_and_nothing_sent(fake_server, tmp_path):
    server = fake_server()
    proc = locust("--host", server.url, "--steps", "1", "--images", "2:512x512", "--run-dir", str(tmp_path / "r"))
    assert proc.returncode == 3, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--images only applies to --endpoint chat" in errors[0], proc.stderr[-2000:]
    assert server.get("/stats")["requests"] == 0
