"""The report shows the intervals and the suspect steps: error bars on the batching curve from the _ci_low/_ci_high
columns (none for a run written before them), open markers and highlighted rows for outlier and unstable steps."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest
from vllm_loadtest.analysis.report import batching_curve, table_html

pytestmark = pytest.mark.unit


def table() -> pd.DataFrame:
    return pd.DataFrame(
        {"step": [0, 1, 2], "users": [1, 2, 4], "aggregate_tok_s": [100.0, 90.0, 400.0],
         "aggregate_tok_s_ci_low": [95.0, 80.0, math.nan], "aggregate_tok_s_ci_high": [106.0, 95.0, math.nan],
         "per_request_tok_s_mean": [100.0, 45.0, 100.0], "per_request_tok_s_mean_ci_low": [99.0, 44.0, 98.0],
         "per_request_tok_s_mean_ci_high": [101.0, 46.0, 102.0], "outlier": [None, True, None],
         "stable": [True, True, False]}
    )  # fmt: skip


def test_the_batching_curve_draws_each_steps_interval_as_an_error_bar():
    fig = batching_curve({"run": table()})
    agg, per = fig.data[0], fig.data[1]
    assert list(agg.error_y.array[:2]) == [6.0, 5.0] and list(agg.error_y.arrayminus[:2]) == [5.0, 10.0]
    assert math.isnan(agg.error_y.array[2])  # no interval: no bar (null in the page), never a zero-width one
    assert list(per.error_y.array) == [1.0, 1.0, 2.0]
    assert list(agg.marker.symbol) == ["circle", "circle-open", "circle-open"]  # the outlier and the unstable step
    old = batching_curve({"old": table().drop(columns=[c for c in table().columns if "_ci_" in c or c in
                                                        ("outlier", "stable")])})  # fmt: skip
    assert old.data[0].error_y.array is None and list(old.data[0].marker.symbol) == ["circle"] * 3


def test_the_step_table_highlights_outlier_and_unstable_steps():
    rows = re.findall(r"<tr[^>]*>.*?</tr>", table_html(table()))
    assert "class='flagged'" not in rows[1]
    assert "class='flagged' title='outlier'" in rows[2] and "<td>OUTLIER</td>" in rows[2]
    assert "class='flagged' title='unstable'" in rows[3] and "<td>UNSTABLE</td>" in rows[3]
