"""A follower's connection to its leader's sidecar, its opening raced (gateway.replication.sidecar_race): a second
connection after 0.2 s, the first to open wins, failures counted only once every connection failed."""

from __future__ import annotations

import pytest

from gateway.errors import ReplayError, ReplayRefused
from gateway.replication.sidecar_race import RacedReplay
from gateway.wire import protocol as P


class Client:
    """A replay client whose opening the test ends (`open`) or fails (`fail`); what was asked of it."""

    def __init__(self, number: int) -> None:
        self.sock = f"sock-{number}"  # what the loop's poller is given
        self.ready = False
        self.asked: list[tuple[int, int]] = []
        self.failure: ReplayError | None = None
        self.closed = False
        self.events: list[P.FetchEnd] = []

    def subscribe(self, pattern: str = "", latest: int = 0) -> None:
        self.asked.append((0, latest))

    def fetch(self, first: int, last: int = 0, pattern: str = "") -> int:
        self.asked.append((first, last))
        return len(self.asked)  # numbered from 1 on each client

    def recv(self, timeout: float | None = None) -> P.FetchEnd | None:
        if self.failure is not None:
            raise self.failure
        return self.events.pop(0) if self.events else None

    def close(self) -> None:
        self.closed = True


class Race:
    """A RacedReplay on a clock the test moves, its clients and the loop's poller."""

    def __init__(self, window_s: float = 0.5) -> None:
        self.now = 100.0
        self.clients: list[Client] = []
        self.polled: dict[object, int] = {}
        self.raced = RacedReplay(self._open, self.now, window_s, self.polled.__setitem__, self.polled.pop,
                                 clock=lambda: self.now)  # fmt: skip

    def _open(self) -> Client:
        self.clients.append(Client(len(self.clients) + 1))
        return self.clients[-1]

    def at(self, now: float) -> object:
        self.now = 100.0 + now
        return self.raced.recv(0)


def test_a_second_connection_races_after_the_first_waits_and_the_first_to_open_wins() -> None:
    race = Race()
    assert race.raced.fetch(5, 9) == 1
    assert race.at(0.19) is None and len(race.clients) == 1  # within its wait: no second connection
    assert race.at(0.2) is None and len(race.clients) == 2  # unanswered for 0.2 s: another, asked the same
    first, second = race.clients
    assert second.asked == first.asked == [(5, 9)] and set(race.polled) == {"sock-1", "sock-2"}
    race.raced.subscribe("", 9)  # asked on every connection still racing
    assert first.asked == second.asked == [(5, 9), (0, 9)]
    assert race.at(0.3) is None and len(race.clients) == 2  # the next wait is 0.4 s
    second.ready = True
    assert race.at(0.31) is None and race.raced.ready
    assert first.closed and not second.closed and set(race.polled) == {"sock-2"}  # the loser out of the poller
    second.events.append(P.FetchEnd(1, 5, 9))
    assert race.at(0.32) == P.FetchEnd(1, 5, 9)
    race.raced.close()
    assert second.closed and not race.polled


def test_an_answer_before_ready_wins_too_and_no_connection_opens_after_the_window() -> None:
    race = Race(window_s=0.5)
    race.raced.fetch(1, 1)
    race.at(0.2)
    race.at(0.6)  # 0.4 s after the second, but past the first one's deadline: no third
    assert len(race.clients) == 2
    race.clients[0].events.append(P.FetchEnd(1, 1, 1))  # the first answered after all (TCP retransmitted)
    assert race.at(0.61) == P.FetchEnd(1, 1, 1)
    assert race.clients[1].closed and not race.clients[0].closed


def test_the_race_fails_once_every_connection_failed_and_at_once_on_a_refusal() -> None:
    race = Race()
    race.at(0.2)
    first, second = race.clients
    first.failure = ReplayError("ATTACH: no answer within 0.5 s")
    assert race.at(0.5) is None and first.closed and set(race.polled) == {"sock-2"}  # the other one still races
    second.failure = ReplayError("ATTACH: no answer within 0.5 s")
    with pytest.raises(ReplayError, match="no answer"):
        race.at(0.7)
    assert second.closed and not race.polled

    race = Race()
    race.clients[0].failure = ReplayRefused("unknown stream")
    with pytest.raises(ReplayRefused):
        race.at(0.01)
