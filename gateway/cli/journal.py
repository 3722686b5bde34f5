"""`zeps journal inspect|verify|repair DIR`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.cli.options import Parser, stream_name

if TYPE_CHECKING:
    from gateway.journal import Finding, VerifyReport


def register(commands: argparse._SubParsersAction) -> None:
    journal: Parser = commands.add_parser("journal", help="inspect, verify and repair journal directories")
    actions = journal.add_subparsers(dest="journal_command", metavar="ACTION", required=True)
    inspect = actions.add_parser("inspect", help="streams, sequence and time ranges, segments, bytes")
    inspect.add_argument("dir", type=Path, help="journal root directory (one subdirectory per stream)")
    inspect.add_argument("--json", action="store_true", help="one JSON object per stream, a line each")
    inspect.set_defaults(handler=_inspect)
    verify = actions.add_parser("verify", help="check every checksum and sequence continuity; exit 0 only if clean")
    verify.add_argument("dir", type=Path, help="journal root directory (one subdirectory per stream)")
    verify.add_argument("--json", action="store_true", help="the report as one JSON object")
    verify.set_defaults(handler=_verify)
    repair = actions.add_parser(
        "repair",
        help="verify, then fix what verify found: rebuild bad indexes, cut a stream at its first corrupt batch",
        description="Runs verify and shows what it would do: delete every index that does not match its segment "
        "(the gateway rebuilds it), and discard each stream from its first corrupt batch on (that segment's rest "
        "and every later segment: those records are lost; their sequences are never reused). Asks before it "
        "changes anything, unless --yes. Stop the gateway first: repair takes the stream's writer lock.",
    )
    repair.add_argument("dir", type=Path, help="journal root directory (one subdirectory per stream)")
    repair.add_argument("--stream", type=stream_name, action="append", help="only this stream (repeatable)")
    repair.add_argument("--yes", "-y", action="store_true", help="do it without asking")
    repair.set_defaults(handler=_repair)


def _inspect(args: argparse.Namespace) -> int:
    from gateway.journal import inspect_root

    for info in inspect_root(args.dir):
        print(json.dumps(_plain(info)) if args.json else info.describe())
    return 0


def _verify(args: argparse.Namespace) -> int:
    from gateway.journal import verify_root

    report = verify_root(args.dir)
    print(json.dumps(_report(report)) if args.json else report.describe())
    return 0 if report.clean else 1


@dataclasses.dataclass
class _Plan:
    """What repair will do: indexes to delete, and per stream the first corrupt batch (segment, offset)."""

    indexes: list[Path] = dataclasses.field(default_factory=list)
    cuts: dict[str, tuple[Path, int]] = dataclasses.field(default_factory=dict)
    left: list[Finding] = dataclasses.field(default_factory=list)  # what repair cannot fix (missing sequences)

    def describe(self) -> list[str]:
        lines = [f"rebuild {path} from its segment" for path in self.indexes]
        for stream, (segment, offset) in sorted(self.cuts.items()):
            later = [p for p in segment.parent.glob("*.seg") if p.name > segment.name]
            dropped = segment.stat().st_size - offset + sum(p.stat().st_size for p in later)
            lines.append(
                f"stream {stream}: discard from {segment.name} byte {offset} on, and {len(later)} later segment(s): "
                f"{dropped} bytes; the records there are lost"
            )
        return lines


def _plan(report: VerifyReport, streams: list[str] | None) -> _Plan:
    plan = _Plan()
    for finding in report.problems:
        stream = finding.path.parent.name
        if streams and stream not in streams:
            continue
        if finding.path.suffix == ".idx":
            if finding.path not in plan.indexes:
                plan.indexes.append(finding.path)
        elif finding.offset is not None:
            cut = (finding.path, finding.offset)
            plan.cuts[stream] = min(plan.cuts.get(stream, cut), cut, key=lambda c: (c[0].name, c[1]))
        else:
            plan.left.append(finding)
    return plan


def _repair(args: argparse.Namespace) -> int:
    from gateway.errors import ConfigError
    from gateway.journal import JournalWriter, truncate_at, verify_root

    report = verify_root(args.dir)
    print(report.describe())
    plan = _plan(report, args.stream)
    if not plan.indexes and not plan.cuts:
        if plan.left:
            print("nothing repair can fix: missing sequences stay missing (readers get JournalTrimmed there)")
        return 0 if report.clean else 1
    print("repair will:")
    for line in plan.describe():
        print(f"  {line}")
    if not args.yes:
        if not sys.stdin.isatty():
            raise ConfigError("repair changes the journal: confirm on a terminal, or pass --yes")
        if input("go ahead? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing changed")
            return 1
    for path in plan.indexes:
        path.unlink(missing_ok=True)
    for stream, (segment, offset) in sorted(plan.cuts.items()):
        print(truncate_at(args.dir, stream, segment.name, offset).describe())
    for stream in sorted({path.parent.name for path in plan.indexes}):
        JournalWriter.open(args.dir, stream).close()  # opening rebuilds a sealed segment's missing index
    for path in plan.indexes:
        print(f"rebuilt {path}" if path.exists() else f"deleted {path} (the active segment's: rebuilt as it grows)")
    after = verify_root(args.dir)
    print(after.describe().splitlines()[-1])
    return 0 if not _plan(after, args.stream).cuts and not _plan(after, args.stream).indexes else 1


def _plain(obj: Any) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(obj).items()}


def _report(report: VerifyReport) -> dict[str, Any]:
    out = _plain(report)
    out["clean"] = report.clean
    out["problems"] = [_plain(f) for f in report.problems]
    out["notes"] = [_plain(f) for f in report.notes]
    return out
