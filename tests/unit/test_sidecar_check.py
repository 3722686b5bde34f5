"""The check before each campaign: a node stands for leader only while its sidecar takes a connection."""

from __future__ import annotations

import logging

import pytest

from gateway.replication.sidecar_check import SidecarCheck


class Sidecar:
    """What the check's connect finds: a listening sidecar (`up`), or a refusal; the addresses asked."""

    def __init__(self) -> None:
        self.up = False
        self.closed = 0
        self.asked: list[tuple[tuple[str, int], float]] = []

    def connect(self, address: tuple[str, int], timeout: float) -> Sidecar:
        self.asked.append((address, timeout))
        if not self.up:
            raise ConnectionRefusedError(111, "Connection refused")
        return self  # the connection: the check closes it at once

    def close(self) -> None:
        self.closed += 1


def test_a_node_stands_only_while_its_sidecar_answers_and_says_so_once_per_episode(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sidecar = Sidecar()
    check = SidecarCheck("tcp://10.0.0.4:5580", connect=sidecar.connect)
    with caplog.at_level(logging.INFO, "gateway.replication.sidecar_check"):
        assert not check()
        assert not check()
        refused = [r.getMessage() for r in caplog.records]
        assert len(refused) == 1, refused  # said once, not at every campaign
        assert "not standing for leader" in refused[0] and "tcp://10.0.0.4:5580" in refused[0]
        assert "Connection refused" in refused[0] and "zeps replay" in refused[0]
        sidecar.up = True
        assert check() and check()
        assert len(caplog.records) == 2 and "answers" in caplog.records[1].getMessage()
    assert {address for address, _ in sidecar.asked} == {("10.0.0.4", 5580)}
    assert sidecar.closed == 2


def test_a_wildcard_endpoint_is_checked_on_this_host() -> None:
    sidecar = Sidecar()
    sidecar.up = True
    assert SidecarCheck("tcp://0.0.0.0:5580", connect=sidecar.connect)()
    assert sidecar.asked[0][0] == ("127.0.0.1", 5580)
