"""`FeedDrain`: an IO thread that keeps a subscriber's multicast feeds read while the application is busy.

Why: libzmq 4.3.4's PGM receiver aborts the whole process (`src/pgm_receiver.cpp:131`, SIGABRT) when a
SUB's pipe fills while packets keep coming, and an application may stop calling `next()` for any length of
time. So one thread owns the feed sockets from the start (ZeroMQ sockets belong to one thread) and moves
every message it reads, as it is, into a queue bounded in bytes; the subscriber's own thread takes the
messages from there and runs everything else (verification, the reconciler, replay) as before.

When the queue is full the thread keeps reading and drops what it reads, counting it: the feed is never left
unread, and what was dropped is a gap the reconciler fills from replay, or a lag it catches up on with
replay (docs/reconciler.md), exactly as if the network had lost it. Nothing is lost for the application.

Threading contract: `take()`, `fileno()`, `dropped` and `close()` are called by the subscriber's thread;
the feed sockets are touched by the drain thread only. The queue is handed over under one lock, once per
message (a message is a batch of records). `fileno()` is readable while messages wait (a pipe written when
the queue stops being empty and read empty, under the lock, when it is emptied), so a zmq.Poller or an
event loop waits on it as on a socket.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import deque
from typing import Any

import zmq

from gateway.errors import McastError
from gateway.transport.pollable import PolledByFd

log = logging.getLogger(__name__)

POLL_MS = 100  # how long the thread waits for input before looking at its stop flag
BURST = 256  # messages read from one feed before the thread looks at the others


class FeedDrain(PolledByFd):
    """Reads `feeds` (socket -> feed name) in a thread into a queue of at most `limit_bytes`."""

    def __init__(self, feeds: dict[Any, str], limit_bytes: int, name: str = "zeps-feeds") -> None:
        self.feeds = feeds
        self.limit_bytes = limit_bytes
        self.queue: deque[tuple[str, list[bytes] | McastError]] = deque()  # a receiver's refusal is passed on
        self.queued_bytes = 0
        self.dropped = 0  # messages read and dropped because the queue was full
        self._full = False  # dropping since the application last took: said once per such spell
        self.lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stop = threading.Event()
        self.failure: BaseException | None = None  # what ended the thread, if not close()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def fileno(self) -> int:
        return self._wake_r

    def take(self, limit: int) -> list[tuple[str, list[bytes] | McastError]]:
        """Up to `limit` (feed name, frames) in arrival order; a malformed datagram comes as its McastError."""
        with self.lock:
            n = min(limit, len(self.queue))
            taken = [self.queue.popleft() for _ in range(n)]
            self._full = False
            self.queued_bytes -= sum(_size(frames) for _, frames in taken)
            if not self.queue:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
        return taken

    def _run(self) -> None:
        try:
            self._drain()
        except BaseException as exc:  # a bug: said, and raised to the application by the subscriber
            log.exception("the feed drain thread failed")
            self.failure = exc
            with self.lock:
                os.write(self._wake_w, b"!")

    def _drain(self) -> None:
        poller = zmq.Poller()
        for sock in self.feeds:
            poller.register(sock, zmq.POLLIN)
        while not self._stop.is_set():
            ready = dict(poller.poll(POLL_MS))
            for sock, feed in self.feeds.items():
                if sock not in ready:
                    continue
                for _ in range(BURST):
                    frames: list[bytes] | McastError
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    except McastError as exc:  # a datagram that is no message (udp://): counted by the subscriber
                        frames = exc
                    size = _size(frames)
                    with self.lock:
                        if self.queued_bytes + size > self.limit_bytes:
                            self.dropped += 1
                            if not self._full:
                                self._full = True
                                log.warning(
                                    "the application has not taken records for a while: %d bytes of multicast "
                                    "wait; dropping what arrives (replay fills it in)",
                                    self.queued_bytes,
                                )
                            continue
                        if not self.queue:
                            os.write(self._wake_w, b"!")
                        self.queue.append((feed, frames))
                        self.queued_bytes += size

    def close(self) -> None:
        """Stop the thread (within POLL_MS), then close the feeds and the pipe."""
        self._stop.set()
        self._thread.join()
        for sock in self.feeds:
            sock.close(linger=0)
        os.close(self._wake_r)
        os.close(self._wake_w)


def _size(frames: list[bytes] | McastError) -> int:
    return 0 if isinstance(frames, McastError) else sum(len(f) for f in frames)
