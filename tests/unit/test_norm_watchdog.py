"""The NORM watchdog (gateway.transport.norm_watchdog): its deadline check on a fake clock, and its thread
ending the "process" (a caught exit) when a call through a session's watched libnorm does not return."""

from __future__ import annotations

import logging
import queue
import threading
from types import SimpleNamespace

import pytest

from gateway.transport.norm import _WatchedLib
from gateway.transport.norm_watchdog import EXIT_STATUS, CallWatch, Watchdog


def checks(watch: CallWatch, start: float, end: float, step: float) -> list[str | None]:
    """overdue() at start, start + step, ... up to end."""
    got, now = [], start
    while now <= end + 1e-9:
        got.append(watch.overdue(now))
        now += step
    return got


def test_a_call_in_progress_for_the_deadline_is_overdue() -> None:
    watch = CallWatch("10.0.0.1;239.1.1.1:5555", deadline_s=5.0)
    watch.begin("NormGetNextEvent")
    got = checks(watch, 100.0, 105.0, 0.5)
    assert got[:-1] == [None] * (len(got) - 1)  # counted from the first check that saw it
    assert got[-1] == "NormGetNextEvent"


def test_calls_that_return_are_never_overdue() -> None:
    watch = CallWatch("s", deadline_s=5.0)
    now = 0.0
    for _ in range(100):  # one call per check, each a new call
        watch.begin("NormStreamRead")
        assert watch.overdue(now) is None
        watch.end()
        now += 0.5
    assert checks(watch, now, now + 60.0, 0.5) == [None] * 121  # idle


def test_a_new_call_starts_the_count_again() -> None:
    watch = CallWatch("s", deadline_s=5.0)
    watch.begin("NormStreamWrite")
    assert checks(watch, 0.0, 4.5, 0.5) == [None] * 10
    watch.end()
    watch.begin("NormStreamWrite")  # same name, another call
    assert checks(watch, 5.0, 9.5, 0.5) == [None] * 10
    assert watch.overdue(10.0) == "NormStreamWrite"


def test_a_frozen_process_does_not_count_its_freeze() -> None:
    """SIGSTOP for 30 s during a call: the first check after it counts max_gap_s, and the call then returns."""
    watch = CallWatch("s", deadline_s=5.0)
    watch.begin("NormGetNextEvent")
    assert watch.overdue(0.0) is None
    assert watch.overdue(30.0) is None
    watch.end()
    assert watch.overdue(30.5) is None
    watch.begin("NormGetNextEvent")  # a call that stays stuck after a freeze: still reported, by checks alone
    assert checks(watch, 31.0, 35.5, 0.5) == [None] * 10
    assert watch.overdue(36.0) == "NormGetNextEvent"


def test_the_thread_ends_the_process_when_a_watched_call_blocks(caplog: pytest.LogCaptureFixture) -> None:
    """A call through a session's _WatchedLib that blocks (a stand-in for libnorm's locked API) is reported in
    one line and ends the process with status 1; the exit is caught here."""
    exits: queue.Queue[int] = queue.Queue()

    watchdog, release = Watchdog(end_process=exits.put), threading.Event()
    watch = CallWatch("10.0.0.1;239.1.1.1:5555", deadline_s=0.3)
    library = _WatchedLib(SimpleNamespace(NormGetNextEvent=release.wait, NormGetDescriptor=lambda: 7), watch)  # type: ignore[arg-type]
    assert library.NormGetDescriptor() == 7  # a call that returns: nothing happens
    caller = threading.Thread(target=library.NormGetNextEvent, daemon=True)
    with caplog.at_level(logging.CRITICAL, "gateway.transport.norm_watchdog"):
        watchdog.add(watch)
        caller.start()
        try:
            assert exits.get(timeout=5.0) == EXIT_STATUS
        finally:
            release.set()
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("norm_call_stuck call=NormGetNextEvent session=10.0.0.1;239.1.1.1:5555 stuck_s=0.3")
    assert "restart" in line and "libnorm version" in line
