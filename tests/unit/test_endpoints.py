"""`Endpoints`: the order in which a client tries its servers, the backoff between rounds, and when a refusal
becomes final."""

from __future__ import annotations

import pytest

from gateway.client.endpoints import CONNECT_TIMEOUT_MS, FIRST_CONNECT_TIMEOUT_MS, Endpoints
from gateway.errors import ConfigError

A, B, C = "tcp://10.0.0.1:5570", "tcp://10.0.0.2:5570", "tcp://10.0.0.3:5570"


def tries(e: Endpoints, n: int, hint: str = "") -> list[str | None]:
    out = []
    for _ in range(n):
        e.failed(hint)
        out.append(e.current)
    return out


def test_in_the_order_given_wrapping_around_each_once() -> None:
    e = Endpoints([A, B, A, C], first=0.1, cap=5.0)
    assert e.all == [A, B, C] and e.current == A and e.several
    assert tries(e, 4) == [B, C, A, B]
    single = Endpoints(A, first=0.1, cap=5.0)
    assert tries(single, 2) == [A, A] and not single.several


def test_the_backoff_grows_once_a_round_not_once_a_try() -> None:
    e = Endpoints([A, B, C], first=0.1, cap=5.0)
    delays = [e.failed() for _ in range(9)]
    assert delays[0] == delays[1] == delays[2] <= 0.1  # round 1: the first delay for each
    assert delays[3] == delays[4] == delays[5] and 0.1 <= delays[3] <= 0.2
    assert 0.2 <= delays[6] <= 0.4
    e.succeeded()
    assert e.failed() <= 0.1
    single = Endpoints(A, first=0.1, cap=0.4)
    ceilings = [0.1, 0.2, 0.4, 0.4]
    assert all(c / 2 <= single.failed() <= c for c in ceilings)  # every failure is a round of its own


def test_a_refusal_naming_a_listed_endpoint_goes_there_next() -> None:
    e = Endpoints([A, B, C], first=0.1, cap=5.0)
    e.failed(f"not the leader; the leader is {C}: retry later")
    assert e.current == C
    e.failed(f"not the leader; the leader is {C}5")  # another port: not named
    assert e.current == A
    e.failed(f"it is {A}")  # the endpoint that refused is no hint
    assert e.current == B


def test_a_refusal_is_final_once_every_endpoint_refused_since_a_success() -> None:
    e = Endpoints([A, B], first=0.1, cap=5.0)
    assert not e.refused("unknown stream")
    e.failed()
    e.failed()  # B failed without an answer: not a refusal
    assert e.current == A and not e.refused("unknown stream")
    e.failed()
    assert e.refused("keys refused") and e.refused_text() == f"{A}: unknown stream; {B}: keys refused"
    e.succeeded()
    assert not e.refusals and not e.all_refused
    assert Endpoints(A, first=0.1, cap=5.0).refused("unknown stream")  # one endpoint: its refusal is all of them


def test_learnt_endpoints_join_the_rotation() -> None:
    e = Endpoints((), first=0.1, cap=5.0)
    assert e.current is None and not e.all_refused and 0 < e.failed() <= 0.1
    e.add(A)
    e.add(B)
    e.add(A)
    assert e.current == A and e.all == [A, B]
    e.move_to(C)
    assert e.current == C and e.all == [A, B, C]
    with pytest.raises(ConfigError, match="non-empty strings"):
        Endpoints([A, ""], first=0.1, cap=5.0)


def test_a_server_that_sends_the_client_elsewhere_starts_the_rounds_again() -> None:
    e = Endpoints([A, B], first=0.1, cap=5.0)
    for _ in range(6):
        e.failed()
    assert e.failed() >= 0.4  # nothing answered for three rounds
    assert e.failed("not the leader: retry later", answered=True) <= 0.1  # a follower: the group is electing
    assert e.failed() <= 0.1 and e.failed() <= 0.2  # the dead one, then a round of its own


def test_an_endpoint_that_went_silent_is_passed_over_while_others_answer() -> None:
    # The leader A went silent (paused); the followers answer "none is elected yet" until one is: the client
    # asks them again, not A, whose kernel would take the connection while A answers nothing.
    e = Endpoints([A, B, C], first=0.1, cap=5.0)
    e.failed()  # A: no answer
    assert e.current == B
    answered = []
    for _ in range(4):
        e.failed("none is elected yet; retry later", answered=True)
        answered.append(e.current)
    assert answered == [C, B, C, B]
    e.failed(f"the leader is {A}", answered=True)  # named: tried again
    assert e.current == A
    silent = Endpoints([A, B, C], first=0.1, cap=5.0)
    assert tries(silent, 4) == [B, C, A, B]  # every one silent: in order, as before
    silent.succeeded()
    assert set(silent.silent) == {A, C}  # B answered; the others did not


def test_an_endpoint_that_went_silent_stays_passed_over_after_a_success_elsewhere() -> None:
    # The leader A was paused; the client attached at B, the new leader, which was deposed in turn and sent it
    # on ("none is elected yet"), as did C: the client asks B and C again, not A, which is still paused.
    e = Endpoints([A, B, C], first=0.1, cap=5.0)
    e.failed()  # A: no answer
    e.succeeded()  # attached at B
    assert set(e.silent) == {A}
    e.failed("none is elected yet; retry later", answered=True)
    assert e.current == C
    e.failed("none is elected yet; retry later", answered=True)
    assert e.current == B
    e.failed(f"the leader is {A}", answered=True)  # A resumed and was elected: named, tried again
    assert e.current == A
    e.succeeded()
    assert not e.silent


def test_when_every_other_endpoint_went_silent_the_one_silent_longest_is_tried_first() -> None:
    # C went silent long ago (and has come back, unasked since); the client attached at B, then B was paused:
    # A answers "none is elected yet", and the client asks C, not B, which has just gone silent.
    e = Endpoints([A, B, C], first=0.1, cap=5.0)
    e.failed()  # A: no answer
    e.failed()  # B: no answer
    assert e.current == C
    e.failed("none is elected yet; retry later", answered=True)  # C answered: the others are silent
    assert e.current == A  # A's silence is older than B's
    e.failed(f"the leader is {B}", answered=True)
    e.succeeded()  # attached at B
    e.failed()  # C named nothing since; B went silent (paused)
    assert set(e.silent) == {B} and e.current == C
    e.failed()  # C: no answer either
    e.failed("none is elected yet; retry later", answered=True)  # A
    assert e.current == B  # B's silence is older than C's


def test_a_refusing_endpoint_does_not_hide_the_silent_ones_for_good() -> None:
    # A and C failed without an answer; B refuses again and again: the rotation still goes on to the others.
    e = Endpoints([A, B, C], first=0.1, cap=5.0)
    e.failed()  # A silent
    e.failed()  # B silent
    e.failed()  # C silent: every one has failed without an answer
    assert e.current == A
    e.failed()
    assert e.current == B
    e.failed("too many clients; retry later")  # B refused: C next, silent or not
    assert e.current == C
    e.failed()  # C: no answer again
    assert e.current == B  # B answered (a refusal): before the silent ones
    e.failed("too many clients; retry later", answered=True)
    assert e.current == A  # the silent ones still come round, the longest silent first


def test_a_connect_waits_short_first_and_longer_each_round_nothing_answered() -> None:
    # a lost SYN costs the first try FIRST_CONNECT_TIMEOUT_MS, not 0.5 s; a path slower than that still connects
    e = Endpoints([A, B], first=0.1, cap=5.0)
    waits = [e.connect_timeout_ms]
    for _ in range(6):
        e.failed()
        waits.append(e.connect_timeout_ms)
    assert waits == [200, 200, 400, 400, CONNECT_TIMEOUT_MS, CONNECT_TIMEOUT_MS, CONNECT_TIMEOUT_MS]
    assert FIRST_CONNECT_TIMEOUT_MS == 200 < CONNECT_TIMEOUT_MS == 500
    e.failed("none is elected yet; retry later", answered=True)  # an answer: short again
    assert e.connect_timeout_ms == FIRST_CONNECT_TIMEOUT_MS


def test_unanswered_counts_failures_without_an_answer_in_a_row_until_it_answers() -> None:
    e = Endpoints(["tcp://a:1", "tcp://b:1"], first=0.05, cap=1.0)
    assert e.unanswered("tcp://a:1") == 0
    e.failed()  # a: silent
    assert e.current == "tcp://b:1" and e.unanswered("tcp://a:1") == 1
    e.failed("the leader is tcp://a:1", answered=True)  # b answers, naming a
    assert e.current == "tcp://a:1" and e.unanswered("tcp://b:1") == 0
    e.failed()  # a silent again
    assert e.unanswered("tcp://a:1") == 2
    e.failed("the leader is tcp://a:1", answered=True)
    e.succeeded()  # a answered at last
    assert e.unanswered("tcp://a:1") == 0
