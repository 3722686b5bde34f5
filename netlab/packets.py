"""Packet tools for lab hosts: capture multicast traffic to a summary and a pcap, inject and replay (scapy),
and probe a link with a paced, numbered UDP stream (plain sockets) to measure loss, delay and order.

Everything runs in a lab process inside the host's namespace, and scapy is imported there, after the process
has entered it: scapy reads interfaces and routes at import time, and would otherwise see the root namespace's.
Captures are ordinary pcap files (Ethernet link type): ``tshark -r FILE -d udp.port==PORT,pgm`` decodes PGM.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import ipaddress
import os
import random
import select
import selectors
import signal
import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event
from typing import Any, cast

from netlab.lab import EXTRA_MESSAGE, ExtraMissing, Host, Lab
from netlab.procs import MP, HostProcess

_MULTICAST = ipaddress.IPv4Network("224.0.0.0/4")
_SO_RCVBUFFORCE, _SOL_PACKET, _PACKET_STATISTICS = 33, 263, 6


@dataclass(frozen=True)
class Flow:
    """IPv4 multicast from one source (address and, for UDP, port) to one group (and UDP port)."""

    source: str
    group: str
    proto: int  # IP protocol: 17 UDP, 2 IGMP, 113 PGM ...
    sport: int  # 0 unless UDP
    dport: int
    packets: int
    bytes: int  # frame bytes, Ethernet header included


@dataclass(frozen=True)
class Capture:
    """What :func:`sniff` saw on a host's interface."""

    host: str
    packets: int  # every captured frame (those the filter let through)
    seconds: float
    flows: list[Flow] = field(default_factory=list)  # multicast only, biggest first
    pcap: str | None = None
    dropped: int = 0  # frames the kernel had to discard because the capture fell behind

    def flow(self, group: str, dport: int | None = None) -> Flow | None:
        """The busiest flow to ``group`` (and UDP port ``dport``), or None."""
        return next((f for f in self.flows if f.group == group and dport in (None, f.dport)), None)

    @property
    def groups(self) -> set[str]:
        return {f.group for f in self.flows}

    @property
    def sources(self) -> set[str]:
        return {f.source for f in self.flows}


def require_scapy(what: str) -> None:
    """LabError naming the lab extra when scapy is missing: checked here, before a host process starts, as
    scapy itself is imported only inside the host (above)."""
    try:
        found = importlib.util.find_spec("scapy") is not None
    except ImportError:
        found = False
    if not found:
        raise ExtraMissing(EXTRA_MESSAGE.format(what=what, module="scapy"))


def _import_scapy() -> None:
    """Load the parts of scapy netlab uses (0.2 s, against 0.7 s for scapy.all): the Linux sockets and the
    Ethernet/IPv4 layers, which register themselves so captured frames are decoded."""
    import scapy.arch
    import scapy.layers.inet
    import scapy.layers.l2  # noqa: F401


def _summarise(frame: Any, flows: dict[tuple[str, str, int, int, int], list[int]]) -> None:
    from scapy.layers.inet import IP, UDP

    ip = frame.getlayer(IP)
    if ip is None or ipaddress.IPv4Address(ip.dst) not in _MULTICAST:
        return
    udp = ip.getlayer(UDP)
    key = (ip.src, ip.dst, ip.proto, udp.sport if udp else 0, udp.dport if udp else 0)
    counts = flows.setdefault(key, [0, 0])
    counts[0] += 1
    counts[1] += len(frame)


def _sniff_here(
    host: str, ifname: str, seconds: float, count: int, bpf: str | None, pcap: str | None, ready: Event, stop: Event
) -> Capture:
    """Runs inside the host: capture until ``count`` frames, ``seconds`` elapsed, or ``stop`` is set."""
    _import_scapy()
    from scapy.config import conf
    from scapy.sendrecv import AsyncSniffer
    from scapy.utils import PcapWriter

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the CLI's Ctrl-C means "stop", which the parent signals
    flows: dict[tuple[str, str, int, int, int], list[int]] = {}
    total = 0
    writer = PcapWriter(pcap, linktype=1, sync=False) if pcap else None

    def on_frame(frame: Any) -> None:
        nonlocal total
        if count and total >= count:
            return
        total += 1
        _summarise(frame, flows)
        if writer is not None:
            writer.write(frame)
        if total == count:
            stop.set()

    # Our own socket: scapy's default buffer (conf.bufsize, 64 KiB) overflows within milliseconds when the
    # Python side falls behind; 32 MiB rides out seconds of a busy machine. Its statistics count what it lost.
    sock = conf.L2listen(iface=ifname, filter=bpf)
    sock.ins.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, 32 << 20)
    sniffer = AsyncSniffer(opened_socket=sock, prn=on_frame, store=False)
    started = time.monotonic()
    sniffer.start()
    ready.set()  # frames are queued in the socket from here on, even before the thread reads them
    stop.wait(seconds)
    sniffer.stop()
    for _ in range(1_000_000):  # frames that arrived before the stop may still be queued: take them too
        if (count and total >= count) or not select.select([sock.ins], [], [], 0)[0]:
            break
        if (frame := sock.recv()) is not None:
            on_frame(frame)
    _, dropped = struct.unpack("=II", sock.ins.getsockopt(_SOL_PACKET, _PACKET_STATISTICS, 8))
    sock.close()
    if writer is not None:
        writer.close()
    found = [Flow(*key, n, size) for key, (n, size) in flows.items()]
    found.sort(key=lambda f: (-f.packets, f.group, f.source))
    return Capture(host, total, round(time.monotonic() - started, 3), found, pcap, dropped)


class Sniffer:
    """A capture running in a lab host (from :func:`start_sniff`); it is already listening."""

    def __init__(self, handle: HostProcess, stop: Event):
        self._handle = handle
        self._stop = stop

    def stop(self) -> None:
        """End the capture now (the result is still collected with :meth:`result`)."""
        self._stop.set()

    def result(self, timeout: float | None = 60.0) -> Capture:
        return self._handle.result(timeout)


def start_sniff(
    lab: Lab,
    host: str | Host,
    *,
    seconds: float = 10.0,
    count: int = 0,
    bpf: str | None = None,
    pcap: str | os.PathLike[str] | None = None,
) -> Sniffer:
    """Start capturing on ``host``'s LAN interface; returns once the capture socket is open and filtering.

    Ends after ``seconds``, or after ``count`` frames (0: no limit), or on :meth:`Sniffer.stop`. ``bpf`` is a
    tcpdump-style filter ("udp port 5555"); ``pcap`` a file to write every captured frame to.
    """
    if seconds <= 0 or count < 0:
        raise ValueError(f"need seconds > 0 and count >= 0 (got {seconds}, {count})")
    require_scapy("capturing")
    h = lab.host(host)
    ready, stop = MP.Event(), MP.Event()
    path = os.fspath(pcap) if pcap is not None else None
    handle = lab.start(h, _sniff_here, h.name, h.ifname, seconds, count, bpf, path, ready, stop)
    sniffer = Sniffer(handle, stop)
    deadline = time.monotonic() + 30.0
    while not ready.wait(0.1):  # bounded; also notices a capture that failed to start (bad filter ...)
        if not handle.is_alive() or time.monotonic() > deadline:
            stop.set()
            handle.result(5.0)  # re-raises the child's error
            raise TimeoutError(f"capture on {h.name} did not start within 30 s")
    return sniffer


def sniff(
    lab: Lab,
    host: str | Host,
    *,
    seconds: float = 10.0,
    count: int = 0,
    bpf: str | None = None,
    pcap: str | os.PathLike[str] | None = None,
) -> Capture:
    """Capture on ``host`` for ``seconds`` (or until ``count`` frames) and summarise its multicast traffic."""
    return start_sniff(lab, host, seconds=seconds, count=count, bpf=bpf, pcap=pcap).result(seconds + 30.0)


def _multicast_mac(group: str) -> str:
    low = int(ipaddress.IPv4Address(group)) & 0x7FFFFF
    return f"01:00:5e:{low >> 16:02x}:{low >> 8 & 0xFF:02x}:{low & 0xFF:02x}"


def _send_paced(ifname: str, frames: Sequence[bytes], pps: float) -> int:
    """Send raw frames on ``ifname`` at ``pps`` frames/s (paced against a schedule, not a fixed sleep)."""
    _import_scapy()
    from scapy.config import conf

    sock = conf.L2socket(iface=ifname)
    try:
        start = time.monotonic()
        for i, frame in enumerate(frames):
            sock.send(frame)  # type: ignore[arg-type]  # scapy sends bytes as they are (stubs say Packet)
            pause = start + (i + 1) / pps - time.monotonic()
            if pause > 0:
                time.sleep(pause)
    finally:
        sock.close()
    return len(frames)


def _inject_here(
    ifname: str,
    group: str,
    port: int,
    payloads: list[bytes],
    src: str | None,
    sport: int | None,
    ttl: int,
    pps: float,
) -> int:
    from scapy.arch import get_if_addr, get_if_hwaddr
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    head = Ether(src=get_if_hwaddr(ifname), dst=_multicast_mac(group)) / IP(
        src=src or get_if_addr(ifname), dst=group, ttl=ttl
    )
    source_port = sport or random.randint(32768, 60999)
    frames = [bytes(head / UDP(sport=source_port, dport=port) / payload) for payload in payloads]
    return _send_paced(ifname, frames, pps)


def inject(
    lab: Lab,
    host: str | Host,
    group: str,
    port: int,
    *,
    count: int = 10,
    size: int = 64,
    payloads: Sequence[bytes] | None = None,
    src: str | None = None,
    sport: int | None = None,
    ttl: int = 1,
    pps: float = 1000.0,
) -> int:
    """Send UDP datagrams to ``group``:``port`` from ``host``, as raw frames; return how many were sent.

    Junk by default: ``count`` random payloads of ``size`` bytes; or exactly ``payloads``. ``src``/``sport``
    forge the source (e.g. a rogue sender posing as the real publisher); by default the host's own address.
    """
    require_scapy("injecting packets")
    if ipaddress.IPv4Address(group) not in _MULTICAST:
        raise ValueError(f"{group} is not an IPv4 multicast group; inject sends to groups (use lab.group(n))")
    if payloads is None:
        if not 0 <= count <= 1_000_000 or not 0 <= size <= 1472:
            raise ValueError(f"count must be 0-1,000,000 and size 0-1472 bytes (got {count}, {size})")
        payloads = [os.urandom(size) for _ in range(count)]
    h = lab.host(host)
    timeout = len(payloads) / pps + 30.0
    return int(lab.run(h, _inject_here, h.ifname, group, port, list(payloads), src, sport, ttl, pps, timeout=timeout))


def _replay_here(ifname: str, path: str, pps: float, limit: int) -> int:
    _import_scapy()
    from scapy.layers.inet import IP, UDP
    from scapy.utils import PcapReader

    frames = []
    with PcapReader(path) as reader:
        for _, frame in zip(range(limit), reader, strict=False):
            # A capture on a veth holds the partial checksums of checksum offload; receivers would drop them.
            for layer in (IP, UDP):
                if layer in frame:
                    del frame[layer].chksum
            frames.append(bytes(frame))
    return _send_paced(ifname, frames, pps)


def replay(
    lab: Lab, host: str | Host, pcap: str | os.PathLike[str], *, pps: float = 1000.0, limit: int = 100_000
) -> int:
    """Send the frames of a pcap file (Ethernet) from ``host``, at ``pps``; return how many.

    Frames go out as captured except for IPv4 and UDP checksums, which are recomputed: captures taken on a
    veth carry the unfinished checksums of checksum offload, and a receiving kernel would drop them.
    """
    require_scapy("replaying a capture")
    h = lab.host(host)
    timeout = limit / pps + 30.0
    return int(lab.run(h, _replay_here, h.ifname, os.fspath(pcap), pps, limit, timeout=timeout))


# --- probes: numbered datagrams, paced, counted at the other end ------------------------------------------

_PROBE = struct.Struct("!Id")  # sequence number, send time (CLOCK_MONOTONIC: one clock for all namespaces)


@dataclass(frozen=True)
class Probe:
    """Arrivals of a probe stream: datagram ``seq`` went to ``ports[seq % len(ports)]``."""

    sent: int
    ports: tuple[int, ...]
    size: int
    arrivals: list[tuple[int, float, float]]  # (seq, one-way delay in ms, arrival time.monotonic()), in order

    @property
    def received(self) -> int:
        return len(self.arrivals)

    @property
    def duplicates(self) -> int:
        return self.received - len({seq for seq, _, _ in self.arrivals})

    @property
    def out_of_order(self) -> int:
        """Arrivals with a lower sequence number than one that arrived before them."""
        late, highest = 0, -1
        for seq, _, _ in self.arrivals:
            if seq < highest:
                late += 1
            highest = max(highest, seq)
        return late

    def lost(self, port: int | None = None) -> list[int]:
        """Sequence numbers never received (of datagrams to ``port``, when given)."""
        got = {seq for seq, _, _ in self.arrivals}
        return [s for s in range(self.sent) if s not in got and port in (None, self.ports[s % len(self.ports)])]

    def loss_runs(self) -> list[int]:
        """Lengths of the runs of consecutive lost datagrams, in order."""
        runs: list[int] = []
        previous = -2
        for seq in self.lost():
            if seq == previous + 1:
                runs[-1] += 1
            else:
                runs.append(1)
            previous = seq
        return runs

    def delays_ms(self, first: int = 0, last: int | None = None) -> list[float]:
        """One-way delays of the arrivals with ``first <= seq < last``, sorted."""
        end = self.sent if last is None else last
        return sorted(d for seq, d, _ in self.arrivals if first <= seq < end)

    def throughput_kbit(self) -> float:
        """Payload kbit/s between the first and the last arrival (headers not counted)."""
        if self.received < 2:
            return 0.0
        span = self.arrivals[-1][2] - self.arrivals[0][2]
        return (self.received - 1) * self.size * 8 / span / 1000 if span > 0 else 0.0


def _receive(
    group: str, ports: tuple[int, ...], ready: Event, done: Event, idle: float, limit: float
) -> list[tuple[int, float, float]]:
    """Runs in the receiving host: record datagrams until the sender is ``done`` and ``idle`` s passed without
    one, or ``limit`` s passed. ``group`` may be a unicast address: the receiver's own."""
    selector = selectors.DefaultSelector()
    membership = socket.inet_aton(group) + socket.inet_aton("0.0.0.0")
    for port in ports:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, 8 << 20)  # a slow reader must not look like loss
        sock.bind((group, port))
        if ipaddress.IPv4Address(group) in _MULTICAST:
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
    ready.set()
    arrivals: list[tuple[int, float, float]] = []
    deadline = time.monotonic() + limit
    while (now := time.monotonic()) < deadline:
        events = selector.select(min(idle, deadline - now))
        if not events and done.is_set():
            break
        for key, _ in events:
            data = cast(socket.socket, key.fileobj).recv(65536)  # registered above
            seq, sent_at = _PROBE.unpack_from(data)
            now = time.monotonic()
            arrivals.append((seq, (now - sent_at) * 1000, now))
    return arrivals


def _send(group: str, ports: tuple[int, ...], count: int, pps: float, size: int, ttl: int, listening: Event) -> int:
    """Runs in the sending host: once the receiver is ``listening``, ``count`` datagrams at ``pps``, paced."""
    if not listening.wait(30.0):
        raise TimeoutError("the probe receiver did not start listening within 30 s")
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
    padding = bytes(max(0, size - _PROBE.size))
    start = time.monotonic()
    for seq in range(count):
        sock.sendto(_PROBE.pack(seq, time.monotonic()) + padding, (group, ports[seq % len(ports)]))
        pause = start + (seq + 1) / pps - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    return count


class ProbeRun:
    """A probe in progress (from :func:`start_probe`)."""

    def __init__(self, sender: HostProcess, receiver: HostProcess, events: tuple[Event, Event], probe: Probe) -> None:
        self._sender, self._receiver = sender, receiver
        # Held to the end: an event's semaphore vanishes with its last reference, maybe before a child has it.
        self._ready, self._done = events
        self._empty = probe

    def result(self, timeout: float = 120.0) -> Probe:
        """Wait for the sender, then for the receiver to fall silent; the arrivals."""
        try:
            self._sender.result(timeout)
        finally:
            self._done.set()
        return dataclasses.replace(self._empty, arrivals=self._receiver.result(timeout))


def start_probe(
    lab: Lab,
    sender: str | Host,
    receiver: str | Host,
    *,
    group: str | None = None,
    ports: Sequence[int] = (5000,),
    count: int = 1000,
    pps: float = 2000.0,
    size: int = 64,
    idle: float = 0.25,
    ttl: int = 1,
) -> ProbeRun:
    """Send ``count`` numbered datagrams (``size`` bytes, at ``pps``) from ``sender`` to a multicast ``group``
    (default ``lab.group(1)``) joined by ``receiver``, round-robin over ``ports``. Returns at once; both start
    in parallel, and the sender sends once the receiver listens.

    ``group`` may also be the receiver's own (unicast) address: a probe across a router. ``ttl`` is the
    multicast TTL (1: the datagrams may not leave the LAN; more: only the routers decide).

    The receiver stops once the sender is done and ``idle`` s passed without a datagram: ``idle`` must exceed
    any delay being measured.
    """
    if not 1 <= count <= 1_000_000 or pps <= 0 or not _PROBE.size <= size <= 1472 or not ports or not 1 <= ttl <= 255:
        raise ValueError(
            f"need 1-1,000,000 datagrams of {_PROBE.size}-1472 bytes, pps > 0, a port, a TTL 1-255 "
            f"(got {count}, {size}, {ttl})"
        )
    target, port_tuple = group or lab.group(1), tuple(ports)
    ready, done = MP.Event(), MP.Event()
    listening = lab.start(receiver, _receive, target, port_tuple, ready, done, idle, count / pps + idle + 60.0)
    sending = lab.start(sender, _send, target, port_tuple, count, pps, size, ttl, ready)
    return ProbeRun(sending, listening, (ready, done), Probe(count, port_tuple, size, []))


def probe(lab: Lab, sender: str | Host, receiver: str | Host, **options: Any) -> Probe:
    """:func:`start_probe` and wait for the :class:`Probe` result."""
    return start_probe(lab, sender, receiver, **options).result()
