"""The heads of a mirror's other source sidecars (docs/mirroring.md): how `zeps mirror` leaves a sidecar whose
journal stopped growing for one that holds more.

A replicated source group (docs/ha.md) has a sidecar per node, each serving its node's committed records. When a
node's gateway dies and its sidecar lives on (the gateway process killed, the leader deposed and not restarted),
that sidecar answers as ever but its journal no longer grows: a mirror reading it would wait for good while the
group's new leader goes on. So while it mirrors from one sidecar, the mirror asks every other one its head
(a FETCH beyond any sequence, answered by FETCH-END naming the head) every `probe_s`, each on a session of its own
opened when first needed; a sidecar that cannot be reached is asked again at the next probe on a new session and
meanwhile counts as holding nothing. `ahead(have)` names the one holding the most beyond `have`, if any.

Threading: the mirror's thread alone. Nothing here waits: `poll` takes only what has arrived.
"""

from __future__ import annotations

from collections.abc import Sequence

import zmq

from gateway.client.replay_client import ReplayClient
from gateway.errors import ReplayError
from gateway.transport.curve import CurveClientKeys
from gateway.wire import protocol as P


class SourceHeads:
    """The heads of sidecars `endpoints` of `stream`, asked every `probe_s` (the module docstring)."""

    def __init__(
        self,
        endpoints: Sequence[str],
        stream: str,
        *,
        features: tuple[str, ...],
        probe_s: float,
        timeout_s: float,
        curve: CurveClientKeys | None,
        ctx: zmq.Context,
    ) -> None:
        self.endpoints, self.stream, self.features = tuple(endpoints), stream, features
        self.probe_s, self.timeout_s, self.curve, self.ctx = probe_s, timeout_s, curve, ctx
        self.heads: dict[str, int] = {}  # endpoint -> its head, as last answered
        self._clients: dict[str, ReplayClient] = {}
        self._next_probe = 0.0

    def poll(self, now: float) -> None:
        """Take the answers that have arrived; ask again once `probe_s` has passed since the last asking."""
        ask = now >= self._next_probe
        if ask:
            self._next_probe = now + self.probe_s
        for endpoint in self.endpoints:
            client = self._clients.get(endpoint)
            try:
                if client is None and ask:
                    client = self._clients[endpoint] = ReplayClient(
                        endpoint, self.stream, features=self.features, timeout=self.timeout_s, curve=self.curve,
                        ctx=self.ctx, fail_unreachable=True,
                    )  # fmt: skip
                if client is None:
                    continue
                while (event := client.recv(0)) is not None:
                    if isinstance(event, P.FetchEnd):
                        self.heads[endpoint] = event.last
                if ask:
                    client.fetch_head()
            except ReplayError:  # refused, gone, unreachable: asked afresh next time
                self._drop(endpoint)

    def ahead(self, have: int) -> tuple[str, int] | None:
        """The sidecar holding the most records beyond `have`, and its head; None if none holds more."""
        best = max(self.heads.items(), key=lambda item: item[1], default=None)
        return best if best is not None and best[1] > have else None

    def _drop(self, endpoint: str) -> None:
        self.heads.pop(endpoint, None)
        client = self._clients.pop(endpoint, None)
        if client is not None:
            client.close()

    def close(self) -> None:
        for endpoint in list(self._clients):
            self._drop(endpoint)
