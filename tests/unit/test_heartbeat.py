"""`Heartbeat`: a publisher with several endpoints leaves a silent gateway as soon as a group elects another
(docs/hardening.md, "What a SIGSTOP of the leader costs by design"), and backs off once leaving proves futile."""

from __future__ import annotations

from gateway.client.heartbeat import FUTILE_S, IVL_MS, LONE_IVL_MS, LONE_TIMEOUT_MS, TIMEOUT_MS, Heartbeat

A, B = "tcp://10.0.0.1:5570", "tcp://10.0.0.2:5570"
SUSPECT_MS = 300  # a group's `--suspect-ms` (gateway.replication): its new leader is elected 0.31-0.37 s after a fault


def test_with_several_endpoints_a_silent_gateway_is_left_when_the_group_suspects_it() -> None:
    ivl, timeout = Heartbeat().ms(True, A, 0.0)
    assert timeout <= SUSPECT_MS  # 500 ms left a paused leader 0.49-0.60 s after the pause
    assert ivl + timeout <= 400  # the latest it is noticed: a ping sent just before the fault, + its timeout
    assert Heartbeat().ms(False, A, 0.0) == (LONE_IVL_MS, LONE_TIMEOUT_MS)  # nowhere to move: keep it


def test_coming_back_at_once_to_the_endpoint_left_doubles_the_timeout_up_to_the_lone_one() -> None:
    # A starved publisher process timed out a gateway whose answer waited in its socket; the followers name
    # that gateway as the leader and the publisher attaches there again: leaving was a false suspicion.
    h = Heartbeat()
    timeouts = []
    for i in range(8):
        h.left(A, 10.0 * i)
        assert h.ms(True, B, 10.0 * i + 0.1) == (IVL_MS, TIMEOUT_MS)  # to another: a failover, if it attaches
        timeouts.append(h.ms(True, A, 10.0 * i + 0.2)[1])  # the connection back is made with the doubled one
        assert h.attached(A, 10.0 * i + 0.2)
        assert h.ms(True, A, 10.0 * i + 5.0)[1] == timeouts[-1]
    assert timeouts[:3] == [2 * TIMEOUT_MS, 4 * TIMEOUT_MS, 8 * TIMEOUT_MS] and timeouts[-1] == LONE_TIMEOUT_MS


def test_a_failover_sets_it_back_and_a_late_return_changes_nothing() -> None:
    h = Heartbeat()
    h.left(A, 0.0)
    h.attached(A, 0.1)
    widened = h.ms(True, A, 1.0)
    h.left(A, 5.0)
    assert h.ms(True, A, 5.0 + FUTILE_S + 0.5) == widened
    assert not h.attached(A, 5.0 + FUTILE_S + 0.5)  # a pause or a cut that outlasted the election's chance
    assert h.ms(True, A, 9.0) == widened
    h.left(A, 9.0)
    assert h.ms(True, B, 9.3) == (IVL_MS, TIMEOUT_MS)  # made with the base timeout, before the attach says so
    assert not h.attached(B, 9.3)  # a new leader: leaving early paid off
    assert h.ms(True, A, 9.4) == (IVL_MS, TIMEOUT_MS)
    assert not h.attached(A, 9.4)  # an attach after no departure (a refusal, an opening's deadline) is none


def test_a_failover_by_a_servers_word_sets_it_back_too() -> None:
    # Widened at A; later A steps down and sends the publisher on (a refusal, no departure): the new leader B
    # gets the base timeout, as a departure from A would have.
    h = Heartbeat()
    h.attached(A, 0.0)
    h.left(A, 1.0)
    h.attached(A, 1.2)
    assert h.ms(True, A, 5.0)[1] == 2 * TIMEOUT_MS
    assert h.ms(True, B, 5.0) == (IVL_MS, TIMEOUT_MS)
    h.attached(B, 5.1)
    assert h.ms(True, B, 9.0) == (IVL_MS, TIMEOUT_MS) and h.ms(True, A, 9.0) == (IVL_MS, TIMEOUT_MS)
