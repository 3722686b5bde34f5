"""Raw NFQUEUE over netlink (no libnetfilter_queue): bind a queue, read packet ids, give verdicts.

The constants are the kernel's ABI, from include/uapi/linux/netlink.h, include/uapi/linux/netfilter.h,
include/uapi/linux/netfilter/nfnetlink.h and include/uapi/linux/netfilter/nfnetlink_queue.h.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterable, Iterator

NETLINK_NETFILTER = 12  # netlink.h
SOL_NETLINK, NETLINK_NO_ENOBUFS = 270, 5  # socket.h, netlink.h
SO_RCVBUFFORCE = 33  # asm-generic/socket.h
NLM_F_REQUEST, NLM_F_ACK = 1, 4  # netlink.h: nlmsg_flags
NLMSG_ERROR = 2  # netlink.h: nlmsg_type
NLMSG_HDRLEN = 16  # sizeof(struct nlmsghdr)
NFGENMSG_LEN = 4  # sizeof(struct nfgenmsg): family, version, res_id (the queue number)
NFNETLINK_V0 = 0
NFNL_SUBSYS_QUEUE = 3  # nfnetlink.h: the message type is subsystem << 8 | message
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = (NFNL_SUBSYS_QUEUE << 8 | m for m in (0, 1, 2))
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2  # enum nfqnl_attr_type
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_FAIL_OPEN = 1
NF_ACCEPT = 1  # netfilter.h
NLA_TYPE_MASK = 0x3FFF  # netlink.h: an attribute type without NLA_F_NESTED/NET_BYTEORDER

QUEUE_MAXLEN = 10_000  # packets the kernel holds for us; more fail open (pass undelayed)


def nlmsg(kind: int, flags: int, queue: int, attrs: list[tuple[int, bytes]]) -> bytes:
    """One nfnetlink message: nlmsghdr, nfgenmsg for ``queue``, then the attributes, each padded to 4 bytes."""
    body = struct.pack("!BBH", socket.AF_UNSPEC, NFNETLINK_V0, queue)
    for attr_type, payload in attrs:
        attr = struct.pack("=HH", 4 + len(payload), attr_type) + payload
        body += attr + b"\0" * (-len(attr) % 4)
    return struct.pack("=IHHII", NLMSG_HDRLEN + len(body), kind, flags, 0, 0) + body


def open_queue(queue: int) -> socket.socket:
    """A netlink socket bound to NFQUEUE ``queue``: metadata only, QUEUE_MAXLEN packets, fail open when full."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.bind((0, 0))
    sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
    sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)  # an overrun must not break the loop
    config = [
        [(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, socket.AF_INET))],
        [
            (NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META)),  # copy_range 0, copy_mode
            (NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_MAXLEN)),
            (NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN)),  # change this flag ...
            (NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN)),  # ... to set
        ],
    ]
    for attrs in config:
        sock.send(nlmsg(NFQNL_MSG_CONFIG, NLM_F_REQUEST | NLM_F_ACK, queue, attrs))
        reply = sock.recv(65536)
        # nlmsghdr.nlmsg_type at 4; an NLMSG_ERROR's struct nlmsgerr.error right after the header (0: an ACK)
        is_error = struct.unpack_from("=H", reply, 4)[0] == NLMSG_ERROR
        if is_error and (err := struct.unpack_from("=i", reply, NLMSG_HDRLEN)[0]):
            raise OSError(-err, f"NFQUEUE {queue} configuration failed: {os.strerror(-err)}")
    return sock


def packet_ids(data: bytes) -> Iterator[int]:
    """Packet ids of the NFQNL_MSG_PACKET messages in one netlink read."""
    pos = 0
    while pos + NLMSG_HDRLEN <= len(data):
        length, kind = struct.unpack_from("=IH", data, pos)
        if length < NLMSG_HDRLEN:
            return
        if kind == NFQNL_MSG_PACKET:
            attr, end = pos + NLMSG_HDRLEN + NFGENMSG_LEN, pos + length
            while attr + 4 <= end:
                attr_len, attr_type = struct.unpack_from("=HH", data, attr)
                if attr_len < 4:
                    break
                if attr_type & NLA_TYPE_MASK == NFQA_PACKET_HDR:  # struct nfqnl_msg_packet_hdr: packet_id first
                    yield struct.unpack_from("!I", data, attr + 4)[0]
                    break
                attr += (attr_len + 3) & ~3
        pos += (length + 3) & ~3


def accept(queue: int, ids: Iterable[int]) -> bytes:
    """The verdicts that let packets ``ids`` of ``queue`` go on, as one write."""
    return b"".join(
        nlmsg(NFQNL_MSG_VERDICT, NLM_F_REQUEST, queue, [(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, i))])
        for i in ids
    )
