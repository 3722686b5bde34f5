"""Clients with several endpoints (issue 18, "clients follow"), against real processes on loopback.

Two independent gateways would keep two different journals, so they cannot stand in for a replicated pair.
What can: for the Publisher, one gateway killed -9 and started again on the journal at the *other* listed
address, and listed endpoints where nothing listens or where a gateway of other streams refuses ATTACH; for
the Subscriber, two `zeps replay` processes serving one journal directory, one killed -9 mid-stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from support.deadlines import SLACK_S, States, Stopwatch, exercise_deadlines
from support.servers import STREAM, GatewayProcess, Side, Stream, assert_exactly_once, free_port, side

from gateway.client.async_publisher import AsyncPublisher
from gateway.client.async_subscriber import AsyncSubscriber
from gateway.client.publisher import Publisher
from gateway.client.subscriber import Subscriber
from gateway.errors import PublishError, ReplayRefused
from gateway.tools.deployment import Keys
from gateway.wire import protocol as P

pytestmark = pytest.mark.timeout(180)


def dead() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


# --- Publisher ------------------------------------------------------------------------------------------------


def test_the_publisher_passes_over_dead_and_refusing_endpoints(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path / "gw")
    others = GatewayProcess(tmp_path / "others", streams=("elsewhere",))  # refuses ATTACH to STREAM
    try:
        began = time.monotonic()
        with Publisher([dead(), others.ingest, gw.ingest], STREAM, confirm=True) as pub:
            attached = time.monotonic() - began
            assert pub.endpoint == gw.ingest
            for i in range(100):
                pub.publish("k", b"%d" % i)
            assert pub.flush() == 100
        assert attached < 1.0, f"{attached:.2f} s to get past a dead and a refusing endpoint"

        async def attach_async() -> str:
            async with await AsyncPublisher.attach([dead(), gw.ingest], STREAM) as apub:
                return apub.sync.endpoint

        assert asyncio.run(attach_async()) == gw.ingest

        # Refused by every endpoint: final, and promptly; the error names each refusal.
        began = time.monotonic()
        with pytest.raises(PublishError, match="every endpoint refused") as refused:
            Publisher([others.ingest, gw.ingest], "nosuch", timeout=10)
        assert time.monotonic() - began < 1.0
        assert refused.value.reason.count("unknown stream") == 2, refused.value.reason

        # A dead endpoint refuses nothing (it may come back): the deadline ends the wait.
        with pytest.raises(PublishError, match=r"no answer within 1\.0 s"):
            Publisher([dead(), others.ingest], STREAM, timeout=1.0)

        # A frozen one (SIGSTOP: TCP connects, nothing answers) is left after the handshake deadline (2 s).
        others.proc.send_signal(signal.SIGSTOP)
        began = time.monotonic()
        with Publisher([others.ingest, gw.ingest], STREAM, timeout=10) as pub:
            assert pub.endpoint == gw.ingest and 1.9 < time.monotonic() - began < 3.0
    finally:
        others.proc.send_signal(signal.SIGCONT)
        others.stop()
        gw.stop()
    assert_exactly_once(tmp_path / "gw", [b"%d" % i for i in range(100)])


def test_a_paused_gateway_among_two_is_left_when_a_group_would_suspect_it(tmp_path: Path) -> None:
    """The Publisher leaves a paused gateway on its ZMTP heartbeat timeout (gateway.client.heartbeat): 300 ms,
    a group's `--suspect-ms`, noticed 0.3-0.4 s after the pause. With the 500 ms it had, no departure came
    before 0.49 s (docs/hardening.md). Load only delays a departure, so the fastest of three is asserted."""
    gws = [GatewayProcess(tmp_path / "a"), GatewayProcess(tmp_path / "b")]
    departures = []
    try:
        with Publisher([g.ingest for g in gws], STREAM, confirm=True, timeout=10) as pub:
            for i in range(3):
                pub.publish("k", b"%d" % i)
                assert pub.flush() is not None and pub.state == "ready"
                paused = next(g for g in gws if g.ingest == pub.endpoint)
                paused.proc.send_signal(signal.SIGSTOP)
                began = time.monotonic()
                try:
                    while pub.endpoint == paused.ingest and time.monotonic() - began < 5.0:
                        time.sleep(0.002)
                    departures.append(time.monotonic() - began)
                finally:
                    paused.proc.send_signal(signal.SIGCONT)
            pub.publish("k", b"last")
            assert pub.flush() is not None and pub.confirmed == 4
    finally:
        for g in gws:
            g.proc.send_signal(signal.SIGCONT)
            g.stop()
    assert min(departures) < 0.48, f"left a paused gateway after {departures} s"


def test_a_gateway_killed_and_restarted_at_the_other_address_gets_every_record_once(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path, "--fsync-ms", "20")  # confirms wait for the group commit: re-sends are many
    first, second = gw.ingest, dead()  # it moves between the two
    bodies: list[bytes] = []
    errors: list[BaseException] = []
    kills_survived = threading.Event()

    def load(pub: Publisher) -> None:
        try:
            began = time.monotonic()
            # 10,000 records/s, at least 60,000 and on until the last kill is survived, so that every kill lands
            # mid-stream however long a restart takes on a loaded machine (bounded: 600,000)
            while len(bodies) < 600_000 and (len(bodies) < 60_000 or not kills_survived.is_set()):
                i = len(bodies)
                bodies.append(b"r%06d" % i)
                pub.publish("k", bodies[i])
                if i % 100 == 0:
                    time.sleep(max(0.0, began + i / 10_000 - time.monotonic()))
            pub.flush(timeout=60)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    outages = []
    try:
        pub = Publisher([first, second], STREAM, confirm=True, batch_records=200, timeout=30)
        worker = threading.Thread(target=load, args=(pub,))
        worker.start()
        for address in (second, first, second):
            time.sleep(0.8)
            assert worker.is_alive(), "the load ended before the kill"
            gw.kill9()
            killed, confirmed = time.monotonic(), pub.confirmed
            time.sleep(0.2)
            gw.restart(address)  # returns once it answers PING there
            up = time.monotonic()
            while pub.confirmed == confirmed and time.monotonic() - up < 10:
                time.sleep(0.002)
            outages.append((time.monotonic() - killed, time.monotonic() - up))
            assert pub.endpoint == address
        kills_survived.set()
        worker.join(90)
        assert not worker.is_alive() and not errors, errors
        assert pub.reconnects >= 3 and pub.confirmed == len(bodies)
        pub.close()
    finally:
        gw.stop()
    assert_exactly_once(tmp_path, bodies)
    print("kill -9 -> next confirm at the other address (after it answered PING):")
    print(", ".join(f"{total * 1000:.0f} ms ({after * 1000:.0f} ms)" for total, after in outages))
    assert max(after for _, after in outages) < 2.5, (
        outages
    )  # at most the backoff cap (2 s), reached while both were down


@contextlib.contextmanager
def follower(leader: str, *, after_publish: bool = False) -> Iterator[tuple[str, list[str]]]:
    """A node that is not (or no longer) the leader, as the ZEPS wire shows it: it refuses ATTACH (or, with
    `after_publish`, attaches and then refuses the first PUBLISH-BATCH) with an INVALID naming `leader`.
    Yields its endpoint and the commands it received."""
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    got: list[str] = []
    stop = threading.Event()
    no = P.invalid(f"not the leader of {STREAM}; the leader is {leader}: {P.RETRY_LATER}")

    def serve() -> None:
        while not stop.is_set():
            if not router.poll(20):
                continue
            identity, frame = router.recv_multipart()
            cmd = P.decode(frame)
            got.append(cmd.NAME)
            match cmd:
                case P.Attach():
                    router.send_multipart([identity, P.encode(P.AttachOk()) if after_publish else no])
                case P.Extend(features=features):
                    router.send_multipart([identity, P.encode(P.ExtendOk(features))])
                case P.PublishBatch():
                    router.send_multipart([identity, no])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{port}", got
    finally:
        stop.set()
        thread.join(5)
        router.close()


def test_a_node_that_is_not_the_leader_sends_the_publisher_to_the_one_it_names(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path)
    bodies = [b"%d" % i for i in range(500)]
    try:
        # Refused at ATTACH, the leader named: tried next, before the dead endpoint listed in between.
        with follower(gw.ingest) as (node, seen), Publisher([node, dead(), gw.ingest], STREAM, confirm=True) as pub:
            assert pub.endpoint == gw.ingest and pub.reconnects == 1 and seen == ["ATTACH"]
            for body in bodies[:200]:
                pub.publish("k", body)
            pub.flush()
        # Only followers (the group is electing): no refusal is final; the deadline ends the wait.
        with (
            follower(gw.ingest) as (a, _),
            follower(gw.ingest) as (b, _),
            pytest.raises(PublishError, match=r"no answer within 1\.0 s"),
        ):
            Publisher([a, b], STREAM, timeout=1.0)
        # A leader that steps down while we publish: its refusal of a batch sends the publisher on, and what it
        # had not confirmed is re-sent to the leader, once.
        with (
            follower(gw.ingest, after_publish=True) as (node, seen),
            Publisher([node, gw.ingest], STREAM, confirm=True) as pub,
        ):
            assert pub.endpoint == node
            for body in bodies[200:]:
                pub.publish("k", body)
            pub.flush()  # confirmed by the leader
            assert pub.endpoint == gw.ingest and pub.confirmed == 300 and "PUBLISH-BATCH" in seen
    finally:
        gw.stop()
    assert_exactly_once(tmp_path, bodies)


# --- Subscriber -----------------------------------------------------------------------------------------------


def take(sub: Subscriber, got: list[int], until: int, within: float = 30.0) -> float:
    """next() until record `until` (asserting each call keeps its deadline); the longest wait between records."""
    longest, last = 0.0, time.monotonic()
    end = last + within
    calls = 0
    while (not got or got[-1] < until) and time.monotonic() < end:
        timeout = (0.0, 0.02, 0.1)[calls % 3]
        calls += 1
        watch = Stopwatch()
        rec = sub.next(timeout=timeout)
        now, took = time.monotonic(), watch.own()
        assert took <= timeout + SLACK_S, f"next(timeout={timeout}) took {took:.3f} s"
        if rec is not None:
            got.append(rec.seq)
            longest, last = max(longest, now - last), now
    return longest


def test_sidecars_on_one_journal_a_kill_9_mid_stream_loses_and_repeats_nothing(tmp_path: Path) -> None:
    root = tmp_path / "journal"
    s = Stream(root, STREAM)
    s.write(20)
    stop = threading.Event()

    def write() -> None:  # the gateway's part: 10 records every 5 ms, bounded
        for _ in range(1200):
            if stop.wait(0.005):
                return
            s.write(1)

    a, b = Side(root, free_port()), Side(root, free_port())
    writer = threading.Thread(target=write)
    got: list[int] = []
    try:
        sub = Subscriber(STREAM, replay=[a.endpoint, b.endpoint], start="earliest", replay_timeout=1.0)
        writer.start()
        stalls = []
        for victim, spare in ((a, b), (b, a)):
            take(sub, got, got[-1] + 1000 if got else 1000)
            assert sub.replay_endpoint == victim.endpoint
            victim.kill9()
            stalls.append(take(sub, got, got[-1] + 1000))
            assert sub.replay_endpoint == spare.endpoint
            victim.start()
        stop.set()
        writer.join(10)
        take(sub, got, s.head)
        assert sub.next(timeout=0.3) is None  # nothing twice
        assert sub.summary()["replay_retries"] == 2
        sub.close()
    finally:
        stop.set()
        a.stop()
        b.stop()
        s.writer.close()
    assert got == list(range(1, s.head + 1))
    print(f"longest wait for a record after a sidecar's kill -9: {', '.join(f'{t * 1000:.0f} ms' for t in stalls)}")
    assert max(stalls) < 1.0, stalls


def test_the_subscriber_keeps_its_deadlines_while_sidecars_rotate(tmp_path: Path) -> None:
    root = tmp_path / "journal"
    s = Stream(root, STREAM)
    s.write(30)
    s.writer.close()
    states = States()
    with Subscriber(
        STREAM, replay=[dead(), dead()], start="earliest", replay_timeout=1.0, on_replay_state=states
    ) as sub:
        assert exercise_deadlines(sub, 2.0) <= {"connecting", "retrying"}
        assert sub.summary()["replay_retries"] >= 4  # both, several rounds: nothing listening fails at once
    assert set(states) == {"connecting", "retrying"}, states

    # CURVE-only sidecars refuse a keyless client: the next one is tried, and only all of them refusing is final.
    keys = Keys.create(tmp_path / "keys")
    with side(root, *keys.server_args()) as curved, side(root) as plain:
        with Subscriber(STREAM, replay=[dead(), curved.endpoint, plain.endpoint], start="earliest") as sub:
            got: list[int] = []
            take(sub, got, 300, within=5.0)
            assert got == list(range(1, 301)) and sub.replay_endpoint == plain.endpoint
        # Frozen (SIGSTOP): left at the reconciler's first-answer deadline (0.3 s), not at the handshake's
        # (replay_timeout, 5 s here), next() on time meanwhile.
        with side(root) as frozen:
            frozen.signal(signal.SIGSTOP)
            with Subscriber(
                STREAM, replay=[frozen.endpoint, plain.endpoint], start="earliest", replay_timeout=5.0
            ) as sub:
                got = []
                began = time.monotonic()
                take(sub, got, 300, within=5.0)
                assert got == list(range(1, 301)) and time.monotonic() - began < 2.5
        with side(root, *keys.server_args()) as curved2:
            sub = Subscriber(STREAM, replay=[curved.endpoint, curved2.endpoint], start="earliest")
            began = time.monotonic()
            with pytest.raises(ReplayRefused, match="every replay sidecar refused"):
                while time.monotonic() - began < 10:
                    sub.next(timeout=0.1)
            assert time.monotonic() - began < 2.0
            sub.close()


def test_the_async_subscriber_follows_too(tmp_path: Path) -> None:
    root = tmp_path / "journal"
    s = Stream(root, STREAM)
    s.write(50)
    s.writer.close()

    async def run(endpoints: list[str]) -> list[int]:
        got: list[int] = []
        async with AsyncSubscriber(STREAM, replay=endpoints, start="earliest", replay_timeout=1.0) as sub:
            end = time.monotonic() + 10
            while len(got) < 500 and time.monotonic() < end:
                watch = Stopwatch()
                rec = await sub.next(timeout=0.05)
                assert watch.own() <= 0.05 + SLACK_S
                if rec is not None:
                    got.append(rec.seq)
        return got

    with side(root) as sidecar:
        assert asyncio.run(run([dead(), sidecar.endpoint])) == list(range(1, 501))


# --- the command line -------------------------------------------------------------------------------------------


def test_zeps_publish_and_subscribe_take_several_endpoints(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path)
    zeps = [sys.executable, "-m", "gateway.cli"]
    try:
        pub = subprocess.run(
            [*zeps, "publish", "--ingest", dead(), "--ingest", gw.ingest, "--stream", STREAM, "--count", "200"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert pub.returncode == 0 and "published 200 records" in pub.stderr, pub.stderr
        env = {**os.environ, "ZEPS_INGEST": f"{dead()},{gw.ingest}", "ZEPS_STREAM": STREAM}
        one = subprocess.run([*zeps, "publish", "--body", "x"], capture_output=True, text=True, timeout=60, env=env)
        assert one.returncode == 0 and "last sequence 201" in one.stderr, one.stderr
    finally:
        gw.stop()
    with side(tmp_path) as sidecar:
        argv = [*zeps, "subscribe", "--replay", dead(), "--replay", sidecar.endpoint, "--stream", STREAM]
        sub = subprocess.run(
            [*argv, "--from", "earliest", "--count", "200", "--format", "text"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        last = subprocess.run(
            [*argv, "--from", "-5", "--count", "5", "--format", "text"], capture_output=True, text=True, timeout=60
        )
    assert sub.returncode == 0, sub.stderr
    assert [line.split()[0] for line in sub.stdout.splitlines()] == [str(i) for i in range(1, 201)]
    assert last.returncode == 0, last.stderr  # the head asked of the first sidecar that answers
    assert [line.split()[0] for line in last.stdout.splitlines()] == [str(i) for i in range(197, 202)]
