"""libpgm's own messages, into our log: once per kind, then counted.

libpgm writes its messages to the process's stdout by default (`Warn: ...`, where a gateway's own output goes),
one line per event: during a partition that a firewall makes (sendto fails with EPERM) that is a line per
packet it cannot send (`Warn: sendto() 239.192.1.1 failed: Operation not permitted`), from the sending
thread, with the socket's send lock and libpgm's message lock held. This handler (pgm_log_set_handler)
takes over: a warning or worse goes to the `gateway.transport.pgm` logger the first time its text is seen in
an interval of EVERY_S, and later ones of that text in the interval are only counted and said with the next
line ("and N more like it"); debug and trace messages are dropped, as libpgm drops them by default.

Threading contract: libpgm calls the handler from whichever thread logs (its I/O threads, libzmq's), which
takes the GIL for the call; nothing here blocks or calls back into libpgm, so holding its send lock meanwhile
is safe.
"""

from __future__ import annotations

import ctypes
import logging
import re
import threading
import time

log = logging.getLogger("gateway.transport.pgm")

EVERY_S = 10.0  # one line per kind of message at most this often
_WARNING, _ERROR = 4, 5  # PGM_LOG_LEVEL_WARNING, PGM_LOG_LEVEL_ERROR (pgm/messages.h)
HANDLER_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_LEVELS = ("Warn: ", "Error: ", "Fatal: ")  # how libpgm starts the messages it hands over
_NUMBERS = re.compile(r"\d+")  # a kind of message: its text with the numbers (addresses, counts) taken out


class Throttle:
    """Which of libpgm's messages to say, and how many of each kind were held back (thread-safe)."""

    def __init__(self, every_s: float = EVERY_S) -> None:
        self.every_s = every_s
        self._lock = threading.Lock()
        self._kinds: dict[str, tuple[float, int]] = {}  # kind -> (when last said, held back since)

    def take(self, message: str, now: float) -> int | None:
        """How many of its kind were held back before this one if `message` is to be said now, else None."""
        kind = _NUMBERS.sub("#", message)
        with self._lock:
            said, held = self._kinds.get(kind, (float("-inf"), 0))
            if now - said < self.every_s:
                self._kinds[kind] = (said, held + 1)
                return None
            self._kinds[kind] = (now, 0)
            return held


_throttle = Throttle()


@HANDLER_TYPE
def _handler(level: int, message: bytes | None, _closure: int | None) -> None:
    if level < _WARNING or message is None:
        return
    text = message.decode(errors="replace").strip()
    text = text.split(": ", 1)[1] if text.startswith(_LEVELS) else text  # libpgm's "Warn: " and the like
    held = _throttle.take(text, time.monotonic())
    if held is not None:
        more = f" (and {held} more like it in the last {_throttle.every_s:g} s)" if held else ""
        log.log(logging.ERROR if level >= _ERROR else logging.WARNING, "libpgm: %s%s", text, more)


def install(lib: ctypes.CDLL) -> None:
    """Route `lib`'s (libpgm's) messages through the handler; the handler lives as long as the module."""
    lib.pgm_log_set_handler.restype = ctypes.c_void_p
    lib.pgm_log_set_handler.argtypes = [HANDLER_TYPE, ctypes.c_void_p]
    lib.pgm_log_set_handler(_handler, None)
