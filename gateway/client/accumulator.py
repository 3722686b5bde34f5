"""The Publisher's accumulator: records in from the application, batches out to the IO thread, the buffer budget.

Smart batching, as in Aeron's publications and the LMAX Disruptor: the IO thread takes whatever is queued when it
is free (cut into batches of at most `batch_records` records and `batch_bytes` bytes) and never waits on a timer.
A lone record leaves at once; while the IO thread encodes and sends one batch, what the application publishes
meanwhile queues behind it and leaves as the next batch. Latency falls as load falls, batches grow as load
rises. `linger_s` > 0 adds Kafka's linger as an upper bound for those who want fuller batches at moderate load:
a partial batch then waits at most that long after its oldest record for others to join it.

Checks (`record`, `records`): a record is checked before it is queued, so a bad call raises there (TypeError for a
wrong type, ValueError for a wrong value, both `BadRecord`) and never harms what is queued.

Threading contract: the application thread alone calls `add`, `extend` and `over_budget` (and only it appends to
the queue, whose appends and pops are atomic: no lock per record); the IO thread alone calls `take`, `put_back`,
`due` and `release`, under `cond` where it writes what the application reads (`taken`, `released_bytes`).
"""

from __future__ import annotations

import math
import operator
import threading
import time
from collections import deque
from collections.abc import Sequence
from itertools import repeat

from gateway.errors import BadRecord, BadRecordType
from gateway.wire import batch as B
from gateway.wire import record_loops as loops

Record = tuple[int, bytes, bytes, int]  # (ts_ns, key, body, ttl_ms)
Taken = tuple[list[Record], int, bool]  # records, their keys' and bodies' bytes, whether one has a TTL
Body = bytes | bytearray | memoryview


class Accumulator:
    def __init__(
        self,
        cond: threading.Condition,
        *,
        batch_records: int,
        batch_bytes: int,
        buffer_bytes: int,
        linger_s: float,
        max_message_bytes: int,
    ) -> None:
        self.cond = cond
        self.batch_records = batch_records
        self.batch_bytes = batch_bytes
        self.buffer_bytes = buffer_bytes
        self.linger_s = linger_s
        self.max_message_bytes = max_message_bytes
        self.queue: deque[Record] = deque()
        self.queued_bytes = 0  # keys and bodies ever queued; written by the application only
        self._wake_at = batch_bytes  # with a linger, the IO thread is woken at each batch's worth queued
        # --- written by the IO thread under cond ---
        self.taken = 0  # records taken from the queue
        self.taken_bytes = 0  # their keys and bodies
        self.released_bytes = 0  # of those, confirmed (or sent, without confirms): the budget is queued - released
        self._due: float | None = None  # with a linger: when the queue's oldest record must leave

    # --- the application's side ---------------------------------------------------------------------

    @property
    def accepted(self) -> int:
        """Records taken in (queued or taken by the IO thread)."""
        with self.cond:
            return self.taken + len(self.queue)

    @property
    def unreleased(self) -> int:
        return self.queued_bytes - self.released_bytes

    def over_budget(self, nbytes: int) -> bool:
        return self.queued_bytes + nbytes - self.released_bytes > self.buffer_bytes

    def add(self, kb: bytes, data: bytes, ttl_ms: int) -> bool | None:
        """Queue one checked record: whether the IO thread must be woken for it; None (nothing queued) if the
        budget has no room for it."""
        queued = self.queued_bytes + len(kb) + len(data)
        if queued - self.released_bytes > self.buffer_bytes:
            return None
        queue = self.queue
        queue.append((time.time_ns(), kb, data, ttl_ms))
        self.queued_bytes = queued
        if queued >= self._wake_at or len(queue) == 1:  # a batch's worth more, or the IO thread may be idle
            self._wake_at = queued + self.batch_bytes
            return True
        return False

    def extend(self, keys: list[bytes], bodies: Sequence[bytes], payload: int) -> bool:
        """Queue checked records (the budget checked by the caller), all stamped now; whether the IO thread
        must be woken."""
        queue = self.queue
        queue.extend(zip(repeat(time.time_ns()), keys, bodies, repeat(0)))  # one loop in C, no Python per record
        self.queued_bytes += payload
        self._wake_at = self.queued_bytes + self.batch_bytes
        return True

    def record(self, key: str, body: Body, ttl: float | None) -> tuple[bytes, bytes, int]:
        """The record as the batch format takes it, or BadRecord naming the value and the fix. (publish() checks
        the common case, a short ASCII str key and a bytes body, inline.)"""
        if not isinstance(key, str):
            raise BadRecordType(f"key {key!r} is a {type(key).__name__}: pass a str (it is sent as UTF-8)")
        kb = key.encode(errors="strict") if key.isascii() else _utf8(key)
        if len(kb) > B.MAX_KEY:
            raise BadRecord(f"key {key[:40]!r}... is {len(kb)} bytes in UTF-8, the limit is {B.MAX_KEY}: shorten it")
        if isinstance(body, bytes):
            data = body
        elif isinstance(body, bytearray | memoryview):
            data = bytes(body)  # a copy: the caller may change its buffer once publish() returns
        else:
            raise BadRecordType(
                f"body {body!r:.40} is a {type(body).__name__}: pass bytes (e.g. text.encode()); nothing was queued"
            )
        if len(kb) + len(data) > self.max_message_bytes:
            raise BadRecord(
                f"key and body of {len(kb) + len(data)} bytes are over the gateway's limit of "
                f"{self.max_message_bytes} (max_message_bytes, the gateway's --max-message-bytes): split the body, "
                "or raise both"
            )
        return kb, data, _ttl_ms(ttl)

    def records(self, keys: Sequence[str], bodies: Sequence[bytes]) -> tuple[list[bytes], Sequence[bytes], int]:
        """Many records as the batch format takes them (keys encoded), and their bytes; BadRecord naming the
        first bad one. Records of str keys and bytes bodies are checked with loops in C, the others one by one."""
        if len(keys) != len(bodies):
            raise BadRecord(f"{len(keys)} keys but {len(bodies)} bodies: pass one body per key")
        if set(map(type, keys)) <= {str} and set(map(type, bodies)) <= {bytes}:
            try:
                kbs = list(map(str.encode, keys))
            except UnicodeEncodeError:
                pass  # named below
            else:
                klens, blens = list(map(len, kbs)), list(map(len, bodies))
                if max(klens, default=0) <= B.MAX_KEY and max(map(operator.add, klens, blens), default=0) <= (
                    self.max_message_bytes
                ):
                    return kbs, bodies, sum(klens) + sum(blens)
        kbs, data, payload = [], [], 0
        for i, (key, body) in enumerate(zip(keys, bodies, strict=True)):
            try:
                kb, value, _ = self.record(key, body, None)
            except BadRecord as exc:
                raise type(exc)(f"record {i}: {exc.reason}") from None
            kbs.append(kb)
            data.append(value)
            payload += len(kb) + len(value)
        return kbs, data, payload

    # --- the IO thread's side -----------------------------------------------------------------------

    def take(self, now: float, hurry: bool) -> list[Taken]:
        """What is due: everything queued, in batches (with a linger: full batches, and the rest once its oldest
        record has waited `linger_s`, or at once when `hurry`: flush() and close())."""
        queue, batches = self.queue, []
        with self.cond:
            while queue:
                if self.linger_s and not hurry and not self._full():
                    if self._due is None:
                        self._due = self._deadline(now, queue[0][0])
                    if now < self._due:
                        break
                records, payload, ttl = loops.take(queue, self.batch_records, self.batch_bytes)
                self.taken += len(records)
                self.taken_bytes += payload
                self._due = None
                batches.append((records, payload, ttl))
        return batches

    def put_back(self, batches: list[Taken]) -> None:
        """Return batches taken but not handed over (the session left READY while they waited) to the front of
        the queue, in their order: they leave first after the next attach."""
        with self.cond:
            for records, payload, _ in reversed(batches):
                self.queue.extendleft(reversed(records))
                self.taken -= len(records)
                self.taken_bytes -= payload
            self._due = None

    def due(self, now: float) -> float | None:
        """Seconds until take() has something to give (None: the queue is empty)."""
        if not self.queue:
            return None
        return 0.0 if self._due is None else max(0.0, self._due - now)

    def release(self, nbytes: int) -> None:
        with self.cond:
            self.released_bytes += nbytes

    def _full(self) -> bool:
        return self.queued_bytes - self.taken_bytes >= self.batch_bytes or len(self.queue) >= self.batch_records

    def _deadline(self, now: float, ts_ns: int) -> float:
        """The monotonic time by which a record queued at wall-clock `ts_ns` must leave: `linger_s` after it,
        never later than `linger_s` from now (a clock stepped back cannot hold it)."""
        age = (time.time_ns() - ts_ns) / 1e9
        return now + self.linger_s - min(max(age, 0.0), self.linger_s)


def _utf8(key: str) -> bytes:
    try:
        return key.encode()
    except UnicodeEncodeError as exc:
        raise BadRecord(f"key {key!r} is not valid UTF-8 ({exc.reason} at {exc.start}): fix the key") from None


def _ttl_ms(ttl: float | None) -> int:
    """A TTL in seconds as the batch format's ttl_ms (0: none)."""
    if ttl is None:
        return 0
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise BadRecordType(f"ttl {ttl!r} must be a number of seconds (None: no TTL)")
    if not math.isfinite(ttl):
        raise BadRecord(f"ttl {ttl!r} must be a number of seconds (None: no TTL)")
    ms = math.ceil(ttl * 1000)
    if not 0 < ms <= B.MAX_TTL_MS:
        raise BadRecord(f"ttl {ttl!r} s is outside 0.001..{B.MAX_TTL_MS // 1000} s (None: no TTL)")
    return ms
