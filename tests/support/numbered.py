"""Numbered multicast test messages whose content a receiver can check: the stream, an 8-digit number, a body."""

from __future__ import annotations

import hashlib


def numbered(stream: bytes, i: int, sizes: tuple[int, ...]) -> list[bytes]:
    """Message number i: the stream name, its number, and (every third message) a body of sizes[i % n] bytes."""
    size = sizes[i % len(sizes)]
    seed = hashlib.sha256(b"%d" % i).digest()
    body = (seed * (size // 32 + 1))[:size]
    head = b"%08d" % i
    return [stream, head, body] if i % 3 == 0 else [stream, head + body]


def number(frames: list[bytes]) -> int:
    """The number of a message made by `numbered`."""
    return int(frames[1][:8])
