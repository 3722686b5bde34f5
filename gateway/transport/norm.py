"""NORM multicast through libnorm itself (ctypes): a rate-controlled sender and a message receiver.

Why not libzmq's norm://: its 4.3.4 engine (src/norm_engine.cpp) cannot carry this feed (docs/norm.md):
- a frame whose encoding exceeds its 2,048-byte copy buffer sends the I/O thread into an endless loop (the
  index of the chunk already written is not reset for the frame's next chunk): the sender spins at 100% CPU,
  sends nothing more, and its socket never closes. Frame bodies above 2,038 bytes are never delivered.
- congestion control is always on with no rate bounds, the GRTT starts at 0.5 s and nothing of RATE,
  RECOVERY_IVL or the buffer sizes can be set: a stream that bursts past its 2 MiB buffer stalls for good
  or breaks, and a receiver that resynchronises after a break aborts the process (zmq_assert).

This module drives the same library (Debian libnorm1) with the settings a feed needs: a fixed transmit rate
(`NormSetTxRate`), buffers sized by the caller, a small initial GRTT for LAN repair, and stream backpressure
(`NormStreamWrite` accepts no more than the stream can hold, so nothing is ever dropped to make room).

The byte stream is framed as libzmq's norm:// frames it (gateway.wire.framing), so either side can talk to a
libzmq peer, and each message starts at
a NORM message boundary (`NormStreamFlush(eom=True)`), where a receiver that joins late or loses data
resynchronises (`NormStreamSeekMsgStart`).

Every libnorm call a session makes goes through its `CallWatch` (gateway.transport.norm_watchdog): a call that
does not return within norm_watchdog.DEADLINE_S (libnorm's protocol thread spinning with its lock held) ends
the process with one log line and status 1, rather than a silent hang. Threading contract: each NormSender
and NormReceiver is used from one thread at a time (its owner's), which alone calls libnorm for its session.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import select
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import zmq

from gateway.errors import NormError
from gateway.transport import norm_filter
from gateway.transport.norm_watchdog import WATCHDOG, CallWatch
from gateway.transport.pollable import PolledByFd, again
from gateway.wire.framing import FIRST_FRAME, MORE, NEXT_FRAME, encode_message, frame_header

log = logging.getLogger(__name__)

_VOIDP = ctypes.c_void_p
_BOOL = ctypes.c_bool
_UINT = ctypes.c_uint
_U8, _U16, _U32 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32

# normApi.h enums (libnorm 1.5.9)
NORM_FLUSH_ACTIVE = 2
NORM_SYNC_CURRENT = 0
NORM_OBJECT_STREAM = 3
NORM_NODE_ANY = 0xFFFFFFFF
NORM_TX_FLUSH_COMPLETED = 3
NORM_RX_OBJECT_NEW = 17
NORM_RX_OBJECT_UPDATED = 19
NORM_RX_OBJECT_COMPLETED = 20
NORM_RX_OBJECT_ABORTED = 21

CLOCK_STEP_S = 1.0  # a wall clock stepped back further restarts a sender (`NormSender._restart_if_clock_went_back`)
_READ_CHUNK = 256 * 1024
_EVENTS_PER_CALL = 1024  # NORM events one call takes at most (`_Session.events`)
_READS_PER_CALL = 64  # then other streams and the caller get a turn; the rest is read on the next call


class _Event(ctypes.Structure):
    _fields_ = (("type", ctypes.c_int), ("session", _VOIDP), ("sender", _VOIDP), ("object", _VOIDP))


def _load() -> ctypes.CDLL:
    name = ctypes.util.find_library("norm") or "libnorm.so.1"
    try:
        lib = ctypes.CDLL(name)
    except OSError as exc:
        raise NormError(f"cannot load libnorm ({exc}); install it: apt-get install libnorm1") from exc
    signatures = {
        "NormCreateInstance": (_VOIDP, [_BOOL]),
        "NormDestroyInstance": (None, [_VOIDP]),
        "NormGetNextEvent": (_BOOL, [_VOIDP, ctypes.POINTER(_Event), _BOOL]),
        "NormGetDescriptor": (ctypes.c_int, [_VOIDP]),
        "NormCreateSession": (_VOIDP, [_VOIDP, ctypes.c_char_p, _U16, _U32]),
        "NormDestroySession": (None, [_VOIDP]),
        "NormSetMulticastInterface": (_BOOL, [_VOIDP, ctypes.c_char_p]),
        "NormSetTTL": (_BOOL, [_VOIDP, _U8]),
        "NormSetRxPortReuse": (None, [_VOIDP, _BOOL, ctypes.c_char_p, ctypes.c_char_p, _U16]),
        "NormGetRandomSessionId": (_U16, []),
        "NormStartSender": (_BOOL, [_VOIDP, _U16, _U32, _U16, _U16, _U16, _U8]),
        "NormStopSender": (None, [_VOIDP]),
        "NormSetTxRate": (None, [_VOIDP, ctypes.c_double]),
        "NormSetCongestionControl": (None, [_VOIDP, _BOOL, _BOOL]),
        "NormSetTxSocketBuffer": (_BOOL, [_VOIDP, _UINT]),
        "NormSetGrttEstimate": (None, [_VOIDP, ctypes.c_double]),
        "NormSetBackoffFactor": (None, [_VOIDP, ctypes.c_double]),
        "NormSetGroupSize": (None, [_VOIDP, _UINT]),
        "NormStreamOpen": (_VOIDP, [_VOIDP, _U32, ctypes.c_char_p, _UINT]),
        "NormStreamWrite": (_UINT, [_VOIDP, _VOIDP, _UINT]),
        "NormStreamFlush": (None, [_VOIDP, _BOOL, ctypes.c_int]),
        "NormStartReceiver": (_BOOL, [_VOIDP, _U32]),
        "NormStopReceiver": (None, [_VOIDP]),
        "NormSetRxSocketBuffer": (_BOOL, [_VOIDP, _UINT]),
        "NormSetDefaultSyncPolicy": (None, [_VOIDP, ctypes.c_int]),
        "NormStreamRead": (_BOOL, [_VOIDP, ctypes.c_char_p, ctypes.POINTER(_UINT)]),
        "NormStreamSeekMsgStart": (_BOOL, [_VOIDP]),
        "NormObjectGetType": (ctypes.c_int, [_VOIDP]),
        "NormSetRxLoss": (None, [_VOIDP, ctypes.c_double]),
        "NormGetRxPort": (_U16, [_VOIDP]),
        "NormGetTxPort": (_U16, [_VOIDP]),
    }
    for fn, (restype, argtypes) in signatures.items():
        func = getattr(lib, fn)
        func.restype = restype
        func.argtypes = argtypes
    return lib


_lib: ctypes.CDLL | None = None


def lib() -> ctypes.CDLL:
    """libnorm, loaded on first use (importing this module needs no NORM)."""
    global _lib
    if _lib is None:
        _lib = _load()
    return _lib


@dataclass(frozen=True, slots=True)
class NormSettings:
    """What a NORM session is told (defaults measured in docs/norm.md).

    rate_kbps: fixed transmit rate, repairs included; the stream applies backpressure above it.
    buffer_bytes: the sender's stream buffer, i.e. its repair window and what a burst may queue; receivers
        size their per-sender buffer from it. Larger buffers absorb bursts but add queueing delay.
    segment_bytes: NORM payload per packet; 1400 keeps packets under a 1500-byte MTU with NORM's headers.
    block_segments / parity_segments: the FEC block and the parity segments repairs may use.
    grtt_s: initial group round-trip estimate; NORM measures it afterwards, raising it at once when a
        round trip takes longer and lowering it only slowly, so a high start keeps repairs slow: the
        library's 0.5 s default makes a LAN's first repairs wait seconds, and 0.01 s gave p99 33 ms at 1%
        loss where 0.001 s gives 5 ms (docs/norm.md). Raise it for a WAN.
    backoff: NACK back-off factor (NACK delay up to backoff * GRTT). 0 for a LAN with few receivers: NACK
        at once (1 doubled p99 under 1% loss). Large groups want the library's 4, so that NACK
        suppression keeps one loss from drawing a NACK from every receiver.
    socket_buffer_bytes: UDP socket buffers (capped by net.core.rmem_max / wmem_max).
    """

    rate_kbps: int = 100_000
    buffer_bytes: int = 8 * 1024 * 1024
    segment_bytes: int = 1400
    block_segments: int = 64
    parity_segments: int = 16
    grtt_s: float = 0.001
    backoff: float = 0.0
    socket_buffer_bytes: int = 4 * 1024 * 1024
    ttl: int = 16


class _WatchedLib:
    """libnorm's functions as a session calls them: each call begins and ends on the session's CallWatch."""

    def __init__(self, library: ctypes.CDLL, watch: CallWatch) -> None:
        self._lib, self._watch = library, watch

    def __getattr__(self, name: str) -> Callable[..., Any]:
        func, watch = getattr(self._lib, name), self._watch

        def call(*args: Any) -> Any:
            watch.begin(name)
            try:
                return func(*args)
            finally:
                watch.end()

        setattr(self, name, call)  # found once per name
        return call


class _Session:
    """One NORM instance (its own protocol thread) with one session on `group:port` via `interface`; its
    libnorm calls are watched (`gateway.transport.norm_watchdog`) from the instance's creation to its end."""

    def __init__(self, interface: str, group: str, port: int, settings: NormSettings) -> None:
        self.where = f"{interface};{group}:{port}"
        self.watch = CallWatch(self.where)
        WATCHDOG.add(self.watch)
        self.lib = _WatchedLib(lib(), self.watch)
        self.instance = self.lib.NormCreateInstance(False)
        if not self.instance:
            WATCHDOG.discard(self.watch)
            raise NormError("NormCreateInstance failed (out of threads or memory?)")
        self.session = self.lib.NormCreateSession(self.instance, group.encode(), port, NORM_NODE_ANY)
        if not self.session:
            self.close()
            raise NormError(f"NormCreateSession({group}:{port}) failed: is {group} a valid address?")
        self.lib.NormSetRxPortReuse(self.session, True, None, None, 0)
        self.lib.NormSetTTL(self.session, settings.ttl)
        if not self.lib.NormSetMulticastInterface(self.session, interface.encode()):
            self.close()
            raise NormError(f"NormSetMulticastInterface({interface!r}) failed: name an interface of this host")
        self.event = _Event()

    def start(self, start: Callable[[], bool]) -> bool:
        """Start sending or receiving (`start` calls NormStartSender or NormStartReceiver) behind the socket
        filter of gateway.transport.norm_filter: one malformed datagram would hang libnorm for good."""
        try:
            return norm_filter.guarded(start, self._ports, f"NORM session on {self.where}")
        except NormError:
            self.close()
            raise

    def _ports(self) -> set[int]:
        return {self.lib.NormGetRxPort(self.session), self.lib.NormGetTxPort(self.session)}

    def events(self) -> Iterator[tuple[int, int | None]]:
        """Pending NORM events as (type, object handle), without waiting: at most _EVENTS_PER_CALL, so that a
        caller's turn ends (and reads its streams) while NORM posts faster than it takes them; the descriptor
        stays readable for the rest."""
        get, instance, event = self.lib.NormGetNextEvent, self.instance, self.event
        for _ in range(_EVENTS_PER_CALL):
            if not get(instance, ctypes.byref(event), False):
                return
            yield event.type, event.object

    def fileno(self) -> int:
        """Readable while NORM events are pending (select/poll, or a zmq.Poller)."""
        return self.lib.NormGetDescriptor(self.instance)

    def close(self) -> None:
        if self.session:
            self.lib.NormDestroySession(self.session)
            self.session = None
        if self.instance:
            self.lib.NormDestroyInstance(self.instance)
            self.instance = None
        WATCHDOG.discard(self.watch)


def _wall_offset() -> float:
    """How far the wall clock is ahead of the monotonic one: it changes only when the wall clock is stepped."""
    return time.time() - time.monotonic()


class NormSender:
    """Sends ZeroMQ-style multipart messages on a NORM stream at a fixed rate, with backpressure.

    `send_multipart` takes a whole message or raises zmq.Again: the stream holds at most `buffer_bytes`
    not yet released, and NORM drains it at `rate_kbps`. At most one accepted message waits here for room
    (a message larger than the free space is written in parts; the rest goes out first on the next call).
    The duck-typed subset of zmq.Socket that the gateway uses: send_multipart, close.
    """

    def __init__(self, interface: str, group: str, port: int, settings: NormSettings, linger_ms: int = 2_000) -> None:
        if settings.rate_kbps <= 0:
            raise NormError("rate_kbps must be positive: NORM sends at a fixed rate")
        self.settings = settings
        self.linger_ms = linger_ms
        self._where = (interface, group, port)
        self._pending: bytes | None = None  # the accepted message not yet all in the stream
        self._written = 0  # how much of it is
        self._flushed = True  # NORM finished flushing everything written (its repair requests answered)
        self._start()
        self._wall = _wall_offset()  # the wall clock's lead on the monotonic one, as last seen

    def _start(self) -> None:
        """A NORM instance (its thread) and session, sending, with its stream open."""
        settings = self.settings
        interface, group, port = self._where
        self._s = _Session(interface, group, port, settings)
        lib_, session = self._s.lib, self._s.session
        lib_.NormSetCongestionControl(session, False, True)
        lib_.NormSetTxRate(session, settings.rate_kbps * 1000.0)
        lib_.NormSetGrttEstimate(session, settings.grtt_s)
        lib_.NormSetBackoffFactor(session, settings.backoff)
        ok = self._s.start(
            lambda: lib_.NormStartSender(
                session,
                lib_.NormGetRandomSessionId(),
                settings.buffer_bytes,
                settings.segment_bytes,
                settings.block_segments,
                settings.parity_segments,
                0,
            )
        )
        if not ok:
            self._s.close()
            raise NormError(
                f"NormStartSender failed on {interface};{group}:{port}: check the interface address and that "
                f"block_segments + parity_segments <= 255 ({settings.block_segments}+{settings.parity_segments})"
            )
        lib_.NormSetTxSocketBuffer(session, settings.socket_buffer_bytes)
        self.stream = lib_.NormStreamOpen(session, settings.buffer_bytes, None, 0)
        if not self.stream:
            self.close()
            raise NormError(f"NormStreamOpen({settings.buffer_bytes} bytes) failed: lower buffer_bytes")
        self._write = lib_.NormStreamWrite
        self._flush = lib_.NormStreamFlush

    def _restart_if_clock_went_back(self) -> None:
        """libnorm times everything (its transmit pacing, flushes, repairs) with gettimeofday(), and schedules
        each timer at an instant of that clock: a wall clock stepped back by S seconds (NTP, `date -s`) stops
        the sender for S seconds, its stream fills, and the gateway stops reading publishers (seen under `zeps
        bench chaos`, issue #34). A step back past CLOCK_STEP_S restarts the sender on the clock as it now is:
        receivers follow it as a restarted sender, and what the old stream had not sent is fetched from the
        replay sidecar like any loss. The message being written goes into the new stream whole."""
        wall = _wall_offset()
        back, self._wall = self._wall - wall, wall
        if back <= CLOCK_STEP_S:
            return
        interface, group, port = self._where
        log.warning("NORM sender on %s;%s:%d: the wall clock went back %.1f s and libnorm's timers run on it; "
                    "restarting the sender", interface, group, port, back)  # fmt: skip
        self._s.lib.NormStopSender(self._s.session)
        self._s.close()
        self._start()
        self._written, self._flushed = 0, True

    def _put(self) -> bool:
        """Write what the stream takes of the pending message; True when all of it is in (the message ends)."""
        data, done = self._pending, self._written
        assert data is not None
        # The tail is passed by address: no copy of the message per partial write.
        where: bytes | int = data
        if done:
            address = ctypes.cast(ctypes.c_char_p(data), _VOIDP).value
            assert address is not None  # a bytes object's buffer is never NULL
            where = address + done
        self._written += self._write(self.stream, where, len(data) - done)
        if self._written < len(data):
            return False
        self._pending = None
        # Push the runt segment out now, mark the next byte as a message start, and solicit NACKs for the tail.
        self._flush(self.stream, True, NORM_FLUSH_ACTIVE)
        self._flushed = False
        return True

    def _drain_events(self) -> None:
        """Consume NORM's events (vacancy is seen by writing), so that its queue does not grow."""
        for kind, _ in self._s.events():
            if kind == NORM_TX_FLUSH_COMPLETED:
                self._flushed = True

    def push(self) -> bool:
        """Write what the stream takes of the message still waiting; True when none waits (call it while not).

        NORM has no callback into Python: an accepted message that did not fit goes out only when its owner
        calls this (or sends again, or closes).
        """
        self._restart_if_clock_went_back()
        self._drain_events()
        return self._pending is None or self._put()

    def send_multipart(self, frames: Sequence[bytes | memoryview], flags: int = 0, copy: bool = True) -> None:
        """Queue one message on the stream; zmq.Again when the stream is full (blocks unless NOBLOCK)."""
        del copy  # accepted for zmq.Socket compatibility: the frames are always copied into the stream
        deadline = None
        while not self.push():
            if flags & zmq.NOBLOCK:
                raise again("NORM stream full: it empties at the sender's rate")
            deadline = deadline or time.monotonic() + self.linger_ms / 1000
            if time.monotonic() > deadline:
                raise again(f"NORM stream still full after {self.linger_ms} ms")
            select.select([self._s.fileno()], [], [], 0.01)
        self._pending, self._written = encode_message(frames), 0
        self._put()

    def close(self, linger_ms: int | None = None) -> None:
        """Finish the pending message and let NORM complete its flush (repairs) for up to `linger_ms`."""
        if self._s.session is None:
            return
        deadline = time.monotonic() + (self.linger_ms if linger_ms is None else linger_ms) / 1000
        if getattr(self, "stream", None):
            while not (self.push() and self._flushed) and time.monotonic() < deadline:
                select.select([self._s.fileno()], [], [], 0.01)
        self._s.lib.NormStopSender(self._s.session)
        self._s.close()

    def __enter__(self) -> NormSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _RxStream:
    """Parse state of one remote sender's stream: bytes not yet parsed and the message being assembled."""

    __slots__ = ("data", "frames", "synced")

    def __init__(self) -> None:
        self.data = bytearray()
        self.frames: list[bytes] = []
        self.synced = False

    def lose_sync(self) -> None:
        self.data.clear()
        self.frames = []
        self.synced = False


class NormReceiver(PolledByFd):
    """Receives the messages of every NORM sender on `group:port` whose first frame starts with a prefix.

    Like a ZeroMQ SUB: prefix subscriptions on the first frame, `poll`, `recv_multipart`, `close`. A receiver
    joins a running stream at its next message boundary (NORM_SYNC_CURRENT); after an unrecoverable loss
    (`breaks` counts them) it resumes at the next message boundary too, so it only ever yields whole
    messages. Gaps are for the caller to detect (sequence numbers), as with PGM.

    Once `hwm` parsed messages wait here (like ZeroMQ's RCVHWM; one read may overshoot it), reading stops and
    the data stays in NORM's buffer: a consumer slower than the feed for longer than that buffer lasts loses
    data (a break, then a sequence gap), never unbounded memory.
    """

    def __init__(
        self,
        interface: str,
        group: str,
        port: int,
        settings: NormSettings,
        subscriptions: Sequence[bytes] = (),
        max_message_bytes: int = 64 * 1024 * 1024,
        hwm: int = 1000,
    ) -> None:
        self._s = _Session(interface, group, port, settings)
        lib_, session = self._s.lib, self._s.session
        lib_.NormSetDefaultSyncPolicy(session, NORM_SYNC_CURRENT)
        if not self._s.start(lambda: lib_.NormStartReceiver(session, settings.buffer_bytes)):
            self._s.close()
            raise NormError(f"NormStartReceiver failed on {interface};{group}:{port}: check the interface address")
        lib_.NormSetRxSocketBuffer(session, settings.socket_buffer_bytes)
        self.subscriptions = tuple(subscriptions)
        self.max_message_bytes = max_message_bytes
        self.hwm = hwm
        self._streams: dict[int, _RxStream] = {}
        self._unread: set[int] = set()  # streams that may hold more than the last call read
        self._ready: deque[list[bytes]] = deque()
        self._buf = ctypes.create_string_buffer(_READ_CHUNK)
        self._view = memoryview(self._buf).cast("B")
        # fileno() is an epoll set of NORM's event pipe and our own pipe, which holds a byte while messages
        # wait here: readable exactly when there is something to do, as a zmq.Poller needs.
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._woken = False
        self._epoll = select.epoll()
        self._epoll.register(self._s.fileno(), select.EPOLLIN)
        self._epoll.register(self._wake_r, select.EPOLLIN)
        self._fd = self._epoll.fileno()
        self.breaks = 0

    def set_rx_loss(self, percent: float) -> None:
        """Have NORM drop this share of the packets it receives (its own test hook): proves repair on a
        network that loses nothing."""
        self._s.lib.NormSetRxLoss(self._s.session, percent)

    def fileno(self) -> int:
        """Readable while a message is ready or NORM has news: register it in a zmq.Poller, then read with
        NOBLOCK until zmq.Again (or stop early: it stays readable)."""
        return self._fd

    def poll(self, timeout: int | None = None, flags: int = zmq.POLLIN) -> int:
        """zmq.POLLIN once a message is ready (waits up to `timeout` ms; None waits for good), else 0."""
        del flags
        deadline = None if timeout is None else time.monotonic() + timeout / 1000
        while True:
            if self._ready:
                return zmq.POLLIN
            self._process()
            if self._ready:
                return zmq.POLLIN
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if left == 0.0:
                return 0
            if not self._unread:
                self._epoll.poll(-1 if left is None else left)

    def waiting(self) -> bool:
        """Whether a whole message is ready, NORM's news taken in first (as a NOBLOCK recv_multipart does)."""
        return bool(self.poll(0))

    def recv_multipart(self, flags: int = 0, copy: bool = True) -> list[bytes]:
        """The next whole message; zmq.Again with NOBLOCK when none is ready."""
        del copy
        if not self.poll(0 if flags & zmq.NOBLOCK else None):
            raise again("no NORM message ready")
        frames = self._ready.popleft()
        self._signal()
        return frames

    def _process(self) -> None:
        for kind, obj in self._s.events():
            if obj is None:  # NORM_OBJECT_INVALID: an event about no object (none of the receiver's)
                continue
            if kind in (NORM_RX_OBJECT_NEW, NORM_RX_OBJECT_UPDATED):
                if self._s.lib.NormObjectGetType(obj) == NORM_OBJECT_STREAM:
                    self._streams.setdefault(obj, _RxStream())
                    self._unread.add(obj)
            elif kind in (NORM_RX_OBJECT_COMPLETED, NORM_RX_OBJECT_ABORTED):
                self._streams.pop(obj, None)
                self._unread.discard(obj)
        for obj in list(self._unread):
            if len(self._ready) >= self.hwm:
                break
            if self._read(obj, self._streams[obj]):
                self._unread.discard(obj)
        self._signal()

    def _signal(self) -> None:
        """Keep a byte in the wake pipe exactly while messages (or unread stream data) wait here."""
        busy = bool(self._ready or self._unread)
        if busy != self._woken:
            if busy:
                os.write(self._wake_w, b"\0")
            else:
                os.read(self._wake_r, 1)
            self._woken = busy

    def _read(self, obj: int, rx: _RxStream) -> bool:
        """Read and parse what the stream holds; True once drained (NORM posts no update until then)."""
        read, seek, buf, view = self._s.lib.NormStreamRead, self._s.lib.NormStreamSeekMsgStart, self._buf, self._view
        n = _UINT()
        for _ in range(_READS_PER_CALL):
            if not rx.synced:
                if not seek(obj):
                    return True  # no message boundary received yet
                rx.synced = True
            n.value = _READ_CHUNK
            if not read(obj, buf, ctypes.byref(n)):
                self.breaks += 1  # data lost for good: resume at the next message boundary
                rx.lose_sync()
                continue
            if n.value == 0:
                return True
            rx.data += view[: n.value]
            self._parse(rx)
            if len(self._ready) >= self.hwm:
                break  # the consumer first
        return False

    def _parse(self, rx: _RxStream) -> None:
        data, pos, end = rx.data, 0, len(rx.data)
        while (header := frame_header(data, pos, end)) is not None:
            flag, fflags, size, head = header
            if flag not in (FIRST_FRAME, NEXT_FRAME) or size > self.max_message_bytes:
                self.breaks += 1  # not our framing: find the next message boundary
                rx.lose_sync()
                return
            if end - pos < head + size:
                break
            frame = bytes(data[pos + head : pos + head + size])
            pos += head + size
            if flag == FIRST_FRAME:
                rx.frames = [frame]
            elif rx.frames:
                rx.frames.append(frame)
            else:
                continue  # the tail of a message whose start was lost
            if not fflags & MORE:
                frames, rx.frames = rx.frames, []
                if frames[0].startswith(self.subscriptions):
                    self._ready.append(frames)
        del data[:pos]

    def close(self, linger: int | None = None) -> None:
        del linger
        if self._s.session is not None:
            self._s.lib.NormStopReceiver(self._s.session)
            self._epoll.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
        self._s.close()

    def __enter__(self) -> NormReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
