"""`Syncer`: a thread that runs the journal writers' group-commit fdatasyncs, so their owner's loop never waits
on the disk.

Why: an fdatasync usually takes 0.2-0.5 ms here, but when the filesystem's journal commits other work at the
same moment (ext4's jbd2, another process writing) one can take 25-230 ms (measured with `perf trace` on the
gateway under load). Made on the gateway's loop, such a sync held every publisher's records unread and
unsequenced for that long: the stall episodes of docs/benchmarks.md ("Recovery"). On a thread of its own it
holds back only what waits for durability: publish confirms, which the owner sends once `synced_seq` covers
them.

One thread serves every writer of its owner (ThreadPoolExecutor with one worker: the kernel serialises the
syncs of one filesystem anyway). Each sync is a Future; when one finishes, a byte is written to a pipe whose
read end (`fileno()`) the owner polls, so it sends the confirms at once rather than at its next timer.

Threading contract: `submit`, `drain` and `close` are called from the owner's thread; the worker only calls
os.fdatasync on the descriptor it was given and writes the pipe. A writer waits for its own sync before it
closes or seals the descriptor (JournalWriter.sync), so the worker never syncs a closed one.
"""

from __future__ import annotations

import contextlib
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor


def timed_fdatasync(fd: int) -> float:
    """fdatasync `fd`; the seconds it took."""
    start = time.perf_counter()
    os.fdatasync(fd)
    return time.perf_counter() - start


class Syncer:
    """The background fdatasync thread of one owner (see the module docstring)."""

    def __init__(self, name: str = "zeps-fsync") -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def fileno(self) -> int:
        """Readable once a sync has finished since the last `drain()`."""
        return self._wake_r

    def submit(self, fd: int) -> Future[float]:
        """fdatasync `fd` on the thread; the Future gives the seconds it took, or raises its OSError."""
        future = self._pool.submit(timed_fdatasync, fd)
        future.add_done_callback(self._wake)  # runs once the Future is done: the owner finds it so
        return future

    def drain(self) -> None:
        """Empty the pipe (the owner was woken by it)."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass

    def close(self) -> None:
        """Finish the syncs under way, stop the thread, close the pipe."""
        self._pool.shutdown(wait=True)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _wake(self, _future: Future[float]) -> None:
        with contextlib.suppress(BlockingIOError):  # a full pipe already says "look"
            os.write(self._wake_w, b"!")
