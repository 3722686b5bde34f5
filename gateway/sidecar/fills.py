"""The sidecar's fill port: small re-requests by datagram, answered by unicast datagrams of journal batches.

Why: a udp:// subscriber that fills a gap over TCP waits for TCP's retransmission timer (>= 200 ms) whenever
an answer segment is lost, and every record behind it waits too. Over datagrams a lost answer costs the
subscriber one short timer of its own (gateway.client.datagram_fills). The format is gateway.wire.fill.

Bounds, because a UDP source address can be forged:
- every datagram is decoded strictly; anything malformed, unauthentic, for an unknown stream or for more
  than `max_records` records is dropped and counted, never answered;
- an answer goes only to the source address and port of its request, and holds at most `max_answer_bytes`
  (a forged request makes the sidecar send a victim at most that much);
- each source host has a token bucket of `rate_bytes` per second (burst `burst_bytes`), charged the answer's
  bytes plus `REQUEST_COST` per request; a request finding the bucket empty is dropped and counted. So a
  forger flooding one victim gets it `rate_bytes`/s at most; `max_sources` buckets are kept (the least
  recently used one is forgotten);
- with a stream key, requests must carry its tag and answers carry one (the subscriber checks them), so only
  holders of the key are answered at all.
The answers hold the journal's bytes: a journal batch that fits one datagram is sent as it is; a larger one
is cut to the range asked for and split to fit (`Batch.part`, `Batch.split`), record bytes copied as they are.

Finding the range: gaps are asked for near the journal's head and in rising order, so the cursor that answered
a stream's last request is kept open where it stopped and the next request at or beyond that point goes on
from there (`Cursor.skip_to`), passing over only the batches journaled since. A cursor opened afresh starts
at the segment's index entry before the range, up to `index_interval` (64 KiB) of batches back: hundreds of
one-record batches, each header read in Python, were most of an answer's time (docs/benchmarks.md, "The udp://
repair, stage by stage"). A request below that point opens a new cursor; a kept cursor idle for `IDLE_S` is
closed (`forget_idle`), so that it never holds a segment retention deleted.

`FillAnswerer` holds the rules without a socket (a datagram, its source and `now` in, the datagrams to send out);
`FillPort` owns the socket, and the replay loop (gateway.replay) calls `serve` when it is readable.
"""

from __future__ import annotations

import logging
import socket
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import Counter

from gateway.errors import FillError, JournalError, JournalTrimmed, NotAJournal, ProtocolError
from gateway.journal import Cursor, JournalReader
from gateway.transport.send_errors import SendErrors
from gateway.transport.token_bucket import TokenBucket
from gateway.transport.udp import DATAGRAM_BYTES, MAX_DATAGRAM
from gateway.wire import batch as B
from gateway.wire import fill as F
from gateway.wire.protocol import validate_stream_name
from gateway.wire.streamkey import StreamKey

log = logging.getLogger(__name__)

REQUEST_COST = 256  # bytes charged to a source per request, answered or not: bounds the work junk can cost
MAX_READERS = 1024  # streams whose journal readers are kept open between requests
MAX_CURSORS = 64  # streams whose last answer's cursor is kept open (a descriptor each) for the next request
IDLE_S = 1.0  # a kept cursor unused this long is closed


@dataclass(frozen=True)
class FillLimits:
    """What one request, and one source host, may get."""

    max_records: int = 1024  # larger requests are dropped: they belong on TCP (FETCH)
    max_answer_bytes: int = 16 * 1024  # datagram bytes per request, at most
    rate_bytes: float = 2 * 1024 * 1024  # per source host per second
    burst_bytes: float = 128 * 1024
    max_sources: int = 4096
    datagram_bytes: int = DATAGRAM_BYTES  # answers are cut to fit this (a 1,500-byte MTU by default)

    def __post_init__(self) -> None:
        if not 1 <= self.max_records <= F.MAX_COUNT:
            raise ValueError(f"fill max_records must be 1..{F.MAX_COUNT}")
        if min(self.max_answer_bytes, self.rate_bytes, self.burst_bytes, self.max_sources) <= 0:
            raise ValueError("fill limits must be positive")
        if not 256 <= self.datagram_bytes <= MAX_DATAGRAM:
            raise ValueError(f"fill datagram_bytes must be 256..{MAX_DATAGRAM}")


DROP_REASONS = ("malformed", "range", "rate", "stream", "journal", "send")


@dataclass
class FillStats:
    """What the fill port did; `dropped` by reason (DROP_REASONS): a malformed or unauthentic datagram, a range
    over max_records, a source over its rate, an unknown stream, a range the journal could not read, an answer
    the socket refused. With `exported`, the sidecar's Prometheus counters move too."""

    requests: int = 0
    answered: int = 0  # requests that got at least one datagram
    skipped: int = 0  # journal batches passed over by header to reach the ranges asked (the search's cost)
    resumed: int = 0  # requests answered by the cursor the stream's last answer left open
    datagrams: int = 0
    bytes: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    exported: tuple[Counter, Counter] | None = None  # (datagrams sent, dropped by reason)

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
        if self.exported is not None:
            self.exported[1].labels(reason).inc()

    def sent(self, datagrams: int, nbytes: int) -> None:
        self.answered += 1
        self.datagrams += datagrams
        self.bytes += nbytes
        if self.exported is not None:
            self.exported[0].inc(datagrams)


class FillAnswerer:
    """No sockets: `answer(datagram, source host, now)` -> the datagrams to send back (read from the journal)."""

    def __init__(self, journal: Path, limits: FillLimits, key: StreamKey | None = None) -> None:
        self.journal = journal
        self.limits = limits
        self.key = key
        self.keys = {key.id: key} if key is not None else None
        self.stats = FillStats()
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self._readers: OrderedDict[str, JournalReader] = OrderedDict()
        self._cursors: OrderedDict[str, tuple[Cursor, float]] = OrderedDict()  # stream: (cursor, last used)
        self._room = limits.datagram_bytes - F.answer_bytes(0, key)

    def answer(self, data: bytes, host: str, now: float) -> list[bytes]:
        self.stats.requests += 1
        try:
            req = F.decode_request(data, self.keys)
        except FillError:
            self.stats.drop("malformed")
            return []
        if req.count > self.limits.max_records:
            self.stats.drop("range")
            return []
        if not self._take(host, REQUEST_COST, now):
            self.stats.drop("rate")
            return []
        reader = self._reader(req.stream)
        if reader is None:
            self.stats.drop("stream")
            return []
        budget = min(self.limits.max_answer_bytes, int(self._buckets[host].tokens))
        try:
            out = self._read(reader, req, budget, now)
        except JournalTrimmed:
            self.stats.drop("journal")  # the subscriber asks TCP, which says TRIMMED
            return []
        except JournalError as exc:
            self.stats.drop("journal")
            log.warning("fill: stream %s: %s", req.stream, exc)
            return []
        sent = sum(len(d) for d in out)
        self._buckets[host].tokens -= sent
        if out:
            self.stats.sent(len(out), sent)
        return out

    def close(self) -> None:
        """Close the cursors kept for the next requests."""
        while self._cursors:
            self._cursors.popitem()[1][0].close()

    def forget_idle(self, now: float) -> None:
        """Close the kept cursors unused for `IDLE_S` (module docstring)."""
        for stream, (cursor, used) in list(self._cursors.items()):
            if now - used >= IDLE_S:
                del self._cursors[stream]
                cursor.close()

    def _read(self, reader: JournalReader, req: F.FillRequest, budget: int, now: float) -> list[bytes]:
        """The answer's datagrams; the cursor that read them is kept for the stream's next request."""
        cursor = self._cursor(req.stream, reader, req.first)
        try:
            skipped = cursor.batches_skipped
            out = list(self._datagrams(cursor, req, budget))
        except BaseException:
            cursor.close()
            raise
        self.stats.skipped += cursor.batches_skipped - skipped
        self._keep(req.stream, cursor, now)
        return out

    def _cursor(self, stream: str, reader: JournalReader, first: int) -> Cursor:
        """A cursor that returns the batch holding `first` next: the stream's kept one if it stands at or
        before it, else a new one (module docstring)."""
        kept = self._cursors.pop(stream, None)
        if kept is not None:
            cursor = kept[0]
            if cursor.next_seq <= first:
                cursor.skip_to(first)
                self.stats.resumed += 1
                return cursor
            cursor.close()
        return reader.cursor(first)

    def _keep(self, stream: str, cursor: Cursor, now: float) -> None:
        self._cursors[stream] = (cursor, now)
        if len(self._cursors) > MAX_CURSORS:
            self._cursors.popitem(last=False)[1][0].close()

    def _datagrams(self, cursor: Cursor, req: F.FillRequest, budget: int) -> Iterator[bytes]:
        """Answer datagrams for the journal's batches of req.first..req.last, up to `budget` bytes, read with
        `cursor` (which stands before req.first)."""
        stream = req.stream.encode()
        while budget > 0:
            batch = cursor.next_batch()
            if batch is None or batch.first_seq > req.last:
                return
            for piece in self._pieces(batch, max(req.first, batch.first_seq), min(req.last, batch.last_seq)):
                datagram = F.encode_answer(req.request_id, piece, stream, self.key)
                if len(datagram) > budget or len(datagram) > MAX_DATAGRAM:
                    return
                budget -= len(datagram)
                yield datagram
            if batch.last_seq >= req.last:
                return

    def _pieces(self, batch: B.Batch, lo: int, hi: int) -> Iterator[bytes | memoryview]:
        """The batch as it is when it fits a datagram, else lo..hi of it in parts that fit."""
        if batch.nbytes <= self._room:
            yield batch.buf
            return
        part = batch
        if (lo, hi) != (batch.first_seq, batch.last_seq):
            part = B.Batch.parse(batch.part(lo, hi), check_crc=False)
        for _, piece in part.split(self._room):
            yield piece

    def _take(self, host: str, cost: float, now: float) -> bool:
        """Refill the host's bucket and charge `cost`; False (nothing charged) when it holds less."""
        limits, buckets = self.limits, self._buckets
        bucket = buckets.get(host)
        if bucket is None:
            bucket = buckets[host] = TokenBucket.full(limits.rate_bytes, limits.burst_bytes, now)
            if len(buckets) > limits.max_sources:
                buckets.popitem(last=False)
        else:
            buckets.move_to_end(host)
            bucket.refill(now)
        if bucket.tokens < cost:
            return False
        bucket.tokens -= cost
        return True

    def _reader(self, stream: str) -> JournalReader | None:
        reader = self._readers.get(stream)
        if reader is not None:
            return reader
        try:
            validate_stream_name(stream)
            reader = JournalReader(self.journal, stream, committed=True)
        except (ProtocolError, ValueError, NotAJournal, OSError):
            return None
        self._readers[stream] = reader
        if len(self._readers) > MAX_READERS:
            self._readers.popitem(last=False)
        return reader


class FillPort:
    """The fill port's socket: non-blocking, answered from the replay loop (one thread, like the ROUTER)."""

    def __init__(
        self, host: str, port: int, answerer: FillAnswerer, *, rcvbuf: int = 1 << 20, errors: SendErrors | None = None
    ) -> None:
        """`errors`: where answers the network refuses are reported (they are dropped and counted either way)."""
        self.answerer, self.errors = answerer, errors
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.bind((host, port))
        self.sock.setblocking(False)
        self.address: tuple[str, int] = self.sock.getsockname()

    def fileno(self) -> int:
        return self.sock.fileno()

    def serve(self, now: float, limit: int = 256) -> None:
        """Answer up to `limit` waiting requests; never blocks (a full socket buffer drops the rest of an answer)."""
        stats = self.answerer.stats
        for _ in range(limit):
            try:
                data, source = self.sock.recvfrom(2048)
            except BlockingIOError:
                return
            except OSError:  # e.g. ICMP port unreachable from an earlier answer: nothing to do
                continue
            for datagram in self.answerer.answer(data, source[0], now):
                try:
                    self.sock.sendto(datagram, source)
                except OSError as exc:  # buffer full, or the source unreachable: the subscriber asks again
                    stats.drop("send")
                    if self.errors:
                        self.errors.refused("fill-answer", source[0], exc, "the rest of that answer is dropped; "
                                            "the subscriber asks again")  # fmt: skip
                    break
                if self.errors:
                    self.errors.sent("fill-answer", source[0])

    def close(self) -> None:
        self.answerer.close()
        self.sock.close()
