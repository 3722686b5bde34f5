"""Delay, jitter and reorder: an iptables NFQUEUE rule and a small process that holds each packet's verdict.

The process runs inside the host's namespace, so ``Lab.down`` kills it with everything else, and the rule has
``--queue-bypass``, so packets go through undelayed if it dies. A change starts a new process on the other of
the direction's two queues, swaps the rule in one step, then lets the old process drain what it holds.
"""

from __future__ import annotations

import select
import subprocess
import sys
from pathlib import Path

from netlab import ns, state
from netlab.impair import nfqueue
from netlab.impair.iptables import DelayRule, iptables, rule_comment
from netlab.impair.model import Direction, Impairment
from netlab.impair.tc import Link
from netlab.lab import Host, Lab, LabError

QUEUES: dict[Direction, tuple[int, int]] = {"in": (1, 3), "out": (2, 4)}  # alternate on change
READY_TIMEOUT = 20.0  # seconds for a new delay process to bind its queue
DRAIN_GRACE = 2.0  # seconds an old process has, beyond its longest delay, to release what it holds


def _start(lab: Lab, host: Host, queue: int, delay_us: int, jitter_us: int, reorder_pct: float) -> int:
    """Start the delay process in ``host`` and wait until it has bound its queue; return its pid."""
    settings = (queue, delay_us, jitter_us, reorder_pct / 100)
    # Stdlib only, so it starts at once; its source goes on the command line, so that it also runs in a container
    # (netlab's Docker backend) that has no copy of this file at this path.
    source = Path(nfqueue.__file__).read_text()
    argv = [sys.executable, "-I", "-S", "-c", source, *map(str, settings)]
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
