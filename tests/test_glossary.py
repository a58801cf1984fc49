import math

import pytest
from vllm_loadtest.analysis import glossary as g

pytestmark = pytest.mark.unit


def test_ttft_e2e_from_token_offsets():
    assert g.ttft_s([0.05, 0.06, 0.08]) == 0.05
    assert g.e2e_s([0.05, 0.06, 0.08]) == 0.08
    assert g.ttft_s([]) is None and g.e2e_s([]) is None


def test_tpot_divides_by_tokens_minus_one():
    assert g.tpot_s(e2e=0.05 + 255 * 0.01, ttft=0.05, output_tokens=256) == pytest.approx(0.01)


@pytest.mark.parametrize("tokens", [None, 0, 1])
def test_tpot_is_none_for_one_token_or_less(tokens):
    assert g.tpot_s(0.5, 0.5, tokens) is None


def test_itl_splits_multi_token_chunks():
    # gaps: 10 ms (1 token), 30 ms (3 tokens), 0 ms (0 tokens: skipped)
    samples = g.itl_samples_s([0.05, 0.06, 0.09, 0.09], [1, 1, 3, 0])
    assert samples == pytest.approx([0.01, 0.01, 0.01, 0.01])
    assert g.itl_samples_s([0.05], [1]) == []


def test_itl_first_chunk_tokens_are_not_samples():
    assert g.itl_samples_s([0.05, 0.07], [2, 2]) == pytest.approx([0.01, 0.01])


def test_per_request_and_aggregate_throughput():
    assert g.per_request_tok_s(100, 2.0) == 50.0
    assert g.per_request_tok_s(None, 2.0) is None and g.per_request_tok_s(10, 0) is None
    assert g.aggregate_tok_s(1000, 4.0) == 250.0
    assert g.aggregate_tok_s(0, 4.0) == 0.0
    assert g.aggregate_tok_s(10, 0.0) is None and g.aggregate_tok_s(10, math.nan) is None


def test_every_formula_states_its_formula_in_one_docstring_line():
    for fn in (g.ttft_s, g.e2e_s, g.tpot_s, g.itl_samples_s, g.per_request_tok_s, g.aggregate_tok_s):
        assert fn.__doc__ and "=" in fn.__doc__.splitlines()[0], fn


def test_docs_define_every_glossary_metric_with_the_same_words():
    """docs/reference/metrics.md is the glossary's page (generated from it); the README sends readers there."""
    from tests.helpers.paths import ROOT

    page = ROOT.joinpath("docs", "reference", "metrics.md").read_text(encoding="utf-8")
    for metric in g.GLOSSARY.values():
        assert f"`{metric.name}`" in page, metric.name
        assert metric.definition in page, f"docs/reference/metrics.md's {metric.name} differs from the glossary"
    assert g.markdown_table() in page, f"regenerate docs/reference/metrics.md with `{g.DOCS_COMMAND}`"
    assert "docs/reference/metrics.md" in ROOT.joinpath("README.md").read_text(encoding="utf-8")


def test_a_section_applies_when_a_column_declared_to_show_it_has_a_value():
    import pandas as pd

    marked = sorted({c.section for c in g.COLUMNS.values() if c.shows is not None})
    assert marked == sorted([g.SERVER, g.GENERATOR, g.REASONING, g.GPU, g.ENERGY, g.LORA, g.SPEC, g.TRIALS])
    for section in marked:
        empty = pd.DataFrame({c.name: [math.nan, math.nan] for c in g.columns(section)})
        assert not g.applies(empty, section), section
        assert not g.applies(pd.DataFrame({"step": [0]}), section), section  # a steps.csv from before it existed
        for c in (c for c in g.columns(section) if c.shows is not None):
            value = "memory_bound" if c.unit == "text" else 3
            assert g.applies(empty.assign(**{c.name: [math.nan, value]}), section), c.name
            if c.shows == "positive":  # a count of 0 (nothing reasoned, no GPU) does not show it
                assert not g.applies(empty.assign(**{c.name: [0, 0]}), section), c.name
    assert g.applies(pd.DataFrame({"step": [0]}), g.STEP)  # declares none: always


def test_a_column_refuses_an_unknown_applicability():
    with pytest.raises(ValueError, match="shows must be one of"):
        g.Column("x", g.STEP, "s", "x", shows="sometimes")


def test_the_reports_optional_parts_are_sections_that_declare_where_they_apply():
    from vllm_loadtest.analysis.report.page import OPTIONAL_PARTS

    for section, _ in OPTIONAL_PARTS:
        assert any(c.shows for c in g.columns(section)), section
