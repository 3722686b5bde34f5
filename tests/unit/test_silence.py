"""A follower's clock of its leader's silence (gateway.replication.silence): no I/O, times given."""

from __future__ import annotations

from gateway.replication.silence import Silence


def test_a_ping_out_and_unanswered_past_suspect_s_is_silence() -> None:
    s = Silence(0.3)
    s.pinged()
    s.out(10.0)
    assert not s.silent(10.29)
    assert s.silent(10.31)


def test_a_ping_queued_behind_a_connect_is_not_counted() -> None:
    """A node that wakes from SIGSTOP, learns of a new leader and is busy for 0.4 s before its connect completes:
    the ping left at 10.4, the leader answers at 10.41: never suspected."""
    s = Silence(0.3)
    s.pinged()  # at 10.0, the link still connecting
    s.pinged()
    assert not s.silent(10.4)  # nothing left yet: whatever the time, not the leader's silence
    s.out(10.4)  # the connect completed, both pings went
    assert not s.silent(10.4)
    s.answered()
    s.pinged()
    s.out(10.45)
    assert not s.silent(10.7)


def test_the_clock_runs_from_the_first_unanswered_ping_out() -> None:
    s = Silence(0.3)
    s.pinged()
    s.out(10.0)
    s.pinged()  # every ack interval, another
    s.out(10.05)
    assert s.silent(10.31)  # counted from 10.0, not 10.05


def test_an_answer_ends_the_silence() -> None:
    s = Silence(0.3)
    s.pinged()
    s.out(10.0)
    s.answered()
    assert not s.silent(20.0)
    s.pinged()
    s.out(20.0)
    assert s.silent(20.4)


def test_nothing_sent_nothing_counted() -> None:
    s = Silence(0.3)
    s.out(10.0)  # the link idle, no ping given to it
    assert not s.silent(100.0)
