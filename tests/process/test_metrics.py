"""The gateway's and the sidecar's Prometheus metrics, read from real processes on loopback.

Per-stream series carry the stream, every known label value shows at 0 from the start, normal use moves no
error counter, and no `_created` series is exported.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import zmq
from prometheus_client.parser import text_string_to_metric_families
from support.servers import STREAM, GatewayProcess, free_port, start_sidecar, zeps_client

from gateway.client.publisher import Publisher
from gateway.wire import batch as B
from gateway.wire import protocol as P

OTHER = "other"
SHORT_LIVED = 20  # publishers that publish one record and close: DETACH, then gone before DETACH-OK arrives
Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Series:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(series: Series, name: str, **labels: str) -> float:
    return series[(name, frozenset(labels.items()))]


def moved(series: Series, *names: str) -> dict[str, float]:
    """The samples of these families that are not 0, by name and labels."""
    return {f"{n}{dict(labels)}": v for (n, labels), v in series.items() if n in names and v}


GATEWAY_ERRORS = (
    "zeps_gateway_rejected_messages_total",
    "zeps_gateway_replies_dropped_total",
    "zeps_gateway_refused_records_total",
    "zeps_gateway_journal_full",
)


def test_every_label_value_is_exported_at_0_from_the_start(tmp_path: Path) -> None:
    port, replay_port = free_port(), free_port()
    gw = GatewayProcess(tmp_path / "journal", "--metrics", f"127.0.0.1:{port}")
    try:
        series = scrape(port)
        with start_sidecar(tmp_path / "journal", "--metrics", f"127.0.0.1:{replay_port}"):
            sidecar = scrape(replay_port)
    finally:
        gw.stop()
    for stream in (STREAM, OTHER):
        for name in (
            "zeps_gateway_published_records_total",
            "zeps_gateway_journaled_records_total",
            "zeps_gateway_journaled_bytes_total",
            "zeps_gateway_head_sequence",
            "zeps_gateway_publishers",
            "zeps_gateway_journal_full",
            "zeps_gateway_batch_records_count",
        ):
            assert value(series, name, stream=stream) == 0, (name, stream)
        for reason in ("journal-full", "journal"):
            assert value(series, "zeps_gateway_refused_records_total", stream=stream, reason=reason) == 0
        for name in (
            "zeps_replay_sessions",
            "zeps_replay_credit_bytes",
            "zeps_replay_served_records_total",
            "zeps_replay_served_bytes_total",
            "zeps_replay_fetches_total",
            "zeps_replay_send_stalls_total",
        ):
            assert value(sidecar, name, stream=stream) == 0, (name, stream)
    for kind in ("auth", "no-signature", "invalid", "clients", "pub-frame", "oversize"):
        assert value(series, "zeps_gateway_rejected_messages_total", kind=kind) == 0
    for reason in ("gone", "unread"):
        assert value(series, "zeps_gateway_replies_dropped_total", reason=reason) == 0
    for kind in ("auth", "no-signature", "frames", "decode", "state", "attach", "command"):
        assert value(sidecar, "zeps_replay_rejected_messages_total", kind=kind) == 0
    for reason in ("detach", "shutdown", "disconnected", "timeout", "not-reading", "error"):
        assert value(sidecar, "zeps_replay_sessions_ended_total", reason=reason) == 0
    for reason in ("malformed", "range", "rate", "stream", "journal", "send"):
        assert value(sidecar, "zeps_replay_fill_dropped_total", reason=reason) == 0
    for op in ("multicast", "heartbeat", "announce", "peer-link", "etcd"):
        assert value(series, "zeps_gateway_send_errors_total", op=op, errno="EPERM") == 0
    for op in ("fill-answer", "tail-datagram", "announce", "etcd"):
        assert value(sidecar, "zeps_replay_send_errors_total", op=op, errno="ENETUNREACH") == 0
    assert not any(name.endswith("_created") for name, _ in series | sidecar)


def test_a_two_stream_gateway_counts_per_stream_and_normal_use_moves_no_error_counter(tmp_path: Path) -> None:
    port = free_port()
    gw = GatewayProcess(tmp_path, "--metrics", f"127.0.0.1:{port}")
    try:
        # The plain command line, as a user would: this used to count a dropped reply ("gone").
        cli = [sys.executable, "-m", "gateway.cli", "publish", "--ingest", gw.ingest, "--stream", STREAM]
        subprocess.run([*cli, "--body", "x"], check=True, timeout=60, capture_output=True)
        for _ in range(SHORT_LIVED - 1):  # the race was lost about every other time: try it often
            with Publisher(gw.ingest, STREAM) as pub:
                pub.publish("", b"x")
        with Publisher(gw.ingest, OTHER, confirm=True) as pub:
            for i in range(250):
                pub.publish(f"k{i % 3}", b"%03d" % i)
            assert pub.flush() == 250
            during = scrape(port)
        deadline = time.monotonic() + 10
        while value(after := scrape(port), "zeps_gateway_publishers", stream=OTHER):
            assert time.monotonic() < deadline, "the publisher's DETACH was not counted"
            time.sleep(0.05)
    finally:
        gw.stop()
    assert value(during, "zeps_gateway_publishers", stream=OTHER) == 1
    assert value(during, "zeps_gateway_publishers", stream=STREAM) == 0
    for stream, records in ((STREAM, SHORT_LIVED), (OTHER, 250)):
        assert value(after, "zeps_gateway_published_records_total", stream=stream) == records
        assert value(after, "zeps_gateway_journaled_records_total", stream=stream) == records
        assert value(after, "zeps_gateway_head_sequence", stream=stream) == records
        assert value(after, "zeps_gateway_batch_records_sum", stream=stream) == records
    # Bytes are record-batch bytes: a header per batch (with the producer's id and number: exactly-once), then per
    # record its overhead, key and body.
    per_batch = B.PRODUCER_HEADER_SIZE + B.RECORD_OVERHEAD + 1  # each short-lived publisher's record: its own batch
    assert value(after, "zeps_gateway_journaled_bytes_total", stream=STREAM) == SHORT_LIVED * per_batch
    assert value(after, "zeps_gateway_journaled_bytes_total", stream=OTHER) >= 250 * (B.RECORD_OVERHEAD + 5)
    assert not moved(after, *GATEWAY_ERRORS)


def test_a_ping_ok_to_a_client_gone_is_no_dropped_reply_an_attach_ok_is(tmp_path: Path) -> None:
    """A readiness probe sends PINGs until one is answered and leaves: the rest of its PING-OKs find it gone.
    The gateway is stopped while the client queues its commands and leaves, so every answer finds it gone.

    libzmq may hand the gateway the departed client's commands or drop them with its connection (CI saw the
    latter once), so the scenario is tried until the gateway answered them: then exactly the ATTACH-OK counts."""
    port = free_port()
    gw = GatewayProcess(tmp_path, "--metrics", f"127.0.0.1:{port}")
    gone = 0.0
    try:
        for _attempt in range(5):
            probe = zeps_client(gw.ingest)
            probe.send(P.encode(P.Ping()))
            assert isinstance(P.decode(probe.recv()), P.PingOk)  # connected
            gw.proc.send_signal(signal.SIGSTOP)
            try:
                for _ in range(5):
                    probe.send(P.encode(P.Ping()))
                probe.send(P.encode(P.Attach(P.PROTOCOL, P.VERSION, STREAM)))  # last: owed its ATTACH-OK
                probe.setsockopt(zmq.LINGER, 2000)
                probe.close()  # the commands wait in the gateway's socket buffer, then the connection's end
            finally:
                gw.proc.send_signal(signal.SIGCONT)
            deadline = time.monotonic() + 2
            while (now := value(scrape(port), "zeps_gateway_replies_dropped_total", reason="gone")) == gone:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            else:
                time.sleep(0.3)  # the rest of this attempt's answers, if any
                assert value(scrape(port), "zeps_gateway_replies_dropped_total", reason="gone") - gone == 1
                return  # the ATTACH-OK, answered after the five PING-OKs: the only one counted
            gone = now
        raise AssertionError("in 5 attempts the gateway never answered a departed client's queued commands")
    finally:
        gw.stop()
