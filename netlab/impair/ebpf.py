"""The eBPF egress filter: loss (random, Gilbert bursts, exactly-N), partition and duplication.

A hand-assembled ``cls_bpf`` program in direct-action mode, loaded with the bpf(2) system call (no compiler, no
libbpf). Its parameters and counters live in a one-element mmap-able array map, so a change is a few stores
into shared memory: nothing is reloaded and no queued packet is lost. The numbers below are the kernel's ABI;
each names the uapi header it comes from.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import socket
import struct

from netlab.impair.model import Impairment
from netlab.lab import LabError

# --- the map value, shared with user space through mmap: parameters (u32), then counters (u64) -------------

P_GOOD_BAD, P_BAD_GOOD, LOSS_GOOD, LOSS_BAD, DUP, PARTITION, STATE, BURST_PORT = range(0, 32, 4)
BURST, SEEN, DROPPED, BURST_DROPPED, DUPLICATED = range(32, 72, 8)
VALUE_SIZE = 72
_DUP_MARK = 0x6E6C6470  # skb->mark of our own clones ("nldp"), so they are not impaired a second time
_U32 = 0xFFFFFFFF  # probabilities are u32 fractions of this, compared with bpf_get_prandom_u32()

# --- bpf(2): arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/unistd.h (aarch64) ------------

_NR_BPF = {"x86_64": 321, "aarch64": 280}.get(os.uname().machine)
# enum bpf_cmd (include/uapi/linux/bpf.h)
BPF_MAP_CREATE, BPF_PROG_LOAD, BPF_PROG_GET_FD_BY_ID, BPF_MAP_GET_FD_BY_ID, BPF_OBJ_GET_INFO_BY_FD = 0, 5, 13, 14, 15
BPF_MAP_TYPE_ARRAY = 2  # enum bpf_map_type
BPF_F_MMAPABLE = 1 << 10  # map_flags
BPF_PROG_TYPE_SCHED_CLS = 3  # enum bpf_prog_type
_PROG_INFO_NR_MAP_IDS = 52  # offsetof(struct bpf_prog_info, nr_map_ids); map_ids (a pointer) follows at 56
_ATTR_SIZE = 128  # enough of union bpf_attr for MAP_CREATE and PROG_LOAD as filled in here

# --- instruction encoding (include/uapi/linux/bpf_common.h, include/uapi/linux/bpf.h) ----------------------

BPF_LD, BPF_LDX, BPF_STX, BPF_JMP, BPF_ALU64 = 0x00, 0x01, 0x03, 0x05, 0x07  # instruction classes
BPF_W, BPF_H, BPF_B, BPF_DW = 0x00, 0x08, 0x10, 0x18  # load/store sizes
BPF_IMM, BPF_MEM, BPF_ATOMIC = 0x00, 0x60, 0xC0  # load/store modes
BPF_K, BPF_X = 0x00, 0x08  # source: immediate or register
BPF_ADD, BPF_AND, BPF_LSH, BPF_MOV = 0x00, 0x50, 0x60, 0xB0  # ALU operations
BPF_JA, BPF_JEQ, BPF_JGE, BPF_JNE, BPF_JLT, BPF_JSLE = 0x00, 0x10, 0x30, 0x50, 0xA0, 0xD0  # jumps
BPF_CALL, BPF_EXIT = 0x80, 0x90
BPF_FETCH = 0x01  # atomic op flag: the old value is loaded into src
BPF_PSEUDO_MAP_VALUE = 2  # ld_imm64 src: imm is a map fd, the result the address of its value
# enum bpf_func_id
BPF_FUNC_GET_PRANDOM_U32, BPF_FUNC_CLONE_REDIRECT, BPF_FUNC_SKB_LOAD_BYTES = 7, 13, 26
# offsetof(struct __sk_buff, mark / protocol / ifindex)
SKB_MARK, SKB_PROTOCOL, SKB_IFINDEX = 8, 16, 40
TC_ACT_OK, TC_ACT_SHOT = 0, 2  # include/uapi/linux/pkt_cls.h
# The packet: include/uapi/linux/if_ether.h, RFC 791, RFC 768.
ETH_HLEN, ETH_P_IP = 14, 0x0800
IP_PROTOCOL_OFFSET, UDP_DEST_OFFSET = 9, 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def bpf(cmd: int, attr: bytearray) -> int:
    if _NR_BPF is None:
        raise LabError(f"netlab knows the bpf(2) syscall number of x86_64 and aarch64 only, not {os.uname().machine}")
    buf = (ctypes.c_char * len(attr)).from_buffer(attr)
    result = _libc.syscall(_NR_BPF, cmd, buf, len(attr))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf(cmd {cmd}): {os.strerror(err)}")
    return int(result)


# --- a small assembler ------------------------------------------------------------------------------------

Insn = tuple[int, int, int, int | str, int]  # opcode, dst, src, offset (or a label to jump to), immediate


def _mov(dst: int, imm: int) -> Insn:
    return (BPF_ALU64 | BPF_MOV | BPF_K, dst, 0, 0, imm)


def _movr(dst: int, src: int) -> Insn:
    return (BPF_ALU64 | BPF_MOV | BPF_X, dst, src, 0, 0)


def _ldx(size: int, dst: int, src: int, off: int) -> Insn:
    return (BPF_LDX | BPF_MEM | size, dst, src, off, 0)


def _stx(size: int, dst: int, src: int, off: int) -> Insn:
    return (BPF_STX | BPF_MEM | size, dst, src, off, 0)


def _alu(op: int, dst: int, imm: int) -> Insn:
    return (BPF_ALU64 | op | BPF_K, dst, 0, 0, imm)


def _add(dst: int, imm: int) -> Insn:
    return _alu(BPF_ADD, dst, imm)


def _jmp(op: int, dst: int, imm: int, label: str) -> Insn:
    return (BPF_JMP | op | BPF_K, dst, 0, label, imm)


def _jmpr(op: int, dst: int, src: int, label: str) -> Insn:
    return (BPF_JMP | op | BPF_X, dst, src, label, 0)


def _goto(label: str) -> Insn:
    return (BPF_JMP | BPF_JA, 0, 0, label, 0)


def _call(helper: int) -> Insn:
    return (BPF_JMP | BPF_CALL, 0, 0, 0, helper)


def _atomic_add(dst: int, src: int, off: int, *, fetch: bool = False) -> Insn:
    """``*(u64 *)(dst + off) += src`` atomically; with ``fetch`` the old value lands in ``src``."""
    return (BPF_STX | BPF_ATOMIC | BPF_DW, dst, src, off, BPF_ADD | (BPF_FETCH if fetch else 0))


def _ld_map_value(dst: int, map_fd: int) -> list[Insn | str]:
    """``dst = &value[0]`` of the map: ld_imm64 takes two instruction slots."""
    return [(BPF_LD | BPF_DW | BPF_IMM, dst, BPF_PSEUDO_MAP_VALUE, 0, map_fd), (0, 0, 0, 0, 0)]


def _count(field: int) -> list[Insn | str]:
    return [_mov(1, 1), _atomic_add(7, 1, field)]


_EXIT: Insn = (BPF_JMP | BPF_EXIT, 0, 0, 0, 0)


def assemble(program: list[Insn | str]) -> bytes:
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


def program(map_fd: int) -> bytes:
    """The egress filter. r6 = skb, r7 = the map value, r8 = Gilbert state, r9 = scratch kept across calls.

    Order per packet: our own clone? pass. Partition? drop. drop_next budget left (and the UDP port matches)?
    drop. Gilbert state transition, then loss with the new state's probability. Then maybe duplicate.
    """
    return assemble(
        [
            _movr(6, 1),
            *_ld_map_value(7, map_fd),
            _ldx(BPF_W, 1, 6, SKB_MARK),
            _jmp(BPF_JEQ, 1, _DUP_MARK, "clone"),
            *_count(SEEN),
            _ldx(BPF_W, 1, 7, PARTITION),
            _jmp(BPF_JNE, 1, 0, "drop"),
            _ldx(BPF_DW, 1, 7, BURST),
            _jmp(BPF_JSLE, 1, 0, "model"),
            _ldx(BPF_W, 9, 7, BURST_PORT),  # network byte order, as read from the packet
            _jmp(BPF_JEQ, 9, 0, "take"),
            _ldx(BPF_W, 1, 6, SKB_PROTOCOL),
            _jmp(BPF_JNE, 1, socket.htons(ETH_P_IP), "model"),
            _movr(1, 6),
            _mov(2, ETH_HLEN),  # the IPv4 header, after the Ethernet header
            _movr(3, 10),
            _add(3, -16),
            _mov(4, 10),
            _call(BPF_FUNC_SKB_LOAD_BYTES),
            _jmp(BPF_JNE, 0, 0, "model"),
            _ldx(BPF_B, 1, 10, -16 + IP_PROTOCOL_OFFSET),
            _jmp(BPF_JNE, 1, socket.IPPROTO_UDP, "model"),
            _ldx(BPF_B, 2, 10, -16),  # version and header length
            _alu(BPF_AND, 2, 0x0F),  # header length in 32-bit words
            _alu(BPF_LSH, 2, 2),  # ... in bytes
            _add(2, ETH_HLEN + UDP_DEST_OFFSET),
            _movr(1, 6),
            _movr(3, 10),
            _add(3, -4),
            _mov(4, 2),
            _call(BPF_FUNC_SKB_LOAD_BYTES),
            _jmp(BPF_JNE, 0, 0, "model"),
            _ldx(BPF_H, 1, 10, -4),
            _jmpr(BPF_JNE, 1, 9, "model"),
            "take",
            _mov(1, -1),
            _atomic_add(7, 1, BURST, fetch=True),
            _jmp(BPF_JSLE, 1, 0, "model"),  # another CPU took the last one
            *_count(BURST_DROPPED),
            _goto("drop"),
            "model",
            _ldx(BPF_W, 8, 7, STATE),
            _jmp(BPF_JNE, 8, 0, "bad"),
            _ldx(BPF_W, 1, 7, P_GOOD_BAD),
            _jmp(BPF_JEQ, 1, 0, "decide"),
            _call(BPF_FUNC_GET_PRANDOM_U32),
            _ldx(BPF_W, 1, 7, P_GOOD_BAD),
            _jmpr(BPF_JGE, 0, 1, "decide"),
            _mov(8, 1),
            _goto("store"),
            "bad",
            _call(BPF_FUNC_GET_PRANDOM_U32),
            _ldx(BPF_W, 1, 7, P_BAD_GOOD),
            _jmpr(BPF_JGE, 0, 1, "decide"),
            _mov(8, 0),
            "store",
            _stx(BPF_W, 7, 8, STATE),
            "decide",
            _ldx(BPF_W, 9, 7, LOSS_GOOD),
            _jmp(BPF_JEQ, 8, 0, "lossy"),
            _ldx(BPF_W, 9, 7, LOSS_BAD),
            "lossy",
            _jmp(BPF_JEQ, 9, 0, "dup"),
            _call(BPF_FUNC_GET_PRANDOM_U32),
            _jmpr(BPF_JLT, 0, 9, "drop"),
            "dup",
            _ldx(BPF_W, 9, 7, DUP),
            _jmp(BPF_JEQ, 9, 0, "pass"),
            _call(BPF_FUNC_GET_PRANDOM_U32),
            _jmpr(BPF_JGE, 0, 9, "pass"),
            _ldx(BPF_W, 9, 6, SKB_MARK),
            _mov(1, _DUP_MARK),
            _stx(BPF_W, 6, 1, SKB_MARK),
            _movr(1, 6),
            _ldx(BPF_W, 2, 6, SKB_IFINDEX),
            _mov(3, 0),  # to the egress of the same device
            _call(BPF_FUNC_CLONE_REDIRECT),
            _stx(BPF_W, 6, 9, SKB_MARK),
            _jmp(BPF_JNE, 0, 0, "pass"),
            *_count(DUPLICATED),
            "pass",
            _mov(0, TC_ACT_OK),
            _EXIT,
            "clone",
            _mov(1, 0),
            _stx(BPF_W, 6, 1, SKB_MARK),
            _goto("pass"),
            "drop",
            *_count(DROPPED),
            _mov(0, TC_ACT_SHOT),
            _EXIT,
        ]
    )


# --- loading, and finding the map again -------------------------------------------------------------------


def load_program(name: str) -> tuple[int, int]:
    """Create the map and load the program; return (program fd, map fd)."""
    attr = bytearray(_ATTR_SIZE)
    # map_type, key_size, value_size, max_entries, map_flags, (inner_map_fd, numa_node), map_name
    struct.pack_into("<IIIII8x16s", attr, 0, BPF_MAP_TYPE_ARRAY, 4, VALUE_SIZE, 1, BPF_F_MMAPABLE, name.encode())
    map_fd = bpf(BPF_MAP_CREATE, attr)
    try:
        code = ctypes.create_string_buffer(program(map_fd))
        license_ = ctypes.create_string_buffer(b"GPL")  # bpf_clone_redirect is GPL-only
        log = ctypes.create_string_buffer(1 << 16)
        attr = bytearray(_ATTR_SIZE)
        # prog_type, insn_cnt, insns, license, log_level, log_size, log_buf, kern_version, prog_flags, prog_name
        struct.pack_into(
            "<IIQQIIQII16s",
            *(attr, 0, BPF_PROG_TYPE_SCHED_CLS, (len(code) - 1) // 8, ctypes.addressof(code)),
            *(ctypes.addressof(license_), 1, len(log), ctypes.addressof(log), 0, 0, name.encode()),
        )
        try:
            prog_fd = bpf(BPF_PROG_LOAD, attr)
        except OSError as exc:
            raise LabError(
                f"the kernel refused netlab's eBPF filter ({exc}); it needs Linux >= 5.12 with BPF syscall and "
                f"JIT. Verifier log: {log.value.decode(errors='replace')[-2000:]}"
            ) from exc
    except BaseException:
        os.close(map_fd)
        raise
    return prog_fd, map_fd


def map_fd_of_program(prog_id: int) -> int:
    """The fd of the (only) map used by the program with id ``prog_id``."""
    attr = bytearray(16)
    struct.pack_into("<I", attr, 0, prog_id)  # prog_id
    prog_fd = bpf(BPF_PROG_GET_FD_BY_ID, attr)
    try:
        map_ids = (ctypes.c_uint32 * 1)()
        info = bytearray(256)  # struct bpf_prog_info, asking for one map id
        struct.pack_into("<IQ", info, _PROG_INFO_NR_MAP_IDS, 1, ctypes.addressof(map_ids))
        info_buf = (ctypes.c_char * len(info)).from_buffer(info)
        attr = bytearray(16)
        struct.pack_into("<IIQ", attr, 0, prog_fd, len(info), ctypes.addressof(info_buf))  # bpf_fd, info_len, info
        bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
    finally:
        os.close(prog_fd)
    attr = bytearray(16)
    struct.pack_into("<I", attr, 0, map_ids[0])  # map_id
    return bpf(BPF_MAP_GET_FD_BY_ID, attr)


class MapValue:
    """The map value of one direction, mapped into this process: plain loads and stores, shared with the kernel."""

    def __init__(self, map_fd: int):
        self._mm = mmap.mmap(map_fd, mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def get(self, fmt: str, offset: int) -> int:
        return int(struct.unpack_from(fmt, self._mm, offset)[0])

    def set(self, fmt: str, offset: int, value: int) -> None:
        struct.pack_into(fmt, self._mm, offset, value)

    def close(self) -> None:
        self._mm.close()


# --- the loss model in the map ----------------------------------------------------------------------------


def _u32(pct: float) -> int:
    return round(pct / 100 * _U32)


def _pct(value: int) -> float:
    return round(value / _U32 * 100, 4)


def set_loss_model(value: MapValue, imp: Impairment) -> None:
    """Bernoulli loss is the Gilbert-Elliott model with no transitions; bursts use the Gilbert special case."""
    if imp.loss_burst is None:
        p, r, loss_good, loss_bad = 0.0, 0.0, imp.loss_pct, 0.0
    else:
        # Mean burst length 1/r; stationary loss p/(p+r).
        r = 100 / imp.loss_burst
        p = r * imp.loss_pct / (100 - imp.loss_pct)
        loss_good, loss_bad = 0.0, 100.0
    value.set("<I", LOSS_GOOD, _u32(loss_good))
    value.set("<I", LOSS_BAD, _u32(loss_bad))
    value.set("<I", P_BAD_GOOD, _u32(r))
    value.set("<I", P_GOOD_BAD, _u32(p))
    if not p:
        value.set("<I", STATE, 0)
    value.set("<I", DUP, _u32(imp.duplicate_pct))


def read_loss_model(value: MapValue) -> tuple[float, float | None, float]:
    """(loss_pct, loss_burst, duplicate_pct) as set by :func:`set_loss_model`."""
    p, r = value.get("<I", P_GOOD_BAD), value.get("<I", P_BAD_GOOD)
    duplicate = _pct(value.get("<I", DUP))
    if not p:
        return _pct(value.get("<I", LOSS_GOOD)), None, duplicate
    return round(100 * p / (p + r), 4), round(_U32 / r, 3), duplicate
