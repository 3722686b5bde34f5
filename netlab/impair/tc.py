"""The traffic-control side, through pyroute2: which interface one direction shapes, netlab's eBPF filter on its
``clsact`` egress hook, and the TBF root qdisc that limits its rate."""

from __future__ import annotations

import contextlib
import errno
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from netlab.impair import ebpf
from netlab.impair.model import Direction
from netlab.lab import Host, LabError

FILTER_NAME = "netlab-impair"
# include/uapi/linux/pkt_sched.h: TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_EGRESS), and the root's parent TC_H_ROOT
CLSACT_EGRESS = 0xFFFFFFF3
TC_H_ROOT = 0xFFFFFFFF
TBF_HANDLE = 0x10000  # "1:", the handle netlab gives its TBF
TCA_BPF_ID = 11  # include/uapi/linux/pkt_cls.h: the attribute pyroute2 does not decode
NLA_TYPE_MASK = 0x3FFF  # include/uapi/linux/netlink.h: an attribute type without NLA_F_NESTED/NET_BYTEORDER


@dataclass(frozen=True)
class Link:
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
    """Attribute ``wanted`` of a tc options blob, read from the raw bytes (struct nlattr: length, type, data)."""
    raw = bytes(options.data[options.offset : options.offset + options.length])
    pos = 4
    while pos + 4 <= len(raw):
        length, kind = struct.unpack_from("=HH", raw, pos)
        if length < 4:
            break
        if kind & NLA_TYPE_MASK == wanted and length >= 8:
            return int(struct.unpack_from("=I", raw, pos + 4)[0])
        pos += (length + 3) & ~3
    return None


def _find_filter(ipr: IPRoute, index: int) -> int | None:
    """The program id of netlab's filter on this interface's egress, or None."""
    try:
        filters = ipr.get_filters(index=index, parent=CLSACT_EGRESS)
    except NetlinkError as exc:
        if exc.code in (errno.ENOENT, errno.EINVAL):  # no clsact qdisc at all
            return None
        raise
    for msg in filters:
        options = msg.get_attr("TCA_OPTIONS")
        if options is not None and options.get_attr("TCA_BPF_NAME") == FILTER_NAME:
            return _nested_u32(options, TCA_BPF_ID)
    return None


@contextlib.contextmanager
def map_value(link: Link, *, create: bool) -> Iterator[ebpf.MapValue | None]:
    """The map value of ``link``'s filter; with ``create``, attach the filter first if there is none.

    Any process finds the map again from the tc filter (its program id), so nothing is kept between calls.
    """
    with link.iproute() as ipr:
        index = link.index(ipr)
        prog_id = _find_filter(ipr, index)
        if prog_id is None and not create:
            yield None
            return
        if prog_id is None:
            prog_fd, map_fd = ebpf.load_program(f"{link.host.veth.replace('-', '_')}_{link.direction}")
            try:
                with contextlib.suppress(NetlinkError):  # EEXIST: a clsact qdisc is already there
                    ipr.tc("add", "clsact", index)
                ipr.tc(
                    "add-filter",
                    "bpf",
                    index,
                    ":1",
                    fd=prog_fd,
                    name=FILTER_NAME,
                    parent=CLSACT_EGRESS,
                    classid=1,
                    direct_action=True,
                )
            except BaseException:
                os.close(map_fd)
                raise
            finally:
                os.close(prog_fd)
        else:
            map_fd = ebpf.map_fd_of_program(prog_id)
    try:
        value = ebpf.MapValue(map_fd)
    finally:
        os.close(map_fd)
    try:
        yield value
    finally:
        value.close()


def remove_filter(link: Link) -> None:
    with link.iproute() as ipr, contextlib.suppress(NetlinkError):  # ENOENT/EINVAL: none there
        ipr.tc("del", "clsact", link.index(ipr))


def set_rate(link: Link, rate_kbit: int | None) -> None:
    if rate_kbit is None and read_rate(link) is None:
        return  # no TBF of ours: leave the root qdisc alone
    with link.iproute() as ipr:
        index = link.index(ipr)
        if rate_kbit is None:
            ipr.tc("del", index=index, handle=TBF_HANDLE, root=True)
            return
        rate = rate_kbit * 125  # bytes/s
        # Bucket: 5 ms of traffic, at least two full frames; queue: 50 ms, as a modest router would have.
        ipr.tc("replace", "tbf", index, handle=TBF_HANDLE, rate=rate, burst=max(3200, rate // 200), latency=50_000)


def read_rate(link: Link) -> int | None:
    with link.iproute() as ipr:
        for msg in ipr.get_qdiscs(index=link.index(ipr)):
            if msg["parent"] == TC_H_ROOT and msg.get_attr("TCA_KIND") == "tbf":
                return round(msg.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")["rate"] / 125)
    return None
