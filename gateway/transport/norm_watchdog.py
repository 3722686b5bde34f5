"""A watchdog that ends the process when a libnorm call does not return (issue #34).

Why: libnorm runs its protocol in a thread of its own and every API call takes that instance's lock. A
protocol thread that spins while holding it (the zero-length header extension that gateway.transport.norm_filter
now drops was one such spin; any other would do the same) blocks every NORM call of the process for good:
NormGetNextEvent, NormStreamWrite, NormStreamRead, even NormDestroyInstance. Nothing fails, nothing is logged,
the gateway or subscriber just stops, and its HA group never fails over. A process that cannot make a libnorm
call return cannot repair itself either: the stuck thread holds the lock, so the only way out is to end the
process. The watchdog logs one line naming the call, the session and the fix, and exits with status 1 (a
failure, RULES' convention), so that a supervisor restarts the process and the HA group fails over.

Theory of operation: `CallWatch` (sans-IO: the caller passes the time in) sees one session's libnorm calls
begin and end, and `overdue(now)` says which call has been in progress for `deadline_s` of the watchdog's own
observation. Each check counts the time since the previous one at most `max_gap_s`: a process frozen by
SIGSTOP, or starved by a loaded host, finds its calls in progress when it resumes, and must not count the
freeze as a stuck call (the next check sees that the call returned). So a stuck call is reported between
`deadline_s` and `deadline_s + max_gap_s` after it began, in time the watchdog was running.

Threading contract: a session's calls begin and end on its owner's thread (gateway.transport.norm: one thread
per sender or receiver), which writes `CallWatch.current` in one store (a tuple: atomic in CPython); only the
watchdog's thread calls `overdue`, and only it touches the other fields. ctypes releases the GIL around
foreign calls, so a thread stuck inside libnorm does not stop the watchdog's. `Watchdog` is one daemon thread
per process, started with the first session; sessions `add` and `discard` their watch under its lock.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

DEADLINE_S = 5.0  # how long one libnorm call may take before the process ends (libnorm's own calls take µs)
CHECKS_PER_DEADLINE = 10  # the watchdog's checks in one deadline: how late past it the exit may come
EXIT_STATUS = 1


class CallWatch:
    """One NORM session's libnorm calls as the watchdog sees them (see the module docstring)."""

    def __init__(self, where: str, deadline_s: float | None = None) -> None:
        self.where = where
        self.deadline_s = DEADLINE_S if deadline_s is None else deadline_s
        self.max_gap_s = 2 * self.deadline_s / CHECKS_PER_DEADLINE
        self.current: tuple[int, str | None] = (0, None)  # (calls begun, the call in progress or None)
        self._calls = 0
        self._seen: tuple[int, str | None] = (0, None)
        self._stuck_s = 0.0
        self._checked: float | None = None

    def begin(self, call: str) -> None:
        self._calls += 1
        self.current = (self._calls, call)

    def end(self) -> None:
        self.current = (self._calls, None)

    def overdue(self, now: float) -> str | None:
        """The call stuck for deadline_s (its name), else None; called at intervals by one thread."""
        gap = 0.0 if self._checked is None else min(max(0.0, now - self._checked), self.max_gap_s)
        self._checked = now
        current = self.current
        if current[1] is None or current != self._seen:
            self._seen, self._stuck_s = current, 0.0
            return None
        self._stuck_s += gap
        return current[1] if self._stuck_s >= self.deadline_s else None


def stuck_message(call: str, where: str, stuck_s: float) -> str:
    """The one line logged before the exit: the cause, what it blocks, and the fix."""
    return (
        f"norm_call_stuck call={call} session={where} stuck_s={stuck_s:.1f}: libnorm's protocol thread holds "
        f"its lock and does not let go, so every NORM call of this process would wait for good; exiting with "
        f"status {EXIT_STATUS} so that the HA group fails over and a supervisor restarts the process. Fix: "
        f"restart it; report the libnorm version (dpkg -s libnorm1) and a capture of the group "
        f"(tshark -d udp.port==PORT,norm) to the ZEPS project"
    )


class Watchdog:
    """The thread that checks every session's `CallWatch` and ends the process on a stuck call."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        end_process: Callable[[int], object] = os._exit,  # the IO shell's exit: unit tests catch it
    ) -> None:
        self._clock, self._exit = clock, end_process
        self._lock = threading.Lock()
        self._watches: set[CallWatch] = set()
        self._thread: threading.Thread | None = None

    def add(self, watch: CallWatch) -> None:
        with self._lock:
            self._watches.add(watch)
            if self._thread is None or not self._thread.is_alive():  # not started, or this is a forked child
                self._thread = threading.Thread(target=self._run, name="norm-watchdog", daemon=True)
                self._thread.start()

    def discard(self, watch: CallWatch) -> None:
        with self._lock:
            self._watches.discard(watch)

    def _run(self) -> None:
        while True:
            with self._lock:
                watches = list(self._watches)
            tick = min((w.deadline_s for w in watches), default=DEADLINE_S) / CHECKS_PER_DEADLINE
            time.sleep(tick)
            now = self._clock()
            for watch in watches:
                call = watch.overdue(now)
                if call is not None:
                    self._fire(watch, call)
                    return  # only where end_process returns: a unit test's

    def _fire(self, watch: CallWatch, call: str) -> None:
        # os._exit: a normal exit would wait for the stuck thread (atexit, non-daemon threads, finalisers that
        # call libnorm), and nothing that takes libnorm's lock can run any more.
        log.critical(stuck_message(call, watch.where, watch.deadline_s))
        sys.stderr.flush()
        self._exit(EXIT_STATUS)


WATCHDOG = Watchdog()  # the process's one watchdog thread, started by the first NORM session
