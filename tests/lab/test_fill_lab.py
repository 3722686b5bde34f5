"""Fill datagrams between lab hosts: a udp:// subscriber under loss fills its gaps by datagram from the sidecar's
fill port (gateway.sidecar.fills, gateway.client.datagram_fills), and the port keeps to its limits whatever is
sent to it: junk, huge ranges, unknown streams, and requests forged with a third host's source address (raw
packets from host "rogue", as the rogue multicast tests send theirs). The sidecar killed mid-stream: gaps go to
TCP, and everything arrives once the sidecar is back.
"""

from __future__ import annotations

import functools
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from support.feedlab import STREAM, WAIT_S, check_all, deploy, publish, subscribe

from gateway.sidecar.fills import FillLimits
from gateway.tools.deployment import Deployment, Keys
from gateway.wire import fill as F
from netlab import Lab
from netlab.impair import Impairment, clear, impair
from netlab.procs import MP

pytestmark = pytest.mark.lab

LIMITS = FillLimits()  # what `zeps replay` runs with
VICTIM_PORT = 40_000
ROGUE_PORT = 40_001


@pytest.fixture
def deployment(make_lab, tmp_path: Path):
    lab: Lab = make_lab(["pub", "gw", "sub", "rogue", "victim"])
    dep = deploy(lab, tmp_path, transport="udp")
    yield dep
    assert not dep.close()


def fill_port(dep: Deployment) -> tuple[str, int]:
    host, _, port = dep.replay.removeprefix("tcp://").rpartition(":")
    return host, int(port)


def request(rid: int, first: int, count: int, stream: str = STREAM) -> bytes:
    return F.encode_request(F.FillRequest(rid, stream, first, count))


def collect(port: int, seconds: float, ready: Any) -> dict[int, int]:
    """In a lab host: the bytes of fill answers arriving at `port` for `seconds`, by request id."""
    got: dict[int, int] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("0.0.0.0", port))
        sock.settimeout(0.1)
        ready.put("up")
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                data = sock.recv(65_535)
            except TimeoutError:
                continue
            rid = F.HEAD.unpack_from(data)[3] if len(data) >= F.HEAD.size else -1
            got[rid] = got.get(rid, 0) + len(data)
    return got


def send_forged(dst: tuple[str, int], datagrams: list[bytes], src: str, sport: int, pps: float) -> float:
    """In a lab host: each datagram as a raw IPv4 packet from `src`:`sport` (not this host); the seconds taken."""
    from netlab.packets import _import_scapy

    _import_scapy()
    from scapy.config import conf
    from scapy.layers.inet import IP, UDP

    sock = conf.L3socket()
    start = time.monotonic()
    try:
        for i, payload in enumerate(datagrams):
            sock.send(IP(src=src, dst=dst[0]) / UDP(sport=sport, dport=dst[1]) / payload)
            time.sleep(max(0.0, start + (i + 1) / pps - time.monotonic()))
    finally:
        sock.close()
    return time.monotonic() - start


def exchange(dst: tuple[str, int], datagrams: list[bytes], wait_s: float) -> dict[int, int]:
    """In a lab host: send each datagram from ROGUE_PORT, then the answer bytes that came within `wait_s`."""
    got: dict[int, int] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("0.0.0.0", ROGUE_PORT))
        for data in datagrams:
            sock.sendto(data, dst)
            time.sleep(0.001)
        sock.settimeout(0.1)
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            try:
                answer = sock.recv(65_535)
            except TimeoutError:
                continue
            rid = F.decode_answer(answer, STREAM.encode())[0]
            got[rid] = got.get(rid, 0) + len(answer)
    return got


def test_a_udp_feed_under_5pct_loss_fills_by_datagram(deployment: Deployment) -> None:
    lab = deployment.lab
    # Both ways: multicast, fill requests and answers, and TCP alike.
    impair(lab, "sub", Impairment(loss_pct=5.0), "both")
    try:
        ready = MP.Queue()
        sub = lab.start("sub", functools.partial(subscribe, ready=ready), deployment.for_host("sub"),
                        deployment.replay, "earliest", 20_000)  # fmt: skip
        ready.get(timeout=WAIT_S)
        lab.run("pub", publish, deployment.ingest, 0, 20_000, 5_000.0, timeout=WAIT_S)
        result = sub.result(timeout=WAIT_S)
    finally:
        clear(lab, "sub")
    check_all(result, 20_000)
    summary = result["summary"]
    assert summary["fill_datagrams"] > 0 and summary["from_replay"] > 0, summary


def test_with_a_stream_key_only_its_holders_are_answered_by_datagram(make_lab, tmp_path: Path) -> None:
    lab = make_lab(["pub", "gw", "sub", "plain"])
    keys = Keys.create(tmp_path / "keys")
    dep = Deployment(lab, tmp_path / "journal", STREAM, transport="udp", keys=keys)
    try:
        for host in ("sub", "plain"):
            impair(lab, host, Impairment(loss_pct=5.0), "in")
        ready = MP.Queue()
        keyed = lab.start("sub", functools.partial(subscribe, ready=ready, stream_key=keys.stream_key(),
                          curve=dep.curve), dep.for_host("sub"), dep.replay, "earliest", 10_000)  # fmt: skip
        plain = lab.start("plain", functools.partial(subscribe, ready=ready, curve=dep.curve),
                          dep.for_host("plain"), dep.replay, "earliest", 10_000)  # fmt: skip
        ready.get(timeout=WAIT_S)
        ready.get(timeout=WAIT_S)
        lab.run("pub", publish, dep.ingest, 0, 10_000, 5_000.0, dep.curve, timeout=WAIT_S)
        with_key, without = keyed.result(timeout=WAIT_S), plain.result(timeout=WAIT_S)
    finally:
        for host in ("sub", "plain"):
            clear(lab, host)
        assert not dep.close()
    check_all(with_key, 10_000)
    check_all(without, 10_000)  # over CURVE'd TCP: its unsigned requests are never answered
    assert with_key["summary"]["fill_datagrams"] > 0, with_key["summary"]
    assert without["summary"]["fill_datagrams"] == 0 and without["summary"]["from_replay"] > 0, without["summary"]


def test_junk_huge_ranges_unknown_streams_and_forged_sources_get_nothing_beyond_the_limits(
    deployment: Deployment,
) -> None:
    lab = deployment.lab
    lab.run("pub", publish, deployment.ingest, 0, 3_000, 0.0, timeout=WAIT_S)
    dst = fill_port(deployment)
    junk = [os.urandom(n) for n in range(0, 400, 2)] + [b"ZF\x01\x01" + os.urandom(30) for _ in range(100)]
    refused = [request(1, 1, F.MAX_COUNT), request(2, 1, LIMITS.max_records + 1), request(3, 1, 10, "nope"),
               request(4, 1, 10, "../feed"), *junk]  # fmt: skip
    assert lab.run("rogue", exchange, dst, refused, 1.0, timeout=WAIT_S) == {}
    # A forger posing as "victim" asks for as much as a request may have, 300 times: the victim gets at most
    # a request's worth per request, and the rate of one source host in all.
    ready = MP.Queue()
    victim = lab.start("victim", collect, VICTIM_PORT, 6.0, ready)
    ready.get(timeout=WAIT_S)
    forged = [request(100 + i, 1, LIMITS.max_records) for i in range(300)]
    victim_ip = lab.host("victim").ip
    took = lab.run("rogue", send_forged, dst, forged, victim_ip, VICTIM_PORT, 500.0, timeout=WAIT_S)
    got = victim.result(timeout=WAIT_S)
    total = sum(got.values())
    print(f"\nforged: {len(forged)} requests in {took:.2f} s; victim got {total:,} bytes for {len(got)} of them")
    assert got, "the forged requests should reach the sidecar (else this test shows nothing)"
    assert max(got.values()) <= LIMITS.max_answer_bytes
    assert total <= LIMITS.burst_bytes + LIMITS.rate_bytes * (took + 1.0)
    assert total < len(forged) * LIMITS.max_answer_bytes / 2  # the rate limit, not the requests, bounded it
    # The sidecar is alive and answers a genuine request from the rogue's own address.
    got = lab.run("rogue", exchange, dst, [request(7, 1, 20)], 1.0, timeout=WAIT_S)
    assert list(got) == [7]


def test_the_sidecar_killed_mid_stream_under_loss(deployment: Deployment) -> None:
    lab = deployment.lab
    impair(lab, "sub", Impairment(loss_pct=2.0), "in")
    try:
        ready = MP.Queue()
        sub = lab.start("sub", functools.partial(subscribe, ready=ready), deployment.for_host("sub"),
                        deployment.replay, "earliest", 24_000)  # fmt: skip
        ready.get(timeout=WAIT_S)
        pub = lab.start("pub", publish, deployment.ingest, 0, 24_000, 2_000.0)
        time.sleep(3.0)
        deployment.kill9("replay")
        time.sleep(6.0)  # gaps meanwhile: unanswered datagrams, then FETCH, whose handshake times out (5 s)
        deployment.start_replay()
        assert pub.result(timeout=WAIT_S) == 24_000
        result = sub.result(timeout=WAIT_S)
    finally:
        clear(lab, "sub")
    check_all(result, 24_000)
    summary = result["summary"]
    assert summary["fill_datagrams"] > 0 and summary["fills_escalated"] > 0, summary
    assert summary["replay_retries"] > 0, summary
