"""Partitions made every way a real network is cut, inside one lab host's namespace.

Why several: how a cut-off host looks to its own sockets depends on how it is cut. A DROP or REJECT rule in
OUTPUT makes `send`/`sendto`/`connect` fail at once with EPERM; a route removed gives ENETUNREACH; the link
set down gives ENETUNREACH or ENETDOWN; a rule in INPUT, or netlab's eBPF partition on the wire, are unseen by
the sender (its packets vanish further on). A fault harness that only drops packets misses every crash a
refused send can cause, so it needs all of them:

- ``ebpf``: :func:`netlab.impair.partition` (both directions, on the wire);
- ``drop-in``, ``drop-out``, ``drop-both``, ``reject-in``, ``reject-out``, ``reject-both``: iptables rules on
  the host's interface in INPUT, OUTPUT or both (the filter table of the host's namespace);
- ``route``: the host's routes through its interface removed (the LAN's and multicast's);
- ``link-down``: the host's interface set down (which takes its routes with it).

:func:`cut` undoes what it did when its block ends, however it ends; and all of it lives in the host's
namespace, so it goes with the lab in any case.
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from netlab import ns
from netlab.impair import heal, partition
from netlab.impair.iptables import iptables
from netlab.lab import Host, Lab, LabError

KINDS = ("ebpf", "drop-in", "drop-out", "drop-both", "reject-in", "reject-out", "reject-both", "route", "link-down")
IP_TIMEOUT = 30.0
_CHAINS = {"in": [("INPUT", "-i")], "out": [("OUTPUT", "-o")], "both": [("INPUT", "-i"), ("OUTPUT", "-o")]}


@contextmanager
def cut(lab: Lab, host: str | Host, kind: str) -> Iterator[None]:
    """``host`` cut off the LAN the way ``kind`` says (one of KINDS) for the block; healed when it ends."""
    if kind not in KINDS:
        raise ValueError(f"unknown cut {kind!r}: one of {', '.join(KINDS)}")
    h = lab.host(host)
    undo = _start(lab, h, kind)
    try:
        yield
    finally:
        undo()


def _start(lab: Lab, h: Host, kind: str) -> Callable[[], None]:
    """Cut `h` the `kind` way; returns what heals it."""
    if kind == "ebpf":
        partition(lab, h)
        return functools.partial(heal, lab, h)
    if kind in ("route", "link-down"):
        routes = _ip(h, "-4", "route", "show", "dev", h.ifname).splitlines()
        if kind == "link-down":
            _ip(h, "link", "set", h.ifname, "down")
        else:
            for route in routes:
                _ip(h, "route", "del", *route.split(), "dev", h.ifname)
        return functools.partial(_restore, h, routes)
    verdict, _, where = kind.partition("-")
    argvs = [[chain, flag, h.ifname, "-j", verdict.upper()] for chain, flag in _CHAINS[where]]
    for argv in argvs:
        iptables(h.netns, "-I", *argv, table="filter")
    return functools.partial(_delete_rules, h, argvs)


def _delete_rules(h: Host, argvs: list[list[str]]) -> None:
    for argv in argvs:
        iptables(h.netns, "-D", *argv, table="filter")


def _restore(h: Host, routes: list[str]) -> None:
    """The interface up and every route it had (the kernel restores only the LAN's when the link comes up)."""
    _ip(h, "link", "set", h.ifname, "up")
    for route in routes:
        _ip(h, "route", "replace", *route.split(), "dev", h.ifname)


def _ip(h: Host, *args: str) -> str:
    run = functools.partial(subprocess.run, ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT)
    done = ns.call_in_netns(h.netns, run)
    if done.returncode != 0:
        raise LabError(f"ip {' '.join(args)} failed in {h.netns}: {done.stderr.strip()}")
    return str(done.stdout)
