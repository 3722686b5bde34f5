"""netlab's NFQUEUE rules in a host's ``mangle`` table: run iptables there and read the rules back.

Each rule carries, in its comment, what the delay process behind it was started with (pid, start time, delay,
jitter, reorder), so any later process reads the state from the kernel rather than from a file.
"""

from __future__ import annotations

import functools
import re
import subprocess
from dataclasses import dataclass

from netlab import ns
from netlab.impair.model import Direction
from netlab.lab import Host, LabError

IPTABLES_TIMEOUT = 30.0
COMMENT_PREFIX = "netlab-delay"
_COMMENT_RE = re.compile(rf'--comment "?{COMMENT_PREFIX} ([^"]+)"?.*--queue-num (\d+)')


@dataclass(frozen=True)
class DelayRule:
    number: int  # position in the chain (iptables -R/-D)
    queue: int
    pid: int
    start: int
    delay_us: int
    jitter_us: int
    reorder_pct: float


def iptables(netns: str, *args: str, table: str = "mangle") -> str:
    """Run iptables (the mangle table unless told) inside a host's namespace; pyroute2 cannot edit iptables."""
    argv = ["iptables", "-w", "10", "-t", table, *args]
    run = functools.partial(subprocess.run, argv, capture_output=True, text=True, timeout=IPTABLES_TIMEOUT)
    try:
        done = ns.call_in_netns(netns, run)
    except FileNotFoundError as exc:
        raise LabError("delays and firewall cuts need the iptables command: apt-get install iptables") from exc
    if done.returncode != 0:
        raise LabError(f"iptables {' '.join(args)} failed in {netns}: {done.stderr.strip()}")
    return str(done.stdout)


def delay_rules(host: Host) -> dict[Direction, DelayRule]:
    """netlab's NFQUEUE rules of ``host``'s interface, by direction (one iptables call for both chains). Only
    that interface's: a namespace with two (a router's) has each one's own."""
    rules: dict[Direction, DelayRule] = {}
    position: dict[str, int] = {}
    for line in iptables(host.netns, "-S").splitlines():
        if not line.startswith("-A "):
            continue
        chain = line.split()[1]
        position[chain] = position.get(chain, 0) + 1
        direction: Direction = "in" if chain == "PREROUTING" else "out"
        match = f" {'-i' if direction == 'in' else '-o'} {host.ifname} "
        if match not in line or not (m := _COMMENT_RE.search(line)):
            continue
        fields = dict(item.split("=", 1) for item in m.group(1).split())
        rules[direction] = DelayRule(
            number=position[chain],
            queue=int(m.group(2)),
            pid=int(fields["pid"]),
            start=int(fields["start"]),
            delay_us=int(fields["delay_us"]),
            jitter_us=int(fields["jitter_us"]),
            reorder_pct=float(fields["reorder_pct"]),
        )
    return rules


def rule_comment(pid: int, start: int | None, delay_us: int, jitter_us: int, reorder_pct: float) -> str:
    """The comment :func:`delay_rules` reads back."""
    return (
        f"{COMMENT_PREFIX} pid={pid} start={start} delay_us={delay_us} "
        f"jitter_us={jitter_us} reorder_pct={reorder_pct:g}"
    )
