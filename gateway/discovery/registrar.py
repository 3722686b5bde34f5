"""The directory beyond one subnet: a gateway or replay sidecar keeps its announcements in etcd, on a thread.

Multicast announcements (gateway.discovery.announcer) reach one LAN. With `--etcd`, a node also writes, for each
stream it serves, the announcement of that one stream (the same bytes a LAN listener hears, signed with the
stream key when there is one) at `/zeps/directory/STREAM/ROLE.NODEID` (gateway.wire.announce.etcd_key), bound
to a lease of `ttl_s` seconds that the thread keeps alive. When the node dies its lease ends and its entries go
with it; when it stops cleanly it revokes the lease and they go at once.

A node of a replicated group (docs/ha.md) says the epoch it leads or follows and whether it leads (the
announcement's `epoch` and `leader`): clients publish to the leader of the highest epoch listed.

An entry is written again only when what clients resolve by changes (channels, the copy held and its source,
ingest, sidecar, epoch), or every REFRESH_S for the head it shows: etcd keeps every revision until it is
compacted, so a put per stream per second would grow its history for nothing. A stream the node no longer
serves is deleted.

Threading contract: the owner's event loop calls `register(now, streams)` once `now` reaches `due`; it builds
the entries (cheap, in memory) and hands them over whole under a lock, never waiting on etcd. One registrar
thread makes every etcd request, each bounded by the client's timeout (ttl_s / 3). While etcd is unreachable
it logs once and retries every renewal interval; if the lease lapsed meanwhile it takes a new one and writes
every entry again.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
from collections.abc import Sequence

from gateway.discovery.announcer import Discovery, advertised
from gateway.errors import CoordinatorError, McastError
from gateway.mcast import address_of
from gateway.transport.etcd import Etcd
from gateway.transport.send_errors import SendErrors
from gateway.wire import announce as A
from gateway.wire.streamkey import StreamKey

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 3  # like the LAN's: an entry outlives its node by at most about three seconds
REFRESH_S = 30.0


class Registrar:
    """Keeps node `node`'s `role` announcements in etcd at `urls`, one entry per stream."""

    def __init__(
        self,
        urls: Sequence[str],
        role: int,
        node: str,
        *,
        ingest: str = "",
        sidecar: str = "",
        key: StreamKey | None = None,
        ttl_s: int = DEFAULT_TTL_S,
        interval_ms: int = A.DISCOVERY_INTERVAL_MS,
        errors: SendErrors | None = None,
    ) -> None:
        """`errors`: where etcd requests the network refuses are reported."""
        self.role, self.node, self.ingest, self.sidecar, self.key = role, node, ingest, sidecar, key
        self.node_id = random.getrandbits(32)
        self.ttl_s, self.interval_ms = ttl_s, interval_ms
        self._etcd = Etcd(urls, timeout_s=ttl_s / 3, errors=errors)
        self.due = 0.0  # monotonic time the owner calls register() next
        self._made: dict[str, tuple[object, float, bytes]] = {}  # etcd key -> (what it says, when made, value)
        # --- shared with the thread, under _cond ---
        self._cond = threading.Condition()
        self._wanted: dict[str, bytes] = {}  # etcd key -> value: what should be in etcd now, replaced whole
        self._stopping = False
        # --- the thread's ---
        self._lease = 0
        self._written: dict[str, bytes] = {}
        self._unreachable = False
        self._thread = threading.Thread(target=self._run, name=f"registrar-{node}", daemon=True)
        self._thread.start()
        log.info("registering %s %s (%08x) in etcd at %s, lease %d s", A.ROLES[role], node, self.node_id,
                 ",".join(self._etcd.urls), ttl_s)  # fmt: skip

    def register(self, now: float, streams: list[A.StreamAd], *, epoch: int = 0, leader: bool = False) -> None:
        """What the node serves now, and its standing in its group (the owner's loop; never waits): entries
        whose content changed are handed to the thread to write."""
        self.due = now + self.interval_ms / 1000
        made = {}
        for ad in streams:
            key = A.etcd_key(ad.name, self.role, self.node_id)
            says = (ad.channels, ad.copy, ad.source, self.ingest, self.sidecar, epoch, leader)
            before = self._made.get(key)
            if before is not None and before[0] == says and now - before[1] < REFRESH_S:
                made[key] = before
                continue
            ann = A.Announcement(self.role, self.node_id, self.node, (ad,), self.ingest, self.sidecar,
                                 time.time_ns(), self.interval_ms, epoch, leader)  # fmt: skip
            try:
                made[key] = (says, now, ann.encode(self.key))
            except McastError as exc:
                log.warning("stream %s not registered in etcd: %s", ad.name, exc)
        if made.keys() != self._made.keys() or any(made[k][2] != self._made[k][2] for k in made):
            with self._cond:
                self._wanted = {k: value for k, (_, _, value) in made.items()}
                self._cond.notify()
        self._made = made

    def close(self) -> None:
        """Stops; revokes the lease, so the entries go at once (a killed node's go when the lease ends)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()
        if self._lease:
            try:
                self._etcd.revoke(self._lease)
            except CoordinatorError as exc:
                log.warning("etcd directory: entries not removed (%s); they go when the lease ends", exc)

    def _run(self) -> None:
        interval = self.ttl_s / 3
        renew_at = 0.0
        while True:
            with self._cond:
                if self._stopping:
                    return
                wanted = self._wanted
            try:
                now = time.monotonic()
                if self._lease and now >= renew_at:
                    if self._etcd.keepalive(self._lease) <= 0:
                        log.warning("etcd directory: the lease lapsed; registering again")
                        self._lease = 0
                    renew_at = now + interval
                if not self._lease:
                    self._lease = self._etcd.grant(self.ttl_s)
                    self._written = {}
                    renew_at = time.monotonic() + interval
                self._write(wanted)
            except CoordinatorError as exc:
                if not self._unreachable:
                    log.warning("etcd directory: %s (retrying every %.2f s)", exc, interval)
                self._unreachable = True
                renew_at = time.monotonic() + interval
            else:
                if self._unreachable:
                    log.info("etcd directory: etcd at %s answers again", self._etcd.url)
                self._unreachable = False
            with self._cond:
                if not self._stopping and self._wanted is wanted:
                    self._cond.wait(max(0.0, renew_at - time.monotonic()))

    def _write(self, wanted: dict[str, bytes]) -> None:
        for key, value in wanted.items():
            if self._stopping:  # close() waits for this thread: one request more at most, not one per stream
                return
            if self._written.get(key) != value:
                self._etcd.put(key, value, self._lease)
                self._written[key] = value
        for key in [k for k in self._written if k not in wanted]:
            self._etcd.delete(key)
            del self._written[key]


def node_registrar(
    urls: Sequence[str],
    discovery: Discovery,
    interfaces: Sequence[str],
    role: int,
    *,
    ingest: str = "",
    sidecar: str = "",
    key: StreamKey | None = None,
    errors: SendErrors | None = None,
) -> Registrar | None:
    """The registrar of a gateway or sidecar given `--etcd` (None without). A wildcard host in an endpoint
    (tcp://*:5570) is registered as the address of the first of `interfaces` (where the node announces or
    multicasts), else as the host name: give endpoints with a routable address when neither reaches clients."""
    if not urls:
        return None
    host = address_of(interfaces[0]) if interfaces else socket.gethostname()
    return Registrar(urls, role, discovery.node, ingest=advertised(ingest, host), sidecar=advertised(sidecar, host),
                     key=key, interval_ms=discovery.interval_ms or A.DISCOVERY_INTERVAL_MS, errors=errors)  # fmt: skip
