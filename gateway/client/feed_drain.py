"""`FeedDrain`: keeps a subscriber's multicast feeds read whether or not the application is calling.

Why: libzmq 4.3.4's PGM receiver aborts the whole process (`src/pgm_receiver.cpp:131`, SIGABRT) when a
SUB's pipe fills while packets keep coming, and an application may stop calling `next()` for any length of
time. So the feeds always have a reader: whoever holds `lock`.

- The application's thread holds it for the whole of each poll turn (`acquire()` ... `release()`), and reads
  the feeds itself, as it would without a drain: while it keeps calling, the drain costs one uncontended
  lock per turn and nothing per record.
- An IO thread (an "agent", as in Aeron and the ZeroMQ Guide's Clone class) looks every CHECK_S. When the
  lock is free and the application has been away for AWAY_S, or says it is about to await (`away()`, as an
  event loop does), it takes the lock and reads the feeds in slices of SLICE_S, moving every message, as it
  is, into a queue bounded in bytes, and writing a pipe (`fileno()`) when the queue stops being empty.
- Back in a poll turn, the application takes the queue first (`take()`), then reads the feeds again: order
  is kept.

When the queue is full the thread keeps reading and drops what it reads, counting it (`dropped`): the feed
is never left unread, and what was dropped is a gap the reconciler fills from replay, or a lag it catches up
on with replay (docs/reconciler.md), as if the network had lost it. Nothing is lost for the application.

Threading contract: the feed receivers, `queue` and `take()` are used only by the holder of `lock`;
`acquire()`, `release()`, `away()` and `close()` by the application's thread. ZeroMQ sockets may move between
threads across a full memory barrier, which the lock is. A receiver that raises `McastError` (udp:// datagrams
that are no message) has the error queued in the message's place, to be counted by the subscriber.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import zmq

from gateway.errors import McastError, ZepsError
from gateway.transport.pollable import PolledByFd

log = logging.getLogger(__name__)

CHECK_S = 0.01  # how often the thread looks whether the application is away
AWAY_S = 0.02  # the application is away when it has not been in a poll turn for this long
SLICE_S = 0.002  # the thread holds the feeds at most this long at a time (an application coming back waits)
BURST = 256  # messages read from one feed before the thread looks at the others

Message = tuple[str, list[bytes] | McastError]  # (feed name, frames, or the receiver's refusal)


class FeedDrain(PolledByFd):
    """The feeds' second reader, for when the application is away; see the module docstring."""

    def __init__(self, feeds: dict[Any, str], limit_bytes: int, name: str = "zeps-feeds") -> None:
        self.feeds = feeds
        self.limit_bytes = limit_bytes
        self.lock = threading.Lock()  # held by whoever reads the feeds
        self.released_at = time.monotonic()  # when the application last ended a poll turn
        self.queue: deque[Message] = deque()
        self.queued_bytes = 0
        self.dropped = 0  # messages read and dropped because the queue was full
        self.failure: BaseException | None = None  # what ended the thread, if not close()
        self._full = False  # dropping since the application last took: said once per such spell
        self._away = threading.Event()  # the application awaits: take over at once
        self._wanted = False  # the application waits for the lock: the thread lets it have it
        self._stop = False
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def fileno(self) -> int:
        """Readable while messages wait in the queue (for an event loop awaiting them)."""
        return self._wake_r

    # --- the application's thread ---------------------------------------------------------------------------

    def acquire(self) -> None:
        """Start a poll turn: the feeds are the caller's until release() (waits at most SLICE_S)."""
        self._wanted = True
        self.lock.acquire()
        self._wanted = False
        self._away.clear()
        if self.failure is not None:
            self.lock.release()
            raise ZepsError(f"the feed drain thread failed: {self.failure!r}") from self.failure

    def release(self) -> None:
        self.released_at = time.monotonic()
        self.lock.release()

    def away(self) -> None:
        """The application is about to await (not poll) for a while: the thread takes over at once."""
        self._away.set()

    def take(self, limit: int) -> list[Message]:
        """Up to `limit` queued messages in arrival order (with the lock held)."""
        n = min(limit, len(self.queue))
        taken = [self.queue.popleft() for _ in range(n)]
        self.queued_bytes -= sum(_size(frames) for _, frames in taken)
        self._full = False
        if not self.queue:
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 4096)
        return taken

    def close(self) -> None:
        """Stop the thread (within CHECK_S), then close the feeds and the pipe."""
        self._stop = True
        self._away.set()
        self._thread.join()
        for sock in self.feeds:
            sock.close(linger=0)
        os.close(self._wake_r)
        os.close(self._wake_w)

    # --- the drain thread -----------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._watch()
        except BaseException as exc:  # a bug: said, and raised to the application at its next turn
            log.exception("the feed drain thread failed")
            self.failure = exc
            os.write(self._wake_w, b"!")

    def _watch(self) -> None:
        poller = zmq.Poller()
        for sock in self.feeds:
            poller.register(sock, zmq.POLLIN)
        in_charge = False  # the last slice was ours: go on without waiting, the application is still away
        while not self._stop:
            if not in_charge:
                self._away.wait(CHECK_S)
            in_charge = False
            if self._wanted:
                time.sleep(SLICE_S / 4)  # the application is coming back: let it have the lock
                continue
            if self._stop or not self.lock.acquire(blocking=False):
                continue  # the application is in a poll turn: it reads the feeds itself
            try:
                if self._away.is_set() or time.monotonic() - self.released_at >= AWAY_S:
                    in_charge = True
                    self._read(dict(poller.poll(int(SLICE_S * 1000))))
            finally:
                self.lock.release()

    def _read(self, ready: dict[Any, int]) -> None:
        for sock, feed in self.feeds.items():
            if sock not in ready:
                continue
            for frames in read_burst(sock):
                size = _size(frames)
                if self.queued_bytes + size > self.limit_bytes:
                    self.dropped += 1
                    if not self._full:
                        self._full = True
                        log.warning(
                            "the application has not taken records for a while: %d bytes of multicast wait; "
                            "dropping what arrives (replay fills it in)",
                            self.queued_bytes,
                        )
                    continue
                if not self.queue:
                    os.write(self._wake_w, b"!")
                self.queue.append((feed, frames))
                self.queued_bytes += size


def read_burst(sock: Any, most: int = BURST) -> Iterator[list[bytes] | McastError]:
    """Up to `most` messages waiting at a feed's receiver (a `gateway.mcast.McastReceiver`), without waiting; a
    receiver's refusal (a udp:// datagram that is no message) comes in the message's place. The first read
    follows a poll that found the receiver ready; after it, the receiver is asked whether more waits
    (`waiting()`) rather than read until it raises zmq.Again, which cost a udp:// receiver about 18 µs per
    delivery at p50 in the latency lab (docs/benchmarks.md, "Sub-hops")."""
    waiting = sock.waiting
    for n in range(most):
        if n and not waiting():
            return
        try:
            yield sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        except McastError as exc:
            yield exc


def _size(frames: list[bytes] | McastError) -> int:
    return 0 if isinstance(frames, McastError) else sum(len(f) for f in frames)
