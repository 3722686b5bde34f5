"""`Heartbeat`: a publisher with several endpoints leaves a silent gateway as soon as a group elects another
(docs/hardening.md, "What a SIGSTOP of the leader costs by design"), and backs off once leaving proves futile."""

from __future__ import annotations

from gateway.client.heartbeat import FUTILE_S, LONE_IVL_MS, LONE_TIMEOUT_MS, Heartbeat

A, B = "tcp://10.0.0.1:5570", "tcp://10.0.0.2:5570"
SUSPECT_MS = 300  # a group's `--suspect-ms` (gateway.replication): its new leader is elected 0.31-0.37 s after a fault


def test_with_several_endpoints_a_silent_gateway_is_left_when_the_group_suspects_it() -> None:
    ivl, timeout = Heartbeat().ms(several=True)
    assert timeout <= SUSPECT_MS  # 500 ms left a paused leader 0.49-0.60 s after the pause
    assert ivl + timeout <= 400  # the latest it is noticed: a ping sent just before the fault, + its timeout
    assert Heartbeat().ms(several=False) == (LONE_IVL_MS, LONE_TIMEOUT_MS)  # nowhere to move: keep it


def test_coming_back_at_once_to_the_endpoint_left_doubles_the_timeout_up_to_the_lone_one() -> None:
    # A starved publisher process timed out a gateway whose answer waited in its socket; the followers name
    # that gateway as the leader and the publisher attaches there again: leaving was a false suspicion.
    h = Heartbeat()
    first = h.ms(several=True)[1]
    timeouts = []
    for i in range(8):
        h.left(A, 10.0 * i)
        assert h.attached(A, 10.0 * i + 0.2)
        timeouts.append(h.ms(several=True)[1])
    assert timeouts[:3] == [2 * first, 4 * first, 8 * first] and timeouts[-1] == LONE_TIMEOUT_MS


def test_a_failover_sets_it_back_and_a_late_return_changes_nothing() -> None:
    h = Heartbeat()
    h.left(A, 0.0)
    h.attached(A, 0.1)
    widened = h.ms(several=True)
    h.left(A, 5.0)
    assert not h.attached(A, 5.0 + FUTILE_S + 0.5)  # a pause or a cut that outlasted the election's chance
    assert h.ms(several=True) == widened
    h.left(A, 9.0)
    assert not h.attached(B, 9.3)  # a new leader: leaving early paid off
    assert h.ms(several=True) == Heartbeat().ms(several=True)
    assert not h.attached(A, 9.4)  # an attach after no departure (a refusal, an opening's deadline) is none
