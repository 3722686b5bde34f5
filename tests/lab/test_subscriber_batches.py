"""`Subscriber.next_batch()`: whole deliveries as views, mixed freely with `next()`, nothing lost or repeated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.feedlab import WAIT_S, deploy, expected, publish

from gateway.client.subscriber import Subscriber
from netlab.procs import MP

pytestmark = pytest.mark.lab

COUNT = 5_000


def read_mixed(multicast: list[str], replay: str, checkpoint: str, ready: Any) -> list[tuple[int, bytes]]:
    """In host sub: three records with next(), the rest of that delivery and then every other with
    next_batch(), copying each record's body out of the views."""
    got: list[tuple[int, bytes]] = []
    with Subscriber("feed", multicast=multicast, replay=replay, start="earliest", checkpoint=checkpoint) as sub:
        ready.put("up")
        for _ in range(3):
            rec = sub.next(timeout=WAIT_S)
            assert rec is not None
            got.append((rec.seq, rec.body))
        while got[-1][0] < COUNT:
            delivery = sub.next_batch(timeout=WAIT_S)
            assert delivery is not None
            assert delivery.lo == got[-1][0] + 1, (delivery.lo, got[-1][0])
            got.extend((seq, bytes(body)) for seq, _, _, body in delivery.raw())
            assert got[-1][0] == delivery.hi
    return got


def test_next_batch_continues_where_next_stopped(make_lab, tmp_path: Path) -> None:
    lab = make_lab(["pub", "gw", "sub"])
    dep = deploy(lab, tmp_path / "journal")
    try:
        ready = MP.Queue()
        checkpoint = tmp_path / "checkpoint"
        sub = lab.start("sub", read_mixed, dep.for_host("sub"), dep.replay, str(checkpoint), ready)
        ready.get(timeout=WAIT_S)
        assert lab.run("pub", publish, dep.ingest, 0, COUNT, 20_000.0, timeout=WAIT_S) == COUNT
        assert sub.result(timeout=WAIT_S) == expected(1, COUNT)
        assert int(checkpoint.read_text()) == COUNT  # the last delivery handed out counts as finished at close
    finally:
        assert not dep.close()
