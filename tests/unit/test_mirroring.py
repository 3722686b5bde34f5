"""The gateway's rules for mirror streams (gateway.sequencer.mirroring): every row of the table, and its doc."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.client.opening import sends_elsewhere
from gateway.journal.promotion import PROMOTED_NAME, Promotion, read_promotion, write_promotion
from gateway.sequencer import mirroring as MR

DOC = Path(__file__).parents[2] / "docs" / "mirroring.md"


def test_the_doc_shows_the_table() -> None:
    assert MR.describe_transitions() in DOC.read_text(), "docs/mirroring.md is stale: paste describe_transitions()"


def test_a_mirror_accepts_only_the_batch_that_continues_its_head() -> None:
    rules = MR.MirrorRules("s", MR.Role.MIRROR)
    assert rules.on(MR.Hello(41)) == MR.Resume(41)
    assert rules.on(MR.MirrorBatch(42, 41)) == MR.Accept()
    for first in (41, 43, 1):
        verdict = rules.on(MR.MirrorBatch(first, 41))
        assert verdict == MR.Refuse(
            f"not contiguous: this mirror's head is 41, the batch starts at {first}; resume from 42"
        )
    assert rules.role is MR.Role.MIRROR


def test_a_mirror_refuses_publishers_naming_both_ways_out() -> None:
    verdict = MR.MirrorRules("orders", MR.Role.MIRROR).on(MR.PublisherBatch())
    assert verdict == MR.Refuse(
        "stream orders is a mirror of another site: publish at the source, or promote this site with "
        "`zeps mirror promote --stream orders`"
    )


def test_promotion_waits_for_the_mark_then_fences_the_mirror() -> None:
    rules = MR.MirrorRules("s", MR.Role.MIRROR)
    assert rules.on(MR.Promote(7)) == MR.Persist(7)
    assert rules.role is MR.Role.PROMOTING, "not promoted before the mark is persisted"
    assert rules.on(MR.Promoted(7)) == MR.PromotedAt(7)
    assert rules.role is MR.Role.PROMOTED
    fenced = MR.Refuse("this site was promoted at sequence 7; it no longer accepts mirror batches")
    assert rules.on(MR.MirrorBatch(8, 7)) == fenced
    assert rules.on(MR.Hello(9)) == fenced
    assert rules.on(MR.PublisherBatch()) == MR.Accept()
    assert rules.on(MR.Promote(12)) == MR.PromotedAt(7), "promoting again answers the first promotion"
    assert rules.on(MR.Promoted(12)) == MR.PromotedAt(7), "a group's mark learnt again changes nothing"


def test_while_the_mark_is_persisted_nothing_writes_the_stream_and_everyone_retries() -> None:
    rules = MR.MirrorRules("s", MR.Role.MIRROR)
    rules.on(MR.Promote(7))
    wait = MR.Refuse("stream s is being promoted at sequence 7 at this site; retry later")
    for event in (MR.MirrorBatch(8, 7), MR.Hello(7), MR.PublisherBatch(), MR.Promote(7)):
        assert rules.on(event) == wait
        assert rules.role is MR.Role.PROMOTING
    assert isinstance(wait, MR.Refuse) and sends_elsewhere(wait.reason), "clients retry, they do not give up"


def test_a_promotion_not_persisted_leaves_a_mirror_and_says_why() -> None:
    rules = MR.MirrorRules("s", MR.Role.MIRROR)
    rules.on(MR.Promote(7))
    assert rules.on(MR.NotPromoted("gateway node n0 no longer leads the group: promote at its leader")) == MR.Refuse(
        "the promotion could not be persisted (gateway node n0 no longer leads the group: promote at its leader): "
        "stream s is still a mirror"
    )
    assert rules.role is MR.Role.MIRROR
    assert rules.on(MR.MirrorBatch(8, 7)) == MR.Accept()
    assert rules.on(MR.Promote(8)) == MR.Persist(8), "it may be asked again"


def test_a_mirror_learns_a_promotion_its_group_made_under_an_earlier_leader() -> None:
    rules = MR.MirrorRules("s", MR.Role.MIRROR)
    assert rules.on(MR.Promoted(30)) == MR.PromotedAt(30)
    assert rules.role is MR.Role.PROMOTED
    assert rules.on(MR.MirrorBatch(31, 30)) == MR.Refuse(
        "this site was promoted at sequence 30; it no longer accepts mirror batches"
    )
    assert rules.on(MR.PublisherBatch()) == MR.Accept()


def test_a_primary_stream_is_no_mirror() -> None:
    rules = MR.MirrorRules("s", MR.Role.PRIMARY)
    assert rules.on(MR.PublisherBatch()) == MR.Accept()
    for event in (MR.Hello(0), MR.MirrorBatch(1, 0), MR.Promote(0)):
        verdict = rules.on(event)
        assert isinstance(verdict, MR.Refuse) and "start the gateway with --mirror s" in verdict.reason
    assert rules.role is MR.Role.PRIMARY


def test_a_promoted_stream_starts_with_its_mark() -> None:
    with pytest.raises(ValueError, match="promoted at"):
        MR.MirrorRules("s", MR.Role.PROMOTED)
    assert MR.MirrorRules("s", MR.Role.PROMOTED, 5).on(MR.MirrorBatch(6, 5)) == MR.Refuse(
        "this site was promoted at sequence 5; it no longer accepts mirror batches"
    )


def test_the_promotion_mark_survives_in_the_stream_directory(tmp_path: Path) -> None:
    assert read_promotion(tmp_path / "s") is None
    write_promotion(tmp_path / "s", Promotion(1234, "tcp://10.1.0.5:5571"))
    assert read_promotion(tmp_path / "s") == Promotion(1234, "tcp://10.1.0.5:5571"), "with the source it mirrored"
    assert not (tmp_path / "s" / "promoted.tmp").exists()
    text = (tmp_path / "s" / PROMOTED_NAME).read_text()
    assert int(text.split()[0]) == 1234, "an earlier version reads the head alone"
    (tmp_path / "s" / PROMOTED_NAME).write_text("77\n")  # an earlier version's mark
    assert read_promotion(tmp_path / "s") == Promotion(77, "")
    assert Promotion(5).encode() == "5"
    assert Promotion.decode(Promotion(5, "tcp://a:1").encode()) == Promotion(5, "tcp://a:1")
