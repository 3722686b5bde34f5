"""A kernel socket filter that keeps NORM datagrams libnorm 1.5.9 cannot parse away from it (issue #34).

libnorm walks a message's header extensions with `NormMsg::GetNextExtension` (include/normMessage.h), which
moves on by the extension's own length: its length byte times 4 for a type below 128, 4 bytes for the
others. An extension of a type below 128 whose length byte is 0 never moves the walk on, and every loop over
the extensions (the FEC information of a new sender's NORM_DATA/INFO in `NormSenderNode::GetFtiData`, the
congestion control, FLUSH, ACK and NACK handlers) then spins for good in libnorm's protocol thread, holding
the instance's lock: no API call returns again. One datagram does it, from any host, with any source id:
one random datagram in about 220,000 (the chaos campaign's junk #4995 of --seed=328782784 is one). Nothing
upstream checks it (the walk is unchanged in NORM's master).

The filter (classic BPF, SO_ATTACH_FILTER, on each UDP socket libnorm opens for a session) walks the header
extensions as libnorm does, from the base header length of the message's type (RFC 5740, libnorm's
`NormMsg::InitFromBuffer`), and drops the datagram when an extension has a zero length or when
MAX_EXTENSIONS steps do not reach the end of the header (libnorm's own messages carry one or two). It also
drops what libnorm rejects anyway: unknown types, command flavors and FEC ids, and datagrams shorter than
what the walk reads. Everything else, so every message a libnorm peer sends, passes unchanged.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
from collections.abc import Callable

from gateway.errors import NormError

MAX_EXTENSIONS = 8  # extensions walked before a header counts as malformed
SO_ATTACH_FILTER = 26  # linux/asm-generic/socket.h
UDP_HEADER = 8  # a UDP socket's filter sees the UDP header first, then the datagram
KEEP, DROP = 0xFFFFFFFF, 0  # a filter's verdict: bytes of the datagram to keep

# Classic BPF opcodes (linux/filter.h)
_LDB_ABS, _LDB_IND, _LD_MEM, _ST, _LDX_IMM = 0x30, 0x50, 0x60, 0x02, 0x01
_ADD_K, _ADD_X, _AND_K, _LSH_K, _TAX, _TXA = 0x04, 0x0C, 0x54, 0x64, 0x07, 0x87
_JA, _JEQ_K, _JGE_K, _JGT_X, _RET_K = 0x05, 0x15, 0x35, 0x2D, 0x06

# NORM message types and command flavors (RFC 5740; libnorm's NormMsg::Type, NormCmdMsg::Flavor)
_INFO, _DATA, _CMD, _NACK, _ACK, _REPORT = 1, 2, 3, 4, 5, 6
_FLUSH, _EOT, _SQUELCH, _CC, _REPAIR_ADV, _ACK_REQ, _APPLICATION = 1, 2, 3, 4, 5, 6, 7
_TYPE, _HEADER_WORDS, _FLAVOR, _FEC_ID = 0, 1, 12, 13  # byte offsets in a NORM message
_FIXED_SIZE_TYPE = 128  # extension types from 128 up are 4 bytes long, whatever their length byte says

# Where the header extensions start (libnorm's header_length_base), as labels of the program below: by message
# type; by command flavor; by FEC id, for NORM_DATA and the FLUSH and SQUELCH commands (16 bytes, then the FEC
# payload id).
_BY_TYPE = {_INFO: "base16", _DATA: "fec", _CMD: "flavor", _NACK: "base24", _ACK: "base24", _REPORT: "base8"}
_BY_FLAVOR = {_FLUSH: "fec", _SQUELCH: "fec", _CC: "base24"} | dict.fromkeys(
    (_EOT, _REPAIR_ADV, _ACK_REQ, _APPLICATION), "base16"
)
_BY_FEC_ID = {2: "base20", 5: "base20", 129: "base24"}

Instruction = tuple[int, str | int, str | int, str | int]  # opcode, jump-if-true, jump-if-false, k (or labels)


def program() -> list[tuple[int, int, int, int]]:
    """The filter as (opcode, jt, jf, k) instructions: NORM datagrams whose header extensions end."""
    p = UDP_HEADER
    # fmt: off
    code: list[Instruction | str] = [
        _op(_LDB_ABS, k=p + _HEADER_WORDS), _op(_LSH_K, k=2), _op(_ADD_K, k=p), _op(_ST, k=0),  # M[0]: header end
        _op(_LDB_ABS, k=p + _TYPE), _op(_AND_K, k=0x0F), *_switch(_BY_TYPE),
        "flavor", _op(_LDB_ABS, k=p + _FLAVOR), *_switch(_BY_FLAVOR),
        "fec", _op(_LDB_ABS, k=p + _FEC_ID), *_switch(_BY_FEC_ID),
    ]
    for base in (8, 16, 20, 24):
        code += [f"base{base}", _op(_LDX_IMM, k=p + base), _op(_JA, k="walk")]
    code.append("walk")
    for step in range(MAX_EXTENSIONS):  # classic BPF jumps forward only: the walk is unrolled
        fixed, moved = f"fixed{step}", f"moved{step}"
        code += [
            _op(_LD_MEM, k=0), _op(_JGT_X, jf="keep"),  # the header ends here: well formed
            _op(_LDB_IND, k=0), _op(_JGE_K, jt=fixed, k=_FIXED_SIZE_TYPE),
            _op(_LDB_IND, k=1), _op(_JEQ_K, jt="drop", k=0),  # a zero length: libnorm's walk would never end
            _op(_LSH_K, k=2), _op(_ADD_X), _op(_TAX), _op(_JA, k=moved),
            fixed, _op(_TXA), _op(_ADD_K, k=4), _op(_TAX),
            moved,
        ]
    code += [_op(_LD_MEM, k=0), _op(_JGT_X, jt="drop", jf="keep")]  # more extensions than libnorm ever sends
    code += ["keep", _op(_RET_K, k=KEEP), "drop", _op(_RET_K, k=DROP)]
    # fmt: on
    return _assemble(code)


def _op(opcode: int, jt: str | int = 0, jf: str | int = 0, k: str | int = 0) -> Instruction:
    """One instruction; a string for jt, jf (or k of a jump) names the label to jump to."""
    return (opcode, jt, jf, k)


def _switch(cases: dict[int, str]) -> list[Instruction]:
    """Jump to the label of A's value; drop any other value."""
    return [*(_op(_JEQ_K, jt=label, k=value) for value, label in cases.items()), _op(_JA, k="drop")]


def _assemble(code: list[Instruction | str]) -> list[tuple[int, int, int, int]]:
    """Resolve labels (strings in the code, targets in jt/jf, and k of an unconditional jump) to offsets."""
    where: dict[str, int] = {}
    body: list[Instruction] = []
    for item in code:
        if isinstance(item, str):
            where[item] = len(body)
        else:
            body.append(item)

    def offset(i: int, target: str | int) -> int:
        return where[target] - i - 1 if isinstance(target, str) else target

    return [(op, offset(i, jt), offset(i, jf), offset(i, k)) for i, (op, jt, jf, k) in enumerate(body)]


def attach(fd: int) -> None:
    """Attach the filter to the socket behind `fd` (a duplicate is used: the socket itself is shared)."""
    code = program()
    insns = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *insn) for insn in code))
    fprog = struct.pack("HL", len(code), ctypes.addressof(insns))  # struct sock_fprog
    with socket.socket(fileno=os.dup(fd)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


def _udp_sockets() -> dict[tuple[int, int], int]:
    """This process's IPv4 datagram sockets: (fd, inode) -> the local port each is bound to."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
            if not link.startswith("socket:"):
                continue
            with socket.socket(fileno=os.dup(int(name))) as sock:
                if sock.family == socket.AF_INET and sock.type == socket.SOCK_DGRAM:
                    found[int(name), int(link[8:-1])] = sock.getsockname()[1]
        except OSError:
            continue  # closed meanwhile
    return found


def guarded(start: Callable[[], bool], ports: Callable[[], set[int]], what: str) -> bool:
    """Call `start` (NormStartReceiver or NormStartSender) and filter the UDP sockets it opened.

    libnorm names no socket of a session, only its ports (`ports`: NormGetRxPort, NormGetTxPort): its sockets
    are the IPv4 datagram sockets that appeared during the call, bound to one of them (a socket another thread
    opened meanwhile is on another port). Raises NormError when none is found (then none can be guarded)."""
    before = _udp_sockets()
    if not start():
        return False
    wanted = ports()
    opened = sorted(fd for (fd, inode), port in _udp_sockets().items() if (fd, inode) not in before and port in wanted)
    if not opened:
        raise NormError(f"{what}: found no socket of the NORM session to filter (is /proc mounted?)")
    for fd in opened:
        attach(fd)
    return True
