"""The server side of the ZEPS handshake (gateway.wire.handshake): ATTACH, then EXTEND once, first."""

from __future__ import annotations

from pathlib import Path

from gateway.wire import handshake as H
from gateway.wire import protocol as P

GRANTABLE = frozenset({P.FEATURE_BATCH, P.FEATURE_CONFIRM})


def new() -> H.Handshake:
    return H.Handshake(GRANTABLE.intersection)


def test_extend_first_grants_what_the_server_grants_of_what_is_wanted() -> None:
    h = new()
    assert h.on(P.Extend((P.FEATURE_BATCH, "unknown", P.FEATURE_RANGE))) == H.Answer(P.ExtendOk(("batch",)), True)
    assert (h.phase, h.features) == (H.Phase.NEGOTIATED, {P.FEATURE_BATCH})


def test_extend_is_refused_once_negotiated_or_after_another_command() -> None:
    extended, late = new(), new()
    extended.on(P.Extend(()))
    assert late.on(P.Ping()) is H.PASS  # the server's to answer; the negotiation is over
    for h in (extended, late):
        answer = h.on(P.Extend((P.FEATURE_BATCH,)))
        assert answer is not None and not answer.accepted
        assert isinstance(answer.reply, P.Invalid) and "EXTEND is allowed once" in answer.reply.reason
        assert h.features == frozenset()


def test_without_a_session_ping_is_answered_and_anything_else_names_attach() -> None:
    assert H.detached(P.Ping()) == H.Answer(P.PingOk(), True)
    answer = H.detached(P.Publish("k", b"v"))
    assert not answer.accepted and isinstance(answer.reply, P.Invalid)
    assert answer.reply.reason.startswith("PUBLISH before ATTACH: send ATTACH")


def test_attach_of_another_version_is_refused_naming_ours() -> None:
    assert H.attach_refusal(P.VERSION) is None
    assert H.attach_refusal(P.VERSION + 1) == f"ZEPS version {P.VERSION + 1} is not served; this server speaks 1"


def test_the_table_covers_every_phase_and_docs_show_it() -> None:
    assert set(H.TRANSITIONS) == set(H.Phase)
    doc = (Path(__file__).parents[2] / "docs" / "protocol.md").read_text()
    assert H.describe_transitions() in doc, "docs/protocol.md is stale: paste gateway.wire.handshake's table"
