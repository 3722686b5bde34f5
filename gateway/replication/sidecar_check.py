"""Whether this node's sidecar answers, asked before each campaign: a node stands for leader only once its journal
is served.

A new leader's followers copy its journal from its sidecar, and subscribers fill their gaps there; a leader whose
sidecar is not listening yet (a node restarted, its gateway up before its `zeps replay`) commits nothing with
`--min-insync 1` or more until it is, and its subscribers cannot fill. So the elector asks this check before
each campaign (gateway.replication.elector's `eligible`): a TCP connect to the sidecar's endpoint, which its
listening socket takes as soon as the process bound it. Processes may start in any order: a node whose sidecar
is not up yet follows, and campaigns at the first election after its sidecar answers. One whose sidecar never
comes up says so once, naming the endpoint and the fix, and says again when it answers.

Threading contract: called on the elector's thread only (each call one connect, bounded by `timeout_s`), and
only when the leader key is vacant: no cost while a leader holds it.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

PROBE_S = 0.2  # the sidecar is on the node's own host as a rule: a connect there takes a millisecond
WILDCARDS = ("0.0.0.0", "*", "::", "")


class Closable(Protocol):
    def close(self) -> None: ...


Connect = Callable[[tuple[str, int], float], Closable]  # socket.create_connection's shape


class SidecarCheck:
    """Whether the sidecar at `endpoint` (tcp://HOST:PORT, the node's --replay-endpoint) takes a connection."""

    def __init__(self, endpoint: str, timeout_s: float = PROBE_S, connect: Connect = socket.create_connection) -> None:
        url = urlsplit(endpoint)
        host = url.hostname or ""
        self.endpoint = endpoint
        self._address = ("127.0.0.1" if host in WILDCARDS else host, url.port or 0)
        self._timeout_s, self._connect = timeout_s, connect
        self._silent = False  # the last check failed, and that was said

    def __call__(self) -> bool:
        """Whether the sidecar takes a connection now (the connection is closed at once)."""
        try:
            self._connect(self._address, self._timeout_s).close()
        except OSError as exc:
            if not self._silent:
                self._silent = True
                log.warning(
                    "ha: not standing for leader: this node's sidecar at %s does not answer (%s); its followers and "
                    "subscribers copy and fill from it. Start `zeps replay --journal JOURNAL --bind %s` beside this "
                    "gateway (docs/ha.md); the node follows meanwhile and stands once it answers",
                    self.endpoint,
                    exc.strerror or type(exc).__name__,
                    self.endpoint,
                )
            return False
        if self._silent:
            self._silent = False
            log.info("ha: this node's sidecar at %s answers: standing for leader again", self.endpoint)
        return True
