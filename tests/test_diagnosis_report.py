import json

import pandas as pd
import pytest
from vllm_loadtest.analysis.diagnosis import BATCH_SLOTS, COMPUTE, KV_CACHE, UNKNOWN, diagnose, gain_per_doubling


def table(tok_s, kv=None, waiting=None, preempt=None, users=(1, 2, 4, 8, 16)):
    n = len(users)
    return pd.DataFrame(
        {
            "step": range(n),
            "users": list(users),
            "aggregate_tok_s": tok_s,
            "kv_cache_usage_max": kv if kv is not None else [float("nan")] * n,
            "waiting_max": waiting if waiting is not None else [float("nan")] * n,
            "preemptions": preempt if preempt is not None else [float("nan")] * n,
        }
    )


@pytest.mark.unit
def test_gain_per_doubling():
    assert gain_per_doubling(100, 200, 1, 2) == pytest.approx(1.0)
    assert gain_per_doubling(100, 121, 4, 16) == pytest.approx(0.1)  # two doublings of 10 %


@pytest.mark.unit
def test_knee_and_kv_cache_binding():
    d = diagnose(
        table(
            [100, 200, 390, 700, 720], kv=[0.1, 0.2, 0.5, 1.0, 1.0], waiting=[0, 0, 0, 5, 40], preempt=[0, 0, 0, 3, 90]
        )
    )
    assert (d.knee_step, d.knee_users) == (3, 8)
    assert d.binding == {3: KV_CACHE, 4: KV_CACHE}
    assert "flattens at 8 users" in d.text[0]


@pytest.mark.unit
def test_compute_and_batch_slots_and_unknown():
    flat = [100, 200, 400, 420, 425]
    assert diagnose(table(flat, kv=[0.1] * 5, waiting=[0] * 5, preempt=[0] * 5)).binding[3] == COMPUTE
    assert diagnose(table(flat, kv=[0.3] * 5, waiting=[0, 0, 0, 4, 12], preempt=[0] * 5)).binding[4] == BATCH_SLOTS
    assert diagnose(table(flat)).binding[3] == UNKNOWN


@pytest.mark.unit
def test_no_knee():
    d = diagnose(table([100, 200, 400, 800, 1600]))
    assert d.knee_step is None and d.binding == {} and "No knee" in d.text[0]


@pytest.mark.contract
def test_report_is_self_contained_and_escapes_server_text(fake_server, tmp_path):
    from vllm_loadtest.analysis.report import REPORT_FILE, SUMMARY_FILE

    from tests.helpers.runs import short_run

    server = fake_server(
        "--ttft-ms", "5", "--itl-ms", "1", "--model", "<script>alert(1)</script>", "--faults", "http_500=5"
    )
    proc = short_run(server.url, tmp_path / "r")
    assert proc.returncode == 1, proc.stderr[-2000:]  # the injected 500s are failures
    page = (tmp_path / "r" / REPORT_FILE).read_text()
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "Plotly.newPlot" in page and "cdn.plot.ly" not in page.split("</script>")[0][:200]
    summary = json.loads((tmp_path / "r" / SUMMARY_FILE).read_text())
    assert summary["errors"]["http_500"] > 0 and summary["ok"] > 0
    assert [s["users"] for s in summary["steps"]] == [1, 2]


@pytest.mark.contract
def test_report_regenerates_from_a_copied_run_dir_and_overlays_compared_runs(fake_server, tmp_path):
    """`python -m analysis report` on a copy rebuilds the same tables; --compare overlays another run's curves."""
    import shutil
    import subprocess
    import sys

    from vllm_loadtest.analysis.report import REPORT_FILE, SUMMARY_FILE

    from tests.helpers.paths import ROOT
    from tests.helpers.runs import locust

    server = fake_server("--ttft-ms", "5", "--itl-ms", "1")
    runs = {}
    for name, tokens in (("short", "8"), ("long", "32")):
        runs[name] = tmp_path / name
        args = ["--host", server.url, "--steps", "1,2", "--step-duration", "2s", "--step-warmup", "0s"]
        proc = locust(*args, "--max-tokens", tokens, "--run-dir", str(runs[name]))
        assert proc.returncode == 0, proc.stderr[-2000:]
    copy = tmp_path / "elsewhere" / "short-copy"
    shutil.copytree(runs["short"], copy)
    for generated in ("requests.parquet", "metrics.parquet", "steps.csv", SUMMARY_FILE, REPORT_FILE):
        (copy / generated).unlink()  # rebuilt from records/ and metrics.jsonl alone
    proc = subprocess.run(
        [sys.executable, "-m", "analysis", "report", str(copy), "--compare", str(runs["long"])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    pd.testing.assert_frame_equal(pd.read_csv(copy / "steps.csv"), pd.read_csv(runs["short"] / "steps.csv"))
    original = json.loads((runs["short"] / SUMMARY_FILE).read_text())
    rebuilt = json.loads((copy / SUMMARY_FILE).read_text())
    assert {k: v for k, v in rebuilt.items() if k != "run_dir"} == {k: v for k, v in original.items() if k != "run_dir"}
    page = (copy / REPORT_FILE).read_text()
    assert "short-copy aggregate tok\\u002fs" in page and "long aggregate tok\\u002fs" in page  # JSON-escaped
    assert page.count("Plotly.newPlot(") == (runs["short"] / REPORT_FILE).read_text().count("Plotly.newPlot(")


@pytest.mark.unit
def test_compare_with_a_directory_that_is_not_a_run_fails_in_one_line(tmp_path):
    import subprocess
    import sys

    from tests.helpers.paths import ROOT

    (tmp_path / "run" / "records").mkdir(parents=True)
    proc = subprocess.run(
        [sys.executable, "-m", "analysis", "report", str(tmp_path / "run"), "--compare", str(tmp_path / "nope")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "has no steps.csv" in proc.stderr
