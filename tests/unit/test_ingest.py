"""The gateway's ingest rules (gateway.sequencer.ingest), sans-IO: commands and `now` in, actions out."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from gateway.sequencer import ingest as I
from gateway.sequencer.config import GatewayConfig
from gateway.sequencer.producers import ProducerTable
from gateway.wire import batch as B
from gateway.wire import protocol as P

DOC = Path(__file__).parents[2] / "docs" / "gateway.md"
A, B2 = b"client-a", b"client-b"


class Gate:
    def __init__(self) -> None:
        self.not_leading: str | None = None
        self.uncommitted: str | None = None
        self.mirrored: dict[str, str] = {}  # stream -> why publishers may not write it

    def refusal(self) -> str | None:
        return self.not_leading

    def uncommitted_refusal(self) -> str | None:
        return self.uncommitted

    def mirror_refusal(self, stream: str) -> str | None:
        return self.mirrored.get(stream)


def core(**config: object) -> tuple[I.Ingest, Gate]:
    settings = GatewayConfig(["s", "t"], Path("/nonexistent"), "tcp://127.0.0.1:1", **config)  # type: ignore[arg-type]
    lanes = {name: SimpleNamespace(producers=ProducerTable(10**12, 100)) for name in settings.streams}
    gate = Gate()
    return I.Ingest(settings, gate, lanes), gate


def attached(*features: str, identity: bytes = A, **config: object) -> tuple[I.Ingest, Gate]:
    ingest, gate = core(**config)
    assert ingest.handle(identity, P.Attach(P.PROTOCOL, P.VERSION, "s"), 0.0) == [
        I.Joined("s"),
        I.Reply(identity, P.AttachOk()),
    ]
    if features:
        granted = P.ExtendOk(tuple(sorted(features)))
        assert ingest.handle(identity, P.Extend(features), 0.0) == [I.Reply(identity, granted)]
    return ingest, gate


def refusal(actions: list[I.Action]) -> tuple[str, str | None]:
    assert len(actions) == 1 and isinstance(actions[0], I.Refuse), actions
    return actions[0].reason, actions[0].kind


def batch(count: int = 2, producer: tuple[int, int] | None = None) -> bytes:
    return B.encode(0, [(1, b"k", b"v")] * count, producer=producer)


# --- the table and the doc -----------------------------------------------------------------------------


def test_the_doc_embeds_the_current_table() -> None:
    assert I.describe_transitions() in DOC.read_text(), "docs/gateway.md is stale: paste describe_transitions()"


def test_the_table_uses_only_the_cores_methods_and_names_every_phase() -> None:
    assert set(I.TRANSITIONS) == set(I.Phase)
    for row in I.TRANSITIONS.values():
        assert set(row.on) == set(I.EVENT_KINDS)
        for function in filter(None, [*row.on.values(), *(go.guard for go in row.go)]):
            assert getattr(I.Ingest, function.__name__) is function


# --- sessions ----------------------------------------------------------------------------------------


def test_without_a_session_ping_is_answered_and_the_rest_names_attach() -> None:
    ingest, _ = core()
    assert (pong := ingest.handle(A, P.Ping(), 0.0)) == [I.Reply(A, P.PingOk())]
    assert not pong[0].owed  # a readiness probe stops at its first PING-OK: one to a probe gone is no error
    reason, kind = refusal(ingest.handle(A, P.Publish("k", b"v"), 0.0))
    assert reason.startswith("PUBLISH before ATTACH") and kind == "invalid"
    assert not ingest.sessions


def test_attach_is_checked_then_a_second_one_starts_over() -> None:
    ingest, _ = core()
    assert "not served" in refusal(ingest.handle(A, P.Attach(P.PROTOCOL, P.VERSION + 1, "s"), 0.0))[0]
    assert refusal(ingest.handle(A, P.Attach(P.PROTOCOL, P.VERSION, "x"), 0.0))[0] == (
        "unknown stream 'x'; this gateway serves: s, t"
    )
    ingest.handle(A, P.Attach(P.PROTOCOL, P.VERSION, "s"), 0.0)
    again = ingest.handle(A, P.Attach(P.PROTOCOL, P.VERSION, "t"), 1.0)
    assert again == [I.Left("s"), I.Joined("t"), I.Reply(A, P.AttachOk())]
    assert ingest.sessions[A].stream == "t"


def test_detach_ends_the_session_with_a_detach_ok_not_owed() -> None:
    ingest, _ = attached()
    assert (answer := ingest.handle(A, P.Detach(), 1.0)) == [I.Left("s"), I.Reply(A, P.DetachOk())]
    assert not answer[1].owed  # a publisher may close right after DETACH: a DETACH-OK it missed is no error
    assert A not in ingest.sessions
    assert refusal(ingest.handle(A, P.Publish("k", b"v"), 2.0))[0].startswith("PUBLISH before ATTACH")


def test_at_the_client_limit_silent_sessions_make_room_else_attach_is_refused() -> None:
    ingest, _ = attached(max_clients=1, client_timeout=10.0)
    reason, kind = refusal(ingest.handle(B2, P.Attach(P.PROTOCOL, P.VERSION, "s"), 5.0))
    assert reason == "too many clients (max 1); try again later" and kind == "clients"
    actions = ingest.handle(B2, P.Attach(P.PROTOCOL, P.VERSION, "t"), 11.0)
    assert actions == [I.Left("s"), I.Joined("t"), I.Reply(B2, P.AttachOk())]
    assert set(ingest.sessions) == {B2}


def test_extend_once_first_grants_and_later_is_refused() -> None:
    ingest, _ = attached(P.FEATURE_CONFIRM)
    assert ingest.sessions[A].handshake.features == {P.FEATURE_CONFIRM}
    assert "EXTEND is allowed once" in refusal(ingest.handle(A, P.Extend((P.FEATURE_BATCH,)), 1.0))[0]
    late, _ = attached()
    assert late.handle(A, P.Ping(), 1.0) == [I.Reply(A, P.PingOk())]
    assert I.Reply(A, P.AttachOk()).owed and I.Reply(A, P.ExtendOk(())).owed and I.Reply(A, P.PublishOk(1, 1)).owed
    assert "EXTEND is allowed once" in refusal(late.handle(A, P.Extend((P.FEATURE_BATCH,)), 1.0))[0]


def test_a_node_that_steps_down_ends_every_session_uncounted() -> None:
    ingest, _ = attached()
    assert ingest.end_all("not the leader") == [I.Refuse(A, "not the leader", None), I.Left("s")]
    assert not ingest.sessions


# --- refusals, in their order ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "cmd", [P.Attach(P.PROTOCOL, P.VERSION, "s"), P.Publish("k", b"v"), P.PublishBatch(b"x")], ids=str
)
def test_a_node_that_does_not_lead_refuses_attach_and_publishes_first(cmd: P.Command) -> None:
    for ingest, gate in (core(), attached()):
        gate.not_leading = "not the leader; the leader is tcp://elsewhere"
        assert refusal(ingest.handle(A, cmd, 1.0)) == ("not the leader; the leader is tcp://elsewhere", "not-leader")


def test_a_leader_without_enough_followers_refuses_publishes_but_answers_pings() -> None:
    ingest, gate = attached(P.FEATURE_BATCH)
    gate.uncommitted = "too few in-sync followers; retry later"
    for cmd in (P.Publish("k", b"v"), P.PublishBatch(batch())):
        assert refusal(ingest.handle(A, cmd, 1.0)) == ("too few in-sync followers; retry later", "uncommitted")
    assert ingest.handle(A, P.Ping(), 1.0) == [I.Reply(A, P.PingOk())]


def test_history_is_the_sidecars_and_other_commands_are_not_allowed() -> None:
    ingest, _ = attached(replay_endpoint="tcp://127.0.0.1:5580")
    reason, _ = refusal(ingest.handle(A, P.Fetch(1, "", 1, 2), 1.0))
    assert reason == "FETCH is served by the replay sidecar at tcp://127.0.0.1:5580, not the ingest"
    assert "ATTACH-OK is not allowed here" in refusal(ingest.handle(A, P.AttachOk(), 1.0))[0]
    assert "PUBLISH-BATCH is not allowed here" in refusal(ingest.handle(A, P.PublishBatch(batch()), 1.0))[0]


# --- publishing ------------------------------------------------------------------------------------


def test_a_record_is_enqueued_within_the_size_limit() -> None:
    ingest, _ = attached(P.FEATURE_CONFIRM, max_message_bytes=4)
    assert ingest.handle(A, P.Publish("k", b"body"), 1.0) == [I.Enqueue(A, "s", b"k", b"body", True)]
    assert "over the limit of 4" in refusal(ingest.handle(A, P.Publish("k", b"bodies"), 1.0))[0]


def test_a_batch_is_checked_then_sequenced() -> None:
    ingest, _ = attached(P.FEATURE_BATCH)
    (action,) = ingest.handle(A, P.PublishBatch(batch(3)), 1.0)
    assert isinstance(action, I.Sequence) and (action.stream, action.batch.count, action.confirm) == ("s", 3, False)
    assert refusal(ingest.handle(A, P.PublishBatch(b"junk"), 1.0))[0].startswith("bad PUBLISH-BATCH")
    numbered = B.encode(5, [(1, b"k", b"v")])
    assert "numbered from 0" in refusal(ingest.handle(A, P.PublishBatch(numbered), 1.0))[0]
    produced = batch(producer=(7, 1))
    assert "needs the 'producer' extension" in refusal(ingest.handle(A, P.PublishBatch(produced), 1.0))[0]


def test_a_producers_batch_after_a_gap_is_refused_out_of_order() -> None:
    ingest, _ = attached(P.FEATURE_BATCH, P.FEATURE_PRODUCER)
    journaled = B.Batch.parse(B.encode(1, [(1, b"k", b"v")] * 2, producer=(7, 1)))
    ingest.lanes["s"].producers.journaled(journaled)  # the producer's records 1 and 2 are in the journal
    (action,) = ingest.handle(A, P.PublishBatch(batch(producer=(7, 3))), 1.0)
    assert isinstance(action, I.Sequence)
    reason, kind = refusal(ingest.handle(A, P.PublishBatch(batch(producer=(7, 5))), 1.0))
    assert kind == "out-of-order" and "re-send from 3" in reason


# --- mirror sessions (docs/mirroring.md) ----------------------------------------------------------------


def test_a_mirror_stream_refuses_publishers_and_its_mirror_session_hands_its_commands_on() -> None:
    ingest, gate = attached("batch", "confirm")
    gate.mirrored["s"] = "stream s is a mirror of another site"
    assert refusal(ingest.handle(A, P.Publish("k", b"v"), 1.0)) == ("stream s is a mirror of another site", "mirror")
    assert refusal(ingest.handle(A, P.PublishBatch(batch()), 1.0))[1] == "mirror"
    assert refusal(ingest.handle(A, P.Mirror(), 1.0))[1] == "invalid"  # 'mirror' not granted: not allowed

    mirror, gate = attached("batch", "confirm", "mirror", identity=b"m")
    gate.mirrored["s"] = "stream s is a mirror of another site"
    for cmd in (P.Mirror(), P.Promote(), P.PublishBatch(batch())):
        assert mirror.handle(b"m", cmd, 1.0) == [I.Mirror(b"m", "s", cmd, True)]
    gate.not_leading = "not the leader"
    assert refusal(mirror.handle(b"m", P.PublishBatch(batch()), 1.0)) == ("not the leader", "not-leader")


def test_a_mirror_session_that_attaches_again_is_a_publisher() -> None:
    ingest, _ = attached("batch", "mirror")
    assert ingest.handle(A, P.Mirror(), 1.0) == [I.Mirror(A, "s", P.Mirror(), False)]
    assert ingest.handle(A, P.Attach(P.PROTOCOL, P.VERSION, "t"), 2.0) == [
        I.Left("s"),
        I.Joined("t"),
        I.Reply(A, P.AttachOk()),
    ]
    assert refusal(ingest.handle(A, P.Mirror(), 2.0))[1] == "invalid"
