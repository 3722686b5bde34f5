"""The client's sans-IO machines: the shared ATTACH -> EXTEND opening, the Publisher's ingest session, and the
accumulator's smart batching. No sockets: commands in, actions out, `now` given."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gateway.client import ingest_session as S
from gateway.client import opening as O
from gateway.client.accumulator import Accumulator
from gateway.client.endpoints import FIRST_CONNECT_TIMEOUT_MS, Endpoints
from gateway.client.heartbeat import IVL_MS, LONE_IVL_MS, LONE_TIMEOUT_MS, TIMEOUT_MS
from gateway.errors import BadRecord, BadRecordType, ConfigError, ZepsError
from gateway.wire import batch as B
from gateway.wire import protocol as P
from gateway.wire.reasons import retry_later

DOC = Path(__file__).parents[2] / "docs" / "client-sessions.md"
GRANTED = (P.FEATURE_BATCH, P.FEATURE_CONFIRM, P.FEATURE_PRODUCER)


# --- the tables and the doc ------------------------------------------------------------------------------


@pytest.mark.parametrize("module", [O, S])
def test_docs_embed_the_current_tables(module: object) -> None:
    assert module.describe_transitions() in DOC.read_text(), "docs/client-sessions.md is stale: regenerate it"  # type: ignore[attr-defined]


@pytest.mark.parametrize(("table", "cls"), [(O.TRANSITIONS, O.Opening), (S.TRANSITIONS, S.IngestSession)])
def test_tables_use_only_their_machines_methods(table: dict, cls: type) -> None:
    for row in table.values():
        functions = [*row.on.values(), *row.timers, *(go.guard for go in row.go), *(go.action for go in row.go)]
        for function in filter(None, functions):
            assert getattr(cls, function.__name__) is function


# --- the opening ---------------------------------------------------------------------------------------


def test_opening_attach_then_extend_then_open() -> None:
    opening = O.Opening("orders", GRANTED, attach_s=2.0, extend_s=1.0)
    assert opening.start(0.0) == P.Attach(P.PROTOCOL, P.VERSION, "orders") and opening.deadline == 2.0
    assert opening.handle(P.Ping(), 0.1) is None and not opening.consumed  # not the opening's: the caller's
    assert opening.handle(P.AttachOk(), 0.5) == O.Reply(P.Extend(GRANTED))
    assert opening.step is O.Step.EXTENDING and opening.deadline == 1.5 and opening.consumed
    assert opening.expired(1.5) and not opening.expired(1.4)
    opening.handle(P.ExtendOk((P.FEATURE_BATCH,)), 0.6)
    assert opening.step is O.Step.OPEN and opening.features == {P.FEATURE_BATCH} and not opening.expired(9.0)


def test_opening_without_extensions_is_open_at_attach_ok() -> None:
    opening = O.Opening("orders", (), attach_s=2.0, extend_s=None)
    opening.start(0.0)
    assert opening.handle(P.AttachOk(), 0.1) is None and opening.step is O.Step.OPEN


def test_opening_refused_keeps_the_reason_and_a_plain_server_opens_without_features() -> None:
    refused = O.Opening("nosuch", GRANTED, attach_s=2.0, extend_s=None)
    refused.start(0.0)
    refused.handle(P.Invalid("unknown stream 'nosuch'"), 0.1)
    assert refused.step is O.Step.REFUSED and refused.reason == "unknown stream 'nosuch'"
    plain = O.Opening("orders", GRANTED, attach_s=2.0, extend_s=None)
    plain.start(0.0)
    plain.handle(P.AttachOk(), 0.1)
    plain.handle(P.Invalid(f"batch refused: {P.RETRY_LATER}"), 0.2)  # an earlier request's answer: passed over
    assert plain.step is O.Step.EXTENDING and not plain.consumed
    plain.handle(P.Invalid("unknown command EXTEND"), 0.3)
    assert plain.step is O.Step.OPEN and plain.features == frozenset()


# --- the ingest session --------------------------------------------------------------------------------


def session(*endpoints: str, confirm: bool = True) -> S.IngestSession:
    listed = list(endpoints) or ["tcp://127.0.0.1:5570"]
    return S.IngestSession(
        "orders", Endpoints(listed, first=0.05, cap=2.0), producer=(7, 100), confirm=confirm, attach_s=10.0
    )


def sent(actions: list[S.Action]) -> list[P.Command]:
    return [P.decode(bytes(a.frame)) for a in actions if isinstance(a, S.Send)]


def ready(s: S.IngestSession, now: float = 0.0, features: tuple[str, ...] = GRANTED) -> None:
    actions = s.handle(S.Tick(), now)
    assert isinstance(actions[0], S.Connect) and sent(actions) == [P.Attach(P.PROTOCOL, P.VERSION, "orders")]
    assert sent(s.handle(S.Received(P.AttachOk()), now)) == [P.Extend(S.WANTED)]
    s.handle(S.Received(P.ExtendOk(features)), now)
    assert s.state is S.State.READY


def publish(s: S.IngestSession, n: int, now: float = 0.0) -> list[S.Action]:
    records = [(0, b"k", b"v%d" % i, 0) for i in range(n)]
    return s.handle(S.Publish(records, 3 * n, False), now)


def test_session_numbers_batches_and_releases_budget_as_confirms_come() -> None:
    s = session()
    ready(s)
    (frame,) = sent(publish(s, 3))
    assert isinstance(frame, P.PublishBatch)
    assert B.Batch.parse(frame.batch).producer == (7, 100)
    (second,) = sent(publish(s, 2))
    assert B.Batch.parse(second.batch).producer == (7, 103)  # numbered on from the first batch
    assert s.handle(S.Received(P.PublishOk(1, 2)), 0.1) == []  # part of the first batch: nothing freed yet
    assert s.handle(S.Received(P.PublishOk(3, 2)), 0.2) == [S.Release(9)]
    assert (s.sent, s.confirmed, s.last_seq, len(s.unconfirmed)) == (5, 4, 4, 1)


def test_session_resends_unconfirmed_batches_in_order_after_a_drop() -> None:
    s = session()
    ready(s)
    frames = [*sent(publish(s, 1)), *sent(publish(s, 1))]
    actions = s.handle(S.Dropped("the connection dropped"), 1.0)
    assert s.state is S.State.DOWN and S.Disconnect() in actions and s.reconnects == 1
    backoff = s.wait(1.0)
    assert backoff is not None and backoff > 0 and s.handle(S.Tick(), 1.0) == []
    s.handle(S.Tick(), 1.0 + backoff)
    s.handle(S.Received(P.AttachOk()), 1.0 + backoff)
    assert sent(s.handle(S.Received(P.ExtendOk(GRANTED)), 1.0 + backoff)) == frames  # re-sent, in order
    assert s.state is S.State.READY and s.attached_once


def test_session_no_confirm_for_the_stall_time_attaches_again() -> None:
    s = session()
    ready(s)
    publish(s, 1, now=1.0)
    assert s.wait(1.0) == S.CONFIRM_STALL_S
    s.handle(S.Tick(), 1.0 + S.CONFIRM_STALL_S)
    assert s.state is S.State.DOWN


def test_session_refusals_first_attach_is_final_later_retried_elsewhere_is_no_refusal() -> None:
    alone = session()
    alone.handle(S.Tick(), 0.0)
    alone.handle(S.Received(P.Invalid("unknown stream 'orders'")), 0.1)
    assert alone.state is S.State.FAILED and alone.error is not None
    assert "ATTACH to stream 'orders' at tcp://127.0.0.1:5570: unknown stream" in alone.error.reason
    pair = session("tcp://a:1", "tcp://b:1")
    pair.handle(S.Tick(), 0.0)
    follower = retry_later("gateway node n1 is a follower (the leader is n2 at tcp://b:1 (epoch 3)): publish to it")
    pair.handle(S.Received(P.Invalid(follower)), 0.1)
    assert pair.state is S.State.DOWN and pair.endpoint == "tcp://b:1"  # sent there, not refused
    pair.handle(S.Tick(), 5.0)
    pair.handle(S.Rejected("the server refused our CURVE key"), 5.1)
    assert pair.state is S.State.DOWN  # one of two refused
    pair.handle(S.Tick(), 10.0)
    pair.handle(S.Received(P.Invalid("unknown stream 'orders'")), 10.1)
    assert pair.state is S.State.FAILED and "every endpoint refused" in str(pair.error)


def test_session_without_confirms_fails_when_asked_for_and_handshake_deadline_moves_on() -> None:
    s = session()
    ready_actions = s.handle(S.Tick(), 0.0)
    assert ready_actions
    s.handle(S.Received(P.AttachOk()), 0.0)
    s.handle(S.Received(P.ExtendOk((P.FEATURE_BATCH,))), 0.0)
    assert s.state is S.State.FAILED and "does not grant publish confirms" in str(s.error)
    slow = session("tcp://a:1", "tcp://b:1")
    slow.handle(S.Tick(), 0.0)
    slow.handle(S.Tick(), S.HANDSHAKE_S)
    assert slow.state is S.State.DOWN and slow.endpoint == "tcp://b:1"


ENDED = P.Invalid(
    "EXTEND before ATTACH: send ATTACH with a stream name first (a session ends when the server restarts or "
    "closes the connection, e.g. for a frame over its size limit)"
)  # what a gateway answers an EXTEND that came after it ended the session (gateway.wire.handshake.detached)


def test_opening_whose_session_the_server_ended_after_attach_ok_is_refused_not_open_without_features() -> None:
    opening = O.Opening("orders", GRANTED, attach_s=2.0, extend_s=1.0)
    opening.start(0.0)
    opening.handle(P.AttachOk(), 0.1)
    opening.handle(P.Invalid(f"gateway node n1 is a follower (none is elected yet): publish to the leader; "
                             f"{P.RETRY_LATER}"), 0.2)  # fmt: skip
    assert opening.step is O.Step.EXTENDING  # passed over, as ever
    opening.handle(ENDED, 0.3)
    assert opening.step is O.Step.REFUSED and O.session_lost(opening.reason)


def test_session_attaches_again_when_a_leader_stepping_down_ends_its_session_between_attach_ok_and_extend() -> None:
    """Seen under zeps bench chaos (norm://, --seed=328782784, step 15): the Publisher failed for good with "the
    gateway no longer grants publish confirms after its restart", and the run took it for a 60 s confirm stall."""
    s = session("tcp://a:1", "tcp://b:1")
    ready(s)
    publish(s, 1, now=0.1)
    s.handle(S.Dropped("the connection dropped"), 1.0)
    s.handle(S.Tick(), 1.0 + (s.wait(1.0) or 0.0))
    assert s.state is S.State.OPENING
    s.handle(S.Received(P.AttachOk()), 2.5)
    s.handle(S.Received(P.Invalid(f"gateway node n2 is a follower (none is elected yet): publish to the leader; "
                                  f"{P.RETRY_LATER}")), 2.6)  # fmt: skip
    s.handle(S.Received(ENDED), 2.7)
    assert s.state is S.State.DOWN and s.error is None and len(s.unconfirmed) == 1  # attaches again, keeps it


def test_session_follows_the_directory_and_a_batch_outside_ready_is_a_bug() -> None:
    s = session("tcp://a:1")
    assert S.Connect("tcp://a:1", first=True, several=False) in s.handle(S.Listed(("tcp://a:1",), 1), 0.0)
    s.handle(S.Received(P.AttachOk()), 0.0)
    s.handle(S.Received(P.ExtendOk(GRANTED)), 0.0)
    s.handle(S.Listed(("tcp://c:1", "tcp://a:1"), 2), 1.0)  # a new leader, in a newer epoch
    assert s.state is S.State.DOWN
    actions = s.handle(S.Tick(), 9.0)
    assert S.Connect("tcp://c:1", False, True, FIRST_CONNECT_TIMEOUT_MS, (IVL_MS, TIMEOUT_MS)) in actions
    with pytest.raises(RuntimeError, match="a bug"):
        publish(s, 1)
    actions = s.handle(S.Close(detach=True), 9.0)
    assert s.state is S.State.CLOSED and not sent(actions)


def test_session_detaches_on_close_when_ready() -> None:
    s = session()
    ready(s)
    assert sent(s.handle(S.Close(detach=True), 1.0)) == [P.Detach()] and s.state is S.State.CLOSED


# --- the accumulator -----------------------------------------------------------------------------------


def accumulator(linger_s: float = 0.0, batch_records: int = 4) -> Accumulator:
    return Accumulator(
        threading.Condition(),
        batch_records=batch_records,
        batch_bytes=1000,
        buffer_bytes=10_000,
        linger_s=linger_s,
        max_message_bytes=1000,
    )


def test_smart_batching_a_lone_record_leaves_at_once_a_backlog_in_full_batches() -> None:
    acc = accumulator()
    assert acc.add(b"k", b"v", 0)  # the queue was empty: wake the IO thread
    assert acc.due(0.0) == 0.0
    (batch,) = acc.take(0.0, hurry=False)
    assert len(batch[0]) == 1 and acc.due(0.0) is None
    for i in range(10):  # what queues while a batch is being sent
        acc.add(b"k", b"%d" % i, 0)
    assert [len(records) for records, _, _ in acc.take(0.0, hurry=False)] == [4, 4, 2]  # capped, never waiting


def test_batches_put_back_leave_first_in_their_order() -> None:
    acc = accumulator()
    for i in range(10):
        acc.add(b"k", b"%d" % i, 0)
    batches = acc.take(0.0, hurry=False)
    acc.put_back(batches[1:])  # the session left READY after the first one
    acc.add(b"k", b"10", 0)
    assert acc.taken == 4 and [r[2] for r in acc.queue] == [b"%d" % i for i in range(4, 11)]


def test_linger_is_an_upper_bound_for_a_partial_batch() -> None:
    acc = accumulator(linger_s=0.05)
    acc.add(b"k", b"v", 0)
    assert acc.take(0.0, hurry=False) == [] and 0 < (acc.due(0.0) or 0) <= 0.05
    assert len(acc.take(0.0, hurry=True)) == 1  # flush() does not wait


def test_publish_many_records_are_checked_in_c_and_named_when_bad() -> None:
    acc = accumulator()
    keys, data, payload = acc.records(["a", "bb"], [b"1", b"22"])
    assert keys == [b"a", b"bb"] and payload == 6
    assert acc.extend(keys, data, payload) and [r[1:] for r in acc.queue] == [(b"a", b"1", 0), (b"bb", b"22", 0)]
    with pytest.raises(BadRecordType, match="record 1: body 'x' is a str"):
        acc.records(["a", "b"], [b"1", "x"])  # type: ignore[list-item]
    with pytest.raises(BadRecord, match="2 keys but 1 bodies"):
        acc.records(["a", "b"], [b"1"])
    with pytest.raises(BadRecord, match=r"record 0: key .* the limit is 255"):
        acc.records(["k" * 256], [b"1"])
    keys, _, _ = acc.records(["é", "k"], [bytearray(b"1"), b"2"])  # not all bytes: one by one, same result
    assert keys == ["é".encode(), b"k"]


def test_wrong_types_are_type_errors_wrong_values_value_errors() -> None:
    acc = accumulator()
    for key, body, ttl in (("k", "a str", None), (b"k", b"v", None), ("k", b"v", "5")):
        with pytest.raises(TypeError) as raised:
            acc.record(key, body, ttl)  # type: ignore[arg-type]
        assert isinstance(raised.value, BadRecord) and isinstance(raised.value, ZepsError)
    for key, body, ttl in (("k" * 256, b"v", None), ("k", b"x" * 1001, None), ("k", b"v", 0)):
        with pytest.raises(ValueError):
            acc.record(key, body, ttl)


def test_an_endpoint_without_a_transport_is_refused_with_the_command_lines_words() -> None:
    with pytest.raises(ConfigError, match=r"'127.0.0.1:5570' has no transport: write tcp://127.0.0.1:5570"):
        Endpoints("127.0.0.1:5570", first=0.05, cap=2.0)


def test_session_connects_with_a_heartbeat_that_widens_after_a_futile_departure() -> None:
    s = session("tcp://a:1", "tcp://b:1")
    connect = s.handle(S.Tick(), 0.0)[0]
    assert isinstance(connect, S.Connect) and connect.heartbeat_ms == (IVL_MS, TIMEOUT_MS)
    s.handle(S.Received(P.AttachOk()), 0.0)
    s.handle(S.Received(P.ExtendOk(GRANTED)), 0.0)
    s.handle(S.Dropped("the connection dropped"), 1.0)  # READY: its heartbeat timed out
    actions = s.handle(S.Tick(), 1.0 + (s.wait(1.0) or 0.0))
    assert s.endpoint == "tcp://b:1" and actions[0] == S.Connect(
        "tcp://b:1", False, True, FIRST_CONNECT_TIMEOUT_MS, (IVL_MS, TIMEOUT_MS)
    )
    s.handle(S.Received(P.Invalid(f"not the leader; the leader is tcp://a:1: {P.RETRY_LATER}")), 1.1)
    actions = s.handle(S.Tick(), 1.1 + (s.wait(1.1) or 0.0))
    assert s.endpoint == "tcp://a:1" and isinstance(actions[0], S.Connect)
    assert actions[0].heartbeat_ms == (IVL_MS, 2 * TIMEOUT_MS)  # back where it was, at once: a false suspicion
    s.handle(S.Received(P.AttachOk()), 1.3)
    s.handle(S.Received(P.ExtendOk(GRANTED)), 1.3)
    s.handle(S.Dropped("the connection dropped"), 2.0)
    actions = s.handle(S.Tick(), 2.0 + (s.wait(2.0) or 0.0))
    assert s.endpoint == "tcp://b:1" and actions[0] == S.Connect(
        "tcp://b:1", False, True, FIRST_CONNECT_TIMEOUT_MS, (IVL_MS, TIMEOUT_MS)
    )
    lone = session("tcp://a:1").handle(S.Tick(), 0.0)[0]
    assert isinstance(lone, S.Connect) and lone.heartbeat_ms == (LONE_IVL_MS, LONE_TIMEOUT_MS)


def test_session_waits_briefly_at_a_node_it_left_for_silence_when_a_follower_names_it() -> None:
    """A follower that has not noticed its leader's pause yet names it: the publisher goes back to the node it
    left for silence, but waits there for the group's suspicion, not HANDSHAKE_S, doubled per try in a row."""
    s = session("tcp://a:1", "tcp://b:1", "tcp://c:1")
    ready(s)
    s.handle(S.Dropped("the connection dropped"), 1.0)  # READY: a is paused, its heartbeat timed out
    now = 1.0 + (s.wait(1.0) or 0.0)
    s.handle(S.Tick(), now)
    assert s.endpoint == "tcp://b:1" and s.wait(now) == pytest.approx(S.HANDSHAKE_S)  # b never failed: the usual wait
    s.handle(S.Received(P.Invalid(retry_later("n2 is a follower (the leader is n1 at tcp://a:1 (epoch 3))"))), now)
    now += s.wait(now) or 0.0
    s.handle(S.Tick(), now)
    assert s.endpoint == "tcp://a:1" and s.wait(now) == pytest.approx(S.SILENT_HANDSHAKE_S)
    now += S.SILENT_HANDSHAKE_S
    s.handle(S.Tick(), now)  # no ATTACH-OK from a: on to the next, b
    assert s.state is S.State.DOWN and s.endpoint == "tcp://b:1"
    now += s.wait(now) or 0.0
    s.handle(S.Tick(), now)
    s.handle(S.Received(P.Invalid(retry_later("n2 is a follower (the leader is n1 at tcp://a:1 (epoch 3))"))), now)
    now += s.wait(now) or 0.0
    s.handle(S.Tick(), now)
    assert s.endpoint == "tcp://a:1" and s.wait(now) == pytest.approx(2 * S.SILENT_HANDSHAKE_S)  # a slow leader
    s.handle(S.Received(P.AttachOk()), now + 0.5)  # ... answers within the doubled wait, and is kept
    s.handle(S.Received(P.ExtendOk(GRANTED)), now + 0.5)
    assert s.state is S.State.READY and s._endpoints.unanswered("tcp://a:1") == 0
