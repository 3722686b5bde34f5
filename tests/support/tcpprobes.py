"""TCP traffic for lab tests, run inside lab hosts (module level: Lab.start pickles them by reference): an echo
server and its clients (a payload echoed, round trips timed), and a sink that times a bulk transfer."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from multiprocessing.queues import Queue

TIMEOUT_S = 60.0


@contextlib.contextmanager
def _one_connection(ip: str, ready: Queue[int]) -> Iterator[socket.socket]:
    """Listen on ``ip`` (a free port, put on ``ready``) and accept one connection."""
    with socket.create_server((ip, 0)) as srv:
        srv.settimeout(20)
        ready.put(srv.getsockname()[1])
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(TIMEOUT_S)
            yield conn


def echo_server(ip: str, ready: Queue[int]) -> int:
    """Accept one connection and echo it back; return the byte count."""
    total = 0
    with _one_connection(ip, ready) as conn:
        while data := conn.recv(65536):
            conn.sendall(data)
            total += len(data)
    return total


def echo_client(ip: str, port: int, payload: bytes, timeout: float = 10.0) -> bytes:
    with socket.create_connection((ip, port), timeout=timeout) as conn:
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        chunks = []
        while data := conn.recv(65536):
            chunks.append(data)
    return b"".join(chunks)


def _round_trips(conn: socket.socket, count: int) -> list[float]:
    """``count`` one-byte ping-pongs on an echo connection, one at a time; each round trip in ms."""
    rtts = []
    for _ in range(count):
        began = time.monotonic()
        conn.sendall(b"p")
        if not conn.recv(1):
            raise ConnectionError("the echo server closed the connection")
        rtts.append((time.monotonic() - began) * 1000)
    return rtts


def _connect(ip: str, port: int) -> socket.socket:
    conn = socket.create_connection((ip, port), timeout=TIMEOUT_S)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def round_trips(ip: str, port: int, count: int) -> list[float]:
    """Round trips (ms) of ``count`` ping-pongs with the echo server at ip:port."""
    with _connect(ip, port) as conn:
        return _round_trips(conn, count)


def round_trips_on_cue(ip: str, port: int, count: int, cues: Queue[bool], out: Queue[list[float]]) -> int:
    """On one connection, for each True taken from ``cues``: ``count`` round trips (ms), put on ``out``; stop at
    False. The connection stays open between phases, so a test can change the network under it. The phases run."""
    phases = 0
    with _connect(ip, port) as conn:
        while cues.get(timeout=TIMEOUT_S):
            out.put(_round_trips(conn, count))
            phases += 1
    return phases


def sink(ip: str, ready: Queue[int]) -> tuple[int, float]:
    """Accept one connection and read it to the end: (bytes, seconds from the first byte to the last)."""
    total, first, last = 0, 0.0, 0.0
    with _one_connection(ip, ready) as conn:
        while data := conn.recv(1 << 16):
            last = time.monotonic()
            first = first or last
            total += len(data)
    return total, last - first


def send_bulk(ip: str, port: int, size: int) -> int:
    """Send ``size`` zero bytes to ip:port and close; the byte count."""
    with socket.create_connection((ip, port), timeout=TIMEOUT_S) as conn:
        conn.sendall(bytes(size))
    return size
