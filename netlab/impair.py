"""Impair the link of one lab host: loss (random, Gilbert bursts, exactly-N), duplication, rate, delay, partition.

Why not netem: kernels built without ``sch_netem`` (this project's test VMs: ``CONFIG_NET_SCH_NETEM`` unset, no
modules, also no ``act_gact``/``cls_matchall``) cannot load it at all, and one mechanism everywhere beats a second,
untested one. So the pieces are:

- **eBPF** (``cls_bpf``, direct action, on a ``clsact`` egress hook): random loss, Gilbert-Elliott loss,
  "drop exactly the next N", partition and duplication (``bpf_clone_redirect``). Its parameters and counters
  live in a one-element mmap-able BPF array, so a change is a few stores into shared memory: nothing is
  reloaded and no queued packet is lost. Any process finds the map again from the tc filter (its program id).
- **TBF** root qdisc (pyroute2): rate limit.
- **NFQUEUE** (iptables ``mangle``, in the host's namespace) feeding a small Python process that holds each
  packet's verdict for the delay: delay, jitter, reorder. It runs inside the host's namespace, so ``Lab.down``
  kills it with everything else; ``--queue-bypass`` lets packets through undelayed if it dies.

Directions: ``"in"`` shapes the egress of the host's *bridge-side* veth (in the root namespace, delay at the
host's PREROUTING): what arrives at the host. ``"out"`` shapes the egress of the host's own interface (inside
its namespace, delay at POSTROUTING): what the host sends, to everyone. Multicast is flooded by the bridge into
each port separately, so "in" on one subscriber impairs that subscriber only.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import heapq
import mmap
import os
import random
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from netlab import ns, state
from netlab.lab import Host, Lab, LabError

Direction = Literal["in", "out"]
DIRECTIONS: tuple[Direction, Direction] = ("in", "out")

_U32 = 0xFFFFFFFF
_ENOENT, _EINVAL = 2, 22
_FILTER_NAME = "netlab-impair"
_CLSACT_EGRESS = 0xFFFFFFF3  # TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_EGRESS)
_TBF_HANDLE = 0x10000
_IPTABLES_TIMEOUT = 30.0


@dataclass(frozen=True)
class Impairment:
    """What one direction of a host's link does to packets. Defaults: a perfect link.

    ``loss_burst`` turns random loss into bursts: the Gilbert model (netem's ``loss gemodel p r 100% 0%``) with
    ``loss_pct`` average loss in bursts of ``loss_burst`` consecutive packets on average (geometric lengths).
    ``reorder_pct`` of the packets skip the delay and so overtake the others (netem's rule; needs a delay).
    Jitter is uniform in ±``jitter_ms`` and reorders packets too, as in netem.
    """

    loss_pct: float = 0.0
    loss_burst: float | None = None
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    reorder_pct: float = 0.0
    duplicate_pct: float = 0.0
    rate_kbit: int | None = None

    def __post_init__(self) -> None:
        for name in ("loss_pct", "reorder_pct", "duplicate_pct"):
            if not 0 <= getattr(self, name) <= 100:
                raise ValueError(f"{name} must be a percentage, 0 to 100 (got {getattr(self, name)})")
        if self.loss_burst is not None and (self.loss_burst < 1 or not 0 < self.loss_pct < 100):
            raise ValueError(
                f"loss_burst (mean burst length, packets) must be >= 1 with 0 < loss_pct < 100 "
                f"(got loss_burst={self.loss_burst}, loss_pct={self.loss_pct})"
            )
        if self.delay_ms < 0 or self.jitter_ms < 0:
            raise ValueError(f"delay_ms and jitter_ms must be >= 0 (got {self.delay_ms}, {self.jitter_ms})")
        if self.reorder_pct and not self.delay_ms:
            raise ValueError("reorder_pct needs delay_ms > 0: reordered packets are the ones that skip the delay")
        if self.rate_kbit is not None and self.rate_kbit <= 0:
            raise ValueError(f"rate_kbit must be > 0, or None for no limit (got {self.rate_kbit})")

    @property
    def is_clear(self) -> bool:
        return self == Impairment()

    def describe(self) -> str:
        """Short text in the CLI's own units, e.g. ``loss 5% burst 10, delay 2ms``."""
        parts = []
        if self.loss_pct:
            parts.append(f"loss {self.loss_pct:g}%" + (f" burst {self.loss_burst:g}" if self.loss_burst else ""))
        if self.delay_ms or self.jitter_ms:
            parts.append(f"delay {self.delay_ms:g}ms" + (f" jitter {self.jitter_ms:g}ms" if self.jitter_ms else ""))
        if self.reorder_pct:
            parts.append(f"reorder {self.reorder_pct:g}%")
        if self.duplicate_pct:
            parts.append(f"duplicate {self.duplicate_pct:g}%")
        if self.rate_kbit:
            mbit = self.rate_kbit / 1000
            parts.append(f"rate {mbit:g}mbit" if self.rate_kbit >= 1000 else f"rate {self.rate_kbit}kbit")
        return ", ".join(parts) or "none"


@dataclass(frozen=True)
class LinkCounters:
    """Counters of the eBPF stage of one direction (zero when nothing is installed)."""

    seen: int = 0  # packets that passed the hook (duplicates not counted)
    dropped: int = 0  # by any cause: random or burst loss, partition, drop_next
    burst_dropped: int = 0  # by drop_next budgets
    burst_left: int = 0  # what the current drop_next budget still has to drop
    duplicated: int = 0
    partitioned: bool = False


# --- eBPF: a hand-assembled program, loaded with the bpf(2) system call ------------------------------------

# Layout of the one map value, shared with user space through mmap.
_P_GOOD_BAD, _P_BAD_GOOD, _LOSS_GOOD, _LOSS_BAD, _DUP, _PARTITION, _STATE, _BURST_PORT = range(0, 32, 4)
_BURST, _SEEN, _DROPPED, _BURST_DROPPED, _DUPLICATED = range(32, 72, 8)
_VALUE_SIZE = 72
_DUP_MARK = 0x6E6C6470  # skb->mark of our own clones, so they are not impaired a second time

_NR_BPF = {"x86_64": 321, "aarch64": 280}.get(os.uname().machine)
_MAP_CREATE, _PROG_LOAD, _PROG_GET_FD_BY_ID, _MAP_GET_FD_BY_ID, _OBJ_GET_INFO_BY_FD = 0, 5, 13, 14, 15
_MAP_TYPE_ARRAY, _F_MMAPABLE, _PROG_TYPE_SCHED_CLS = 2, 1 << 10, 3
_HELPER_PRANDOM, _HELPER_CLONE_REDIRECT, _HELPER_SKB_LOAD_BYTES = 7, 13, 26
_SKB_MARK, _SKB_PROTOCOL, _SKB_IFINDEX = 8, 16, 40  # offsets in struct __sk_buff
_TC_ACT_OK, _TC_ACT_SHOT = 0, 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _bpf(cmd: int, attr: bytearray) -> int:
    if _NR_BPF is None:
        raise LabError(f"netlab knows the bpf(2) syscall number of x86_64 and aarch64 only, not {os.uname().machine}")
    buf = (ctypes.c_char * len(attr)).from_buffer(attr)
    result = _libc.syscall(_NR_BPF, cmd, buf, len(attr))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf(cmd {cmd}): {os.strerror(err)}")
    return int(result)


Insn = tuple[int, int, int, int | str, int]  # opcode, dst, src, offset (or a label to jump to), immediate
_W, _H, _B, _DW = 0x00, 0x08, 0x10, 0x18
_JEQ, _JGE, _JNE, _JLT, _JSLE = 0x10, 0x30, 0x50, 0xA0, 0xD0


def _mov(dst: int, imm: int) -> Insn:
    return (0xB7, dst, 0, 0, imm)


def _movr(dst: int, src: int) -> Insn:
    return (0xBF, dst, src, 0, 0)


def _ldx(size: int, dst: int, src: int, off: int) -> Insn:
    return (0x61 | size, dst, src, off, 0)


def _stx(size: int, dst: int, src: int, off: int) -> Insn:
    return (0x63 | size, dst, src, off, 0)


def _add(dst: int, imm: int) -> Insn:
    return (0x07, dst, 0, 0, imm)


def _jmp(op: int, dst: int, imm: int, label: str) -> Insn:
    return (0x05 | op, dst, 0, label, imm)


def _jmpr(op: int, dst: int, src: int, label: str) -> Insn:
    return (0x0D | op, dst, src, label, 0)


def _goto(label: str) -> Insn:
    return (0x05, 0, 0, label, 0)


def _call(helper: int) -> Insn:
    return (0x85, 0, 0, 0, helper)


def _atomic_add(dst: int, src: int, off: int, *, fetch: bool = False) -> Insn:
    """``*(u64 *)(dst + off) += src`` atomically; with ``fetch`` the old value lands in ``src``."""
    return (0xDB, dst, src, off, 0x01 if fetch else 0x00)


def _count(field: int) -> list[Insn | str]:
    return [_mov(1, 1), _atomic_add(7, 1, field)]


_EXIT: Insn = (0x95, 0, 0, 0, 0)


def _assemble(program: list[Insn | str]) -> bytes:
    """Encode instructions; strings in the list are labels, jump offsets are resolved against them."""
    labels, slot = {}, 0
    for item in program:
        if isinstance(item, str):
            labels[item] = slot
        else:
            slot += 1
    out, slot = [], 0
    for item in program:
        if isinstance(item, str):
            continue
        code, dst, src, off, imm = item
        if isinstance(off, str):
            off = labels[off] - slot - 1
        out.append(struct.pack("<BBhi", code, src << 4 | dst, off, imm))
        slot += 1
    return b"".join(out)


def _program(map_fd: int) -> bytes:
    """The egress filter. r6 = skb, r7 = the map value, r8 = Gilbert state, r9 = scratch kept across calls.

    Order per packet: our own clone? pass. Partition? drop. drop_next budget left (and the UDP port matches)?
    drop. Gilbert state transition, then loss with the new state's probability. Then maybe duplicate.
    """
    return _assemble(
        [
            _movr(6, 1),
            (0x18, 7, 2, 0, map_fd),  # r7 = &value[0]  (ld_imm64, BPF_PSEUDO_MAP_VALUE)
            (0x00, 0, 0, 0, 0),
            _ldx(_W, 1, 6, _SKB_MARK),
            _jmp(_JEQ, 1, _DUP_MARK, "clone"),
            *_count(_SEEN),
            _ldx(_W, 1, 7, _PARTITION),
            _jmp(_JNE, 1, 0, "drop"),
            _ldx(_DW, 1, 7, _BURST),
            _jmp(_JSLE, 1, 0, "model"),
            _ldx(_W, 9, 7, _BURST_PORT),  # network byte order, as read from the packet
            _jmp(_JEQ, 9, 0, "take"),
            _ldx(_W, 1, 6, _SKB_PROTOCOL),
            _jmp(_JNE, 1, socket.htons(0x0800), "model"),
            _movr(1, 6),
            _mov(2, 14),  # IPv4 header, after the Ethernet header
            _movr(3, 10),
            _add(3, -16),
            _mov(4, 10),
            _call(_HELPER_SKB_LOAD_BYTES),
            _jmp(_JNE, 0, 0, "model"),
            _ldx(_B, 1, 10, -16 + 9),  # protocol
            _jmp(_JNE, 1, socket.IPPROTO_UDP, "model"),
            _ldx(_B, 2, 10, -16),  # version and header length
            (0x57, 2, 0, 0, 0x0F),  # r2 &= 0xf
            (0x67, 2, 0, 0, 2),  # r2 <<= 2
            _add(2, 14 + 2),  # UDP destination port
            _movr(1, 6),
            _movr(3, 10),
            _add(3, -4),
            _mov(4, 2),
            _call(_HELPER_SKB_LOAD_BYTES),
            _jmp(_JNE, 0, 0, "model"),
            _ldx(_H, 1, 10, -4),
            _jmpr(_JNE, 1, 9, "model"),
            "take",
            _mov(1, -1),
            _atomic_add(7, 1, _BURST, fetch=True),
            _jmp(_JSLE, 1, 0, "model"),  # another CPU took the last one
            *_count(_BURST_DROPPED),
            _goto("drop"),
            "model",
            _ldx(_W, 8, 7, _STATE),
            _jmp(_JNE, 8, 0, "bad"),
            _ldx(_W, 1, 7, _P_GOOD_BAD),
            _jmp(_JEQ, 1, 0, "decide"),
            _call(_HELPER_PRANDOM),
            _ldx(_W, 1, 7, _P_GOOD_BAD),
            _jmpr(_JGE, 0, 1, "decide"),
            _mov(8, 1),
            _goto("store"),
            "bad",
            _call(_HELPER_PRANDOM),
            _ldx(_W, 1, 7, _P_BAD_GOOD),
            _jmpr(_JGE, 0, 1, "decide"),
            _mov(8, 0),
            "store",
            _stx(_W, 7, 8, _STATE),
            "decide",
            _ldx(_W, 9, 7, _LOSS_GOOD),
            _jmp(_JEQ, 8, 0, "lossy"),
            _ldx(_W, 9, 7, _LOSS_BAD),
            "lossy",
            _jmp(_JEQ, 9, 0, "dup"),
            _call(_HELPER_PRANDOM),
            _jmpr(_JLT, 0, 9, "drop"),
            "dup",
            _ldx(_W, 9, 7, _DUP),
            _jmp(_JEQ, 9, 0, "pass"),
            _call(_HELPER_PRANDOM),
            _jmpr(_JGE, 0, 9, "pass"),
            _ldx(_W, 9, 6, _SKB_MARK),
            _mov(1, _DUP_MARK),
            _stx(_W, 6, 1, _SKB_MARK),
            _movr(1, 6),
            _ldx(_W, 2, 6, _SKB_IFINDEX),
            _mov(3, 0),  # to the egress of the same device
            _call(_HELPER_CLONE_REDIRECT),
            _stx(_W, 6, 9, _SKB_MARK),
            _jmp(_JNE, 0, 0, "pass"),
            *_count(_DUPLICATED),
            "pass",
            _mov(0, _TC_ACT_OK),
            _EXIT,
            "clone",
            _mov(1, 0),
            _stx(_W, 6, 1, _SKB_MARK),
            _goto("pass"),
            "drop",
            *_count(_DROPPED),
            _mov(0, _TC_ACT_SHOT),
            _EXIT,
        ]
    )


def _load_program(name: str) -> tuple[int, int]:
    """Create the map and load the program; return (program fd, map fd)."""
    attr = bytearray(128)
    struct.pack_into("<IIIII8x16s", attr, 0, _MAP_TYPE_ARRAY, 4, _VALUE_SIZE, 1, _F_MMAPABLE, name.encode())
    map_fd = _bpf(_MAP_CREATE, attr)
    try:
        code = ctypes.create_string_buffer(_program(map_fd))
        license_ = ctypes.create_string_buffer(b"GPL")  # bpf_clone_redirect is GPL-only
        log = ctypes.create_string_buffer(1 << 16)
        attr = bytearray(128)
        struct.pack_into(
            "<IIQQIIQII16s",
            *(attr, 0, _PROG_TYPE_SCHED_CLS, (len(code) - 1) // 8, ctypes.addressof(code)),
            *(ctypes.addressof(license_), 1, len(log), ctypes.addressof(log), 0, 0, name.encode()),
        )
        try:
            prog_fd = _bpf(_PROG_LOAD, attr)
        except OSError as exc:
            raise LabError(
                f"the kernel refused netlab's eBPF filter ({exc}); it needs Linux >= 5.12 with BPF syscall and "
                f"JIT. Verifier log: {log.value.decode(errors='replace')[-2000:]}"
            ) from exc
    except BaseException:
        os.close(map_fd)
        raise
    return prog_fd, map_fd


def _map_fd_of_program(prog_id: int) -> int:
    """The fd of the (only) map used by the program with id ``prog_id``."""
    attr = bytearray(16)
    struct.pack_into("<I", attr, 0, prog_id)
    prog_fd = _bpf(_PROG_GET_FD_BY_ID, attr)
    try:
        map_ids = (ctypes.c_uint32 * 1)()
        info = bytearray(256)
        struct.pack_into("<IQ", info, 52, 1, ctypes.addressof(map_ids))
        info_buf = (ctypes.c_char * len(info)).from_buffer(info)
        attr = bytearray(16)
        struct.pack_into("<IIQ", attr, 0, prog_fd, len(info), ctypes.addressof(info_buf))
        _bpf(_OBJ_GET_INFO_BY_FD, attr)
    finally:
        os.close(prog_fd)
    attr = bytearray(16)
    struct.pack_into("<I", attr, 0, map_ids[0])
    return _bpf(_MAP_GET_FD_BY_ID, attr)


class _Value:
    """The map value of one direction, mapped into this process: plain loads and stores, shared with the kernel."""

    def __init__(self, map_fd: int):
        self._mm = mmap.mmap(map_fd, mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def get(self, fmt: str, offset: int) -> int:
        return int(struct.unpack_from(fmt, self._mm, offset)[0])

    def set(self, fmt: str, offset: int, value: int) -> None:
        struct.pack_into(fmt, self._mm, offset, value)

    def close(self) -> None:
        self._mm.close()


# --- the pieces on one interface ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Link:
    """One direction of one host's link: which interface, in which namespace, hooks which chain for delay."""

    host: Host
    direction: Direction

    @property
    def netns(self) -> str | None:
        return None if self.direction == "in" else self.host.netns

    @property
    def ifname(self) -> str:
        return self.host.veth if self.direction == "in" else self.host.ifname

    @property
    def chain(self) -> str:
        return "PREROUTING" if self.direction == "in" else "POSTROUTING"

    def iproute(self) -> IPRoute:
        return IPRoute(netns=self.netns, flags=0) if self.netns else IPRoute()

    def index(self, ipr: IPRoute) -> int:
        found = ipr.link_lookup(ifname=self.ifname)
        if not found:
            raise LabError(f"interface {self.ifname} of host {self.host.name} is gone; is the lab still up?")
        return int(found[0])


def _nested_u32(options: Any, wanted: int) -> int | None:
    """Attribute ``wanted`` of a tc options blob, read from the raw bytes (pyroute2 does not decode TCA_BPF_ID)."""
    raw = bytes(options.data[options.offset : options.offset + options.length])
    pos = 4
    while pos + 4 <= len(raw):
        length, kind = struct.unpack_from("=HH", raw, pos)
        if length < 4:
            break
        if kind & 0x7FFF == wanted and length >= 8:
            return int(struct.unpack_from("=I", raw, pos + 4)[0])
        pos += (length + 3) & ~3
    return None


def _find_filter(ipr: IPRoute, index: int) -> int | None:
    """The program id of netlab's filter on this interface's egress, or None."""
    try:
        filters = ipr.get_filters(index=index, parent=_CLSACT_EGRESS)
    except NetlinkError as exc:
        if exc.code in (_ENOENT, _EINVAL):  # no clsact qdisc at all
            return None
        raise
    for msg in filters:
        options = msg.get_attr("TCA_OPTIONS")
        if options is not None and options.get_attr("TCA_BPF_NAME") == _FILTER_NAME:
            return _nested_u32(options, 11)  # TCA_BPF_ID
    return None


@contextlib.contextmanager
def _value(link: _Link, *, create: bool) -> Iterator[_Value | None]:
    """The map value of ``link``'s filter; with ``create``, attach the filter first if there is none."""
    with link.iproute() as ipr:
        index = link.index(ipr)
        prog_id = _find_filter(ipr, index)
        if prog_id is None and not create:
            yield None
            return
        if prog_id is None:
            prog_fd, map_fd = _load_program(f"{link.host.veth.replace('-', '_')}_{link.direction}")
            try:
                with contextlib.suppress(NetlinkError):  # EEXIST: a clsact qdisc is already there
                    ipr.tc("add", "clsact", index)
                ipr.tc(
                    "add-filter",
                    "bpf",
                    index,
                    ":1",
                    fd=prog_fd,
                    name=_FILTER_NAME,
                    parent=_CLSACT_EGRESS,
                    classid=1,
                    direct_action=True,
                )
            except BaseException:
                os.close(map_fd)
                raise
            finally:
                os.close(prog_fd)
        else:
            map_fd = _map_fd_of_program(prog_id)
    try:
        value = _Value(map_fd)
    finally:
        os.close(map_fd)
    try:
        yield value
    finally:
        value.close()


def _remove_filter(link: _Link) -> None:
    with link.iproute() as ipr, contextlib.suppress(NetlinkError):  # ENOENT/EINVAL: none there
        ipr.tc("del", "clsact", link.index(ipr))


def _u32(pct: float) -> int:
    return round(pct / 100 * _U32)


def _pct(value: int) -> float:
    return round(value / _U32 * 100, 4)


def _set_loss_model(value: _Value, imp: Impairment) -> None:
    """Bernoulli loss is the Gilbert-Elliott model with no transitions; bursts use the Gilbert special case."""
    if imp.loss_burst is None:
        p, r, loss_good, loss_bad = 0.0, 0.0, imp.loss_pct, 0.0
    else:
        # Mean burst length 1/r; stationary loss p/(p+r).
        r = 100 / imp.loss_burst
        p = r * imp.loss_pct / (100 - imp.loss_pct)
        loss_good, loss_bad = 0.0, 100.0
    value.set("<I", _LOSS_GOOD, _u32(loss_good))
    value.set("<I", _LOSS_BAD, _u32(loss_bad))
    value.set("<I", _P_BAD_GOOD, _u32(r))
    value.set("<I", _P_GOOD_BAD, _u32(p))
    if not p:
        value.set("<I", _STATE, 0)
    value.set("<I", _DUP, _u32(imp.duplicate_pct))


def _read_loss_model(value: _Value) -> tuple[float, float | None, float]:
    """(loss_pct, loss_burst, duplicate_pct) as set by :func:`_set_loss_model`."""
    p, r = value.get("<I", _P_GOOD_BAD), value.get("<I", _P_BAD_GOOD)
    duplicate = _pct(value.get("<I", _DUP))
    if not p:
        return _pct(value.get("<I", _LOSS_GOOD)), None, duplicate
    return round(100 * p / (p + r), 4), round(_U32 / r, 3), duplicate


def _set_rate(link: _Link, rate_kbit: int | None) -> None:
    if rate_kbit is None and _read_rate(link) is None:
        return  # no TBF of ours: leave the root qdisc alone
    with link.iproute() as ipr:
        index = link.index(ipr)
        if rate_kbit is None:
            ipr.tc("del", index=index, handle=_TBF_HANDLE, root=True)
            return
        rate = rate_kbit * 125  # bytes/s
        # Bucket: 5 ms of traffic, at least two full frames; queue: 50 ms, as a modest router would have.
        ipr.tc("replace", "tbf", index, handle=_TBF_HANDLE, rate=rate, burst=max(3200, rate // 200), latency=50_000)


def _read_rate(link: _Link) -> int | None:
    with link.iproute() as ipr:
        for msg in ipr.get_qdiscs(index=link.index(ipr)):
            if msg["parent"] == 0xFFFFFFFF and msg.get_attr("TCA_KIND") == "tbf":
                return round(msg.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")["rate"] / 125)
    return None


# --- delay: NFQUEUE and a verdict-holding process ---------------------------------------------------------

_NETLINK_NETFILTER = 12
_NFQ_PACKET, _NFQ_VERDICT, _NFQ_CONFIG = (3 << 8) | 0, (3 << 8) | 1, (3 << 8) | 2
_NLM_F_REQUEST, _NLM_F_ACK, _NLMSG_ERROR = 1, 4, 2
_NF_ACCEPT = 1
_QUEUES: dict[Direction, tuple[int, int]] = {"in": (1, 3), "out": (2, 4)}  # alternate on change
_COMMENT_RE = re.compile(r'--comment "?netlab-delay ([^"]+)"?.*--queue-num (\d+)')


def _nlmsg(kind: int, flags: int, queue: int, attrs: list[tuple[int, bytes]]) -> bytes:
    body = struct.pack("!BBH", socket.AF_UNSPEC, 0, queue)
    for attr_type, payload in attrs:
        attr = struct.pack("=HH", 4 + len(payload), attr_type) + payload
        body += attr + b"\0" * (-len(attr) % 4)
    return struct.pack("=IHHII", 16 + len(body), kind, flags, 0, 0) + body


def _nfq_open(queue: int) -> socket.socket:
    """A netlink socket bound to NFQUEUE ``queue``: metadata only, 10,000 packets, fail open when full."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_NETFILTER)
    sock.bind((0, 0))
    sock.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE
    sock.setsockopt(270, 5, 1)  # SOL_NETLINK, NETLINK_NO_ENOBUFS: an overrun must not break the loop
    config = [
        [(1, struct.pack("!BxH", 1, socket.AF_INET))],  # NFQA_CFG_CMD: bind
        [
            (2, struct.pack("!IB", 0, 1)),  # NFQA_CFG_PARAMS: copy metadata only
            (3, struct.pack("!I", 10_000)),  # NFQA_CFG_QUEUE_MAXLEN
            (4, struct.pack("!I", 1)),  # NFQA_CFG_MASK: FAIL_OPEN ...
            (5, struct.pack("!I", 1)),  # NFQA_CFG_FLAGS: ... set
        ],
    ]
    for attrs in config:
        sock.send(_nlmsg(_NFQ_CONFIG, _NLM_F_REQUEST | _NLM_F_ACK, queue, attrs))
        reply = sock.recv(65536)
        if struct.unpack_from("=H", reply, 4)[0] == _NLMSG_ERROR and (err := struct.unpack_from("=i", reply, 16)[0]):
            raise OSError(-err, f"NFQUEUE {queue} configuration failed: {os.strerror(-err)}")
    return sock


def _packet_ids(data: bytes) -> Iterator[int]:
    """Packet ids of the NFQNL_MSG_PACKET messages in one netlink read."""
    pos = 0
    while pos + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, pos)
        if length < 16:
            return
        if kind == _NFQ_PACKET:
            attr, end = pos + 20, pos + length
            while attr + 4 <= end:
                attr_len, attr_type = struct.unpack_from("=HH", data, attr)
                if attr_len < 4:
                    break
                if attr_type & 0x7FFF == 1:  # NFQA_PACKET_HDR
                    yield struct.unpack_from("!I", data, attr + 4)[0]
                    break
                attr += (attr_len + 3) & ~3
        pos += (length + 3) & ~3


def _run_delay(queue: int, delay_s: float, jitter_s: float, reorder: float) -> None:
    """Hold each packet of ``queue`` for its delay, then accept it. SIGTERM: finish the held ones, then exit."""
    sock = _nfq_open(queue)
    sock.setblocking(False)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    draining = False

    def on_term(_signum: int, _frame: object) -> None:
        nonlocal draining
        draining = True

    signal.signal(signal.SIGTERM, on_term)
    print("ready", flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    rng = random.Random()
    held: list[tuple[float, int]] = []  # (due, packet id); ids grow, so ties keep arrival order
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        now = time.monotonic()
        due = []
        while held and held[0][0] <= now:
            due.append(heapq.heappop(held)[1])
        if due:
            sock.send(
                b"".join(
                    _nlmsg(_NFQ_VERDICT, _NLM_F_REQUEST, queue, [(2, struct.pack("!II", _NF_ACCEPT, i))]) for i in due
                )
            )
        if held:
            timeout: float | None = max(0.0, held[0][0] - time.monotonic()) * 1000
        else:
            timeout = 0 if draining else None  # draining: only look for stragglers, then exit
        events = dict(poller.poll(timeout))
        if wake_r in events:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 64)
        arrived = 0
        for _ in range(1024):  # bounded: let due packets go out between bursts of arrivals
            try:
                data = sock.recv(1 << 16)
            except BlockingIOError:
                break
            now = time.monotonic()
            for packet_id in _packet_ids(data):
                arrived += 1
                if reorder and rng.random() < reorder:
                    heapq.heappush(held, (now, packet_id))
                else:
                    heapq.heappush(held, (now + delay_s + rng.uniform(-jitter_s, jitter_s), packet_id))
        if draining and not held and not arrived:
            return


def delay_daemon(argv: list[str]) -> int:
    """Entry point of the delay process: ``QUEUE DELAY_US JITTER_US REORDER_FRACTION``."""
    queue, delay_us, jitter_us, reorder = int(argv[0]), int(argv[1]), int(argv[2]), float(argv[3])
    _run_delay(queue, delay_us / 1e6, jitter_us / 1e6, reorder)
    return 0


@dataclass(frozen=True)
class _DelayRule:
    number: int  # position in the chain (iptables -R/-D)
    queue: int
    pid: int
    start: int
    delay_us: int
    jitter_us: int
    reorder_pct: float


def _iptables(netns: str, *args: str) -> str:
    """Run iptables (mangle table) inside a host's namespace; pyroute2 cannot edit iptables."""
    argv = ["iptables", "-w", "10", "-t", "mangle", *args]
    run = functools.partial(subprocess.run, argv, capture_output=True, text=True, timeout=_IPTABLES_TIMEOUT)
    try:
        done = ns.call_in_netns(netns, run)
    except FileNotFoundError as exc:
        raise LabError("delay, jitter and reorder need the iptables command: apt-get install iptables") from exc
    if done.returncode != 0:
        raise LabError(f"iptables {' '.join(args)} failed in {netns}: {done.stderr.strip()}")
    return str(done.stdout)


def _delay_rules(host: Host) -> dict[Direction, _DelayRule]:
    """netlab's NFQUEUE rules in ``host``, by direction (one iptables call for both chains)."""
    rules: dict[Direction, _DelayRule] = {}
    position: dict[str, int] = {}
    for line in _iptables(host.netns, "-S").splitlines():
        if not line.startswith("-A "):
            continue
        chain = line.split()[1]
        position[chain] = position.get(chain, 0) + 1
        if not (m := _COMMENT_RE.search(line)):
            continue
        fields = dict(item.split("=", 1) for item in m.group(1).split())
        direction: Direction = "in" if chain == "PREROUTING" else "out"
        rules[direction] = _DelayRule(
            number=position[chain],
            queue=int(m.group(2)),
            pid=int(fields["pid"]),
            start=int(fields["start"]),
            delay_us=int(fields["delay_us"]),
            jitter_us=int(fields["jitter_us"]),
            reorder_pct=float(fields["reorder_pct"]),
        )
    return rules


def _start_delay(lab: Lab, host: Host, queue: int, delay_us: int, jitter_us: int, reorder_pct: float) -> int:
    """Start the delay process in ``host`` and wait until it has bound its queue; return its pid."""
    code = "import sys, netlab.impair as m; sys.exit(m.delay_daemon(sys.argv[1:]))"
    argv = [sys.executable, "-c", code, str(queue), str(delay_us), str(jitter_us), str(reorder_pct / 100)]
    proc = lab.popen(
        host,
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # outlives a `netlab impair` command; Lab.down kills it with the namespace
    )
    assert proc.stdout is not None
    with proc.stdout:
        ready, _, _ = select.select([proc.stdout], [], [], 20.0)
        line = proc.stdout.readline().decode(errors="replace") if ready else ""
        if line.strip() != "ready":
            ns.kill_pids([proc.pid])
            output = line + (proc.stdout.read().decode(errors="replace") if ready else "(no output in 20 s)")
            raise LabError(f"the delay process for {host.name} did not start: {output.strip()}")
    return proc.pid


def _stop_delay(rule: _DelayRule, timeout: float) -> None:
    """Let the delay process release what it holds and exit (SIGKILL after ``timeout`` s); only if it is ours."""
    if state.process_start_time(rule.pid) == rule.start:
        ns.kill_pids([rule.pid], grace=timeout)


def _set_delay(lab: Lab, link: _Link, imp: Impairment, existing: _DelayRule | None) -> None:
    """Install, change or remove the NFQUEUE delay of ``link``. A change starts a new process on the other
    queue, swaps the rule in one step, then lets the old process drain: no packet is dropped or left behind."""
    delay_us, jitter_us = round(imp.delay_ms * 1000), round(imp.jitter_ms * 1000)
    wanted = (delay_us, jitter_us, imp.reorder_pct)
    host, match = link.host, ("-i" if link.direction == "in" else "-o")
    if existing and (existing.delay_us, existing.jitter_us, existing.reorder_pct) == wanted:
        return
    if delay_us or jitter_us:
        queue = next(q for q in _QUEUES[link.direction] if not existing or q != existing.queue)
        pid = _start_delay(lab, host, queue, *wanted)
        comment = (
            f"netlab-delay pid={pid} start={state.process_start_time(pid)} delay_us={delay_us} "
            f"jitter_us={jitter_us} reorder_pct={imp.reorder_pct:g}"
        )
        spec = [match, host.ifname, "-m", "comment", "--comment", comment]
        spec += ["-j", "NFQUEUE", "--queue-num", str(queue), "--queue-bypass"]
        try:
            if existing:
                _iptables(host.netns, "-R", link.chain, str(existing.number), *spec)
            else:
                _iptables(host.netns, "-I", link.chain, "1", *spec)
        except BaseException:
            ns.kill_pids([pid])
            raise
    elif existing:
        _iptables(host.netns, "-D", link.chain, str(existing.number))
    if existing:
        _stop_delay(existing, timeout=(existing.delay_us + existing.jitter_us) / 1e6 + 2.0)


# --- public API -----------------------------------------------------------------------------------------


def _directions(direction: str) -> tuple[Direction, ...]:
    if direction == "both":
        return DIRECTIONS
    if direction in DIRECTIONS:
        return (direction,)  # type: ignore[return-value]
    raise ValueError(f"direction must be 'in', 'out' or 'both', not {direction!r}")


def _one_direction(direction: str) -> Direction:
    if direction not in DIRECTIONS:
        raise ValueError(f"this reads one direction, 'in' or 'out', not {direction!r}")
    return direction  # type: ignore[return-value]


def _link(lab: Lab, host: str | Host, direction: Direction) -> _Link:
    lab._check_up()
    return _Link(lab.host(host), direction)


def impair(lab: Lab, host: str | Host, imp: Impairment, direction: str = "in") -> None:
    """Make ``host``'s link behave as ``imp`` (replacing what was set; partition and drop_next stay).

    Safe while traffic flows: loss and duplication change in place, the rate limit keeps its queue, a new
    delay takes over from the old one without losing the packets it holds.
    """
    for d in _directions(direction):
        link = _link(lab, host, d)
        with _value(link, create=True) as value:
            assert value is not None
            _set_loss_model(value, imp)
        _set_rate(link, imp.rate_kbit)
        _set_delay(lab, link, imp, _delay_rules(link.host).get(d))


def clear(lab: Lab, host: str | Host, direction: str = "both") -> None:
    """Remove every impairment of ``host`` (in ``direction``), partition and drop_next budgets included."""
    for d in _directions(direction):
        link = _link(lab, host, d)
        _set_delay(lab, link, Impairment(), _delay_rules(link.host).get(d))
        _set_rate(link, None)
        _remove_filter(link)


def current(lab: Lab, host: str | Host, direction: str = "in") -> Impairment | None:
    """What ``impair`` set on ``host``'s link in ``direction`` ("in" or "out"), read back from the kernel."""
    d = _one_direction(direction)
    link = _link(lab, host, d)
    loss_pct, loss_burst, duplicate_pct = 0.0, None, 0.0
    with _value(link, create=False) as value:
        if value is not None:
            loss_pct, loss_burst, duplicate_pct = _read_loss_model(value)
    rule = _delay_rules(link.host).get(d)
    imp = Impairment(
        loss_pct=loss_pct,
        loss_burst=loss_burst,
        delay_ms=rule.delay_us / 1000 if rule else 0.0,
        jitter_ms=rule.jitter_us / 1000 if rule else 0.0,
        reorder_pct=rule.reorder_pct if rule else 0.0,
        duplicate_pct=duplicate_pct,
        rate_kbit=_read_rate(link),
    )
    return None if imp.is_clear else imp


def partition(lab: Lab, host: str | Host) -> None:
    """Cut ``host`` off the LAN: every packet to and from it is dropped (its link stays up, silently)."""
    for d in DIRECTIONS:
        with _value(_link(lab, host, d), create=True) as value:
            assert value is not None
            value.set("<I", _PARTITION, 1)


def heal(lab: Lab, host: str | Host) -> None:
    """Undo :func:`partition`; other impairments stay as they were."""
    for d in DIRECTIONS:
        with _value(_link(lab, host, d), create=False) as value:
            if value is not None:
                value.set("<I", _PARTITION, 0)


def drop_next(lab: Lab, host: str | Host, count: int, *, udp_port: int | None = None, direction: str = "in") -> None:
    """Drop exactly the next ``count`` packets (only UDP to ``udp_port`` when given) on ``host``'s link.

    Counted in the kernel, one decrement per packet, so it is exact whatever the rate; a new call replaces
    the remaining budget. Wait for it with :func:`wait_burst`.
    """
    if count < 0 or (udp_port is not None and not 0 < udp_port < 65536):
        raise ValueError(f"need count >= 0 and a UDP port 1-65535 or None (got {count}, {udp_port})")
    for d in _directions(direction):
        with _value(_link(lab, host, d), create=True) as value:
            assert value is not None
            value.set("<I", _BURST_PORT, socket.htons(udp_port or 0))
            value.set("<q", _BURST, count)


def counters(lab: Lab, host: str | Host, direction: str = "in") -> LinkCounters:
    """Packets seen, dropped, duplicated so far by the eBPF stage of one direction ("in" or "out")."""
    with _value(_link(lab, host, _one_direction(direction)), create=False) as value:
        if value is None:
            return LinkCounters()
        return LinkCounters(
            seen=value.get("<Q", _SEEN),
            dropped=value.get("<Q", _DROPPED),
            burst_dropped=value.get("<Q", _BURST_DROPPED),
            burst_left=max(0, value.get("<q", _BURST)),
            duplicated=value.get("<Q", _DUPLICATED),
            partitioned=bool(value.get("<I", _PARTITION)),
        )


def wait_burst(lab: Lab, host: str | Host, timeout: float = 10.0, direction: str = "in") -> LinkCounters:
    """Wait until the :func:`drop_next` budget is used up; TimeoutError if traffic did not consume it in time.

    The kernel has no event for this, so the counter is read every 5 ms (bounded by ``timeout``).
    """
    deadline = time.monotonic() + timeout
    with _value(_link(lab, host, _one_direction(direction)), create=False) as value:
        if value is None:
            raise LabError(f"no drop_next budget on {host}: call drop_next() first")
        while (left := value.get("<q", _BURST)) > 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{left} packets of the drop_next budget on {host} still to drop after {timeout} s")
            time.sleep(0.005)
    return counters(lab, host, direction)


def summary(lab: Lab, host: str | Host) -> str:
    """One line for ``netlab status``: each direction's impairment and whether the host is partitioned."""
    parts = []
    for d in DIRECTIONS:
        imp = current(lab, host, d)
        if imp is not None:
            parts.append(f"{d}: {imp.describe()}")
    if counters(lab, host, "in").partitioned:
        parts.append("PARTITIONED")
    return "; ".join(parts)
