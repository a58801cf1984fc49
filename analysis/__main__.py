"""Rebuild a run's outputs from the files in its run directory.

python -m analysis steps RUN_DIR                         # requests.parquet, metrics.parquet, steps.csv
python -m analysis report RUN_DIR [--compare RUN_DIR ...]  # the end of the run again (analysis.finish): the
                                                           # console text of the live run, steps.csv,
                                                           # summary.json, summary.md, report.html
                                                           # (--compare: a Comparison per other run)
python -m analysis glossary                                # the metric glossary as a Markdown table
python -m analysis glossary --docs [--write docs/reference/metrics.md]  # every column's page (stdout, or written there)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .diskio import WriteFailure
from .records import RECORDS_DIR
from .run import STEPS_FILE, finalize
from .steps import format_table


def snapshot(run_dir: Path, report: Path | None, records: Path | None) -> int:
    """Nothing is written into the run directory: the run is still writing there."""
    if records is not None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from .records import SCHEMA, merge_records

        df = merge_records(run_dir, write=False)
        pq.write_table(pa.Table.from_pandas(df, schema=SCHEMA, preserve_index=False), records)
    if report is not None:
        from .finish import report_so_far

        report.write_text(report_so_far(run_dir), encoding="utf-8")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis")
    sub = parser.add_subparsers(dest="command", required=True)
    steps = sub.add_parser("steps", help="merge the raw records and print/write the per-step table")
    steps.add_argument("run_dir", type=Path)
    report = sub.add_parser(
        "report", help="finish the run again: the tables and verdicts, summary.json, summary.md and report.html"
    )
    report.add_argument("run_dir", type=Path)
    report.add_argument(
        "--compare",
        type=Path,
        nargs="*",
        default=[],
        help="other run directories to overlay and compare step by step (differences against their noise)",
    )
    gloss = sub.add_parser("glossary", help="print the metric glossary as a Markdown table")
    gloss.add_argument(
        "--docs", action="store_true", help="print docs/reference/metrics.md instead: every column of every table"
    )
    gloss.add_argument(
        "--write", type=Path, metavar="PATH", help="write docs/reference/metrics.md's text to PATH (implies --docs)"
    )
    snap = sub.add_parser("snapshot", help="the report and/or the records of a run in progress, written elsewhere")
    snap.add_argument("run_dir", type=Path)
    snap.add_argument("--report", type=Path, help="write report.html of the run so far here")
    snap.add_argument("--records", type=Path, help="write requests.parquet of the run so far here")
    args = parser.parse_args(argv)
    if args.command == "snapshot":
        return snapshot(args.run_dir, args.report, args.records)
    if args.command == "glossary":
        from .glossary import docs_markdown, markdown_table

        if args.write is not None:
            args.write.parent.mkdir(parents=True, exist_ok=True)
            args.write.write_text(docs_markdown(), encoding="utf-8")
            print(f"wrote {args.write}")
        elif args.docs:
            print(docs_markdown(), end="")
        else:
            print(markdown_table())
        return 0

    if not (args.run_dir / RECORDS_DIR).is_dir():
        print(
            f"error: {args.run_dir} has no {RECORDS_DIR}/ folder; pass a run directory written by a run "
            "(for example reports/<timestamp>)",
            file=sys.stderr,
        )
        return 2
    for other in getattr(args, "compare", []):
        if not (other / STEPS_FILE).exists():
            print(f"error: {other} has no {STEPS_FILE}; run `python -m analysis steps {other}` first", file=sys.stderr)
            return 2
    try:
        if args.command == "report":
            from .finish import finish_run

            # The exit code stays 0 whatever the verdicts: this rebuilds the outputs, it is no gate.
            finish_run(args.run_dir, compare=args.compare, echo=lambda text: print(text, flush=True))
            return 0
        table = finalize(args.run_dir)
    except WriteFailure as e:  # a full disk: the raw files are untouched, the command can be run again
        print(
            f"error: {e}: the raw files are kept; make room there (or copy {args.run_dir} to another disk), then run "
            "this again",
            file=sys.stderr,
        )
        return 2
    print(format_table(table))
    print(f"\nwrote {args.run_dir / 'requests.parquet'} and {args.run_dir / STEPS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
