"""Coverage-guided fuzzing of the decoders (tests/fuzz/targets.py) with atheris (libFuzzer for Python).

    python tests/fuzz/run.py TARGET [LIBFUZZER FLAGS...]     one target, in this process (what `all` runs)
    python tests/fuzz/run.py all [--runs N] [--max-time S]    every target in turn, one process each; prints
                                                             the executions per target, exit 1 on a crash

A target starts from its seeds (tests/fuzz/corpus/TARGET, read only) and keeps what it finds in a scratch
corpus (build/fuzz/corpus/TARGET, kept between runs, never committed); a crash's input is written to
build/fuzz/crashes/ and becomes a regression test (tests/unit). The gateway's Python modules are instrumented
for coverage; the compiled record loops and the C reassembler are driven through Python and checked
against their Python twins (they are not built with -fsanitize=fuzzer, so their branches give no coverage).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SEEDS = HERE / "corpus"
BUILD = REPO / "build" / "fuzz"
EXECUTED = re.compile(rb"stat::number_of_executed_units: (\d+)")  # -print_final_stats=1, crash or not
NAMES = (
    "command",
    "batch",
    "payload",
    "announcement",
    "fill_datagram",
    "datagram",
    "apdu",
    "peer_link",
    "journal",
    "stream_files",
)  # targets.TARGETS, named here so `all` imports no gateway module (each child instruments its own imports)
# Longest input per target where libFuzzer's default (4096 bytes) costs more than it finds: the file targets'
# time grows with the input, and 1,024 bytes is ten batches with their index, 512 the three small files whole.
MAX_LEN = {"journal": 1024, "stream_files": 512}


def one(name: str, flags: list[str]) -> None:
    """Fuzz one target in this process until libFuzzer's flags stop it (libFuzzer exits the process)."""
    import atheris

    with atheris.instrument_imports(include=["gateway"]):
        from targets import TARGETS
    scratch = BUILD / "corpus" / name
    scratch.mkdir(parents=True, exist_ok=True)
    (BUILD / "crashes").mkdir(parents=True, exist_ok=True)
    if name in MAX_LEN and not any(f.startswith("-max_len=") for f in flags):
        flags = [f"-max_len={MAX_LEN[name]}", *flags]
    argv = [sys.argv[0], f"-artifact_prefix={BUILD / 'crashes'}/{name}-", *flags, str(scratch), str(SEEDS / name)]
    atheris.Setup(argv, TARGETS[name])
    atheris.Fuzz()


def campaign(names: list[str], runs: int, max_time: int) -> int:
    """Each target in its own process, one after the other (the machine may be shared); 1 if one crashed."""
    rows, failed = [], []
    for name in names:
        start = time.monotonic()
        cmd = [sys.executable, __file__, name, f"-runs={runs}", f"-max_total_time={max_time}", "-print_final_stats=1"]
        proc = subprocess.run(cmd, capture_output=True, env={**os.environ, "PYTHONHASHSEED": "0"}, check=False)
        done = EXECUTED.search(proc.stderr)
        execs = int(done.group(1)) if done else 0
        seconds = time.monotonic() - start
        rows.append((name, execs, seconds, proc.returncode))
        print(f"fuzz {name}: {execs:,} executions in {seconds:.0f} s, exit {proc.returncode}", flush=True)
        if proc.returncode != 0 or not done:
            failed.append(name)
            sys.stderr.buffer.write(proc.stderr[-4000:])
    print(f"fuzz: {len(rows)} targets, {sum(r[1] for r in rows):,} executions, {len(failed)} failed {failed or ''}")
    return 1 if failed else 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] != "all":
        if sys.argv[1] not in NAMES:
            print(f"unknown fuzz target {sys.argv[1]!r}: use one of {', '.join(NAMES)} or all", file=sys.stderr)
            return 2
        one(sys.argv[1], sys.argv[2:])
        return 0
    parser = argparse.ArgumentParser(description="Fuzz every decoder in turn, bounded in runs and time.")
    parser.add_argument("all", choices=["all"])
    parser.add_argument("--runs", type=int, default=1_000_000, help="executions per target (default 1,000,000)")
    parser.add_argument("--max-time", type=int, default=600, help="seconds per target at most (default 600)")
    parser.add_argument("--only", nargs="+", choices=NAMES, default=list(NAMES), help="these targets only")
    args = parser.parse_args()
    return campaign(args.only, args.runs, args.max_time)


if __name__ == "__main__":
    sys.exit(main())
