"""A gateway whose wall clock is stepped while it runs (netlab.wallclock: one process's CLOCK_REALTIME moved,
as NTP or `date -s` would, its monotonic clock and sleeps untouched). Journal time comes from the wall clock
and the authority from the monotonic one (docs/journal.md): a step back must not reorder journal time or stall
the gateway, a step forward shows as a jump in journal time and nothing else; OpenPGM's timers and rate limiter
run on the monotonic clock too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.servers import STREAM, GatewayProcess

from gateway import Publisher
from gateway.journal import JournalReader, verify_root
from netlab import WallClock

PGM_CLOCK = """import ctypes, sys, time
import zmq
from gateway.transport import pgm
ctx = zmq.Context()  # libzmq's first context initialises libpgm (pgm_init), as in every gateway process
now = ctypes.CFUNCTYPE(ctypes.c_uint64)(ctypes.c_void_p.in_dll(pgm.lib(), "pgm_time_update_now").value)
print(now(), flush=True)
sys.stdin.readline()
time.sleep(0.2)
print(now(), flush=True)
"""

SCRIPT = """import sys, time
print(time.time(), time.monotonic(), flush=True)
sys.stdin.readline()
time.sleep(0.05)
print(time.time(), time.monotonic(), flush=True)
"""


def test_a_step_moves_the_wall_clock_of_the_process_only_and_leaves_its_sleeps(tmp_path: Path) -> None:
    clock = WallClock(tmp_path / "clock")
    child = subprocess.Popen([sys.executable, "-c", SCRIPT], env=clock.env(), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdin is not None and child.stdout is not None
        wall0, mono0 = map(float, child.stdout.readline().split())
        clock.step(-3600)
        child.stdin.write("\n")
        child.stdin.flush()
        wall1, mono1 = map(float, child.stdout.readline().split())
    finally:
        child.kill()
        child.wait(10)
    assert -3600 < wall1 - wall0 < -3590  # an hour back, plus the time the child slept
    assert 0.04 < mono1 - mono0 < 10  # its monotonic clock and its sleep: the machine's


def test_a_gateway_stepped_back_and_forward_journals_every_record_once_in_time_order(tmp_path: Path) -> None:
    clock = WallClock(tmp_path / "clock")
    root = tmp_path / "journal"
    gw = GatewayProcess(root, streams=(STREAM,), env=clock.env())
    phases = {"before": 0.0, "back": -3600.0, "forward": 7200.0}  # the steps: an hour back, then two forward
    try:
        with Publisher(gw.ingest, STREAM, confirm=True) as pub:
            for phase, step in phases.items():
                clock.step(step)
                for i in range(300):
                    pub.publish(phase, b"%s %d" % (phase.encode(), i))
                pub.flush()
    finally:
        err = gw.stop()
    assert "Traceback" not in err, err
    reader = JournalReader(root, STREAM)
    rows = []
    with reader.cursor(1) as cursor:
        while (batch := cursor.next_batch()) is not None:
            rows += [(r.seq, batch.ts_ns, r.key) for r in batch.records()]
    assert [seq for seq, _, _ in rows] == list(range(1, 901))  # every record once, in order
    times = [ts for _, ts, _ in rows]
    assert times == sorted(times)  # journal time never goes back, whatever the wall clock does
    last = {phase: max(ts for _, ts, k in rows if k == phase) for phase in phases}
    first = {phase: min(ts for _, ts, k in rows if k == phase) for phase in phases}
    assert last["back"] - last["before"] < 2e9  # an hour back: journal time waits for the clock, it never goes back
    assert first["forward"] - last["back"] > 3500e9  # an hour forward (net): journal time jumps with the clock
    assert verify_root(root).clean


def test_a_step_back_of_the_wall_clock_leaves_openpgm_s_clock_running(tmp_path: Path) -> None:
    # Debian's libpgm reads gettimeofday() unless PGM_TIMER says otherwise, and holds its clock still until the
    # wall clock is past its last reading: a step back froze a leader's PGM sender (rate limiter and timers) for
    # as long as the step, its queue filled and it stopped reading its publishers (issue #34).
    clock = WallClock(tmp_path / "clock")
    env = clock.env()
    env.pop("PGM_TIMER", None)  # the gateway's choice, not one inherited from the test's environment
    child = subprocess.Popen([sys.executable, "-c", PGM_CLOCK], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdin is not None and child.stdout is not None
        before = int(child.stdout.readline())
        clock.step(-3600)
        child.stdin.write("\n")
        child.stdin.flush()
        after = int(child.stdout.readline())
    finally:
        child.kill()
        child.wait(10)
    assert 0.15e6 < after - before < 10e6  # microseconds: it ran on through the step, by the child's sleep
