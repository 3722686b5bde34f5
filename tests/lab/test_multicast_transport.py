"""Raw pyzmq over epgm:// and norm:// between two lab hosts: every message arrives, in order, exactly once.

PUB and SUB sit in different namespaces (libzmq disables multicast loop for PGM). The subscriber checks
each message against the one it expects next; loss is silent in libzmq, so only this catches it. A TCP
control socket between the hosts tells the publisher when the subscriber is really receiving.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import pytest
import zmq

from netlab import Lab

pytestmark = pytest.mark.lab

COUNT = 2_000
DATA_PORT = 5555
CONTROL_PORT = 5556
RATE_KBIT = 100_000  # ZMQ_RATE is in kbit/s and defaults to 100
RECOVERY_IVL_MS = 2_000
NORM_FRAMES_PER_S = 1_000  # a NORM burst over ~2 MiB stalls libzmq 4.3.4's sender for good
WAIT_S = 30.0
DUPLICATE_WAIT_MS = 300  # after the last message, anything arriving this soon is a duplicate


def message(i: int) -> bytes:
    """Message number ``i``: its number and 96 bytes that differ for every i."""
    return b"%06d|" % i + hashlib.sha256(b"%d" % i).digest() * 3


def _multicast_socket(ctx: zmq.Context[Any], kind: int, transport: str) -> zmq.Socket[Any]:
    sock = ctx.socket(kind)
    # A PUB must linger to flush; a NORM SUB that lingers blocks its close for the whole period.
    sock.setsockopt(zmq.LINGER, int(WAIT_S * 1000) if kind == zmq.PUB else 0)
    if transport == "epgm":  # the PGM receive window derives from both, on the SUB side too
        sock.setsockopt(zmq.RATE, RATE_KBIT)
        sock.setsockopt(zmq.RECOVERY_IVL, RECOVERY_IVL_MS)
    return sock


def subscriber(endpoint: str, control: str, transport: str, count: int) -> dict[str, Any]:
    """Acknowledge the first warm-up message, then check ``count`` messages one by one."""
    with zmq.Context() as ctx, _multicast_socket(ctx, zmq.SUB, transport) as sub, ctx.socket(zmq.PAIR) as ctl:
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.RCVTIMEO, int(WAIT_S * 1000))
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.connect(endpoint)
        ctl.setsockopt(zmq.LINGER, 5_000)
        ctl.bind(control)
        warmups = received = 0
        problem = None
        while received < count:
            try:
                msg = sub.recv()
            except zmq.Again:
                problem = f"nothing for {WAIT_S} s after {received} messages"
                break
            if msg.startswith(b"warm-up") and received == 0:
                if warmups == 0:
                    ctl.send(b"receiving")
                warmups += 1
                continue
            if msg != message(received):
                problem = f"message {received}: expected {message(received)[:7]!r}..., got {msg[:20]!r}"
                break
            received += 1
        if problem is None and sub.poll(DUPLICATE_WAIT_MS):
            problem = f"a message after the last one: {sub.recv()[:20]!r}"
        ctl.send(b"done")
        return {"received": received, "warmups": warmups, "problem": problem}


def publisher(endpoint: str, control: str, transport: str, count: int, rate: float | None) -> dict[str, Any]:
    """Send warm-ups until the subscriber says it receives, then ``count`` messages (paced if ``rate``)."""
    with zmq.Context() as ctx, _multicast_socket(ctx, zmq.PUB, transport) as pub, ctx.socket(zmq.PAIR) as ctl:
        # PUB drops silently above SNDHWM (1000), and the PGM engine drains only at ZMQ_RATE.
        pub.setsockopt(zmq.SNDHWM, 0)
        pub.connect(endpoint)
        ctl.setsockopt(zmq.LINGER, 0)
        ctl.connect(control)
        deadline = time.monotonic() + WAIT_S
        warmups = 0
        while not ctl.poll(50):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the subscriber received none of {warmups} warm-up messages in {WAIT_S} s")
            pub.send(b"warm-up %d" % warmups)
            warmups += 1
        assert ctl.recv() == b"receiving"
        started = time.monotonic()
        for i in range(count):
            pub.send(message(i))
            if rate and i % 10 == 9:  # pace in batches of 10 against an absolute schedule
                time.sleep(max(0.0, started + (i + 1) / rate - time.monotonic()))
        sent_in = time.monotonic() - started
        # Stay until the subscriber is done: a PUB that exits drops what libzmq still holds.
        if not ctl.poll(int(WAIT_S * 1000)):
            raise TimeoutError(f"the subscriber did not finish within {WAIT_S} s after the last message")
        return {"warmups": warmups, "sent_in": sent_in}


def run_transport(lab: Lab, transport: str, rate: float | None) -> None:
    pub, sub = lab.host("pub"), lab.host("sub")
    group = lab.group(1)
    control = f"tcp://{sub.ip}:{CONTROL_PORT}"
    receiver = lab.start(sub, subscriber, f"{transport}://{sub.ip};{group}:{DATA_PORT}", control, transport, COUNT)
    sender = lab.start(pub, publisher, f"{transport}://{pub.ip};{group}:{DATA_PORT}", control, transport, COUNT, rate)
    got = receiver.result(timeout=3 * WAIT_S)  # first: its finding explains a publisher timeout
    sent = sender.result(timeout=WAIT_S)
    assert got["problem"] is None, f"{transport}: {got}, publisher {sent}"
    assert got["received"] == COUNT
    assert got["warmups"] >= 1


def test_epgm_delivers_every_message_in_order(lab: Lab) -> None:
    run_transport(lab, "epgm", rate=None)


def test_norm_delivers_every_message_in_order(lab: Lab) -> None:
    run_transport(lab, "norm", rate=NORM_FRAMES_PER_S)
