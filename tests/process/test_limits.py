"""Resource limits of the gateway and the replay sidecar, as real processes on loopback: every refusal is an
error the client library raises with the reason, and clients within the limits carry on unaffected."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.servers import STREAM, GatewayProcess, Stream, journal_records, start_sidecar

from gateway.client.publisher import Publisher
from gateway.client.replay_client import ReplayClient
from gateway.errors import BadRecord, PublishError, ReplayError
from gateway.wire.batch import Batch
from gateway.wire.protocol import FetchEnd

pytestmark = pytest.mark.timeout(120)


def test_gateway_client_limit_detach_frees_a_slot_and_silent_sessions_make_room(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path, "--max-clients", "2", "--client-timeout", "1")
    try:
        first = Publisher(gw.ingest, STREAM, confirm=True, timeout=5)
        second = Publisher(gw.ingest, STREAM, confirm=True, timeout=5)
        with pytest.raises(PublishError, match=r"too many clients \(max 2\)"):
            Publisher(gw.ingest, STREAM, timeout=5)
        first.close()  # DETACH: the slot is free at once
        third = attach_when_free(gw.ingest)
        third.publish("k", b"third")
        assert third.flush() == 1
        time.sleep(1.2)  # both sessions fall silent for longer than --client-timeout
        with Publisher(gw.ingest, STREAM, confirm=True, timeout=5) as fourth:  # they make room for it
            fourth.publish("k", b"fourth")
            assert fourth.flush() == 2
        second.publish("k", b"second")  # its session was ended for the newcomer: it attaches again, re-sends
        assert second.flush() == 3 and second.reconnects >= 1
        second.abort()
        third.abort()
    finally:
        gw.stop()
    assert [body for _, _, body in journal_records(tmp_path)] == [b"third", b"fourth", b"second"]


def attach_when_free(ingest: str, within: float = 5.0) -> Publisher:
    """A Publisher once a slot is free: a DETACH and the next ATTACH travel on different connections, so the
    ATTACH may overtake it by a moment."""
    deadline = time.monotonic() + within
    while True:
        try:
            return Publisher(ingest, STREAM, confirm=True, timeout=5)
        except PublishError as exc:
            if "too many clients" not in exc.reason or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_gateway_message_limits_answer_or_close_and_spare_other_publishers(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path, "--max-message-bytes", "1000")
    try:
        with Publisher(gw.ingest, STREAM, confirm=True, timeout=5) as good:
            good.publish("k", b"before")
            assert good.flush() == 1
            # Records each within the limit, but more than it together in one PUBLISH-BATCH: INVALID, with it.
            batcher = Publisher(gw.ingest, STREAM, confirm=True, timeout=5, batch_records=3)
            for _ in range(3):
                batcher.publish("k", b"x" * 600)
            with pytest.raises(PublishError, match="over the limit of 1000"):
                batcher.flush()
            batcher.abort()
            # A record over the limit the Publisher knows is refused by publish() itself, before it is queued.
            with Publisher(gw.ingest, STREAM, confirm=True, timeout=5, max_message_bytes=1000) as small:
                with pytest.raises(BadRecord, match="over the gateway's limit of 1000"):
                    small.publish("k", b"x" * 1001)
                with pytest.raises(BadRecord, match="over the gateway's limit of 1000"):
                    small.publish("k", b"x" * (2 << 20))
            good.publish("k", b"after")
            assert good.flush() == 2
    finally:
        gw.stop()
    assert [body for _, _, body in journal_records(tmp_path)] == [b"before", b"after"]


def test_gateway_limits_must_be_positive(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "gateway.cli", "gateway", "--journal", str(tmp_path), "--stream", STREAM,
            "--ingest", "tcp://127.0.0.1:1", "--max-clients", "0"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "--max-clients" in done.stderr and "below the minimum 1" in done.stderr, done.stderr


def test_replay_limits_clients_fetches_and_command_size(tmp_path: Path) -> None:
    root = tmp_path / "journal"
    root.mkdir()
    stream = Stream(root, "lim")
    stream.write(20, per_batch=1)
    opts = ("--max-clients", "2", "--max-fetches", "3", "--max-command-bytes", "4096")
    with start_sidecar(root, *opts) as side:
        one = ReplayClient(side.endpoint, "lim", timeout=5)
        two = ReplayClient(side.endpoint, "lim", timeout=5, window=1)
        one.wait_ready()
        two.wait_ready()
        third = ReplayClient(side.endpoint, "lim", timeout=5)
        with pytest.raises(ReplayError, match=r"too many clients \(max 2\)"):
            third.wait_ready()  # the handshake says so, not the constructor
        third.close()
        one.close()  # DETACH frees the slot at once
        one = ReplayClient(side.endpoint, "lim", timeout=5)
        one.wait_ready()

        # One byte of credit: the first FETCH gets one frame and stays outstanding, so do the next two.
        for _ in range(4):
            two.fetch(1, 20)
        with pytest.raises(ReplayError, match="3 fetches outstanding already"):
            while two.recv(timeout=5) is not None:
                pass
        two.close()

        # A bad frame within --max-command-bytes is read and answered; the session goes on.
        one.sock.send(b"\xaa\xa5\x00" + b"\0" * 4000)
        with pytest.raises(ReplayError, match="unknown command 0"):
            one.recv(timeout=5)
        # One over it closes the connection unread; the session is gone with it. The next request goes over a
        # new connection and is refused, or, sent as the old one closed, is lost and times out.
        one.sock.send(b"\xaa\xa5\x00" + b"\0" * 8192)
        one.subscribe()
        try:
            answer = one.recv(timeout=5)
        except ReplayError as exc:
            assert re.search(r"before ATTACH|ended", str(exc)), exc
        else:
            assert answer is None  # sent as the old connection closed: lost, and nothing came back
        one.close()
        with ReplayClient(side.endpoint, "lim", timeout=5) as fine:  # everyone else is served as before
            fine.fetch(1, 20)
            records = []
            while isinstance(event := fine.recv(timeout=5), Batch):
                records.extend((r.seq, r.key, r.body) for r in event.records())
            assert isinstance(event, FetchEnd)
        assert records == stream.expected()
    stream.writer.close()
