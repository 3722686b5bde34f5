"""`gateway.cli.heap.settle`: what a started server holds leaves the collector's walk; what comes after does not."""

from __future__ import annotations

import gc

from gateway.cli import heap


def test_settle_freezes_what_lives_and_later_cycles_are_still_collected() -> None:
    class Node:
        def __init__(self) -> None:
            self.peer: Node | None = None

    try:
        heap.settle()
        assert gc.get_freeze_count() > 0
        a, b = Node(), Node()
        a.peer, b.peer = b, a  # a cycle made after settling
        del a, b
        assert gc.collect() >= 2  # found and freed: freezing did not stop collection
    finally:
        gc.unfreeze()  # this test process is not a server: give its objects back to the collector
