"""`zeps export`: a stream's journaled records into Parquet, through Spark (needs the spark extra)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.cli.options import journal_root, position, stream_name

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
    p.add_argument(
        "--journal", type=journal_root, required=True, help="the gateway's journal root (one directory per stream)"
    )
    p.add_argument("--stream", type=stream_name, required=True)
    p.add_argument(
        "--from", dest="start", type=position(), help="first sequence, or an ISO-8601 journal time with a zone"
    )
    p.add_argument("--until", type=position(), help="last sequence, or an ISO-8601 journal time (inclusive)")
    p.add_argument("--master", help="Spark master URL (default: spark-submit's, else local[*])")


def source_options(args: argparse.Namespace) -> dict[str, str]:
    """--from/--until as options of the zeps data source. ConfigError (exit 2) for a range it cannot read.

    Checks that the journal holds the stream first, so a wrong path fails at once, before Spark starts.
    """
    from gateway.errors import ConfigError
    from gateway.journal import JournalReader

    JournalReader(args.journal, args.stream)
    options = {}
    for flag, pos, (seq_option, time_option) in (
        ("--from", args.start, ("fromSeq", "fromTime")),
        ("--until", args.until, ("toSeq", "toTime")),
    ):
        if pos is None:
            continue
        if pos.back is not None:
            raise ConfigError(f"{flag} -{pos.back}: the last N records is for history and subscribe; give a sequence")
        options[time_option if pos.time_ns is not None else seq_option] = str(
            pos.time_ns if pos.time_ns is not None else pos.seq
        )
    return options


def _run(args: argparse.Namespace) -> int:
    from gateway.errors import ConfigError
    from gateway.spark import run_command

    options = source_options(args)
    if "://" not in args.out and Path(args.out).exists() and not args.overwrite:
        raise ConfigError(f"{args.out} exists: pass --overwrite to replace it, or another --to")

    def job(spark: SparkSession) -> int:
        from gateway.spark.export import export

        result = export(spark, str(args.journal), args.stream, args.out, options=options, overwrite=args.overwrite)
        print(result.describe(args.stream), file=sys.stderr)
        return 0

    return run_command("zeps export", args, job)
