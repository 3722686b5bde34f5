"""Fixtures of the unit tier."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zmq


@pytest.fixture
def feed() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """An inproc PUSH -> PULL pair standing in for a multicast feed: (sender, receiver)."""
    ctx = zmq.Context.instance()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    address = f"inproc://feed-{time.monotonic_ns()}"
    pull.bind(address)
    push.connect(address)
    yield push, pull
    push.close(linger=0)
    pull.close(linger=0)
