"""Delay, jitter and reorder: an iptables NFQUEUE rule and a small process that holds each packet's verdict.

The process runs inside the host's namespace, so ``Lab.down`` kills it with everything else, and the rule has
``--queue-bypass``, so packets go through undelayed if it dies. A change starts a new process on the other of
the direction's two queues, swaps the rule in one step, then lets the old process drain what it holds.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import random
import select
import signal
import subprocess
import sys
import time

from netlab import ns, state
from netlab.impair import nfqueue
from netlab.impair.iptables import DelayRule, iptables, rule_comment
from netlab.impair.model import Direction, Impairment
from netlab.impair.tc import Link
from netlab.lab import Host, Lab, LabError

QUEUES: dict[Direction, tuple[int, int]] = {"in": (1, 3), "out": (2, 4)}  # alternate on change
READY_TIMEOUT = 20.0  # seconds for a new delay process to bind its queue
DRAIN_GRACE = 2.0  # seconds an old process has, beyond its longest delay, to release what it holds


def run(queue: int, delay_s: float, jitter_s: float, reorder: float) -> None:
    """Hold each packet of ``queue`` for its delay, then accept it. SIGTERM: finish the held ones, then exit."""
    sock = nfqueue.open_queue(queue)
    sock.setblocking(False)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    draining = False

    def on_term(_signum: int, _frame: object) -> None:
        nonlocal draining
        draining = True

    signal.signal(signal.SIGTERM, on_term)
    print("ready", flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    rng = random.Random()
    held: list[tuple[float, int]] = []  # (due, packet id); ids grow, so ties keep arrival order
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        now = time.monotonic()
        due = []
        while held and held[0][0] <= now:
            due.append(heapq.heappop(held)[1])
        if due:
            sock.send(nfqueue.accept(queue, due))
        if held:
            timeout: float | None = max(0.0, held[0][0] - time.monotonic()) * 1000
        else:
            timeout = 0 if draining else None  # draining: only look for stragglers, then exit
        events = dict(poller.poll(timeout))
        if wake_r in events:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 64)
        arrived = 0
        for _ in range(1024):  # bounded: let due packets go out between bursts of arrivals
            try:
                data = sock.recv(1 << 16)
            except BlockingIOError:
                break
            now = time.monotonic()
            for packet_id in nfqueue.packet_ids(data):
                arrived += 1
                if reorder and rng.random() < reorder:
                    heapq.heappush(held, (now, packet_id))
                else:
                    heapq.heappush(held, (now + delay_s + rng.uniform(-jitter_s, jitter_s), packet_id))
        if draining and not held and not arrived:
            return


def delay_daemon(argv: list[str]) -> int:
    """Entry point of the delay process: ``QUEUE DELAY_US JITTER_US REORDER_FRACTION``."""
    queue, delay_us, jitter_us, reorder = int(argv[0]), int(argv[1]), int(argv[2]), float(argv[3])
    run(queue, delay_us / 1e6, jitter_us / 1e6, reorder)
    return 0


def _start(lab: Lab, host: Host, queue: int, delay_us: int, jitter_us: int, reorder_pct: float) -> int:
    """Start the delay process in ``host`` and wait until it has bound its queue; return its pid."""
    code = "import sys, netlab.impair.delay as m; sys.exit(m.delay_daemon(sys.argv[1:]))"
    argv = [sys.executable, "-c", code, str(queue), str(delay_us), str(jitter_us), str(reorder_pct / 100)]
    proc = lab.popen(
        host,
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # outlives a `netlab impair` command; Lab.down kills it with the namespace
    )
    assert proc.stdout is not None
    with proc.stdout:
        ready, _, _ = select.select([proc.stdout], [], [], READY_TIMEOUT)
        line = proc.stdout.readline().decode(errors="replace") if ready else ""
        if line.strip() != "ready":
            ns.kill_pids([proc.pid])
            output = line + (
                proc.stdout.read().decode(errors="replace") if ready else f"(no output in {READY_TIMEOUT:g} s)"
            )
            raise LabError(f"the delay process for {host.name} did not start: {output.strip()}")
    return proc.pid


def _stop(rule: DelayRule, timeout: float) -> None:
    """Let the delay process release what it holds and exit (SIGKILL after ``timeout`` s); only if it is ours."""
    if state.process_start_time(rule.pid) == rule.start:
        ns.kill_pids([rule.pid], grace=timeout)


def set_delay(lab: Lab, link: Link, imp: Impairment, existing: DelayRule | None) -> None:
    """Install, change or remove the NFQUEUE delay of ``link``. A change starts a new process on the other
    queue, swaps the rule in one step, then lets the old process drain: no packet is dropped or left behind."""
    delay_us, jitter_us = round(imp.delay_ms * 1000), round(imp.jitter_ms * 1000)
    wanted = (delay_us, jitter_us, imp.reorder_pct)
    host, match = link.host, ("-i" if link.direction == "in" else "-o")
    if existing and (existing.delay_us, existing.jitter_us, existing.reorder_pct) == wanted:
        return
    if delay_us or jitter_us:
        queue = next(q for q in QUEUES[link.direction] if not existing or q != existing.queue)
        pid = _start(lab, host, queue, *wanted)
        comment = rule_comment(pid, state.process_start_time(pid), *wanted)
        spec = [match, host.ifname, "-m", "comment", "--comment", comment]
        spec += ["-j", "NFQUEUE", "--queue-num", str(queue), "--queue-bypass"]
        try:
            if existing:
                iptables(host.netns, "-R", link.chain, str(existing.number), *spec)
            else:
                iptables(host.netns, "-I", link.chain, "1", *spec)
        except BaseException:
            ns.kill_pids([pid])
            raise
    elif existing:
        iptables(host.netns, "-D", link.chain, str(existing.number))
    if existing:
        _stop(existing, timeout=(existing.delay_us + existing.jitter_us) / 1e6 + DRAIN_GRACE)
