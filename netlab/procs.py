"""Python callables run in a child process inside a lab host's namespace, with results and exceptions.

Children are started with the ``spawn`` method: a forked copy of a parent that holds pyzmq contexts (and
their I/O threads) is not safe, and ``forkserver`` would fork from a server that is not in the namespace.
The child enters the namespace before it calls the function, so sockets it opens live on the lab LAN.
The function's module is imported *before* that, so it must not open sockets at import time.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import pickle
import time
import traceback
from collections.abc import Callable
from typing import Any

from netlab import ns

MP = multiprocessing.get_context("spawn")
"""Use ``MP.Queue()`` / ``MP.Event()`` for objects passed to lab processes."""

_PENDING = object()


class HostError(RuntimeError):
    """A lab process failed without a usable Python exception (crashed, killed, unpicklable error)."""


class RemoteTraceback(Exception):
    """Carries the child's formatted traceback; set as ``__cause__`` of the re-raised exception."""

    def __str__(self) -> str:
        return "\n" + str(self.args[0])


def _child_main(
    netns_path: str, fn: Callable[..., Any], args: tuple[Any, ...], conn: multiprocessing.connection.Connection
) -> None:
    """Runs in the spawned child: enter the namespace, call ``fn``, send back ("ok", value) or an error."""
    try:
        ns.enter(netns_path)
        value = fn(*args)
    except BaseException as exc:
        text = "".join(traceback.format_exception(exc))
        try:
            payload: bytes | None = pickle.dumps(exc)
        except Exception:
            payload = None
        conn.send(("error", payload, f"{type(exc).__name__}: {exc}", text))
        return
    try:
        conn.send(("ok", value))
    except Exception as exc:  # e.g. the value cannot be pickled
        conn.send(("error", None, f"cannot send the result back: {exc!r}", traceback.format_exc()))


class HostProcess:
    """Handle of a callable running in a lab host (from ``Lab.start``)."""

    def __init__(self, host: str, netns_path: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.host = host
        self.fn_name = getattr(fn, "__qualname__", repr(fn))
        self._conn, child_conn = MP.Pipe(duplex=False)
        self._proc = MP.Process(
            target=_child_main,
            args=(netns_path, fn, args, child_conn),
            name=f"netlab-{host}-{self.fn_name}",
            daemon=False,
        )
        self._proc.start()
        child_conn.close()
        self._outcome: Any = _PENDING

    @property
    def pid(self) -> int:
        assert self._proc.pid is not None
        return self._proc.pid

    def is_alive(self) -> bool:
        return self._proc.is_alive()

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` s for the outcome; return True when the process has finished."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._outcome is _PENDING:
            # Read before joining: a child blocked writing a large result would never exit otherwise.
            if not self._conn.poll(timeout):
                return False
            try:
                self._outcome = self._conn.recv()
            except (EOFError, OSError):
                # Died without sending anything, or killed while sending (multiprocessing's OSError "got end of
                # file during message": a SIGTERM from terminate() landing in the child's write of its result).
                self._outcome = None
            self._conn.close()
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        self._proc.join(left)
        return not self._proc.is_alive()

    def result(self, timeout: float | None = None) -> Any:
        """The callable's return value; re-raises its exception (child traceback as ``__cause__``).

        Raises TimeoutError if it has not finished within ``timeout`` s (the process keeps running).
        """
        if not self.join(timeout):
            raise TimeoutError(
                f"{self.fn_name} in host {self.host!r} (pid {self.pid}) did not finish within {timeout} s"
            )
        if self._outcome is None:
            raise HostError(
                f"{self.fn_name} in host {self.host!r} (pid {self.pid}) died without a result, "
                f"exit code {self._proc.exitcode} (negative: killed by that signal)"
            )
        if self._outcome[0] == "ok":
            return self._outcome[1]
        _, payload, summary, text = self._outcome
        exc: BaseException | None = None
        if payload is not None:
            try:
                exc = pickle.loads(payload)
            except Exception:
                exc = None
        if not isinstance(exc, BaseException):
            raise HostError(f"{self.fn_name} in host {self.host!r} failed: {summary}\n{text}")
        raise exc from RemoteTraceback(text)

    def terminate(self, grace: float = 2.0) -> None:
        """Stop the process (SIGTERM, then SIGKILL after ``grace`` s) and reap it."""
        if self._proc.is_alive():
            ns.kill_pids([self.pid], grace=grace)
        self.join(5.0)
