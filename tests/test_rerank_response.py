"""A rerank answer's contract (analysis/rerank_response.py): one result per document or per top_n, each index a
document of the request once, each score a finite number; usage's prompt tokens kept (total_tokens from a server
without prompt_tokens), missing when the body has no usage."""

from __future__ import annotations

import json

import pytest
from vllm_loadtest.analysis.rerank_response import expected_results, parse_rerank

pytestmark = pytest.mark.unit


def body(indices, scores=None, usage=None, **extra) -> bytes:
    scores = scores if scores is not None else [1.0 - 0.1 * i for i in range(len(indices))]
    results = [{"index": i, "document": {"text": f"d{i}"}, "relevance_score": s} for i, s in zip(indices, scores)]
    answer = {"id": "rerank-1", "model": "m", "results": results, **extra}
    if usage is not None:
        answer["usage"] = usage
    return json.dumps(answer).encode()


def test_a_full_answer_keeps_the_contract_and_its_prompt_tokens():
    answer = parse_rerank(body([2, 0, 1], usage={"prompt_tokens": 30, "total_tokens": 30}), 3)
    assert answer.error is None and answer.results == 3 and answer.prompt_tokens == 30


def test_top_n_asks_fewer_results_and_zero_or_more_asks_all():
    assert expected_results(8, 2) == 2 and expected_results(8, 0) == 8 and expected_results(3, 5) == 3
    assert parse_rerank(body([4, 1]), 8, top_n=2).error is None
    assert parse_rerank(body([0, 1, 2]), 3, top_n=5).error is None


def test_total_tokens_stand_in_for_a_server_without_prompt_tokens_and_no_usage_is_missing():
    assert parse_rerank(body([0], usage={"total_tokens": 7}), 1).prompt_tokens == 7
    answer = parse_rerank(body([0]), 1)
    assert answer.error is None and answer.prompt_tokens is None  # missing, never 0


@pytest.mark.parametrize(
    ("raw", "documents", "top_n", "error"),
    [
        (body([0, 1]), 3, 0, "2 result(s) for 3 document(s)"),
        (body([0, 1, 2]), 8, 2, "3 result(s) for 8 document(s) (top_n 2)"),
        (body([0, 3]), 2, 0, "results[1].index 3 is not one of 0..1 once"),
        (body([1, 1]), 2, 0, "results[1].index 1 is not one of 0..1 once"),
        (body([0, True]), 2, 0, "results[1].index True is not one of 0..1 once"),
        (body([0, 1], scores=[0.5, "high"]), 2, 0, "results[1].relevance_score 'high' is not a finite number"),
        (body([0, 1], scores=[0.5, None]), 2, 0, "results[1].relevance_score None is not a finite number"),
        (b'{"id": "x", "data": []}', 2, 0, "the body has no results list"),
        (b'{"error": {"message": "model does not score"}}', 2, 0, "an error with HTTP 200: model does not score"),
        (b"[1, 2]", 2, 0, "the body is a JSON list, not an object"),
    ],
)
def test_a_body_that_breaks_the_contract_says_which_rule(raw, documents, top_n, error):
    assert parse_rerank(raw, documents, top_n).error == error


def test_a_body_that_is_not_json_quotes_its_start():
    error = parse_rerank(b"<html><body>502 Bad Gateway</body></html>", 2).error
    assert error.startswith("the body is not JSON") and "'<html><body>502 Bad Gateway" in error
