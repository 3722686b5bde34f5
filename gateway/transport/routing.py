"""A reply on a ROUTER socket with ZMQ_ROUTER_MANDATORY, never blocking: sent, or why it could not go.

With ROUTER_MANDATORY a reply to a peer that left raises EHOSTUNREACH instead of vanishing, and one to a peer
whose queue is full raises EAGAIN (NOBLOCK) before any part is queued: the caller decides what each costs
(the gateway and the replay sidecar count both; a leader's peer link says the same again later).
"""

from __future__ import annotations

from typing import Literal

import zmq

Outcome = Literal["sent", "unread", "gone"]


def route(sock: zmq.Socket, identity: bytes, frame: bytes) -> Outcome:
    """Send `frame` to `identity`: "sent"; "unread" when its queue is full (it reads nothing); "gone"."""
    try:
        sock.send_multipart((identity, frame), zmq.NOBLOCK)
    except zmq.Again:
        return "unread"
    except zmq.ZMQError as exc:
        if exc.errno != zmq.EHOSTUNREACH:
            raise
        return "gone"
    return "sent"
