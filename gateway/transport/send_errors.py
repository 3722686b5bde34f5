"""Refused sends: what every socket of every process does when the network refuses a send or a connect.

Why one place: a firewall rule (EPERM), a route removed (ENETUNREACH), a link set down (ENETDOWN), a full
device queue (ENOBUFS), a closed port (ECONNREFUSED) make `send`, `sendto` and `connect` fail at once, where a
packet dropped further on would have gone unseen. Every protocol above already recovers from loss (NAKs, gap
fills from the replay sidecar, requests asked again, connections made again with backoff), so a refused send
is a dropped packet, or a connection to try again: never an exit. The caller drops what it was sending (or
closes the connection it retries) and reports the error here; this class logs one line when an episode starts
(the operation, the socket's endpoint, the errno's name) and one when a send to that endpoint goes through
again, and counts every refusal in `zeps_<process>_send_errors_total{op,errno}`.

An episode is kept per (operation, endpoint): a partition refuses thousands of datagrams a second, and each
would otherwise be a line of log.

Threading contract: one SendErrors may be shared by the threads of a process (a dict update and a counter
increment, each atomic under the GIL); an episode's two lines may then interleave with other log lines.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

log = logging.getLogger(__name__)

# What a partition, a firewall or a full device queue make a send or a connect return (exported at 0 per op).
MAX_EPISODES = 1024  # open at once: the oldest is forgotten past this (endpoints that never come back)
USUAL = ("EPERM", "EACCES", "ENETUNREACH", "EHOSTUNREACH", "ENETDOWN", "ENOBUFS", "ECONNREFUSED")


def errno_name(exc: BaseException) -> str:
    """The symbolic name of the errno of `exc` or of the error it wraps (EPERM), else the name of its type."""
    return describe(exc)[0]


def describe(exc: BaseException) -> tuple[str, str]:
    """(errno name, what it means) of `exc` or of the error it wraps, else (its type's name, its text).
    Libraries wrap the OSError: etcd3gw, requests and urllib3 three deep, urllib3 in `reason`."""
    inner, text = exc, str(exc)
    for _ in range(8):
        code = getattr(inner, "errno", None)
        if isinstance(code, int):
            return errno.errorcode.get(code, str(code)), os.strerror(code)
        text = text or str(inner)  # the outermost that says something
        wrapped = inner.__cause__ or inner.__context__ or getattr(inner, "reason", None)
        if not isinstance(wrapped, BaseException):
            break
        inner = wrapped
    return type(exc).__name__, text or "no reason given"


@dataclass(slots=True)
class _Episode:
    errno: str
    since: float
    count: int = 1


class SendErrors:
    """The refused sends of one process: an episode per (op, endpoint), logged at its start and end, counted."""

    def __init__(self, process: str, ops: Iterable[str], registry: CollectorRegistry | None = None) -> None:
        self.process = process
        self.counter = Counter(
            f"zeps_{process}_send_errors_total",
            "Sends and connects the network refused (dropped, or a connection tried again), by operation and errno",
            ["op", "errno"],
            registry=registry,
        )
        for op in ops:
            for name in USUAL:
                self.counter.labels(op, name)
        self._episodes: dict[tuple[str, str], _Episode] = {}

    def refused(self, op: str, endpoint: str, exc: BaseException, outcome: str = "dropped") -> None:
        """`op` to `endpoint` failed with `exc`: count it; log it (with `outcome`, what the caller does about
        it) if it starts an episode."""
        name, meaning = describe(exc)
        self.counter.labels(op, name).inc()
        episode = self._episodes.get((op, endpoint))
        if episode is not None:
            episode.count += 1
            episode.errno = name
            return
        if len(self._episodes) >= MAX_EPISODES:
            del self._episodes[next(iter(self._episodes))]
        self._episodes[(op, endpoint)] = _Episode(name, time.monotonic())
        log.warning("%s: %s to %s refused (%s: %s): %s; if it lasts, check this host's link, routes and firewall "
                    "(iptables)", self.process, op, endpoint, name, meaning, outcome)  # fmt: skip

    def sent(self, op: str, endpoint: str) -> None:
        """`op` to `endpoint` went through: ends its episode, if one is open (cheap when none is)."""
        if not self._episodes:
            return
        episode = self._episodes.pop((op, endpoint), None)
        if episode is not None:
            log.warning("%s: %s to %s goes through again, after %d refused (last %s) in %.1f s", self.process, op,
                        endpoint, episode.count, episode.errno, time.monotonic() - episode.since)  # fmt: skip

    def open_episodes(self) -> dict[tuple[str, str], str]:
        """(op, endpoint) -> the errno name last seen, for the episodes not yet over."""
        return {key: episode.errno for key, episode in self._episodes.items()}
