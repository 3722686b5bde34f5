"""`DatagramFills`: a subscriber's gap fills by datagram, hedged on a timer, escalated to TCP FETCH.

The reconciler asks for a bounded range (`Request`); the subscriber hands a small one to `ask` instead of
sending FETCH: one re-request datagram to the sidecar's fill port (gateway.wire.fill), answered by unicast
datagrams of record batches, which `receive` returns as (request id, batch) for the reconciler in the order
FETCH answers have: contiguous. Datagrams are not: one lost or late leaves a hole, and the reconciler would
take a batch beyond it for a range the journal lacks (a Loss). So a batch beyond the first sequence still
missing is held (`MAX_EARLY` per range) until the hole is filled, and an answer to no range asked here
(repeated, late, after the range went to TCP) is returned under `STALE`, an id the reconciler never issues:
it is then used only where it continues the stream. Whatever is lost on the way, request or answer, is asked
for again after a short timer, from the first sequence still missing; after `tries` datagrams without
progress the range is handed back (`expire`) for the subscriber to FETCH over TCP under the same request id:
the fallback when the fill port is off, unreachable or its answers keep being lost. Datagrams keep asking
alongside the FETCH (up to `tries` more), so a sidecar that was only slow (a loaded machine) still answers
first, and a TCP answer delayed by a retransmission does not hold the range. The reconciler never knows
which path carried an answer: both are contiguous from where its request stood, and its own progress
timeout (seconds) stays the backstop for both.

A fill port that answers nothing (off, an older sidecar, a firewall) must not cost every fill its tries:
after `SILENT_RANGES` ranges in a row went to TCP with no answer datagram in between, ranges go to TCP at
once, and one datagram per `PROBE_S` (sent alongside the FETCH) looks whether the port answers again.

The timer follows the measured round trip (Karn's rule: only answers to a first datagram are samples):
srtt + 4 x rttvar, within `MIN_WAIT_S`..`MAX_WAIT_S`, `FIRST_WAIT_S` before the first sample.

`FillHedge` holds those rules, sans-IO: calls with `now` in, requests to send (`outbox`), answers to hand
on and ranges to FETCH out. `DatagramFills` is its socket: non-blocking, so a send refused by a full buffer
counts as a lost datagram; only datagrams from the sidecar's address are read, and only answers that decode
(with a stream key: that carry its tag) are used, the rest counted in `rejected`. Threading: one thread,
the subscriber's poll loop.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from gateway.errors import FillError
from gateway.transport.send_errors import SendErrors
from gateway.transport.udp import MAX_DATAGRAM
from gateway.wire import batch as B
from gateway.wire import fill as F
from gateway.wire.streamkey import StreamKey

FIRST_WAIT_S = 0.01
MIN_WAIT_S = 0.002
MAX_WAIT_S = 0.05
TRIES = 4  # datagrams per range without progress before TCP takes it
MAX_RECORDS = 256  # larger ranges go to TCP at once
SILENT_RANGES = 2
MAX_EARLY = 64  # batches held per range while an earlier one is missing
STALE = 0  # the request id of answers to no range asked here (the reconciler's ids start at 1)
PROBE_S = 1.0


@dataclass(slots=True)
class _Ask:
    lo: int  # the first sequence still missing
    hi: int
    tries: int
    sent_at: float
    due: float
    early: list[B.Batch] = field(default_factory=list)  # beyond a hole at `lo`
    escalated: bool = False  # FETCHed over TCP too


@dataclass
class DatagramStats:
    requests: int = 0  # datagrams sent (first tries and repeats)
    repeats: int = 0
    answers: int = 0  # answer datagrams used
    escalated: int = 0  # ranges handed to TCP
    probes: int = 0  # datagrams sent alongside a FETCH while the port seemed silent
    rejected: int = 0  # datagrams dropped: not from the sidecar, malformed, or failing the stream key


class FillHedge:
    """The ranges asked for by datagram, their timers and what has come of them; sans-IO (module docstring).

    Requests to send collect in `outbox`, for the IO shell to send (and clear) after each call.
    """

    def __init__(self, stream: str, *, tries: int = TRIES, max_records: int = MAX_RECORDS) -> None:
        if tries < 1 or not 1 <= max_records <= F.MAX_COUNT:
            raise ValueError(f"datagram fills: tries >= 1 and max_records within 1..{F.MAX_COUNT}")
        self.stream = stream
        self.tries = tries
        self.max_records = max_records
        self.stats = DatagramStats()
        self.asks: dict[int, _Ask] = {}
        self.outbox: list[F.FillRequest] = []
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.unanswered = 0  # ranges handed to TCP since the last answer datagram
        self._probe_at = 0.0

    @property
    def wait(self) -> float:
        """How long a datagram's answer may take before it is asked for again."""
        if self.srtt is None:
            return FIRST_WAIT_S
        return min(MAX_WAIT_S, max(MIN_WAIT_S, self.srtt + 4 * self.rttvar))

    @property
    def silent(self) -> bool:
        """The fill port has left the last ranges unanswered: TCP takes them at once."""
        return self.unanswered >= SILENT_RANGES

    def ask(self, request_id: int, lo: int, hi: int, now: float) -> bool:
        """Ask for lo..hi by datagram; False if the range is too large for datagrams or the port is silent
        (FETCH it)."""
        if hi - lo + 1 > self.max_records or request_id > F.MAX_REQUEST_ID:
            return False
        ask = _Ask(lo, hi, 0, now, now)
        if self.silent:
            if now >= self._probe_at:  # an answer to it is used like any other, and ends the silence
                self._probe_at = now + PROBE_S
                self.stats.probes += 1
                self._send(request_id, ask, now)
            return False
        self.asks[request_id] = ask
        self._send(request_id, ask, now)
        return True

    def cancel(self, request_id: int) -> None:
        self.asks.pop(request_id, None)

    def clear(self) -> None:
        """Forget every range (the reconciler voided its requests)."""
        self.asks.clear()

    def next_due(self) -> float | None:
        return min((a.due for a in self.asks.values()), default=None)

    def answered(self, rid: int, batch: B.Batch, now: float) -> list[tuple[int, B.Batch]]:
        """An answer datagram's batch: what to hand the reconciler now, as (request id, batch), in order."""
        self.stats.answers += 1
        self.unanswered = 0
        ask = self.asks.get(rid)
        if ask is None:
            return [(STALE, batch)]
        if batch.first_seq > ask.lo:
            if len(ask.early) < MAX_EARLY:
                ask.early.append(batch)
            return []
        if batch.last_seq < ask.lo:
            return []
        if ask.tries == 1:
            self._sample(now - ask.sent_at)
        out: list[tuple[int, B.Batch]] = []
        while True:  # hand it out, then the held ones it makes contiguous
            out.append((rid, batch))
            ask.lo = batch.last_seq + 1
            ask.tries = 0  # progress: the remainder gets a full set of tries
            ask.due = now + self.wait
            if ask.lo > ask.hi:
                del self.asks[rid]
                return out
            usable = [b for b in ask.early if b.first_seq <= ask.lo]
            ask.early = [b for b in ask.early if b.first_seq > ask.lo]
            nxt = max((b for b in usable if b.last_seq >= ask.lo), key=lambda b: b.last_seq, default=None)
            if nxt is None:
                return out
            batch = nxt

    def expire(self, now: float, next_seq: int) -> list[tuple[int, int, int]]:
        """Ask again for what is overdue (from `next_seq` at least); the ranges out of tries are returned as
        (request id, lo, hi): FETCH them (datagrams go on asking alongside, up to `tries` more)."""
        escalate: list[tuple[int, int, int]] = []
        for rid, ask in list(self.asks.items()):
            if ask.due > now:
                continue
            ask.lo = max(ask.lo, next_seq)
            if ask.lo > ask.hi:
                del self.asks[rid]
            elif ask.tries >= self.tries and not ask.escalated:
                ask.escalated = True
                self.stats.escalated += 1
                self.unanswered += 1
                escalate.append((rid, ask.lo, ask.hi))
                self._send(rid, ask, now)
            elif ask.tries >= 2 * self.tries:
                del self.asks[rid]  # TCP has it
            else:
                self.stats.repeats += 1
                self._send(rid, ask, now)
        return escalate

    def _send(self, rid: int, ask: _Ask, now: float) -> None:
        ask.tries += 1
        ask.sent_at, ask.due = now, now + self.wait * ask.tries  # later tries wait longer: a busy sidecar
        self.outbox.append(F.FillRequest(rid, self.stream, ask.lo, ask.hi - ask.lo + 1))
        self.stats.requests += 1

    def _sample(self, rtt: float) -> None:
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt


class DatagramFills:
    """`FillHedge` with its socket, for one stream and one sidecar; see the module docstring."""

    def __init__(
        self,
        sidecar: tuple[str, int],
        stream: str,
        *,
        keys: dict[int, StreamKey] | None = None,
        tries: int = TRIES,
        max_records: int = MAX_RECORDS,
        rcvbuf: int = 1 << 20,
        errors: SendErrors | None = None,
    ) -> None:
        """`errors`: where requests the network refuses are reported (they count as lost either way)."""
        self.errors = errors
        self.hedge = FillHedge(stream, tries=tries, max_records=max_records)
        self.sidecar = sidecar
        self.name = stream.encode()
        self.keys = keys or None
        self.sign = next(iter(keys.values())) if keys else None  # the newest key held signs (the first given)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    @property
    def stats(self) -> DatagramStats:
        return self.hedge.stats

    def ask(self, request_id: int, lo: int, hi: int, now: float) -> bool:
        """`FillHedge.ask`, its datagram sent."""
        asked = self.hedge.ask(request_id, lo, hi, now)
        self._flush()
        return asked

    def expire(self, now: float, next_seq: int) -> list[tuple[int, int, int]]:
        """`FillHedge.expire`, its datagrams sent."""
        escalate = self.hedge.expire(now, next_seq)
        self._flush()
        return escalate

    def receive(self, now: float, limit: int = 256) -> list[tuple[int, B.Batch]]:
        """The answers that have arrived, as `FillHedge.answered` hands them on."""
        out: list[tuple[int, B.Batch]] = []
        for _ in range(limit):
            try:
                data, source = self.sock.recvfrom(MAX_DATAGRAM)
            except BlockingIOError:
                break
            except OSError:  # ICMP port unreachable for an earlier request: the fill port is closed
                continue
            if source != self.sidecar:
                self.stats.rejected += 1
                continue
            try:
                rid, batch = F.decode_answer(data, self.name, self.keys)
            except FillError:
                self.stats.rejected += 1
                continue
            out += self.hedge.answered(rid, batch, now)
        return out

    def close(self) -> None:
        self.hedge.clear()
        self.sock.close()

    def _flush(self) -> None:
        where = f"{self.sidecar[0]}:{self.sidecar[1]}"
        for request in self.hedge.outbox:
            try:
                self.sock.sendto(F.encode_request(request, self.sign), self.sidecar)
            except OSError as exc:  # buffer full, no route: as if lost on the way; the timer asks again
                if self.errors:
                    self.errors.refused("fill-request", where, exc, "asked again when its timer runs out, or over TCP")
            else:
                if self.errors:
                    self.errors.sent("fill-request", where)
        self.hedge.outbox.clear()
