"""FeedDrain: the IO thread that reads the multicast receivers while the application is away. Here with inproc
sockets standing in for the feeds: who reads when, what it queues, what it drops when full (and counts), how
it wakes an awaiting reader, and what it passes on."""

from __future__ import annotations

import os
import select
import time
from collections import deque
from typing import Any

import zmq

from gateway.client.feed_drain import FeedDrain, read_burst
from gateway.errors import UdpError
from gateway.transport.pollable import PolledByFd
from gateway.transport.udp import UdpReceiver

CTX = zmq.Context.instance()


def wait_for(cond: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.005)


def readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def test_the_thread_reads_only_while_the_application_is_away(feed) -> None:
    push, pull = feed
    drain = FeedDrain({pull: "A"}, limit_bytes=1 << 20)
    try:
        drain.acquire()  # a poll turn: the feeds are the application's
        push.send_multipart([b"s", b"mine"])
        time.sleep(0.1)
        assert not drain.queue and pull.poll(0)  # left for the application to read
        assert pull.recv_multipart() == [b"s", b"mine"]
        drain.release()
        assert not readable(drain.fileno())
        for i in range(10):  # the application is away: the thread takes over
            push.send_multipart([b"s", b"%d" % i])
        wait_for(lambda: len(drain.queue) == 10)
        assert readable(drain.fileno())
        drain.acquire()
        assert drain.take(4) == [("A", [b"s", b"%d" % i]) for i in range(4)]
        assert readable(drain.fileno())  # six still wait
        assert [frames[1] for _, frames in drain.take(100)] == [b"%d" % i for i in range(4, 10)]
        assert not readable(drain.fileno()) and drain.queued_bytes == 0
        drain.release()
    finally:
        drain.close()


def test_a_full_queue_keeps_reading_and_drops_what_it_reads(feed) -> None:
    push, pull = feed
    drain = FeedDrain({pull: "A"}, limit_bytes=1000)
    try:
        for _ in range(50):
            push.send_multipart([b"s", b"x" * 99])  # 100 bytes each: 10 fit
        wait_for(lambda: len(drain.queue) + drain.dropped == 50)
        assert (len(drain.queue), drain.dropped, drain.queued_bytes) == (10, 40, 1000)
        drain.acquire()
        drain.take(10)
        drain.release()
        push.send_multipart([b"s", b"y"])  # room again: queued
        wait_for(lambda: len(drain.queue) == 1)
        drain.acquire()
        assert drain.take(1) == [("A", [b"s", b"y"])]
        drain.release()
    finally:
        drain.close()


class Datagrams(PolledByFd):
    """A receiver that refuses datagrams starting with b"bad", as UdpReceiver does. A pipe stands in for its
    socket's readiness (one byte a datagram): tests/unit opens no socket."""

    def __init__(self) -> None:
        self.ready, self.signal = os.pipe()
        os.set_blocking(self.ready, False)
        self.datagrams: deque[bytes] = deque()

    def send(self, data: bytes) -> None:
        self.datagrams.append(data)
        os.write(self.signal, b"x")

    def fileno(self) -> int:
        return self.ready

    def waiting(self) -> bool:
        return bool(self.datagrams)

    def recv_multipart(self, flags: int = 0) -> list[bytes]:
        try:
            os.read(self.ready, 1)
        except BlockingIOError:
            raise zmq.Again() from None
        data = self.datagrams.popleft()
        if data.startswith(b"bad"):
            raise UdpError(f"a frame of 200 bytes at byte 3 overruns the {len(data)}-byte datagram")
        return [b"s", data]

    def close(self, linger: int | None = None) -> None:
        os.close(self.ready)
        os.close(self.signal)


def test_a_receivers_refusals_are_passed_on_not_fatal() -> None:
    datagrams = Datagrams()
    drain = FeedDrain({datagrams: "A"}, limit_bytes=1 << 20)
    try:
        for data in (b"bad1", b"ok1", b"bad2", b"ok2"):
            datagrams.send(data)
        wait_for(lambda: len(drain.queue) == 4)
        drain.acquire()
        taken = [frames for _, frames in drain.take(10)]
        drain.release()
        assert [f[1] for f in taken if isinstance(f, list)] == [b"ok1", b"ok2"]
        assert [str(f) for f in taken if isinstance(f, UdpError)] == [
            "a frame of 200 bytes at byte 3 overruns the 4-byte datagram"
        ] * 2
        assert drain.failure is None and drain.queued_bytes == 0
    finally:
        drain.close()


def test_an_awaiting_application_is_taken_over_at_once(feed) -> None:
    push, pull = feed
    drain = FeedDrain({pull: "A"}, limit_bytes=1 << 20)
    try:
        drain.acquire()
        drain.release()
        drain.away()  # an event loop about to await the pipe
        push.send_multipart([b"s", b"now"])
        assert select.select([drain.fileno()], [], [], 10)[0]  # woken by the pipe
        drain.acquire()
        assert drain.take(10) == [("A", [b"s", b"now"])]
        drain.release()
    finally:
        drain.close()


class ListedDatagrams(UdpReceiver):
    """A udp:// receiver over a list of messages (no socket), counting the reads that found none."""

    def __init__(self, messages: list[list[bytes]]) -> None:  # not UdpReceiver's: no socket
        self.messages = deque(messages)
        self.empty_reads = 0

    def waiting(self) -> bool:
        return bool(self.messages)

    def recv_multipart(self, flags: int = 0, copy: bool = True) -> list[bytes | memoryview]:
        if not self.messages:
            self.empty_reads += 1
            raise zmq.Again()
        return list(self.messages.popleft())


def test_a_burst_of_datagrams_ends_without_a_read_that_finds_none() -> None:
    datagrams = ListedDatagrams([[b"s", b"1"], [b"s", b"2"]])
    assert list(read_burst(datagrams)) == [[b"s", b"1"], [b"s", b"2"]]
    assert datagrams.empty_reads == 0  # asked whether more waits: cheaper than a zmq.Again
    assert list(read_burst(datagrams)) == [] and datagrams.empty_reads == 1  # a first read is tried (polled ready)
