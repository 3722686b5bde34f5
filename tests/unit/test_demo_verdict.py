"""`zeps demo`'s plan and verdict (issue #33 item 10), without the lab: the outage it stages is longer than PGM's
repair window as sized, and the verdict fails a run where the journal did not fill it, however complete the
stream (tests/lab runs the demo itself)."""

from __future__ import annotations

from typing import Any

from gateway.tools.demo import DemoPlan, _verdict


def report(plan: DemoPlan, from_replay: int) -> dict[str, Any]:
    """A subscriber's report: the whole feed, in order, `from_replay` of it over replay."""
    return {
        "delivered": plan.records,
        "last_seq": plan.records,
        "from_live": plan.records - from_replay,
        "from_replay": from_replay,
        "gaps_detected": 1,
        "gaps_filled": 1,
        "duplicates_dropped": 0,
        "unauthenticated": 0,
        "out_of_order": 0,
        "wrong_content": 0,
        "lost_reported": 0,
        "state": "MERGED",
    }


def test_the_outage_is_longer_than_the_window_pgm_is_given() -> None:
    plan = DemoPlan()
    # Bytes, not seconds: rate x recovery interval over the feed's bytes per second.
    assert plan.window_s < plan.outage_s / 2, (plan.tuning, plan.window_s)
    assert plan.beyond_window >= plan.rate / 2


def test_the_verdict_needs_the_journal_to_have_filled_the_outage() -> None:
    plan, said = DemoPlan(), []
    late = report(plan, 20_000)
    assert _verdict(plan, {"early": report(plan, plan.beyond_window), "late": late}, said.append)
    assert said[-1] == "VERDICT: PASS"
    # What the issue saw: early complete, 50 records over replay, PGM having repaired the outage.
    assert not _verdict(plan, {"early": report(plan, 50), "late": late}, said.append)
    assert said[-1] == "VERDICT: FAIL" and any("NOT filled from the journal" in line for line in said)
