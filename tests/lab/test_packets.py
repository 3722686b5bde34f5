"""netlab.packets: captures summarise what is on the wire and write pcaps tshark reads; injected and replayed
datagrams reach ordinary receivers; probes count what arrives."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest
import zmq
from scapy.layers.inet import UDP
from scapy.utils import rdpcap

from netlab import MP, Lab, packets

pytestmark = pytest.mark.lab

NETLAB_CLI = Path(sys.executable).parent / "netlab"
PORT = 5000
PGM_PORT = 5555
FRAME = 14 + 20 + 8  # Ethernet, IPv4 and UDP headers


@pytest.fixture
def lab(make_lab: Callable[..., Lab]) -> Lab:
    return make_lab(["pub", "sub", "rogue"])


def tshark(*args: str) -> list[str]:
    if shutil.which("tshark") is None:
        pytest.fail("tshark is missing: apt-get install tshark (listed in scripts/apt-packages.txt)", pytrace=False)
    done = subprocess.run(["tshark", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


# --- run inside lab hosts ------------------------------------------------------------------------------------


def collect(group: str, port: int, ready: Event, idle: float) -> list[tuple[str, int, bytes]]:
    """A plain UDP receiver on the group: (source address, source port, payload) until ``idle`` s of silence."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((group, port))
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, socket.inet_aton(group) + bytes(4))
        sock.settimeout(20.0)  # for the first datagram
        ready.set()
        got = []
        try:
            while len(got) < 10_000:
                payload, (address, sport) = sock.recvfrom(65536)
                got.append((address, sport, payload))
                sock.settimeout(idle)
        except TimeoutError:
            pass
    return got


def epgm_publisher(address: str, group: str, count: int) -> None:
    ctx = zmq.Context()
    try:
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.RATE, 10_000)
        pub.setsockopt(zmq.LINGER, 2000)  # close() waits until everything is on the wire
        pub.connect(f"epgm://{address};{group}:{PGM_PORT}")
        for n in range(count):
            pub.send(b"tick %d" % n)
            time.sleep(0.01)
        pub.close()
    finally:
        ctx.term()


def start_collector(
    lab: Lab, host: str, port: int = PORT, idle: float = 0.5
) -> Callable[[], list[tuple[str, int, bytes]]]:
    ready = MP.Event()
    handle = lab.start(host, collect, lab.group(1), PORT, ready, idle)
    assert ready.wait(30), "the receiver did not start"
    return lambda: handle.result(60)  # type: ignore[no-any-return]


# --- tests ---------------------------------------------------------------------------------------------------


def test_sniff_summarises_a_multicast_sender_and_writes_a_pcap(lab: Lab, tmp_path: Path) -> None:
    pcap = tmp_path / "feed.pcap"
    sniffer = packets.start_sniff(lab, "rogue", seconds=20, count=300, bpf=f"udp port {PORT}", pcap=pcap)
    sent = packets.probe(lab, "pub", "sub", count=300, pps=3000, size=100)
    capture = sniffer.result()
    assert sent.received == 300
    pub, group = lab.host("pub").ip, lab.group(1)
    assert capture.packets == 300 and capture.dropped == 0
    assert capture.groups == {group} and capture.sources == {pub}
    flow = capture.flow(group, PORT)
    assert flow is not None and (flow.proto, flow.packets, flow.bytes) == (17, 300, 300 * (FRAME + 100))

    lines = tshark("-r", str(pcap), "-T", "fields", "-e", "ip.src", "-e", "ip.dst", "-e", "udp.dstport")
    assert lines == [f"{pub}\t{group}\t{PORT}"] * 300


def test_capture_of_epgm_decodes_as_pgm_in_tshark(lab: Lab, tmp_path: Path) -> None:
    pcap = tmp_path / "pgm.pcap"
    odata = f"udp port {PGM_PORT} and udp[12] == 4"  # PGM type byte: ODATA (0x00 would be SPM)
    sniffer = packets.start_sniff(lab, "sub", seconds=30, bpf=odata, pcap=pcap)
    lab.run("pub", epgm_publisher, lab.host("pub").ip, lab.group(1), 50)
    time.sleep(0.2)
    sniffer.stop()
    capture = sniffer.result()
    # libzmq packs messages that queued up (a stall on a loaded machine) into one ODATA: 50 messages, <= 50 packets.
    assert 0 < capture.packets <= 50 and capture.sources == {lab.host("pub").ip}
    framed = [bytes([len(m) + 1, 0]) + m for m in (b"tick %d" % n for n in range(50))]  # ZMTP/1.0: length, flags
    assert [m in pcap.read_bytes() for m in framed] == [True] * 50
    rows = tshark("-r", str(pcap), "-d", f"udp.port=={PGM_PORT},pgm", "-T", "fields", "-e", "_ws.col.Info")
    sequence = [int(m.group(1), 16) for row in rows if (m := re.match(r"ODATA\s+sqn 0x([0-9a-f]+)", row))]
    assert sequence == list(range(sequence[0], sequence[0] + capture.packets)), rows


def test_inject_junk_from_a_rogue_posing_as_the_publisher(lab: Lab) -> None:
    collected = start_collector(lab, "sub")
    pub = lab.host("pub").ip
    assert packets.inject(lab, "rogue", lab.group(1), PORT, count=50, size=80, src=pub, sport=4242) == 50
    got = collected()
    assert len(got) == 50
    assert {(address, sport, len(payload)) for address, sport, payload in got} == {(pub, 4242, 80)}
    assert len({payload for _, _, payload in got}) == 50  # random junk, all different


def test_inject_exact_payloads_with_the_hosts_own_address(lab: Lab) -> None:
    collected = start_collector(lab, "sub")
    payloads = [b"first", b"", b"third"]
    packets.inject(lab, "rogue", lab.group(1), PORT, payloads=payloads)
    got = collected()
    assert [payload for _, _, payload in got] == payloads
    assert {address for address, _, _ in got} == {lab.host("rogue").ip}


def test_replay_resends_a_capture_that_receivers_accept(lab: Lab, tmp_path: Path) -> None:
    pcap = tmp_path / "feed.pcap"
    sniffer = packets.start_sniff(lab, "rogue", seconds=20, count=100, bpf=f"udp port {PORT}", pcap=pcap)
    packets.probe(lab, "pub", "sub", count=100, pps=2000)
    sniffer.result()
    captured = [bytes(frame[UDP].payload) for frame in rdpcap(str(pcap))]

    collected = start_collector(lab, "sub")
    assert packets.replay(lab, "rogue", pcap, pps=2000) == 100
    assert [payload for _, _, payload in collected()] == captured


def test_bad_capture_filter_fails_at_start(lab: Lab) -> None:
    with pytest.raises(Exception, match="Failed to compile filter"):
        packets.start_sniff(lab, "sub", bpf="udp port ((")


def test_inject_refuses_unicast_targets(lab: Lab) -> None:
    with pytest.raises(ValueError, match="not an IPv4 multicast group"):
        packets.inject(lab, "rogue", lab.host("sub").ip, PORT)


def test_cli_capture_and_inject(lab: Lab, tmp_path: Path) -> None:
    pcap = tmp_path / "cli.pcap"
    rogue, group = f"{lab.name}/rogue", lab.group(1)
    capture = subprocess.Popen(
        [
            str(NETLAB_CLI),
            "capture",
            f"{lab.name}/sub",
            "--out",
            str(pcap),
            "--count",
            "20",
            "--filter",
            f"udp port {PORT}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert capture.stderr is not None
        assert "capturing on" in capture.stderr.readline()  # printed once the capture listens
        inject = [str(NETLAB_CLI), "inject", rogue, f"{group}:{PORT}", "--count", "20", "--src", "10.9.9.9:999"]
        assert "sent 20 datagrams" in subprocess.run(inject, capture_output=True, text=True, timeout=60).stdout
        out, _ = capture.communicate(timeout=60)
    finally:
        capture.kill()
        capture.wait()
    assert capture.returncode == 0
    assert f"10.9.9.9 -> {group} proto 17 999 -> {PORT}: 20 packets" in out
    assert len(rdpcap(str(pcap))) == 20
