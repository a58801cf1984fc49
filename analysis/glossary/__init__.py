"""The one glossary: every metric the suite reports, every column it writes, their units and their formulas.

`GLOSSARY` defines the metrics (docs/reference/metrics.md's first table). `COLUMNS` declares every column of
`steps.csv` and of `requests.parquet` once: its unit, formula, meaning, console header, format and section. The step
table's column lists (`analysis.steps.STEP_COLUMNS`, `analysis.server_metrics.SERVER_COLUMNS`, `analysis.generator.
GENERATOR_COLUMNS`, `analysis.schedule.OPEN_LOOP_COLUMNS`), the console tables, the web UI's LLM tab, the
report's per-step table and docs/reference/metrics.md are derived from it, so they cannot disagree. The core step
columns also carry the function that computes them. Pure functions (no network, no Locust); times are seconds unless a
name says otherwise.
"""

from __future__ import annotations

from .columns import (  # noqa: F401
    EMBEDDINGS,
    FORMAT_WORDS,
    GENERATOR,
    GPU,
    LIVE,
    OPEN_LOOP,
    REASONING,
    REQUESTS,
    RERANK,
    SERVER,
    SERVER_BOUNDS,
    STEP,
    STEP_END,
    TURNS,
    UNCERTAINTY,
    Column,
    StepData,
    format_value,
)
from .console import (  # noqa: F401
    SECTIONS,
    Section,
    aligned,
    console_rows,
    console_table,
)
from .docs import (  # noqa: F401
    DOCS_COMMAND,
    DOCS_FILE,
    docs_markdown,
)
from .energy import ENERGY  # noqa: F401
from .formulas import (  # noqa: F401
    aggregate_tok_s,
    answer_tokens,
    answer_tpot_s,
    e2e_s,
    flagged,
    intended_s,
    itl_samples_s,
    mean,
    numeric_column,
    per_request_tok_s,
    percentile,
    percentile_never,
    reasoning_share,
    reasoning_time_s,
    schedule_lag_s,
    tokens_per_chunk,
    tpot_s,
    ttfo_values,
    ttft_s,
)
from .metrics import (  # noqa: F401
    GLOSSARY,
    Metric,
    markdown_table,
)
from .models import LORA, MODELS  # noqa: F401
from .registry import (  # noqa: F401
    COLUMNS,
    STEP_TABLE,
    WEB_UI,
    applies,
    columns,
    names,
    step_values,
    web_columns,
)
from .spec_decode import SPEC  # noqa: F401
from .trials import TRIAL_COLUMNS, TRIAL_METRICS, TRIALS  # noqa: F401
