"""The check before each campaign: a node stands for leader only while its sidecar answers a replay session's
opening."""

from __future__ import annotations

import logging

import pytest

from gateway.errors import ReplayError
from gateway.replication.sidecar_check import SidecarCheck

NO_ANSWER = "ATTACH to stream 's' at tcp://10.0.0.4:5580: no answer within 0.5 s; is `zeps replay` running there?"


class Sidecar:
    """What the check's replay client finds: a sidecar that opens the session at the second look (`up`), or none
    (the opening's deadline); the deadlines asked and the clients closed."""

    def __init__(self) -> None:
        self.up = False
        self.asked: list[float] = []
        self.closed = 0
        self.ready = False
        self._looks = 0

    def open(self, timeout_s: float) -> Sidecar:
        self.asked.append(timeout_s)
        self.ready, self._looks = False, 0
        return self

    def recv(self, timeout: float | None = None) -> None:
        if not self.up:
            raise ReplayError(NO_ANSWER)
        self._looks += 1
        self.ready = self._looks >= 2

    def close(self) -> None:
        self.closed += 1


def test_a_node_stands_only_while_its_sidecar_answers_and_says_so_once_per_episode(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sidecar = Sidecar()
    check = SidecarCheck("tcp://10.0.0.4:5580", sidecar.open, timeout_s=0.5)
    with caplog.at_level(logging.INFO, "gateway.replication.sidecar_check"):
        assert not check()
        assert not check()
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 1, said  # said once, not at every campaign
        assert "not standing for leader" in said[0] and "sidecar at tcp://10.0.0.4:5580" in said[0]
        assert NO_ANSWER in said[0] and "zeps replay --journal JOURNAL --bind tcp://10.0.0.4:5580" in said[0]
        sidecar.up = True
        assert check() and check()
        assert len(caplog.records) == 2 and "answers: standing for leader again" in caplog.records[1].getMessage()
    assert sidecar.asked == [0.5] * 4 and sidecar.closed == 4  # one client per check, each closed
