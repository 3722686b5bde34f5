"""The delay process: raw NFQUEUE over netlink (no libnetfilter_queue), holding each packet's verdict.

Standard library only, and run as a script (``python -I -S -c SOURCE QUEUE DELAY_US JITTER_US REORDER``), not
imported through netlab: a new delay process binds its queue in milliseconds, so a change of delay under
traffic leaves no long stretch on the old settings. The constants are the kernel's ABI, from
include/uapi/linux/netlink.h, include/uapi/linux/netfilter.h, include/uapi/linux/netfilter/nfnetlink.h and
include/uapi/linux/netfilter/nfnetlink_queue.h.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import random
import select
import signal
import socket
import struct
import sys
import time
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


def run(queue: int, delay_s: float, jitter_s: float, reorder: float) -> None:
    """Hold each packet of ``queue`` for its delay, then accept it. SIGTERM: finish the held ones, then exit."""
    sock = open_queue(queue)
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
            sock.send(accept(queue, due))
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
            for packet_id in packet_ids(data):
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
    run(queue, delay_us / 1e6, jitter_us / 1e6, reorder)
    return 0


if __name__ == "__main__":
    sys.exit(delay_daemon(sys.argv[1:]))
