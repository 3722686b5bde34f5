"""`ConnectRetry`: a connect with no answer is made again after 0.2 s, then after twice as long, up to the
kernel's own 1 s; one that ends by itself starts the next afresh. `ConnectWaits`: that doubling alone, which the
clients' endpoint rotation uses too (tests/unit/test_endpoints.py)."""

from __future__ import annotations

import pytest

from gateway.transport.connect_retry import FIRST_S, MAX_S, ConnectRetry, ConnectWaits


def test_a_connect_without_an_answer_is_given_up_at_its_deadline_and_the_wait_doubles_up_to_the_kernels() -> None:
    r = ConnectRetry()
    r.started(10.0)
    assert not r.expired(10.0 + FIRST_S - 0.01)
    assert r.expired(10.0 + FIRST_S)
    assert not r.expired(11.0)  # given up: nothing under way until the owner connects again
    waits = []
    for _ in range(5):
        r.started(20.0)
        waits.append(r.until - 20.0 if r.until is not None else None)
        assert r.expired(30.0)
    # a path whose round trip is longer still connects, after a few tries
    assert waits == pytest.approx([2 * FIRST_S, 4 * FIRST_S, MAX_S, MAX_S, MAX_S])


def test_a_connect_that_ends_by_itself_is_not_given_up_and_the_next_waits_first_s_again() -> None:
    r = ConnectRetry()
    r.started(0.0)
    assert r.expired(1.0)  # the wait doubled
    r.started(1.0)
    r.ended()  # connected (or refused: the network answered)
    assert not r.expired(100.0)
    r.started(100.0)
    assert r.until == pytest.approx(100.0 + FIRST_S)


def test_the_waits_double_from_first_to_max_for_each_connect_in_a_row_without_an_answer() -> None:
    assert [ConnectWaits().after(n) for n in range(5)] == pytest.approx([FIRST_S, 0.4, 0.8, MAX_S, MAX_S])
    clients = ConnectWaits(0.2, 0.5)
    assert [clients.after(n) for n in (0, 1, 2, 10**6)] == pytest.approx([0.2, 0.4, 0.5, 0.5])


def test_a_connect_retry_with_other_waits_follows_them() -> None:
    r = ConnectRetry(ConnectWaits(0.1, 0.3))
    for expected in (0.1, 0.2, 0.3, 0.3):
        r.started(0.0)
        assert r.until == pytest.approx(expected)
        assert r.expired(1.0)


@pytest.mark.parametrize(("first", "most"), [(0.0, 1.0), (0.5, 0.2)])
def test_deadlines_that_cannot_work_are_refused(first: float, most: float) -> None:
    with pytest.raises(ValueError, match="first_s"):
        ConnectWaits(first, most)
