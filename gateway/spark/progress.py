"""Progress of the Spark jobs a command runs: tasks done of the running stages, from Spark's status tracker.

On a terminal it is one line on stderr, rewritten in place; otherwise it is quiet, and with -v it is logged at
INFO every `log_every` seconds. A task of the zeps source is one journal segment, so for `zeps export` the
count is segments done.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import TextIO

from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class Progress:
    """Context manager: reports the session's progress from a background thread until the block ends."""

    def __init__(
        self,
        spark: SparkSession,
        what: str,
        *,
        out: TextIO | None = None,  # default: sys.stderr as it is when the job runs
        interval: float = 0.5,
        log_every: float = 10.0,
    ) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.what = what
        self.out = out or sys.stderr
        self.tty = self.out.isatty()
        self.interval = interval
        self.log_every = log_every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zeps-progress", daemon=True)
        self._start = time.monotonic()

    def status(self) -> str | None:
        """'WHAT: done/total tasks (P%), S s' over the active stages; None when no stage runs."""
        done = total = 0
        for stage in self.tracker.getActiveStageIds():
            info = self.tracker.getStageInfo(stage)
            if info is not None:
                done += info.numCompletedTasks
                total += info.numTasks
        if not total:
            return None
        elapsed = time.monotonic() - self._start
        return f"{self.what}: {done}/{total} tasks ({100 * done // total}%), {elapsed:.0f} s"

    def _run(self) -> None:
        logged = self._start
        while not self._stop.wait(self.interval):
            text = self.status()
            if text is None:
                continue
            if self.tty:
                self.out.write(f"\r{text}\x1b[K")
                self.out.flush()
            if time.monotonic() - logged >= self.log_every:
                logged = time.monotonic()
                log.info("%s", text)

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self.tty:
            self.out.write("\r\x1b[K")
            self.out.flush()
