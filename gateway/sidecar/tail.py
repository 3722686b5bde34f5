"""A session's datagram tail (TAIL-UDP): the stream's new journal batches sent as datagrams to the session's peer.

Why: a site mirror across a lossy WAN waits a TCP retransmission (a round trip or 200 ms) for every lost
segment of its subscription; datagrams with redundancy (gateway.wire.tail) repair a single loss with no round
trip. The TCP subscription stays the reliable copy; the mirror merges both by sequence (docs/mirroring.md).

Bounds, so the option cannot be turned into a weapon or a load:
- the datagrams go only to the IP address of the session's own TCP peer (ZeroMQ's Peer-Address), at the UDP
  port the session named: a client can only ask for its own traffic (no reflection, no amplification towards
  a third party), and only while its authenticated session lives (closed with it);
- its own cursor over the committed journal (never waiting for the session's credit or its TCP pipe), from
  the journal's head when asked: the live tail only, never history;
- a token bucket of `TailLimits.rate_bytes` per second (burst `burst_bytes`): a journal batch whose datagrams
  the bucket cannot pay for is not sent (the subscription brings it), so a burst never makes the tail fall
  behind; a batch goes whole or in all its parts, or not at all (the mirror writes only whole batches);
- at most `reads` journal batches per pump: the replay loop's other sessions keep their turn.

`TailSender.pump(now)` is called by the replay loop (gateway.replay) every turn; `next_due` says when its
repeats or parity are due. Threading: the replay loop's thread alone.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass

from gateway.errors import BatchError
from gateway.sidecar.session import Cursor, Journal
from gateway.transport.send_errors import SendErrors
from gateway.transport.token_bucket import TokenBucket
from gateway.transport.udp import DATAGRAM_BYTES
from gateway.wire import batch as B
from gateway.wire import tail as T

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TailLimits:
    rate_bytes: float = 16 * 1024 * 1024  # per session per second: 10,000 records/s with repeat:1 is ~3 MB/s
    burst_bytes: float = 512 * 1024
    reads: int = 64  # journal batches per pump
    datagram_bytes: int = DATAGRAM_BYTES


@dataclass
class TailStats:
    datagrams: int = 0
    bytes: int = 0
    skipped: int = 0  # batches not sent (over the rate, too large a record) and datagrams the socket refused


class TailSender:
    """The tail of one session: `peer` (its TCP peer's IP), `port`, `token`, `redundancy` (module docstring)."""

    def __init__(
        self,
        journal: Journal,
        peer: str,
        port: int,
        token: int,
        redundancy: T.Redundancy,
        now: float,
        limits: TailLimits | None = None,
        errors: SendErrors | None = None,
    ) -> None:
        """`errors`: where sends the network refuses are reported (issue #30: once per episode, counted)."""
        self.limits = limits or TailLimits()
        self.errors = errors
        self.address = (peer, port)
        self.encoder = T.TailEncoder(token, redundancy)
        self.stats = TailStats()
        self._room = self.limits.datagram_bytes - T.HEAD.size
        self._bucket = TokenBucket.full(self.limits.rate_bytes, self.limits.burst_bytes, now)
        self.cursor: Cursor = journal.cursor(journal.last_seq + 1)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setblocking(False)

    @property
    def next_due(self) -> float | None:
        return self.encoder.next_due

    def pump(self, now: float) -> None:
        """Send what the journal has new (up to `reads` batches), then what the encoder has due."""
        self._bucket.refill(now)
        for _ in range(self.limits.reads):
            batch = self.cursor.next_batch()
            if batch is None:
                break
            pieces = self._pieces(batch)
            cost = sum(map(len, pieces)) + len(pieces) * T.HEAD.size
            if not pieces or self._bucket.tokens < cost:  # all of its parts or none: a part alone is never written
                self.stats.skipped += 1
                continue
            for piece in pieces:
                self._send(self.encoder.push(piece, now))
        self._send(self.encoder.due(now))

    def close(self) -> None:
        self.cursor.close()
        self.sock.close()

    def _pieces(self, batch: B.Batch) -> list[bytes]:
        """The batch's data payloads (gateway.wire.tail.pieces); none if it cannot be cut to fit."""
        try:
            return T.pieces(batch, self._room)
        except BatchError:
            return []

    def _send(self, datagrams: list[bytes]) -> None:
        for datagram in datagrams:
            self._bucket.tokens -= len(datagram)
            try:
                self.sock.sendto(datagram, self.address)
            except OSError as exc:  # buffer full, no route: as if lost; the subscription carries the records
                self.stats.skipped += 1
                if self.errors:
                    self.errors.refused("tail-datagram", self.address[0], exc, "dropped; the subscription "
                                        "carries those records")  # fmt: skip
                continue
            if self.errors:
                self.errors.sent("tail-datagram", self.address[0])
            self.stats.datagrams += 1
            self.stats.bytes += len(datagram)
