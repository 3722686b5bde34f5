"""What a zmq.Poller needs of a receiver that is not a ZeroMQ socket (NORM, udp://)."""

from __future__ import annotations

from collections.abc import Callable

import zmq


def again(reason: str) -> zmq.Again:
    """zmq.Again carrying `reason`: pyzmq's own constructor drops its message and says only "Resource
    temporarily unavailable", which would hide why a NORM or udp:// transport refused."""
    error = zmq.Again()
    error.strerror = reason
    return error


class PolledByFd:
    """A receiver registered in a zmq.Poller by its `fileno()`.

    The poller reports such objects by their fd: comparing equal to it lets code written for sockets
    (`if sock in dict(poller.poll())`) work unchanged.
    """

    def fileno(self) -> int:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return other is self or (isinstance(other, int) and other == self.fileno())

    def __hash__(self) -> int:
        return hash(self.fileno())


Watch = Callable[[zmq.Socket | PolledByFd, int], None]  # the gateway loop's poller: wake on these events of it
Unwatch = Callable[[zmq.Socket | PolledByFd], None]  # ... no more (before it closes)
