"""report.html: one self-contained file (plotly's JavaScript inlined) rebuilt from a run directory's files.

Every piece of text that comes from the server or the run (model names, error messages, options) is escaped. The
page is put together in page.py from the sections' modules: charts.py (per-step charts), timeline.py (over the
run), verdicts.py (ceiling, SLO, capacity, load generator) and distributions.py (CDFs, arrivals, workload, turns).
"""

from __future__ import annotations

from ..run import REPORT_FILE, SUMMARY_FILE
from .charts import (
    CDF_RANKS,
    CDF_TAIL_RANKS,
    TTFT_TTFO,
    batching_curve,
    latency_figure,
    reasoning_html,
)
from .distributions import arrivals_figure, arrivals_html, cdf_points
from .page import build_report, table_html
from .timeline import gpu_html
from .verdicts import capacity_figure, capacity_html

__all__ = [
    "CDF_RANKS", "CDF_TAIL_RANKS", "REPORT_FILE", "SUMMARY_FILE", "TTFT_TTFO", "arrivals_figure", "arrivals_html",
    "batching_curve", "build_report", "capacity_figure", "capacity_html", "cdf_points", "gpu_html",
    "latency_figure", "reasoning_html", "table_html",
]  # fmt: skip
