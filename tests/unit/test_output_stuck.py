"""A multicast output whose transport takes nothing while batches wait says so once, and again when it takes
batches again (gateway.sequencer.output): the gateway stops reading publishers meanwhile, and nothing else would
say why (issue #34: a PGM sender whose clock stood still held a group's leader for over 60 s, unlogged)."""

from __future__ import annotations

import logging

import pytest
import zmq

from gateway.mcast import Endpoint
from gateway.sequencer.metrics import GatewayMetrics
from gateway.sequencer.output import STUCK_S, McastOutput

STREAM = "s"
LOGGER = "gateway.sequencer.output"


class Transport:
    """A sender that takes messages only while `open` (else zmq.Again, as a rate-limited one does)."""

    def __init__(self) -> None:
        self.open = False
        self.sent: list[tuple[bytes, ...]] = []

    def send_multipart(self, frames: tuple[bytes, ...], flags: int = 0, copy: bool = True) -> None:
        if not self.open:
            raise zmq.Again()
        self.sent.append(frames)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def output(transport: Transport, clock: Clock) -> McastOutput:
    endpoint = Endpoint.parse("epgm://10.0.0.1;239.192.1.1:5555")
    series = GatewayMetrics([STREAM]).add_output(str(endpoint), {STREAM: 0})
    out = McastOutput(transport, endpoint, {STREAM: 0}, {}, series, 16, clock=clock)  # type: ignore[arg-type]
    for seq in range(1, 4):
        out.queue.append(((STREAM.encode(), b"batch %d" % seq), seq))
    return out


def stuck_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_a_transport_that_takes_nothing_is_said_once_then_its_recovery(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)  # its own: another test may quiet "gateway"
    transport, clock = Transport(), Clock()
    out = output(transport, clock)
    for _ in range(3):  # refused for less than STUCK_S: a transport at its rate, not worth a word
        out.pump()
        clock.now += STUCK_S / 4
    assert stuck_lines(caplog) == []
    for _ in range(1000):  # refused past STUCK_S, pumped every RETRY_S: one line for the episode
        clock.now += McastOutput.RETRY_S
        assert out.pump() == McastOutput.RETRY_S
        clock.now += STUCK_S / 1000
    said = stuck_lines(caplog)
    assert len(said) == 1
    assert "has taken nothing for" in said[0] and "3 batches wait" in said[0] and "docs/pgm.md" in said[0]
    transport.open = True
    assert out.pump() is None  # it takes them all again
    assert [f[1] for f in transport.sent] == [b"batch 1", b"batch 2", b"batch 3"]
    said = stuck_lines(caplog)
    assert len(said) == 2 and "takes batches again" in said[1]


def test_an_idle_output_or_one_that_sends_at_its_rate_is_never_stuck(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)  # its own: another test may quiet "gateway"
    transport, clock = Transport(), Clock()
    out = output(transport, clock)
    transport.open = True
    assert out.pump() is None
    for _ in range(10):  # nothing waits: idle, however long
        clock.now += STUCK_S
        assert out.pump() is None
    transport.open = False
    for seq in range(10):  # refused for STUCK_S / 2 at a time, then it takes what waits: slow, not stuck
        out.queue.append(((STREAM.encode(), b"batch %d" % seq), seq))
        out.pump()
        clock.now += STUCK_S / 2
        out.pump()
        transport.open = True
        out.pump()
        transport.open = False
    assert len(transport.sent) == 13
    assert stuck_lines(caplog) == []
