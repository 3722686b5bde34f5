"""`zeps analyze`: per-key counts, times, rates and sizes, gap audit and publish-to-journal timing (spark extra)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.cli.export import add_source_arguments, source_options
from gateway.cli.options import positive

if TYPE_CHECKING:
    from pyspark.sql import SparkSession  # imported lazily: Spark is optional


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "analyze",
        help="report per key (count, first/last time, mean and peak rate, sizes) and a gap audit, with Spark",
        description="A Spark job over the journal (one task per segment). Prints, for the stream and per key: "
        "records, first and last publish time, mean rate and peak rate (most records in one second), body "
        "sizes (min/p50/p90/p99/max); for the stream also sequence continuity (every gap) and "
        "publish-to-journal time (batch journal time minus record publish time). Needs the spark extra.",
    )
    add_source_arguments(p)
    p.add_argument("--top", type=positive, default=20, help="keys in the table, most records first (default 20)")
    p.add_argument("--plot", type=Path, help="draw records/s over time for the top keys into this PNG")
    p.add_argument("--plot-keys", type=positive, default=5, help="keys in the plot (default 5)")
    p.add_argument("--json", action="store_true", help="print the whole report as one JSON object")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from gateway.spark import run_command

    options = source_options(args)

    def job(spark: SparkSession) -> int:
        from gateway.spark.analyze import analyze, plot_rates, summary
        from gateway.spark.export import read_journal
        from gateway.spark.progress import Progress

        df = read_journal(spark, str(args.journal), args.stream, {**options, "journalTime": "true"})
        with Progress(spark, f"analyze {args.stream}"), summary(df) as slim:
            try:
                report = analyze(slim, args.stream)
            except ValueError as exc:
                print(f"zeps analyze: {exc}", file=sys.stderr)
                return 2
            if args.plot:
                plot_rates(slim, report, args.plot, top=args.plot_keys)
        print(json.dumps(dataclasses.asdict(report)) if args.json else report.describe(args.top))
        if args.plot:
            print(f"plot: {args.plot}", file=sys.stderr)
        return 0

    return run_command("zeps analyze", args, job)
