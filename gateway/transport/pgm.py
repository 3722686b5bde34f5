"""PGM multicast through OpenPGM itself (libpgm): a sender and a receiver with timers set for a LAN.

Why not libzmq's epgm://: libzmq 4.3.4 compiles OpenPGM's NAK timers in (src/pgm_socket.cpp): a receiver waits
up to 50 ms before its first NAK and 200 ms before it repeats one or gives up waiting for a repair, and PGM
delivers in order, so one lost packet holds everything behind it that long (p99 170-210 ms at 1% loss on a
LAN, docs/benchmarks.md). This module drives the same library (Debian libpgm-5.3-0, the one libzmq links) with
every timer a setting (`PgmSettings`, microseconds as OpenPGM takes them).

Wire compatibility with libzmq's epgm:// and pgm:// (src/pgm_sender.cpp, src/pgm_receiver.cpp): every APDU is
one TPDU (at most PGM_MSS bytes, never fragmented: libzmq's receiver asserts one buffer per APDU) made of a
2-byte big-endian offset to the first message that starts in it (0xFFFF: none does) and a run of ZMTP/1 frames;
`gateway.wire.apdu` holds those rules (packetising, and reassembling each sender's stream). The sender starts
every message in a new APDU (offset 0): a message goes out as soon as it is sent, and libzmq reads it the same.
A plain pyzmq SUB reads our feed; our receiver reads a libzmq PUB.

OpenPGM has no thread of its own: its timers (NAKs, SPM heartbeats, repairs) advance only while someone calls into
the socket. So each `PgmSender` and `PgmReceiver` owns one I/O thread that alone calls libpgm for its socket,
waiting in poll(2) on the socket's descriptors for at most the time OpenPGM reports to its next timer
(PGM_TIME_REMAIN, PGM_RATE_REMAIN). That thread is native (gateway/transport/_pgm_loop.c: the receiver's
reassembles the APDUs too and hands whole messages over in batches, the sender's cuts each message into its APDUs
as it queues it; neither takes the GIL per packet), so a busy interpreter delays neither OpenPGM's timers nor its
reads. Where that extension was not built (no C compiler or no libpgm-dev), or with ZEPS_PURE_PYTHON=1, the same
loops run in Python threads (`_PythonSendLoop`, `_PythonReceiveLoop`), which need the GIL between libpgm calls and
fall behind at full rate (docs/pgm.md, "Cost at full rate"); `IO_LOOPS` says which run. Threading contract: the
owner calls the public methods from one thread; they only touch a queue under a lock and an eventfd; libpgm sees a
single thread per socket, as libzmq's engine does (a reset reopens the receiver's socket from that thread).

Counters (`PgmReceiver.stats`): repairs received are the RDATA packets delivered (the packet type is in the
buffer), unrecoverable losses the count OpenPGM reports with each reset (`lost_count`). The NAK counters live
in OpenPGM's private peer structures, which its public API does not expose: NAKs are seen on the wire
(tshark, docs/pgm.md) or inferred (a repair received means a NAK went out).

Size: about 770 lines, kept whole: libpgm's ctypes binding (option names, structure layouts, one socket), the
settings and both I/O loops (native and Python) with their sender and receiver are the one way to drive one
library, tested as one in the lab (tests/lab/test_pgm.py); its packetising rules are gateway.wire.apdu.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import logging
import os
import select
import struct
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Protocol

import zmq

from gateway.errors import PgmError
from gateway.transport import pgm_log
from gateway.transport.pollable import PolledByFd
from gateway.wire.apdu import Reassembler, packetise

log = logging.getLogger(__name__)

_VOIDP, _BOOL, _INT, _SIZE, _LEN = ctypes.c_void_p, ctypes.c_bool, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint32
_IPPROTO_PGM, _IPPROTO_UDP, _SOL_SOCKET, _SO_RCVBUF, _SO_SNDBUF = 113, 17, 1, 8, 7
_AF_INET, _SOCK_SEQPACKET, _MSG_ERRQUEUE = 2, 5, 0x2000

# pgm/socket.h option names (enum from 0x2000) and I/O status
(PGM_SEND_SOCK, PGM_RECV_SOCK, PGM_REPAIR_SOCK, PGM_PENDING_SOCK, _ACK, PGM_TIME_REMAIN, PGM_RATE_REMAIN, _RA,
 PGM_MTU, _MSSS, PGM_MSS, _PDU, PGM_MULTICAST_LOOP, PGM_MULTICAST_HOPS, _TOS, PGM_AMBIENT_SPM, PGM_HEARTBEAT_SPM,
 _TXW_BYTES, PGM_TXW_SQNS, _TXW_SECS, _TXW_MAX_RTE, PGM_PEER_EXPIRY, PGM_SPMR_EXPIRY, _RXW_BYTES, PGM_RXW_SQNS,
 _RXW_SECS, _RXW_MAX_RTE, PGM_NAK_BO_IVL, PGM_NAK_RPT_IVL, PGM_NAK_RDATA_IVL, PGM_NAK_DATA_RETRIES,
 PGM_NAK_NCF_RETRIES, _FEC, _CR, _PGMCC, PGM_SEND_ONLY, PGM_RECV_ONLY, _PASSIVE, _ABORT, PGM_NOBLOCK,
 PGM_SEND_GROUP, PGM_JOIN_GROUP, _LEAVE, _BLOCK, _UNBLOCK, _JSG, _LSG, _MSF, PGM_UDP_ENCAP_UCAST_PORT,
 PGM_UDP_ENCAP_MCAST_PORT, _UO, _UR, PGM_ODATA_MAX_RTE, PGM_RDATA_MAX_RTE) = range(0x2000, 0x2000 + 54)  # fmt: skip
(IO_ERROR, IO_NORMAL, IO_RESET, IO_FIN, IO_EOF, IO_WOULD_BLOCK, IO_RATE_LIMITED, IO_TIMER_PENDING,
 IO_CONGESTION) = range(9)  # fmt: skip
_RDATA = 0x05  # pgm/packet.h: a repair

# Layouts from Debian's libpgm-dev 5.3.128 headers (checked with offsetof on x86_64).
_GSR_SIZE = 392  # struct pgm_group_source_req
_GROUP_REQ_SIZE = 136  # struct group_req, what PGM_JOIN_GROUP / PGM_SEND_GROUP read of it
_MSGV_SIZE = 136  # struct pgm_msgv_t: uint32 msgv_len, 16 skb pointers
_SKB = struct.Struct("<40x8sI52xH6xQ32xQ")  # pgm_sk_buff_t: tsi @40, sequence @48, len @104, pgm_header @112, data @152
_MSGV_HEAD = struct.Struct("<I4xQ")  # pgm_msgv_t: msgv_len, msgv_skb[0]
_MSGV_BATCH = 64  # APDUs per pgm_recvmsgv call


class _Error(ctypes.Structure):
    _fields_ = (("domain", _INT), ("code", _INT), ("message", ctypes.c_char_p))


class _AddrInfo(ctypes.Structure):
    _fields_ = (("ai_family", ctypes.c_uint16), ("ai_recv_addrs_len", ctypes.c_uint32), ("ai_recv_addrs", _VOIDP),
                ("ai_send_addrs_len", ctypes.c_uint32), ("ai_send_addrs", _VOIDP))  # fmt: skip


class _SockAddr(ctypes.Structure):
    _pack_ = 2
    _fields_ = (("sa_port", ctypes.c_uint16), ("gsi", ctypes.c_uint8 * 6), ("sport", ctypes.c_uint16))


class _InterfaceReq(ctypes.Structure):
    _fields_ = (
        ("ir_interface", ctypes.c_uint32),
        ("ir_scope_id", ctypes.c_uint32),
        ("ir_address", ctypes.c_uint8 * 128),
    )


class _TimeVal(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long))


_ERRP = ctypes.POINTER(ctypes.POINTER(_Error))


def _load() -> ctypes.CDLL:
    name = ctypes.util.find_library("pgm-5.3") or "libpgm-5.3.so.0"
    try:
        lib = ctypes.CDLL(name)
    except OSError as exc:
        raise PgmError(f"cannot load libpgm ({exc}); install it: apt-get install libpgm-5.3-0") from exc
    signatures = {
        "pgm_init": (_BOOL, [_ERRP]),
        "pgm_error_free": (None, [_VOIDP]),
        "pgm_getaddrinfo": (_BOOL, [ctypes.c_char_p, _VOIDP, ctypes.POINTER(ctypes.POINTER(_AddrInfo)), _ERRP]),
        "pgm_freeaddrinfo": (None, [_VOIDP]),
        "pgm_socket": (_BOOL, [ctypes.POINTER(_VOIDP), ctypes.c_uint16, _INT, _INT, _ERRP]),
        "pgm_setsockopt": (_BOOL, [_VOIDP, _INT, _INT, _VOIDP, ctypes.c_uint32]),
        "pgm_getsockopt": (_BOOL, [_VOIDP, _INT, _INT, _VOIDP, ctypes.POINTER(ctypes.c_uint32)]),
        "pgm_gsi_create_from_data": (_BOOL, [_VOIDP, ctypes.c_char_p, _INT]),
        "pgm_bind3": (_BOOL, [_VOIDP, _VOIDP, _LEN, _VOIDP, _LEN, _VOIDP, _LEN, _ERRP]),
        "pgm_connect": (_BOOL, [_VOIDP, _ERRP]),
        "pgm_close": (_BOOL, [_VOIDP, _BOOL]),
        "pgm_send": (_INT, [_VOIDP, ctypes.c_char_p, _SIZE, ctypes.POINTER(_SIZE)]),
        "pgm_recvmsgv": (_INT, [_VOIDP, _VOIDP, _SIZE, _INT, ctypes.POINTER(_SIZE), _ERRP]),
        "pgm_free": (None, [_VOIDP]),
    }
    for fn, (restype, argtypes) in signatures.items():
        func = getattr(lib, fn)
        func.restype = restype
        func.argtypes = argtypes
    err = ctypes.POINTER(_Error)()
    if not lib.pgm_init(ctypes.byref(err)):
        raise PgmError(f"pgm_init failed: {_take_error(lib, err)}")
    pgm_log.install(lib)  # its warnings into our log, once per kind and counted (a partition: one per packet)
    return lib


def _take_error(lib: ctypes.CDLL, err: ctypes._Pointer[_Error]) -> str:
    if not err:
        return "no reason given"
    text = (err.contents.message or b"").decode(errors="replace")
    lib.pgm_error_free(err)
    return text


_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()


def lib() -> ctypes.CDLL:
    """libpgm, loaded and initialised on first use (importing this module needs no PGM)."""
    global _lib
    with _lib_lock:
        if _lib is None:
            _lib = _load()
    return _lib


@dataclass(frozen=True, slots=True)
class PgmSettings:
    """What an OpenPGM socket is told; times in microseconds as OpenPGM takes them (docs/pgm.md).

    rate_kbps: the sender's original-data rate (PGM_ODATA_MAX_RTE); repairs have their own bucket of the same
        size (PGM_RDATA_MAX_RTE), so that a burst of NAKs cannot starve the feed nor the feed its repairs.
    recovery_ivl_ms: how long a sender keeps data for repair; with the rate it sizes both windows (sequences).
    nak_bo_ivl_us: a receiver that sees a gap waits a random time up to this before it NAKs (suppression:
        on a LAN with few receivers keep it short; with hundreds, raise it so that one NAK serves all).
        libzmq: 50 ms.
    nak_rpt_ivl_us: NAK again when no NCF (the sender's acknowledgement of a NAK) came within this. libzmq 200 ms.
    nak_rdata_ivl_us: NAK again when the NCF came but no repair within this. libzmq 200 ms.
    nak_data_retries / nak_ncf_retries: how often, before the data counts as lost for good (1-255). With the
        2 ms intervals, 255 tries ride out about 0.5 s of a receiver or sender not being scheduled (a loaded
        host) before a reset; libzmq tries 50 times at 200 ms.
    ambient_spm_us: the sender's SPM (source path message) interval while idle: receivers learn where to NAK
        from an SPM, and a late joiner asks for one (SPMR) after spmr_expiry_us.
    heartbeat_spm_us: SPMs right after data, at these intervals, so that a lost last packet is detected
        within the first interval rather than at the next data or the ambient SPM.
    peer_expiry_us: a receiver forgets a sender silent (no SPM) this long.
    max_tpdu: the largest PGM packet in bytes (fits the MTU).
    sndbuf, rcvbuf: the sockets' kernel buffers in bytes.
    hops: the multicast TTL.
    multicast_loop: deliver to receivers in the sender's own namespace (libzmq: never).
    """

    rate_kbps: int = 100_000
    recovery_ivl_ms: int = 2_000
    nak_bo_ivl_us: int = 500
    nak_rpt_ivl_us: int = 2_000
    nak_rdata_ivl_us: int = 2_000
    nak_data_retries: int = 255
    nak_ncf_retries: int = 255
    ambient_spm_us: int = 1_000_000
    heartbeat_spm_us: tuple[int, ...] = field(
        default=(1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000, 256_000, 512_000, 1_000_000)
    )
    spmr_expiry_us: int = 5_000
    peer_expiry_us: int = 300_000_000
    max_tpdu: int = 1_500
    sndbuf: int = 4 * 1024 * 1024
    rcvbuf: int = 4 * 1024 * 1024
    hops: int = 16
    multicast_loop: bool = False  # libzmq's choice: receivers in the sender's own namespace see nothing

    def __post_init__(self) -> None:
        if self.rate_kbps <= 0 or self.recovery_ivl_ms <= 0:
            raise PgmError("rate_kbps and recovery_ivl_ms must be positive: they size PGM's windows")
        if not (1 <= self.nak_data_retries <= 255 and 1 <= self.nak_ncf_retries <= 255):
            raise PgmError("nak_data_retries and nak_ncf_retries must be 1..255 (OpenPGM's range)")
        if min(self.nak_bo_ivl_us, self.nak_rpt_ivl_us, self.nak_rdata_ivl_us, self.spmr_expiry_us) < 2:
            raise PgmError("NAK and SPMR intervals are microseconds and must be at least 2")

    def window_sqns(self) -> int:
        """Sequences in a window: recovery_ivl of data at the rate in full TPDUs (as libzmq computes it)."""
        return max(64, self.rate_kbps * 125 * self.recovery_ivl_ms // 1000 // self.max_tpdu)


class _Socket:
    """One OpenPGM socket bound to `group:port` via the interface address, joined and connected."""

    def __init__(
        self, interface: str, group: str, port: int, settings: PgmSettings, *, sender: bool, udp: bool
    ) -> None:
        self.lib = lib()
        self.sock = _VOIDP()
        err = ctypes.POINTER(_Error)()
        self.where = where = f"{'epgm' if udp else 'pgm'}://{interface};{group}:{port}"
        res = ctypes.POINTER(_AddrInfo)()
        if not self.lib.pgm_getaddrinfo(f"{interface};{group}".encode(), None, ctypes.byref(res), ctypes.byref(err)):
            raise PgmError(f"{where}: {_take_error(self.lib, err)}: give the interface's IPv4 address")
        try:
            proto = _IPPROTO_UDP if udp else _IPPROTO_PGM
            if not self.lib.pgm_socket(ctypes.byref(self.sock), _AF_INET, _SOCK_SEQPACKET, proto, ctypes.byref(err)):
                hint = "" if udp else " (pgm:// needs raw sockets: run as root or use epgm://)"
                raise PgmError(f"{where}: pgm_socket: {_take_error(self.lib, err)}{hint}")
            if udp:
                self._set(PGM_UDP_ENCAP_UCAST_PORT, port)
                self._set(PGM_UDP_ENCAP_MCAST_PORT, port)
            self._set(PGM_MTU, settings.max_tpdu)
            self._set(_SO_RCVBUF, settings.rcvbuf, level=_SOL_SOCKET)
            self._set(_SO_SNDBUF, settings.sndbuf, level=_SOL_SOCKET)
            if sender:
                self._set(PGM_SEND_ONLY, 1)
                self._set(PGM_ODATA_MAX_RTE, settings.rate_kbps * 125)
                self._set(PGM_RDATA_MAX_RTE, settings.rate_kbps * 125)
                self._set(PGM_TXW_SQNS, settings.window_sqns())
                self._set(PGM_AMBIENT_SPM, settings.ambient_spm_us)
                beats = (ctypes.c_int * len(settings.heartbeat_spm_us))(*settings.heartbeat_spm_us)
                self._setp(PGM_HEARTBEAT_SPM, beats, ctypes.sizeof(beats))
            else:
                self._set(PGM_RECV_ONLY, 1)
                self._set(PGM_RXW_SQNS, settings.window_sqns())
                self._set(PGM_PEER_EXPIRY, settings.peer_expiry_us)
                self._set(PGM_SPMR_EXPIRY, settings.spmr_expiry_us)
                self._set(PGM_NAK_BO_IVL, settings.nak_bo_ivl_us)
                self._set(PGM_NAK_RPT_IVL, settings.nak_rpt_ivl_us)
                self._set(PGM_NAK_RDATA_IVL, settings.nak_rdata_ivl_us)
                self._set(PGM_NAK_DATA_RETRIES, settings.nak_data_retries)
                self._set(PGM_NAK_NCF_RETRIES, settings.nak_ncf_retries)
            addr = _SockAddr(sa_port=port, sport=0)
            seed = os.urandom(8)
            self.lib.pgm_gsi_create_from_data(ctypes.byref(addr, 2), seed, len(seed))
            info = res.contents
            if_req = _InterfaceReq(ir_interface=ctypes.c_uint32.from_address(info.ai_recv_addrs).value)
            size = ctypes.sizeof(if_req)
            ok = self.lib.pgm_bind3(self.sock, ctypes.byref(addr), ctypes.sizeof(addr), ctypes.byref(if_req), size,
                                    ctypes.byref(if_req), size, ctypes.byref(err))  # fmt: skip
            if not ok:
                raise PgmError(f"{where}: pgm_bind3: {_take_error(self.lib, err)}")
            for i in range(info.ai_recv_addrs_len):
                self._setp(PGM_JOIN_GROUP, info.ai_recv_addrs + i * _GSR_SIZE, _GROUP_REQ_SIZE)
            self._setp(PGM_SEND_GROUP, info.ai_send_addrs, _GROUP_REQ_SIZE)
            self._set(PGM_MULTICAST_LOOP, int(settings.multicast_loop))
            self._set(PGM_MULTICAST_HOPS, settings.hops)
            self._set(PGM_NOBLOCK, 1)
            if not self.lib.pgm_connect(self.sock, ctypes.byref(err)):
                raise PgmError(f"{where}: pgm_connect: {_take_error(self.lib, err)}")
        except BaseException:
            self.close()
            raise
        finally:
            self.lib.pgm_freeaddrinfo(res)
        self.mss = self.get(PGM_MSS)

    @property
    def address(self) -> int:
        """The pgm_sock_t's address, for the native receive loop (gateway/transport/_pgm_loop.c)."""
        return self.sock.value or 0

    def _setp(self, name: int, value: object, size: int, level: int = _IPPROTO_PGM) -> None:
        if not self.lib.pgm_setsockopt(self.sock, level, name, value, size):
            raise PgmError(f"pgm_setsockopt({name:#x}) refused its value: check the PgmSettings field for it")

    def _set(self, name: int, value: int, level: int = _IPPROTO_PGM) -> None:
        v = ctypes.c_int(value)
        self._setp(name, ctypes.byref(v), ctypes.sizeof(v), level)

    def get(self, name: int) -> int:
        v, n = ctypes.c_int(), ctypes.c_uint32(ctypes.sizeof(ctypes.c_int))
        if not self.lib.pgm_getsockopt(self.sock, _IPPROTO_PGM, name, ctypes.byref(v), ctypes.byref(n)):
            raise PgmError(f"pgm_getsockopt({name:#x}) failed")
        return v.value

    def remain(self, name: int) -> float:
        """Seconds to OpenPGM's next timer (PGM_TIME_REMAIN) or rate-limit opening (PGM_RATE_REMAIN)."""
        tv, n = _TimeVal(), ctypes.c_uint32(ctypes.sizeof(_TimeVal))
        if not self.lib.pgm_getsockopt(self.sock, _IPPROTO_PGM, name, ctypes.byref(tv), ctypes.byref(n)):
            return 0.001
        return max(0.0, tv.tv_sec + tv.tv_usec / 1e6)

    def poller(self, names: Sequence[int], wake: int) -> select.epoll:
        """An epoll set of the socket's descriptors `names` (readable) and the `wake` eventfd."""
        ep = select.epoll()
        for name in names:
            ep.register(self.get(name), select.EPOLLIN)
        ep.register(wake, select.EPOLLIN)
        return ep

    def close(self) -> None:
        if self.sock:
            self.lib.pgm_close(self.sock, True)
            self.sock = _VOIDP()


class _IoThread:
    """The thread that alone drives one OpenPGM socket, woken by an eventfd (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self.wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.lock = threading.Lock()
        self.stopping = False
        self.thread = threading.Thread(target=self.run, name=name, daemon=True)

    def run(self) -> None:
        raise NotImplementedError

    def notify(self) -> None:
        os.eventfd_write(self.wake, 1)

    def wait(self, ep: select.epoll, timeout: float | None) -> None:
        ep.poll(-1 if timeout is None else timeout)
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.wake)

    def stop(self, timeout: float) -> None:
        self.stopping = True
        self.notify()
        self.thread.join(timeout)

    def close_fd(self) -> None:
        os.close(self.wake)


def _native_loop() -> ModuleType | None:
    if os.environ.get("ZEPS_PURE_PYTHON") == "1":
        return None
    try:
        from gateway.transport import _pgm_loop
    except ImportError:  # built without a C compiler or without libpgm-dev
        return None
    return _pgm_loop


_native = _native_loop()
IO_LOOPS = "native" if _native else "python"  # which loops PgmSender and PgmReceiver run (docs/pgm.md)


@dataclass(slots=True)
class SenderStats:
    messages: int = 0
    apdus: int = 0
    rate_limited: int = 0  # times the I/O thread waited for OpenPGM's rate limiter
    dropped: int = 0  # messages pgm_send refused with an error (not seen in practice)


class _SendLoop(Protocol):
    """What drives one sending socket: `_pgm_loop.SendLoop` (a native thread) or `_PythonSendLoop`.

    `send` queues one message (its frames, cut into APDUs of at most `mss` bytes: gateway.wire.apdu.packetise,
    in C for the native loop) unless `hwm` messages still wait after `wait_s` seconds; the thread alone calls
    libpgm: it sends at OpenPGM's rate, answers NAKs with repairs and keeps the SPM timers.
    """

    def send(self, frames: Sequence[bytes | bytearray | memoryview], mss: int, wait_s: float, /) -> bool: ...
    def counters(self) -> dict[str, int]: ...
    def close(self, linger_s: float, /) -> None: ...


class _PythonSendLoop(_IoThread):
    """The send loop in a Python thread, where gateway.transport._pgm_loop was not built (as `_PythonReceiveLoop`)."""

    def __init__(self, sock: _Socket, hwm: int) -> None:
        super().__init__(f"pgm-send {sock.where}")
        self._s, self.hwm = sock, hwm
        self._queue: deque[list[bytes]] = deque()  # messages as APDUs, oldest first
        self._room = threading.Condition(self.lock)
        self.stats = SenderStats()
        self._ep = sock.poller((PGM_RECV_SOCK, PGM_REPAIR_SOCK, PGM_PENDING_SOCK), self.wake)
        self._send_fd = sock.get(PGM_SEND_SOCK)
        self.thread.start()

    def send(self, frames: Sequence[bytes | bytearray | memoryview], mss: int, wait_s: float, /) -> bool:
        return self.queue(packetise(frames, mss), wait_s)

    def queue(self, apdus: list[bytes], wait_s: float) -> bool:
        """Queue one message as the APDUs that carry it (`send` after packetising; any bytes go as they are)."""
        with self._room:
            if not self._room.wait_for(lambda: len(self._queue) < self.hwm, wait_s):
                return False
            self._queue.append(apdus)
            was_idle = len(self._queue) == 1
        if was_idle:
            self.notify()
        return True

    def counters(self) -> dict[str, int]:
        with self.lock:
            return dataclasses.asdict(self.stats)

    def run(self) -> None:
        s, send, recv = self._s, self._s.lib.pgm_send, self._s.lib.pgm_recvmsgv
        dummy, n = ctypes.create_string_buffer(_MSGV_SIZE), _SIZE()
        writable = select.epoll()
        writable.register(self._send_fd, select.EPOLLOUT)
        while True:
            # NAKs, SPMRs and the repairs they ask for; SPM timers.
            status = recv(s.sock, dummy, 1, 0, ctypes.byref(n), None)
            rate_wait = s.remain(PGM_RATE_REMAIN) if status == IO_RATE_LIMITED else None
            blocked = False
            while True:
                with self.lock:
                    if not self._queue:
                        break
                    message = self._queue[0]
                apdu = message[0]
                status = send(s.sock, apdu, len(apdu), ctypes.byref(n))
                if status == IO_NORMAL:
                    self.stats.apdus += 1
                    message.pop(0)
                    if not message:
                        self._done(dropped=False)
                    continue
                if status == IO_RATE_LIMITED:
                    self.stats.rate_limited += 1
                    rate_wait = s.remain(PGM_RATE_REMAIN)
                elif status == IO_WOULD_BLOCK:
                    blocked = True
                else:
                    self._done(dropped=True)
                    continue
                break
            with self.lock:
                if self.stopping and not self._queue:
                    break
            timeout = s.remain(PGM_TIME_REMAIN)  # sending re-arms the heartbeat SPMs
            if rate_wait is not None:
                timeout = min(timeout, rate_wait)
            if blocked:
                writable.poll(min(timeout, 0.001))
            else:
                self.wait(self._ep, timeout)
        writable.close()

    def _done(self, *, dropped: bool) -> None:
        with self._room:
            self._queue.popleft()
            if dropped:
                self.stats.dropped += 1
            else:
                self.stats.messages += 1
            self._room.notify()

    def close(self, linger_s: float) -> None:
        self.stop(linger_s)
        if self.thread.is_alive():  # still rate limited: give up on all but the message being sent
            with self.lock:
                while len(self._queue) > 1:
                    self._queue.pop()
            self.thread.join()
        self._ep.close()
        self.close_fd()


class PgmSender:
    """Sends ZeroMQ-style multipart messages on a PGM session at `rate_kbps`, with backpressure.

    `send_multipart` queues a whole message or raises zmq.Again once `hwm` messages wait for the rate limiter
    (after waiting up to `linger_ms` unless NOBLOCK), so nothing is dropped to make room. The duck-typed subset
    of zmq.Socket that the gateway uses: send_multipart, close. The socket is driven by a native thread
    (gateway/transport/_pgm_loop.c), or by `_PythonSendLoop` where that extension was not built.
    """

    def __init__(self, interface: str, group: str, port: int, settings: PgmSettings, *, udp: bool = True,
                 hwm: int = 64, linger_ms: int = 2_000) -> None:  # fmt: skip
        self._s = _Socket(interface, group, port, settings, sender=True, udp=udp)
        self.hwm, self.linger_ms = hwm, linger_ms
        self.mss = self._s.mss
        self._loop: _SendLoop = _native.SendLoop(self._s.address, hwm) if _native else _PythonSendLoop(self._s, hwm)
        self._closed = False

    @property
    def stats(self) -> SenderStats:
        """The counters so far (a snapshot)."""
        return SenderStats(**self._loop.counters())

    def send_multipart(
        self, frames: Sequence[bytes | bytearray | memoryview], flags: int = 0, copy: bool = True
    ) -> None:
        """Queue one message; zmq.Again when `hwm` messages wait already (blocks up to linger_ms unless NOBLOCK)."""
        del copy  # the frames are always copied (into APDUs, then by OpenPGM into its window)
        if not self._loop.send(frames, self.mss, 0.0 if flags & zmq.NOBLOCK else self.linger_ms / 1000):
            raise zmq.Again()  # the queue drains at the sender's rate

    def close(self, linger_ms: int | None = None) -> None:
        """Send what is queued (for up to `linger_ms`), then close the session."""
        if self._closed:
            return
        self._closed = True
        self._loop.close((self.linger_ms if linger_ms is None else linger_ms) / 1000)
        self._s.close()

    def __enter__(self) -> PgmSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(slots=True)
class ReceiverStats:
    messages: int = 0
    apdus: int = 0
    repairs: int = 0  # RDATA delivered: losses PGM repaired
    resets: int = 0  # times OpenPGM reported data lost for good (each starts a new session)
    lost: int = 0  # sequences lost for good (OpenPGM's lost_count)
    junk: int = 0  # APDUs or frames that are not libzmq's framing (that sender's stream resynchronises)
    overruns: int = 0  # messages dropped because `hwm` messages waited for the consumer


class _ReceiveLoop(Protocol):
    """What drives one receiving socket: `_pgm_loop.ReceiveLoop` (a native thread) or `_PythonReceiveLoop`.

    The thread alone calls libpgm, reassembles APDUs, and queues whole messages (at most `hwm`: newer ones are
    counted as overruns); `fileno` is an eventfd readable while messages wait; `take` pops the oldest.
    """

    def start(self) -> None: ...
    def take(self) -> list[bytes] | None: ...
    def ready(self) -> int: ...
    def counters(self) -> dict[str, int]: ...
    def fileno(self) -> int: ...
    def close(self) -> None: ...


class _PythonReceiveLoop(_IoThread):
    """The receive loop in a Python thread: used when gateway.transport._pgm_loop was not built (no C compiler
    or no libpgm-dev) or ZEPS_PURE_PYTHON=1. It needs the GIL between libpgm calls, so a busy interpreter delays
    OpenPGM's timers and, at full rate, its reads (docs/pgm.md, "Cost at full rate")."""

    def __init__(
        self,
        sock: _Socket,
        reopen: Callable[[], _Socket],
        subscriptions: Sequence[bytes],
        hwm: int,
        max_message_bytes: int,
    ) -> None:
        super().__init__(f"pgm-recv {sock.where}")
        self._s, self._reopen, self.hwm = sock, reopen, hwm
        self._apdus = Reassembler(subscriptions, max_message_bytes)
        self.stats = ReceiverStats()
        self._ready: deque[list[bytes]] = deque()
        self._signal = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)  # holds 1 while messages wait
        self._signalled = False
        self._ep = sock.poller((PGM_RECV_SOCK, PGM_PENDING_SOCK), self.wake)

    def start(self) -> None:
        self.thread.start()

    def fileno(self) -> int:
        return self._signal

    def ready(self) -> int:
        return len(self._ready)

    def counters(self) -> dict[str, int]:
        with self.lock:
            return dataclasses.asdict(self.stats)

    def take(self) -> list[bytes] | None:
        with self.lock:
            frames = self._ready.popleft() if self._ready else None
            if not self._ready and self._signalled:
                os.eventfd_read(self._signal)
                self._signalled = False
            return frames

    def run(self) -> None:
        recv = self._s.lib.pgm_recvmsgv
        msgv = ctypes.create_string_buffer(_MSGV_SIZE * _MSGV_BATCH)
        base, n = ctypes.addressof(msgv), _SIZE()
        while not self.stopping:
            s = self._s
            ctypes.c_void_p.from_address(base + 8).value = None  # a reset puts its error skb here
            status = recv(s.sock, msgv, _MSGV_BATCH, _MSG_ERRQUEUE, ctypes.byref(n), None)
            if status == IO_NORMAL:
                self._deliver(base, n.value)
            elif status == IO_RESET:
                self._reset(ctypes.c_void_p.from_address(base + 8).value)
            elif status == IO_TIMER_PENDING:
                self.wait(self._ep, s.remain(PGM_TIME_REMAIN))
            elif status == IO_RATE_LIMITED:
                self.wait(self._ep, s.remain(PGM_RATE_REMAIN))
            elif status == IO_WOULD_BLOCK:
                self.wait(self._ep, None)
            else:
                log.warning("pgm_recvmsgv returned status %d", status)
                self.wait(self._ep, 0.01)

    def _deliver(self, base: int, nbytes: int) -> None:
        """Parse the APDUs pgm_recvmsgv put in the msgv array (their lengths add up to `nbytes`)."""
        out: list[list[bytes]] = []
        at, string_at, feed, repairs, apdus = base, ctypes.string_at, self._apdus.feed, 0, 0
        while nbytes > 0:
            count, first = _MSGV_HEAD.unpack(string_at(at, _MSGV_HEAD.size))
            parts, tsi = [], b""
            for i in range(count):
                skb = first if i == 0 else ctypes.c_void_p.from_address(at + 8 + 8 * i).value or 0
                tsi, _, length, header, data = _SKB.unpack(string_at(skb, _SKB.size))
                # A received skb holds its packet right behind it (pgm_alloc_skb): one copy for type and payload.
                packet = string_at(skb, data - skb + length)
                repairs += packet[header - skb + 4] == _RDATA
                parts.append(packet[data - skb :])
                nbytes -= length
            at += _MSGV_SIZE
            apdus += 1
            feed(tsi, parts[0] if count == 1 else b"".join(parts), out)
        with self.lock:
            self.stats.repairs += repairs
            self.stats.apdus += apdus
            self.stats.junk = self._apdus.junk
            if out:
                room = max(0, self.hwm - len(self._ready))
                self.stats.overruns += max(0, len(out) - room)
                self._ready.extend(out[:room])
                self.stats.messages += min(room, len(out))
                if not self._signalled:
                    os.eventfd_write(self._signal, 1)
                    self._signalled = True

    def _reset(self, skb: int | None) -> None:
        """OpenPGM lost data for good: count it, then have the receiver open a new session (PgmReceiver._reopen)."""
        with self.lock:
            self.stats.resets += 1
            if skb:
                self.stats.lost += _SKB.unpack(ctypes.string_at(skb, _SKB.size))[1]  # this session's lost_count
        if skb:
            self._s.lib.pgm_free(skb)  # the error buffer OpenPGM allocated for this report
        self._apdus.lose_all()
        self._ep.close()
        self._s = self._reopen()
        self._ep = self._s.poller((PGM_RECV_SOCK, PGM_PENDING_SOCK), self.wake)

    def close(self) -> None:
        self.stop(5.0)
        self._ep.close()
        self.close_fd()
        os.close(self._signal)


class PgmReceiver(PolledByFd):
    """Receives the messages of every PGM sender on `group:port` whose first frame starts with a subscription.

    Like a ZeroMQ SUB: prefix subscriptions on the first frame, `poll`, `recv_multipart`, `close`, and a
    `fileno` for zmq.Poller (readable exactly while a message waits). It joins a running session at the next
    message start and, after an unrecoverable loss, resumes at the next message start too: it yields only
    whole messages; gaps are for the caller's sequence numbers. Junk on the group (not PGM, or PGM that is not
    libzmq's framing) is counted and skipped.

    The socket is driven by a native thread (gateway/transport/_pgm_loop.c) that never takes the GIL per
    packet, or by `_PythonReceiveLoop` where that extension was not built (`IO_LOOPS` says which).

    Once `hwm` messages wait here, newer ones are dropped (counted in `stats.overruns`): a consumer slower than
    the feed sees a sequence gap (for replay to fill), never unbounded memory, and PGM goes on reading and
    repairing at the wire's pace. (Pausing the reads instead overruns the socket's buffer: OpenPGM then has
    thousands of sequences to NAK for at once, which the sender no longer holds; measured, it stopped
    delivering for good.)
    """

    def __init__(
        self,
        interface: str,
        group: str,
        port: int,
        settings: PgmSettings,
        subscriptions: Sequence[bytes] = (),
        *,
        udp: bool = True,
        hwm: int = 1000,
        max_message_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self._open = lambda: _Socket(interface, group, port, settings, sender=False, udp=udp)
        self._s = self._open()
        subscriptions = tuple(subscriptions)
        self._loop: _ReceiveLoop
        if _native is not None:
            self._loop = _native.ReceiveLoop(self._s.address, self._reopen_address, subscriptions, hwm,
                                             max_message_bytes)  # fmt: skip
        else:
            self._loop = _PythonReceiveLoop(self._s, self._reopen, subscriptions, hwm, max_message_bytes)
        self._closed = False
        self._loop.start()

    def _reopen(self) -> _Socket:
        """A new session after an unrecoverable loss, called by the loop's thread (the socket's only user).

        Measured: an OpenPGM receiver (libzmq's too) that has reported unrecoverable loss may deliver nothing
        more, for good, while its senders go on (docs/pgm.md). A new socket joins like a late joiner, at each
        sender's next message start; what passes meanwhile is a sequence gap, for replay to fill.
        """
        fresh = self._open()
        self._s.close()
        self._s = fresh
        return fresh

    def _reopen_address(self) -> int:
        return self._reopen().address

    @property
    def stats(self) -> ReceiverStats:
        """The counters so far (a snapshot)."""
        return ReceiverStats(**self._loop.counters())

    def fileno(self) -> int:
        return self._loop.fileno()

    def poll(self, timeout: int | None = None, flags: int = zmq.POLLIN) -> int:
        """zmq.POLLIN once a message is ready (waits up to `timeout` ms; None waits for good), else 0."""
        del flags
        if self._loop.ready():
            return zmq.POLLIN
        ready = select.select([self.fileno()], [], [], None if timeout is None else timeout / 1000)[0]
        return zmq.POLLIN if ready and self._loop.ready() else 0

    def waiting(self) -> bool:
        """Whether a whole message is ready (what recv_multipart takes)."""
        return bool(self._loop.ready())

    def recv_multipart(self, flags: int = 0, copy: bool = True) -> list[bytes]:
        """The next whole message; zmq.Again with NOBLOCK when none is ready."""
        del copy
        while (frames := self._loop.take()) is None:
            if flags & zmq.NOBLOCK:
                raise zmq.Again()  # no message ready
            self.poll(None)
        return frames

    def close(self, linger: int | None = None) -> None:
        del linger
        if self._closed:
            return
        self._closed = True
        self._loop.close()
        self._s.close()

    def __enter__(self) -> PgmReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
