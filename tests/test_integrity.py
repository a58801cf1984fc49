"""The integrity check: client records against the server's counters (in a real run: tests/test_integrity_run.py)."""

import pandas as pd
import pytest
from vllm_loadtest.analysis.integrity import integrity
from vllm_loadtest.analysis.server_metrics import GENERATION_TOKENS, SUCCESS, merge_scrapes, scrape_line

pytestmark = pytest.mark.unit


def metrics(tmp_path, scrapes):
    with open(tmp_path / "metrics.jsonl", "wb") as f:
        for t, (stop, length, tokens) in scrapes:
            lab = {"model_name": "m"}
            f.write(
                scrape_line(
                    t,
                    [
                        (SUCCESS, {**lab, "finished_reason": "stop"}, stop),
                        (SUCCESS, {**lab, "finished_reason": "length"}, length),
                        (SUCCESS, {**lab, "finished_reason": "abort"}, 0.0),
                        (GENERATION_TOKENS, lab, tokens),
                    ],
                )
            )
    return merge_scrapes(tmp_path, write=False)


def records(ok_tokens, failed=0):
    n = len(ok_tokens) + failed
    return pd.DataFrame(
        {"status": ["ok"] * len(ok_tokens) + ["error"] * failed, "output_tokens": list(ok_tokens) + [3] * failed},
        index=range(n),
    )


def test_exact_agreement(tmp_path):
    m = metrics(tmp_path, [(0, (5, 10, 1000)), (1, (6, 11, 1030)), (2, (7, 12, 1050))])
    check = integrity(records([10, 10, 15, 15]), m)
    assert check["requests_match"] and check["tokens_match"] and not check["mismatch"]
    assert (check["server_finished"], check["server_generated_tokens"]) == (4, 50)


def test_extra_server_traffic_is_a_mismatch(tmp_path):
    m = metrics(tmp_path, [(0, (0, 0, 0)), (1, (1, 2, 90))])
    check = integrity(records([20, 30]), m)
    assert check["mismatch"] and check["text"][0].startswith("MISMATCH") and "+1" in check["text"][0]


def test_failed_streams_explain_a_token_difference(tmp_path):
    m = metrics(tmp_path, [(0, (0, 0, 0)), (1, (0, 2, 56))])
    check = integrity(records([20, 30], failed=2), m)
    assert check["requests_match"] and not check["tokens_match"] and not check["mismatch"]


def test_without_metrics_it_says_so():
    check = integrity(records([1]), None)
    assert not check["available"] and "not available" in check["text"][0]


def test_a_cut_off_stream_the_server_finished_is_not_a_mismatch(tmp_path):
    """A stream sent whole but unread when its user was stopped: the server counts it finished, the records cut off.
    The server's count may exceed the ok requests by at most the cut-off ones."""
    m = metrics(tmp_path, [(0, (0, 0, 0)), (1, (1, 2, 80))])
    cut = records([20, 30], failed=1).assign(error_type=[None, None, "cut_off"])
    check = integrity(cut, m)
    assert check["requests_within"] and not check["requests_match"] and not check["mismatch"]
    assert check["text"][0].startswith("Requests: the server finished 3 normally") and "1 of the 1" in check["text"][0]
    (tmp_path / "more").mkdir()
    more = metrics(tmp_path / "more", [(0, (0, 0, 0)), (1, (2, 2, 80))])  # one beyond the cut-off one: other traffic
    assert integrity(cut, more)["mismatch"]


def finishing(ok_tokens, ends):
    """ok records of `ok_tokens` output tokens that finished at `ends` (s, the scrapes' clock)."""
    return records(ok_tokens).assign(start_time=[e - 1.0 for e in ends], duration_s=1.0)


def test_requests_that_finished_after_the_last_scrape_are_not_a_mismatch(tmp_path):
    """The run's last scrape failed (a busy server past its timeout): the counters end at the scrape of t=10, and the
    request that finished at t=12 is not in them. Within settle_s of the scrape, one at t=8 may not be either."""
    m = metrics(tmp_path, [(0, (0, 0, 0)), (10, (1, 1, 20))])
    check = integrity(finishing([10, 10, 10], [5, 8, 12]), m)
    assert check["late"] == 1 and check["requests_within"] and not check["mismatch"], check["text"]
    assert check["text"][0] == (
        "Requests: the server finished 2 normally, the records hold 3 ok (-1): 1 of them finished after the run's "
        "last successful scrape of the server (or within a scrape's time of it), which its counters may not hold."
    )
    assert check["text"][1].startswith("Tokens: the server generated 20, the ok requests hold 30 (-10): the 1 ")
    assert integrity(finishing([10, 10, 10], [5, 8, 12]), m, settle_s=3.0)["late"] == 2


def test_late_requests_explain_no_more_than_themselves(tmp_path):
    m = metrics(tmp_path, [(0, (0, 0, 0)), (10, (1, 0, 10))])
    check = integrity(finishing([10, 10, 10], [5, 6, 12]), m)  # 3 ok, 1 late: the server must hold at least 2
    assert check["late"] == 1 and not check["requests_within"] and check["mismatch"]
    assert check["text"][0].startswith("MISMATCH: the server finished 1 requests normally, the records hold 3 ok")
    (tmp_path / "tokens").mkdir()
    fewer = metrics(tmp_path / "tokens", [(0, (0, 0, 0)), (10, (2, 0, 15))])  # 2 finished, but 5 tokens short
    assert integrity(finishing([10, 10, 10], [5, 6, 12]), fewer)["mismatch"]
