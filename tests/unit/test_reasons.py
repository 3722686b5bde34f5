"""The INVALID reasons a client acts on (gateway.wire.reasons): every one the servers build is recognised by its
predicate, and by none of the others; a reason of another kind by none."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.client.opening import sends_elsewhere
from gateway.sequencer import mirroring as MR
from gateway.wire import handshake as H
from gateway.wire import protocol as P
from gateway.wire import reasons as R

GATEWAY = Path(__file__).parents[2] / "gateway"


@pytest.mark.parametrize(
    "why",
    [
        "too many clients (max 64)",  # the replay sidecar, full
        "gateway node n1 is a follower (the leader is n2 at tcp://10.0.0.2:5570 (epoch 7)): publish to the leader",
        "gateway node n1 is a follower (none is elected yet): publish to the leader",
        "gateway node n1 is shutting down: publish to another node",
        "producer 00000000000000ff: its records 5 to 9 were refused, not journaled: re-send from 5",
        "n" * 400,  # too long for an INVALID: cut in the text, the mark kept
        "caf\u00e9 \x01",  # escaped, as every INVALID is
    ],
)
def test_a_retry_later_reason_is_recognised_after_it_crossed_the_wire(why: str) -> None:
    reason = R.retry_later(why)
    sent = P.decode(P.invalid(reason))
    assert isinstance(sent, P.Invalid) and sent.reason == reason
    assert R.retries_later(sent.reason) and sends_elsewhere(sent.reason)
    assert not R.session_lost(sent.reason) and not R.names_not_leading(sent.reason)


def test_a_stream_being_promoted_tells_everyone_to_retry() -> None:
    rules = MR.MirrorRules("s", MR.Role.MIRROR)
    rules.on(MR.Promote(7))
    verdict = rules.on(MR.Hello(7))
    assert isinstance(verdict, MR.Refuse) and R.retries_later(verdict.reason)


@pytest.mark.parametrize("cmd", [P.Publish("k", b"v"), P.Extend(("batch",)), P.Fetch(1, "", 1, 2), P.Detach()])
def test_a_command_without_a_session_is_answered_session_lost(cmd: P.Command) -> None:
    answer = H.detached(cmd)
    assert isinstance(answer.reply, P.Invalid)
    reason = answer.reply.reason
    assert R.session_lost(reason) and not R.retries_later(reason) and not sends_elsewhere(reason)


def test_a_promotion_asked_of_a_node_that_no_longer_leads_sends_the_asker_to_the_leader() -> None:
    rules = MR.MirrorRules("s", MR.Role.MIRROR)
    rules.on(MR.Promote(7))
    verdict = rules.on(MR.NotPromoted(R.not_leading("n0")))  # quoted inside the promotion's refusal
    assert isinstance(verdict, MR.Refuse) and R.names_not_leading(verdict.reason) and sends_elsewhere(verdict.reason)
    assert not R.retries_later(verdict.reason) and not R.session_lost(verdict.reason)


@pytest.mark.parametrize(
    "reason",
    [
        "ZEPS version 2 is not served; this server speaks 1",
        "unknown stream 'x'; streams here: a, b (a stream appears when the gateway opens it)",
        "stream s is a mirror of another site: publish at the source, or promote this site with `zeps mirror "
        "promote --stream s`",
        "the promotion could not be persisted (etcd at http://127.0.0.1:2379: refused): stream s is still a mirror",
        "a refusal that mentions the leader and a later retry, no ATTACH before it",
    ],
)
def test_a_final_refusal_is_recognised_by_no_predicate(reason: str) -> None:
    assert not R.retries_later(reason) and not R.session_lost(reason) and not R.names_not_leading(reason)
    assert not sends_elsewhere(reason)


def test_no_server_spells_a_recognised_reason_itself() -> None:
    """Each is built by gateway.wire.reasons, so that its text and its predicate stay together."""
    spelt = re.compile(r"\{(P\.)?RETRY_LATER\}|[;:] retry later[\"']|before ATTACH: |promote at its leader")
    found = [
        f"{path.relative_to(GATEWAY)}:{n}"
        for path in GATEWAY.rglob("*.py")
        if path.name != "reasons.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if spelt.search(line)
    ]
    assert not found, f"build these reasons with gateway.wire.reasons: {found}"
