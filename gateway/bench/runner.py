"""What every scenario shares: settings, progress on stderr, medians over runs, the machine record, and the
probes that read a process's CPU time and memory from /proc.

A scenario is a module with `TITLE`, `estimate(settings) -> seconds` and `run(settings) -> Result`. It builds
its tables from `Stat`s (the median of the runs, with the range shown), states its targets as `Target`s, and
hands data for plots to the report as `Plot`s. Everything it starts it stops itself, by pid, in `finally`
blocks or context managers, so a failure or Ctrl-C (SIGTERM is turned into the same) leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
import unittest.mock
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import zmq

from gateway.bench import BenchError
from gateway.wire import record_loops
from netlab import HostProcess

STREAM = "bench"
BODY = 100  # bytes per record body, every scenario
KEYS = 100  # routing keys key000..key099
PERCENTILES = (50.0, 90.0, 99.0, 99.9)  # of latencies, every scenario that measures them
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Settings:
    """What `zeps bench` was told. `quick` shrinks every size to prove the harness, not to measure."""

    runs: int = 3
    quick: bool = False
    journal_gb: float = 2.0  # memory scenario: the journal the sidecar serves
    catchup_records: int = 5_000_000  # replay scenario: history a late joiner catches up on
    tmp: Path = field(default_factory=lambda: Path(os.environ.get("TMPDIR", "/tmp")))
    transport: str = "udp"  # chaos and soak scenarios: the multicast transport
    chaos_faults: int = 100  # chaos scenario: its faults and the schedule's seed
    chaos_seed: int | None = None  # None: drawn at random (and printed)
    chaos_kinds: tuple[str, ...] | None = None  # chaos: the fault kinds drawn from (None: all, nemesis.KINDS)
    chaos_overlap: bool = True  # chaos: whether a step may hold a second fault starting inside the first
    soak_minutes: float = 60.0  # soak scenario: how long
    rate: float | None = None  # chaos and soak scenarios: the publisher's records a second (None: the scenario's)
    promotion_only: bool = False  # mirror scenario: only its promotion rows of their own
    lag_only: bool = False  # mirror scenario: only the lag of its WAN rows (one path, --paths 4, datagram tail)

    def size(self, full: int, quick: int) -> int:
        return quick if self.quick else full


class Progress:
    """One line per step on stderr, with the time since the benchmark started."""

    def __init__(self, scenario: str) -> None:
        self.scenario = scenario
        self.start = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"[bench {self.scenario} {time.monotonic() - self.start:6.1f}s] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Stat:
    """One metric over runs: shown as the median, with the range when there was more than one run."""

    values: tuple[float, ...]
    unit: str = ""
    digits: int = 0

    @classmethod
    def of(cls, values: Sequence[float] | None, unit: str = "", digits: int = 0) -> Stat:
        if not values:
            raise BenchError("a metric with no runs: every run failed before measuring it")
        return cls(tuple(values), unit, digits)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def fmt(self, value: float) -> str:
        return f"{value:,.{self.digits}f}"

    def __str__(self) -> str:
        text = self.fmt(self.median) + (f" {self.unit}" if self.unit else "")
        if len(self.values) > 1:
            text += f" ({self.fmt(min(self.values))} to {self.fmt(max(self.values))})"
        return text


@dataclass(frozen=True)
class Table:
    title: str
    columns: tuple[str, ...]
    rows: Sequence[tuple[object, ...]]


@dataclass(frozen=True)
class Target:
    """A goal of an issue and what this run measured against it (met None: not comparable here)."""

    goal: str
    measured: str
    met: bool | None
    issue: int | None = None  # the issue that set it, when not the scenario's own (Result.issue)


@dataclass(frozen=True)
class Plot:
    """Data for one PNG: series label -> (x values or labels, y values); kind "line" or "bar"."""

    name: str
    title: str
    xlabel: str
    ylabel: str
    series: dict[str, tuple[list, list[float]]]
    kind: str = "line"
    logy: bool = False


@dataclass
class Result:
    scenario: str
    title: str
    method: str
    tables: list[Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    runs: int = 0
    seconds: float = 0.0
    issue: int = 8  # the issue that set its targets


def repeat(
    runs: int, progress: Progress, what: str, once: Callable[[int], dict[str, float]], failures: list[str]
) -> dict[str, list[float]]:
    """Call `once(i)` `runs` times; gather each metric it returns into a list (one value per run).

    A run that fails is reported (progress, and a line in `failures`) and left out of the medians: one
    bad run on a shared machine should not cost the others. Ctrl-C is not a failure: it stops everything.
    """
    gathered: dict[str, list[float]] = {}
    for i in range(runs):
        progress(f"{what}: run {i + 1}/{runs}")
        try:
            measured = once(i)
        except Exception as exc:
            text = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            progress(f"{what}: run {i + 1} failed: {text}")
            failures.append(f"{what}: run {i + 1} of {runs} failed ({type(exc).__name__}: {text})")
            continue
        for key, value in measured.items():
            gathered.setdefault(key, []).append(value)
    return gathered


def percentiles(ns: Sequence[int], which: Sequence[float] = PERCENTILES) -> dict[str, float]:
    """{"p50": ms, ...}: the percentiles `which` of the times `ns` (nanoseconds), in ms."""
    ms = sorted(x / 1e6 for x in ns)
    return {f"p{p:g}": ms[min(len(ms) - 1, int(len(ms) * p / 100))] for p in which}


def times(data: bytes) -> array:
    """Times in ns as the benchmarks' subscribers return them: the bytes of an array("q")."""
    out = array("q")
    out.frombytes(data)
    return out


@contextlib.contextmanager
def time_limit(seconds: float, what: str) -> Iterator[None]:
    """Raise BenchError in the main thread after `seconds`: every scenario is bounded in time, even when a
    call it makes hangs (seen once: a netlink request of a lab's set-up that was never answered). The
    exception unwinds the scenario's context managers, so its labs, processes and files are removed."""

    def expire(signum: int, frame: object) -> None:
        raise BenchError(f"{what} did not finish within {seconds:.0f} s; everything it started was stopped")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def stop_process(proc: subprocess.Popen) -> None:
    """End a server a scenario started on this host: SIGTERM, and SIGKILL if it is still there after 10 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def stop(*handles: HostProcess) -> None:
    """End lab processes that are still running (a failed run's), by pid; finished ones are left alone."""
    for handle in handles:
        if handle.is_alive():
            handle.terminate()


# --- probes ------------------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (its threads included), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def runqueue_seconds(pid: int) -> float:
    """Time a process's threads spent runnable but waiting for a CPU, from /proc/PID/task/*/schedstat: on a
    loaded machine, what starves a pipeline whose processes each use little CPU."""
    return _schedstat_seconds(pid, 1)


def run_seconds(pid: int) -> float:
    """CPU time of a process's live threads in nanoseconds' resolution, from /proc/PID/task/*/schedstat: for
    short measurements, where /proc/PID/stat's clock ticks (10 ms) round a few ms of work to 0 or to 10 ms.
    Threads that ended are not counted: measure processes whose threads live throughout."""
    return _schedstat_seconds(pid, 0)


def _schedstat_seconds(pid: int, field: int) -> float:
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError, IndexError, ValueError):  # a thread that ended meanwhile
            total += int(stat.read_text().split()[field])
    return total / 1e9


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """User + system CPU time of a process's threads by role, from /proc/PID/task: "main" (the thread it started
    with), "zmq-io" (ZeroMQ's IO threads), "other" (the rest, as long as they run)."""
    out = dict.fromkeys(("main", "zmq-io", "other"), 0.0)
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                head, tail = f.read().rsplit(")", 1)
        except OSError:  # ended meanwhile
            continue
        fields = tail.split()
        role = "main" if int(tid) == pid else "zmq-io" if head.split("(", 1)[1].startswith("ZMQbg/IO") else "other"
        out[role] += (int(fields[11]) + int(fields[12])) / _CLK_TCK
    return out


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc/PID/statm."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def need_disk(directory: Path, nbytes: int, what: str) -> None:
    """Refuse, naming the fix, unless `directory` has `nbytes` free plus a 2 GiB margin for everyone else."""
    free = shutil.disk_usage(directory).free
    if free < nbytes + (2 << 30):
        raise BenchError(
            f"{what} needs {nbytes / 2**30:.1f} GiB in {directory} and leaves 2 GiB spare, but only "
            f"{free / 2**30:.1f} GiB are free: pass a smaller --journal-gb, or --tmp DIR on a larger disk"
        )


# --- the machine -------------------------------------------------------------------------------------------


def _first_line(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "not installed"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr).strip() else "?"


def _cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def _os_name() -> str:
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.system()


def _package(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def python_record_loops() -> contextlib.AbstractContextManager:
    """Processes started inside run the record loops in Python (ZEPS_PURE_PYTHON=1, read at their import):
    the comparison that shows what the compiled ones win."""
    return unittest.mock.patch.dict(os.environ, {"ZEPS_PURE_PYTHON": "1"})


def _debian(package: str) -> str:
    return _first_line(["dpkg-query", "-W", "-f=${Version}", package])


def machine() -> dict[str, str]:
    """What the numbers were measured on: recorded with every result."""
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": f"{_cpu_model()}, {os.cpu_count()} cores",
        "memory": f"{mem_kb / 2**20:.1f} GiB",
        "os": f"{_os_name()}, Linux {platform.release()}",
        "python": f"CPython {platform.python_version()}, record loops {record_loops.IMPLEMENTATION}",
        "pyzmq / libzmq": f"{zmq.__version__} / {zmq.zmq_version()} (Debian libzmq5 {_debian('libzmq5')})",
        "libpgm / libnorm": f"{_debian('libpgm-5.3-0')} / {_debian('libnorm1')}",
        "nats-server / nats-py": f"{_first_line(['nats-server', '--version'])} / {_package('nats-py')}",
        "socket buffers": f"rmem_max {_sysctl('net/core/rmem_max')}, wmem_max {_sysctl('net/core/wmem_max')}",
        "load average at start": load,
    }


def _sysctl(name: str) -> str:
    try:
        return Path(f"/proc/sys/{name}").read_text().strip()
    except OSError:
        return "?"
