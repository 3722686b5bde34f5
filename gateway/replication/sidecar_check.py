"""Whether this node's sidecar answers, asked before each campaign: a node stands for leader only once its journal
is served.

A new leader's followers copy its journal from its sidecar, and subscribers fill their gaps there; a leader whose
sidecar is not listening yet (a node restarted, its gateway up before its `zeps replay`) commits nothing with
`--min-insync 1` or more until it is, and its subscribers cannot fill. So the elector asks this check before
each campaign (gateway.replication.elector's `eligible`): the opening of a replay session (ATTACH to one of the
node's streams, READY) on a connection of its own, made as its followers' copiers make theirs (the group's client
keys, if its sidecars require CURVE). A bare TCP connect would say only that something listens, and a CURVE
sidecar would count and log it as a failed handshake. Processes may start in any order: a node whose sidecar is
not up yet follows, and campaigns at the first election after its sidecar answers. One whose sidecar never comes
up says so once, naming the endpoint, the failure and the fix, and says again when it answers.

Threading contract: called on the elector's thread only (each call one connection, its opening bounded by
`timeout_s`; the client is that thread's alone), and only when the leader key is vacant and the node is in sync:
no cost while a leader holds it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gateway.errors import ReplayError
from gateway.replication.sidecar_race import ReplaySource

log = logging.getLogger(__name__)

PROBE_S = 0.5  # the opening's deadline: a follower's copier gives the leader's sidecar as long (Follower.timeout_s)
SLICE_S = 0.02  # the opening is advanced this often


class SidecarCheck:
    """Whether the sidecar at `endpoint` (the node's --replay-endpoint) answers: `open_client(timeout_s)` makes a
    replay client to it whose opening must end within `timeout_s`."""

    def __init__(self, endpoint: str, open_client: Callable[[float], ReplaySource], timeout_s: float = PROBE_S) -> None:
        self.endpoint = endpoint
        self._open, self._timeout_s = open_client, timeout_s
        self._silent = False  # the last check failed, and that was said

    def __call__(self) -> bool:
        """Whether a replay session with the sidecar opens now (it is closed at once)."""
        try:
            client = self._open(self._timeout_s)
            try:
                while not client.ready:
                    client.recv(SLICE_S)  # advances the opening; raises at its deadline, or on a refusal
            finally:
                client.close()
        except ReplayError as exc:
            if not self._silent:
                self._silent = True
                log.warning(
                    "ha: not standing for leader: this node's sidecar at %s does not answer (%s); its followers and "
                    "subscribers copy and fill from it. Start `zeps replay --journal JOURNAL --bind %s` beside this "
                    "gateway (docs/ha.md); the node follows meanwhile and stands once it answers",
                    self.endpoint,
                    exc,
                    self.endpoint,
                )
            return False
        if self._silent:
            self._silent = False
            log.info("ha: this node's sidecar at %s answers: standing for leader again", self.endpoint)
        return True
