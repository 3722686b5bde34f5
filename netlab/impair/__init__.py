"""Impair the link of one lab host: loss (random, Gilbert bursts, exactly-N), duplication, rate, delay, partition.

Why not netem: kernels built without ``sch_netem`` (this project's test VMs: ``CONFIG_NET_SCH_NETEM`` unset, no
modules, also no ``act_gact``/``cls_matchall``) cannot load it at all, and one mechanism everywhere beats a second,
untested one. So the pieces are, one module each:

- ``ebpf``: a hand-assembled ``cls_bpf`` program (direct action) and its mmap-able parameter map, loaded with
  bpf(2): random loss, Gilbert-Elliott loss, "drop exactly the next N", partition and duplication
  (``bpf_clone_redirect``). A change is a few stores into shared memory: nothing reloaded, no queued packet lost.
- ``tc``: where it goes (pyroute2): a ``clsact`` egress hook for the program, a **TBF** root qdisc for the rate.
- ``delay``: an iptables ``mangle`` rule (``iptables``) sending the packets to NFQUEUE, where a small process in
  the host's namespace (``nfqueue``, raw netlink) holds each packet's verdict: delay, jitter, reorder.
- ``model``: :class:`Impairment` and :class:`LinkCounters`, what this module's functions take and give.

Directions: ``"in"`` shapes the egress of the host's *bridge-side* veth (in the root namespace, delay at the
host's PREROUTING): what arrives at the host. ``"out"`` shapes the egress of the host's own interface (inside
its namespace, delay at POSTROUTING): what the host sends, to everyone. Multicast is flooded by the bridge into
each port separately, so "in" on one subscriber impairs that subscriber only.
"""

from __future__ import annotations

import socket
import time

from netlab.impair import ebpf
from netlab.impair.delay import set_delay
from netlab.impair.iptables import delay_rules
from netlab.impair.model import DIRECTIONS, Direction, Impairment, LinkCounters
from netlab.impair.nfqueue import delay_daemon
from netlab.impair.tc import Link, map_value, read_rate, remove_filter, set_rate
from netlab.lab import Host, Lab, LabError

__all__ = [
    "DIRECTIONS",
    "Direction",
    "Impairment",
    "LinkCounters",
    "clear",
    "counters",
    "current",
    "delay_daemon",
    "drop_next",
    "heal",
    "impair",
    "partition",
    "summary",
    "wait_burst",
]


def _directions(direction: str) -> tuple[Direction, ...]:
    if direction == "both":
        return DIRECTIONS
    if direction in DIRECTIONS:
        return (direction,)
    raise ValueError(f"direction must be 'in', 'out' or 'both', not {direction!r}")


def _one_direction(direction: str) -> Direction:
    if direction not in DIRECTIONS:
        raise ValueError(f"this reads one direction, 'in' or 'out', not {direction!r}")
    return direction


def _link(lab: Lab, host: str | Host, direction: Direction) -> Link:
    lab._check_up()
    return Link(lab.host(host), direction)


def impair(lab: Lab, host: str | Host, imp: Impairment, direction: str = "in") -> None:
    """Make ``host``'s link behave as ``imp`` (replacing what was set; partition and drop_next stay).

    Safe while traffic flows: loss and duplication change in place, the rate limit keeps its queue, a new
    delay takes over from the old one without losing the packets it holds.
    """
    for d in _directions(direction):
        link = _link(lab, host, d)
        with map_value(link, create=True) as value:
            assert value is not None
            ebpf.set_loss_model(value, imp)
        set_rate(link, imp.rate_kbit)
        set_delay(lab, link, imp, delay_rules(link.host).get(d))


def clear(lab: Lab, host: str | Host, direction: str = "both") -> None:
    """Remove every impairment of ``host`` (in ``direction``), partition and drop_next budgets included."""
    for d in _directions(direction):
        link = _link(lab, host, d)
        set_delay(lab, link, Impairment(), delay_rules(link.host).get(d))
        set_rate(link, None)
        remove_filter(link)


def current(lab: Lab, host: str | Host, direction: str = "in") -> Impairment | None:
    """What ``impair`` set on ``host``'s link in ``direction`` ("in" or "out"), read back from the kernel."""
    d = _one_direction(direction)
    link = _link(lab, host, d)
    loss_pct, loss_burst, duplicate_pct = 0.0, None, 0.0
    with map_value(link, create=False) as value:
        if value is not None:
            loss_pct, loss_burst, duplicate_pct = ebpf.read_loss_model(value)
    rule = delay_rules(link.host).get(d)
    imp = Impairment(
        loss_pct=loss_pct,
        loss_burst=loss_burst,
        delay_ms=rule.delay_us / 1000 if rule else 0.0,
        jitter_ms=rule.jitter_us / 1000 if rule else 0.0,
        reorder_pct=rule.reorder_pct if rule else 0.0,
        duplicate_pct=duplicate_pct,
        rate_kbit=read_rate(link),
    )
    return None if imp.is_clear else imp


def partition(lab: Lab, host: str | Host) -> None:
    """Cut ``host`` off the LAN: every packet to and from it is dropped (its link stays up, silently)."""
    for d in DIRECTIONS:
        with map_value(_link(lab, host, d), create=True) as value:
            assert value is not None
            value.set("<I", ebpf.PARTITION, 1)


def heal(lab: Lab, host: str | Host) -> None:
    """Undo :func:`partition`; other impairments stay as they were."""
    for d in DIRECTIONS:
        with map_value(_link(lab, host, d), create=False) as value:
            if value is not None:
                value.set("<I", ebpf.PARTITION, 0)


def drop_next(lab: Lab, host: str | Host, count: int, *, udp_port: int | None = None, direction: str = "in") -> None:
    """Drop exactly the next ``count`` packets (only UDP to ``udp_port`` when given) on ``host``'s link.

    Counted in the kernel, one decrement per packet, so it is exact whatever the rate; a new call replaces
    the remaining budget. Wait for it with :func:`wait_burst`.
    """
    if count < 0 or (udp_port is not None and not 0 < udp_port < 65536):
        raise ValueError(f"need count >= 0 and a UDP port 1-65535 or None (got {count}, {udp_port})")
    for d in _directions(direction):
        with map_value(_link(lab, host, d), create=True) as value:
            assert value is not None
            value.set("<I", ebpf.BURST_PORT, socket.htons(udp_port or 0))
            value.set("<q", ebpf.BURST, count)


def counters(lab: Lab, host: str | Host, direction: str = "in") -> LinkCounters:
    """Packets seen, dropped, duplicated so far by the eBPF stage of one direction ("in" or "out")."""
    with map_value(_link(lab, host, _one_direction(direction)), create=False) as value:
        if value is None:
            return LinkCounters()
        return LinkCounters(
            seen=value.get("<Q", ebpf.SEEN),
            dropped=value.get("<Q", ebpf.DROPPED),
            burst_dropped=value.get("<Q", ebpf.BURST_DROPPED),
            burst_left=max(0, value.get("<q", ebpf.BURST)),
            duplicated=value.get("<Q", ebpf.DUPLICATED),
            partitioned=bool(value.get("<I", ebpf.PARTITION)),
        )


def wait_burst(lab: Lab, host: str | Host, timeout: float = 10.0, direction: str = "in") -> LinkCounters:
    """Wait until the :func:`drop_next` budget is used up; TimeoutError if traffic did not consume it in time.

    The kernel has no event for this, so the counter is read every 5 ms (bounded by ``timeout``).
    """
    deadline = time.monotonic() + timeout
    with map_value(_link(lab, host, _one_direction(direction)), create=False) as value:
        if value is None:
            raise LabError(f"no drop_next budget on {host}: call drop_next() first")
        while (left := value.get("<q", ebpf.BURST)) > 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{left} packets of the drop_next budget on {host} still to drop after {timeout} s")
            time.sleep(0.005)
    return counters(lab, host, direction)


def summary(lab: Lab, host: str | Host) -> str:
    """One line for ``netlab status``: each direction's impairment and whether the host is partitioned."""
    parts = []
    for d in DIRECTIONS:
        imp = current(lab, host, d)
        if imp is not None:
            parts.append(f"{d}: {imp.describe()}")
    if counters(lab, host, "in").partitioned:
        parts.append("PARTITIONED")
    return "; ".join(parts)
