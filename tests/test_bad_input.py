"""Bad input: one clear line naming the problem and the fix, exit code 3, and no request sent.

Each case is found in this process, by the checks a headless run makes before any load and in their order
(tests/helpers/badinput.py): the parser, options.check(), the run directory, preflight against a running fake
server. A few real runs check what a user sees: that one `error:` line on stderr, exit code 3, nothing sent."""

import pytest

from tests.helpers.badinput import first_error
from tests.helpers.runs import locust
from tests.helpers.servers import FakeServer

QUICK = ["--steps", "1", "--step-duration", "2s", "--step-warmup", "0s", "--max-tokens", "4"]


@pytest.fixture(scope="module")
def server():
    """One fake server for the module's in-process cases: none of them may send it a request."""
    server = FakeServer(["--model", "served-model"])
    yield server
    server.stop()


def one_error_line(proc) -> str:
    assert proc.returncode == 3, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "INFO" not in line]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-2000:]
    return errors[0]


@pytest.mark.contract
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--endpoint", "classify"], "--endpoint"),  # argparse's choices, through the parser's one-line error()
        (["--max-tokens", "0"], "--max-tokens 0 must be at least 1"),  # options.check()
        (["--model", "nope"], "--model 'nope' is not served by"),  # preflight's question to the server
    ],
    ids=["parser", "check", "preflight"],
)
def test_a_run_with_bad_input_stops_with_one_line_exit_3_and_nothing_sent(fake_server, tmp_path, args, expected):
    server = fake_server("--model", "served-model")
    line = one_error_line(locust("--host", server.url, *QUICK, *args, "--run-dir", str(tmp_path / "r")))
    assert expected in line
    assert server.get("/stats")["requests"] == 0


@pytest.mark.contract
def test_a_prompt_file_is_used_in_turn(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "2", "--itl-ms", "1")
    path = tmp_path / "prompts.json"
    path.write_text('["first prompt", "second prompt"]')
    # A 5 s step, not QUICK's 2 s: the run must complete requests (one that completes none exits 1), and a 2 s step
    # completed none when Locust started slowly on a busy machine.
    steps = ["--steps", "1", "--step-duration", "5s", "--step-warmup", "0s", "--max-tokens", "4"]
    proc = locust("--host", server.url, *steps, "--prompt-file", str(path), "--run-dir", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.unit
def test_unknown_model(server, tmp_path):
    line = first_error("--host", server.url, *QUICK, "--model", "nope", "--run-dir", str(tmp_path / "r"))
    assert "--model 'nope' is not served by" in line and "served-model" in line
    assert server.get("/stats")["requests"] == 0


@pytest.mark.unit
def test_unknown_endpoint_option(server):
    line = first_error("--host", server.url, *QUICK, "--endpoint", "classify")
    assert "--endpoint" in line and "classify" in line
    assert server.get("/stats")["requests"] == 0


@pytest.mark.unit
def test_rejected_api_key(fake_server, tmp_path, monkeypatch, capsys, caplog):
    server = fake_server("--api-key", "right")
    monkeypatch.setenv("OPENAI_API_KEY", "wrong")
    line = first_error("--host", server.url, *QUICK, "--run-dir", str(tmp_path / "r"))
    captured = capsys.readouterr()
    assert "refused the API key" in line and "wrong" not in line + captured.out + captured.err + caplog.text
    assert server.get("/stats")["requests"] == 0


@pytest.mark.unit
@pytest.mark.parametrize(
    ("content", "expected"),
    [('["ok", ', "is not JSON"), ('{"prompt": "x"}', "must be a non-empty JSON list"), (None, "No such file")],
)
def test_a_prompt_file_that_does_not_parse(server, tmp_path, content, expected):
    path = tmp_path / "prompts.json"
    if content is not None:
        path.write_text(content)
    line = first_error("--host", server.url, *QUICK, "--prompt-file", str(path))
    assert "--prompt-file" in line and expected in line
    assert server.get("/stats")["requests"] == 0


@pytest.mark.unit
def test_an_unwritable_run_directory(server, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    line = first_error("--host", server.url, *QUICK, "--run-dir", str(blocker / "run"))
    assert "cannot create run directory" in line and "--run-dir" in line
    assert server.get("/stats")["requests"] == 0


@pytest.mark.unit
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--steps", "0"], "--steps"),
        (["--step-duration", "soon"], "--step-duration"),
        (["--step-warmup", "40s", "--step-duration", "30s"], "--step-warmup"),
        (["--max-tokens", "0"], "--max-tokens"),
        (["--max-tokens", "many"], "--max-tokens"),
        (["--read-timeout", "-1"], "--read-timeout"),
        (["--dataset", "lorem"], "--dataset"),
        (["--dataset", "synthetic:0"], "--dataset synthetic:0"),
        (["--dataset", "synthetic:1"], "--dataset synthetic:1"),  # shorter than any word: found by preflight
        (["--max-tokens-dist", "uniform:9:1"], "--max-tokens-dist"),
        (["--num-prompts", "0"], "--num-prompts"),
        (["--rates", "0"], "--rates"),
        (["--rates", "1,fast"], "--rates"),
        (["--rates", "1,2", "--steps", "4"], "are alternatives"),
        (["--rates", "1", "--max-users", "0"], "--max-users"),
        (["--rates", "1", "--arrival", "bursty"], "--arrival"),
        (["--max-error-rate", "lots"], "--max-error-rate"),
        (["--max-error-rate", "150%"], "--max-error-rate"),
        (["--max-error-rate", "-1"], "--max-error-rate"),
        (["--slo", "ttft=1s"], "no objective 'ttft'"),
    ],
)
def test_invalid_values(server, tmp_path, args, expected):
    line = first_error("--host", server.url, *args, "--run-dir", str(tmp_path / "r"))
    assert expected in line
    assert server.get("/stats")["requests"] == 0


@pytest.mark.unit
@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("[{", "is not JSON"),
        ('[{"conversations": [{"from": "gpt", "value": "x"}]}]', "no conversation"),
        (None, "No such file"),
    ],
)
def test_a_sharegpt_file_that_does_not_parse(server, tmp_path, content, expected):
    path = tmp_path / "sharegpt.json"
    if content is not None:
        path.write_text(content)
    line = first_error("--host", server.url, *QUICK, "--dataset", f"sharegpt:{path}")
    assert f"--dataset sharegpt:{path}" in line and expected in line
    assert server.get("/stats")["requests"] == 0
