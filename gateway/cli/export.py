"""`zeps export`: a stream's journaled records into Parquet, through Spark (needs the spark extra)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession  # imported lazily: Spark is optional


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "export",
        help="write a stream's journaled records to Parquet with Spark (spark extra)",
        description="Reads the journal directly (not through the replay sidecar), one Spark task per segment; "
        "--from/--until are resolved through the journal's index, so only the segments of the range are read. "
        "Columns: stream, seq, ts_ns (publish time), key, body. Shows progress on a terminal (-v: in the log).",
    )
    add_source_arguments(p)
    p.add_argument("--to", dest="out", required=True, help="output Parquet directory (a path Spark can write)")
    p.add_argument("--overwrite", action="store_true", help="replace the output if it exists")
    p.set_defaults(handler=_run)


def add_source_arguments(p: argparse.ArgumentParser) -> None:
    """The journal, stream, range and Spark options `zeps export` and `zeps analyze` share."""
    p.add_argument("--journal", type=Path, required=True, help="the gateway's journal root (one directory per stream)")
    p.add_argument("--stream", required=True)
    p.add_argument(
        "--from", dest="start", help="first sequence, or an ISO-8601 journal time (UTC unless it has a zone)"
    )
    p.add_argument("--until", help="last sequence, or an ISO-8601 journal time (inclusive)")
    p.add_argument("--master", help="Spark master URL (default: spark-submit's, else local[*])")


def source_options(args: argparse.Namespace) -> dict[str, str]:
    """--from/--until as options of the zeps data source. ValueError (exit 2) for a malformed value.

    Checks that the journal holds the stream first, so a wrong path fails at once, before Spark starts.
    """
    from gateway.client.position import parse_position
    from gateway.journal import JournalReader

    JournalReader(args.journal, args.stream)
    options = {}
    for flag, value, (seq_option, time_option) in (
        ("--from", args.start, ("fromSeq", "fromTime")),
        ("--until", args.until, ("toSeq", "toTime")),
    ):
        if value is not None:
            try:
                seq, ns = parse_position(value)
            except ValueError as exc:
                raise ValueError(str(exc).replace("--from", flag)) from None
            options[time_option if ns is not None else seq_option] = str(ns if ns is not None else seq)
    return options


def _run(args: argparse.Namespace) -> int:
    from gateway.spark import run_command

    try:
        options = source_options(args)
        if "://" not in args.out and Path(args.out).exists() and not args.overwrite:
            raise ValueError(f"{args.out} exists: pass --overwrite to replace it, or another --to")
    except ValueError as exc:
        print(f"zeps export: {exc}", file=sys.stderr)
        return 2

    def job(spark: SparkSession) -> int:
        from gateway.spark.export import export

        result = export(spark, str(args.journal), args.stream, args.out, options=options, overwrite=args.overwrite)
        print(result.describe(args.stream), file=sys.stderr)
        return 0

    return run_command("zeps export", args, job)
