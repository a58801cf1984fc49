"""The end of a run is computed once (analysis/finish.py): the live run and `python -m analysis report` on a copy of
its run directory print the same tables and verdicts, and write the same files."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys

import pandas as pd
import pytest
from vllm_loadtest.analysis.finish import compute_so_far, finish_run
from vllm_loadtest.analysis.run import error_limit, parse_rate

from tests.conftest import ROOT
from tests.helpers.runs import short_run

SECTIONS = ("Diagnosis", "Integrity check", "SLO gate", "Efficiency ceiling")


def end_of_run(stdout: str, run_dir) -> str:
    """The end-of-run text of a console output, from the batching curve to the Report line, the run directory's
    path replaced by RUN_DIR (Locust's own stats table follows it in a live run)."""
    start = stdout.index("Batching curve")
    end = stdout.index("\n", stdout.index("\nReport: ", start) + 1)
    return stdout[start:end].replace(str(run_dir), "RUN_DIR")


def section(text: str, title: str) -> list[str]:
    """The '- ' lines under a 'Title:' line."""
    match = re.search(rf"^{re.escape(title)}:\n((?:- .*\n?)*)", text, flags=re.M)
    assert match, f"no {title} section in:\n{text}"
    return match.group(1).splitlines()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """One short headless run with --slo (one objective met, one broken) and a ceiling, finished live; then a copy
    of its run directory finished again by `python -m analysis report`."""
    from tests.conftest import FakeServer

    tmp = tmp_path_factory.mktemp("finish")
    server = FakeServer(["--ttft-ms", "20", "--itl-ms", "2", "--faults", "http_500=7"])
    try:
        live = short_run(
            server.url, tmp / "run", "--slo", "ttft_p95=2s,ttft_p50=5ms", "--max-error-rate", "50%",
            "--memory-bandwidth-gbs", "1000", "--model-bytes", "1GB",
        )  # fmt: skip
    finally:
        server.stop()
    copy = tmp / "elsewhere" / "copy"
    shutil.copytree(tmp / "run", copy)
    for name in ("steps.csv", "summary.json", "summary.md", "report.html"):
        (copy / name).unlink()  # written again from the raw files
    report = subprocess.run(
        [sys.executable, "-m", "analysis", "report", str(copy)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    return live, tmp / "run", report, copy


@pytest.mark.contract
def test_report_on_a_copy_prints_what_the_live_run_printed(finished_run):
    live, run_dir, report, copy = finished_run
    # A broken --slo fails a headless run; `python -m analysis report` rebuilds the outputs and exits 0 as before.
    assert live.returncode == 1, live.stdout[-3000:] + live.stderr[-3000:]
    assert report.returncode == 0, report.stderr[-3000:]
    live_text, report_text = end_of_run(live.stdout, run_dir), end_of_run(report.stdout, copy)
    for title in SECTIONS:
        assert section(live_text, title) == section(report_text, title), title
    tables = live_text.split("\nDiagnosis:")[0]
    assert "Server (vLLM /metrics" in tables and "Load generator (self-checks" in tables
    assert tables == report_text.split("\nDiagnosis:")[0]
    assert live_text == report_text  # and the Errors, Results and Report lines, paths aside
    assert "SLO gate FAILED" in live_text and "ttft_p50 <= 5.0 ms" in live_text
    assert re.search(r"^Errors: \d+ of \d+ requests \(.*\), within --max-error-rate 50\.00%$", live_text, re.M)
    assert any("MISMATCH" not in line for line in section(live_text, "Integrity check"))


@pytest.mark.contract
def test_the_files_of_both_ends_agree(finished_run):
    _, run_dir, _, copy = finished_run
    pd.testing.assert_frame_equal(pd.read_csv(copy / "steps.csv"), pd.read_csv(run_dir / "steps.csv"))
    assert (copy / "summary.md").read_text() == (run_dir / "summary.md").read_text()
    live, rebuilt = (json.loads((d / "summary.json").read_text()) for d in (run_dir, copy))
    assert live.pop("run_dir") != rebuilt.pop("run_dir") and live == rebuilt
    assert live["slo"]["passed"] is False and live["ceiling"]["decode_ceiling_tok_s"] == pytest.approx(1000.0)
    assert live["errors"]["http_500"] > 0


@pytest.mark.contract
def test_one_outcome_feeds_the_console_the_files_and_the_report(finished_run, tmp_path):
    _, run_dir, _, _ = finished_run
    again = tmp_path / "again"
    shutil.copytree(run_dir, again)
    (again / "report.html").unlink()
    printed: list[str] = []
    outcome = finish_run(again, report=False, echo=printed.append)  # --no-report
    assert "\n".join(printed) == outcome.console and "Report:" not in outcome.console
    assert not (again / "report.html").exists() and set(outcome.files) == {"steps.csv", "summary.md", "summary.json"}
    summary = json.loads((again / "summary.json").read_text())
    assert summary["slo"] == outcome.slo and summary["integrity"] == outcome.integrity
    assert summary["diagnosis"] == outcome.diagnosis.to_dict() and summary["ceiling"] == outcome.ceiling
    assert outcome.slo_failed and not outcome.errors_over_limit
    failed, total = outcome.errors["failed"], outcome.errors["requests"]
    assert f"Errors: {failed} of {total} requests" in outcome.console and 0 < failed < total
    # The report shows the outcome's verdicts, not its own: change one and the page follows.
    from vllm_loadtest.analysis.report import build_report

    outcome.slo["text"] = ["SLO gate FAILED (as the outcome says).", *outcome.slo["text"][1:]]
    outcome.diagnosis_lines = ["A diagnosis line only the outcome holds."]
    outcome.integrity["text"] = ["An integrity line only the outcome holds."]
    page = build_report(outcome)
    assert "as the outcome says" in page and "only the outcome holds" in page and "An integrity line" in page


@pytest.mark.contract
def test_the_snapshot_writes_nothing_into_the_run_directory(finished_run, tmp_path):
    _, run_dir, _, _ = finished_run
    snap = tmp_path / "snap"
    shutil.copytree(run_dir, snap)
    for name in ("requests.parquet", "metrics.parquet", "generator.parquet", "steps.csv", "summary.json"):
        (snap / name).unlink()
    before = sorted(p.relative_to(snap) for p in snap.rglob("*"))
    outcome = compute_so_far(snap)
    assert sorted(p.relative_to(snap) for p in snap.rglob("*")) == before
    as_csv = pd.read_csv(io.StringIO(outcome.table.to_csv(index=False)))
    pd.testing.assert_frame_equal(as_csv, pd.read_csv(run_dir / "steps.csv"))
    assert outcome.slo["text"] == json.loads((run_dir / "summary.json").read_text())["slo"]["text"]


@pytest.mark.unit
def test_the_error_limit():
    records = pd.DataFrame(
        {"status": ["ok", "ok", "error", "error"], "error_type": [None, None, "http_500", "cut_off"]}
    )
    assert error_limit(records, "0")["over_limit"] and error_limit(records, None)["over_limit"]
    within = error_limit(records, "50%")
    assert (within["failed"], within["requests"], within["over_limit"]) == (1, 3, False)
    assert within["text"] == "Errors: 1 of 3 requests (33.33%), within --max-error-rate 50.00%"
    assert error_limit(records.iloc[:0], "0")["rate"] == 0.0
    assert parse_rate("1%", "--max-error-rate") == pytest.approx(0.01)
    with pytest.raises(ValueError, match="--max-error-rate"):
        parse_rate("2", "--max-error-rate")
