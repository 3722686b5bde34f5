"""`zeps bench`: run benchmark scenarios against the peers and print (or write) the report."""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from gateway.cli import extras

DEFAULT_REPORT = Path("docs/benchmarks.md")
# What a scenario needs beyond the base install, checked before anything runs: found missing at the end, it
# would cost the whole run. The report's plots need matplotlib (the spark extra).
NEEDS = {"recovery": ("lab", ("scapy",)), "sink": ("spark", ("pyspark", "pyarrow"))}


def register(commands: argparse._SubParsersAction) -> None:
    from gateway.bench import SCENARIOS

    p = commands.add_parser(
        "bench",
        help="benchmarks against raw pyzmq, NATS JetStream; medians over runs",
        description="Each scenario builds its own namespace lab, runs real gateway, replay, subscriber and peer "
        "processes, and removes everything it made, also on failure or Ctrl-C. Prints Markdown tables of "
        "medians; `all` also writes docs/benchmarks.md and its PNG plots. Needs root (network namespaces).",
    )
    p.add_argument("scenario", choices=(*SCENARIOS, "all"))
    p.add_argument(
        "--runs", type=_positive(int), default=3, help="runs per measurement; the median is reported (default 3)"
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes, to check the harness (numbers mean nothing)")
    p.add_argument("--journal-gb", type=_positive(float), default=2.0, help="memory: journal size in GiB (default 2)")
    p.add_argument(
        "--catchup-records", type=_positive(int), default=5_000_000, help="replay: history a late joiner catches up on"
    )
    p.add_argument(
        "--transport", choices=("udp", "epgm", "norm"), default="udp", help="chaos, soak: the multicast transport"
    )
    p.add_argument("--faults", type=_positive(int), default=100, help="chaos: how many faults (default 100)")
    p.add_argument("--seed", type=int, help="chaos: the schedule's seed (default: drawn and printed)")
    p.add_argument(
        "--kinds",
        type=_fault_kinds,
        help="chaos: draw faults only of these kinds, K1,K2,... (default: every kind; a wrong name lists them)",
    )
    p.add_argument(
        "--no-overlap",
        dest="overlap",
        action="store_false",
        help="chaos: one fault at a time (default: some steps hold a second fault starting inside the first)",
    )
    p.add_argument("--minutes", type=_positive(float), default=60.0, help="soak: how long (default 60)")
    p.add_argument(
        "--rate", type=_positive(float), help="chaos, soak: the publisher's records/s (default 5,000 and 20,000)"
    )
    p.add_argument(
        "--promotion-only",
        action="store_true",
        help="mirror: only the promotion rows of their own (B a group; A cut off at the router), not the links' runs",
    )
    p.add_argument(
        "--lag-only",
        action="store_true",
        help="mirror: only the lag of the WAN rows (one path, --paths 4, --datagram-tail), alternated in one lab",
    )
    p.add_argument("--tmp", type=_directory, default=Path(tempfile.gettempdir()), help="where journals and stores go")
    p.add_argument("--report", type=Path, help=f"write the Markdown report here (all: {DEFAULT_REPORT})")
    p.add_argument("--label", default="", help="a line for the report's head, e.g. 'contended machine, preliminary'")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from gateway.bench import ON_DEMAND, SCENARIOS, BenchError, report, scenario
    from gateway.bench.runner import Result, Settings, machine, time_limit

    if os.geteuid() != 0:
        raise OSError("zeps bench builds network namespaces and needs root: run it as root, e.g. with sudo")
    names = tuple(s for s in SCENARIOS if s not in ON_DEMAND) if args.scenario == "all" else (args.scenario,)
    target = args.report or (DEFAULT_REPORT if args.scenario == "all" else None)
    needs = [NEEDS[name] for name in names if name in NEEDS]
    if target is not None:
        needs.append(("spark", ("matplotlib",)))  # the report's plots
    for extra, modules in needs:
        extras.require(extra, *modules)
    settings = Settings(
        runs=args.runs,
        quick=args.quick,
        journal_gb=args.journal_gb,
        catchup_records=args.catchup_records,
        tmp=args.tmp,
        transport=args.transport,
        chaos_faults=args.faults,
        chaos_seed=args.seed,
        chaos_kinds=args.kinds,
        chaos_overlap=args.overlap,
        soak_minutes=args.minutes,
        rate=args.rate,
        promotion_only=args.promotion_only,
        lag_only=args.lag_only,
    )
    estimate = sum(scenario(name).estimate(settings) for name in names)
    print(f"zeps bench {args.scenario}: about {estimate / 60:.0f} min on an idle 2-core machine", file=sys.stderr)
    signal.signal(signal.SIGTERM, functools.partial(_interrupt, os.getpid()))  # clean up as on Ctrl-C
    record = machine()
    results = []
    for name in names:
        module = scenario(name)
        try:
            with time_limit(120 + 3 * module.estimate(settings), f"zeps bench {name}"):
                results.append(module.run(settings))
        except BenchError as exc:
            if len(names) == 1:
                print(f"zeps bench {name}: {exc}", file=sys.stderr)
                return 1
            results.append(Result(name, module.TITLE, "", notes=[f"**This scenario failed:** {exc}"]))
    record["load average at end"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(report.markdown(results, record))
    if target is not None:
        command = f"zeps bench {args.scenario} --runs {args.runs}" + (" --quick" if args.quick else "")
        for path in report.write(results, record, target, command, args.label):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def _positive(kind: type) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text} is not positive")
        return value

    return parse


def _fault_kinds(text: str) -> tuple[str, ...]:
    """K1,K2,...: fault kinds of the chaos nemesis (gateway.bench.nemesis.KINDS)."""
    from gateway.bench.nemesis import check_kinds

    try:
        return check_kinds(k.strip() for k in text.split(",") if k.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _directory(text: str) -> Path:
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a directory")
    return Path(text)


def _interrupt(pid: int, signum: int, frame: object) -> None:
    """SIGTERM in the bench process unwinds like Ctrl-C. Processes forked from it inherit the handler (pyroute2
    forks helpers into namespaces and ends them with SIGTERM): there it must do what SIGTERM always does."""
    if os.getpid() != pid:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise KeyboardInterrupt
