"""Leader election on a real etcd: one leader at a time, no overlap across kill and SIGSTOP, etcd restarts."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.etcd import EtcdProcess

from gateway.errors import CoordinatorError
from gateway.replication.elector import RETRY_S, Elector
from gateway.transport.etcd import Etcd

pytestmark = pytest.mark.timeout(120)

KEY = "/zeps/test/leader"


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    server = EtcdProcess(tmp_path).start()
    yield server
    server.kill()


def wait_for(what: Callable[[], bool], timeout_s: float) -> float:
    """Monotonic time at which `what` first held (polled every ms); fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if what():
            return time.monotonic()
        time.sleep(0.001)
    raise AssertionError(f"not within {timeout_s} s")


def test_one_leader_and_a_successor_only_after_its_authority_ends(etcd: EtcdProcess) -> None:
    a = Elector(etcd.url, KEY, "a").start()
    wait_for(lambda: a.may_act(time.monotonic()), 5)
    b = Elector(etcd.url, KEY, "b").start()
    try:
        time.sleep(1.5)  # several renewals: a stays leader, b never acts
        assert a.may_act(time.monotonic()) and not b.may_act(time.monotonic())
        epoch_a, _ = a.authority()
        a.close(resign=False)  # a dies without a word: b must wait for the lease
        _, a_until = a._leadership.epoch, a._leadership.authority_until
        took_over = wait_for(lambda: b.may_act(time.monotonic()), 5)
        assert took_over >= a_until, "b acted while a could still act"
        assert b.authority()[0] > epoch_a
    finally:
        b.close()


def test_a_resigning_leader_hands_over_at_once(etcd: EtcdProcess) -> None:
    a = Elector(etcd.url, KEY, "a").start()
    b = Elector(etcd.url, KEY, "b").start()
    try:
        first = wait_for(lambda: a.may_act(time.monotonic()) or b.may_act(time.monotonic()), 5)
        leader, other = (a, b) if a.may_act(first) else (b, a)
        epoch = leader.authority()[0]
        leader.close(resign=True)
        holder = Etcd(etcd.url).holder(KEY)  # the key went with the revoked lease, not a TTL later
        assert holder is None or holder.create_revision > epoch
        wait_for(lambda: other.may_act(time.monotonic()), 5)
    finally:
        a.close()
        b.close()


CHILD = """
import sys, time
from gateway.errors import CoordinatorError
from gateway.replication.elector import Elector
from gateway.transport.etcd import Etcd
e = Elector(sys.argv[1], sys.argv[2], "paused").start()
end = time.monotonic() + 20
while time.monotonic() < end:
    now = time.monotonic()
    print(f"{now:.6f} {int(e.may_act(now))}", flush=True)
    time.sleep(0.002)
"""


def test_a_leader_paused_past_its_lease_never_acts_after_its_successor_took_over(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    out = open(tmp_path / "child.out", "w")  # noqa: SIM115
    child = subprocess.Popen([sys.executable, "-c", CHILD, etcd.url, KEY], stdout=out)
    try:
        lines = lambda: (tmp_path / "child.out").read_text().split("\n")[:-1]  # noqa: E731
        wait_for(lambda: any(line.endswith(" 1") for line in lines()), 10)
        b = Elector(etcd.url, KEY, "b").start()
        try:
            os.kill(child.pid, signal.SIGSTOP)
            took_over = wait_for(lambda: b.may_act(time.monotonic()), 5)
            os.kill(child.pid, signal.SIGCONT)
            time.sleep(0.5)
            acting = [float(t) for t, may in (line.split() for line in lines()) if may == "1"]
            assert acting, "the child never led"
            assert max(acting) < took_over, "the paused leader acted after its successor took over"
        finally:
            b.close()
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        out.close()


def test_etcd_down_ends_authority_and_leadership_returns_with_etcd(etcd: EtcdProcess) -> None:
    a = Elector(etcd.url, KEY, "a").start()
    try:
        wait_for(lambda: a.may_act(time.monotonic()), 5)
        calls = 0
        keepalive = a._etcd.keepalive

        def counted(lease: int) -> int:
            nonlocal calls
            calls += 1
            return keepalive(lease)

        a._etcd.keepalive = counted  # type: ignore[method-assign]
        etcd.kill()
        wait_for(lambda: not a.may_act(time.monotonic()), 5)
        # Without etcd, authority ended within one lease of the last renewal that etcd answered.
        assert a._leadership.authority_until <= a._leadership.renewed_at + a.ttl_s
        # A refused renewal is retried after RETRY_S, not at once: a handful of tries, not thousands.
        assert 1 <= calls <= a.ttl_s / RETRY_S + 2, calls
        etcd.start()
        wait_for(lambda: a.may_act(time.monotonic()), 10)
    finally:
        a.close()


def test_jobs_run_on_the_elector_thread_and_their_outcomes_wake_the_owner(etcd: EtcdProcess) -> None:
    elector = Elector(etcd.url, KEY, "a").start()
    try:
        wait_for(lambda: elector.may_act(time.monotonic()), 5)
        for n in range(5):  # posted faster than run: the newest of a name replaces one not yet started
            elector.post("put", lambda e, n=n: e.put("/zeps/test/job", str(n)) or n)
        assert select.select([elector], [], [], 5)[0] == [elector]
        outcomes: list[tuple[str, object]] = []
        wait_for(lambda: bool(outcomes.extend(elector.outcomes())) or outcomes[-1:] == [("put", 4)], 5)
        assert Etcd(etcd.url).get("/zeps/test/job") == "4"
        assert not select.select([elector], [], [], 0)[0]  # nothing waits: the fd is not readable
        assert etcd.proc is not None
        os.kill(etcd.proc.pid, signal.SIGSTOP)
        try:
            elector.post("get", lambda e: e.get("/zeps/test/job"))
            assert select.select([elector], [], [], 5)[0] == [elector]
            ((name, outcome),) = elector.outcomes()
            assert name == "get" and isinstance(outcome, CoordinatorError), outcome  # timed out, reported
        finally:
            os.kill(etcd.proc.pid, signal.SIGCONT)
    finally:
        elector.close()


def test_a_follower_that_hears_its_leader_polls_the_key_at_the_renewal_interval(etcd: EtcdProcess) -> None:
    a = Elector(etcd.url, KEY, "a").start()
    wait_for(lambda: a.may_act(time.monotonic()), 5)
    b = Elector(etcd.url, KEY, "b", poll_s=0.05)
    polls: list[float] = []
    holder = b._etcd.holder  # the real request, counted

    def counted(key: str) -> object:
        polls.append(time.monotonic())
        return holder(key)

    b._etcd.holder = counted  # type: ignore[method-assign]
    b.start()
    try:
        time.sleep(1.0)
        unheard = len(polls)
        b.leader_heard(True)  # the gateway's loop hears the leader on its link
        time.sleep(0.3)  # the poll already due may still come
        polls.clear()
        time.sleep(1.0)
        heard = len(polls)
        b.leader_heard(False)
        told = time.monotonic()
        wait_for(lambda: bool(polls) and polls[-1] > told, 2)
        assert polls[-1] - told < 0.2, "no poll soon after the leader went unheard"
        assert unheard >= 10 and heard <= 6, (unheard, heard)  # every 0.05 s; every 0.25 s (the renewal interval)
    finally:
        b.close()
        a.close()
