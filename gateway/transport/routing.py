"""A ROUTER socket's messages, never blocking: the next one received (`take`), and a reply with
ZMQ_ROUTER_MANDATORY (`route`): sent, or why it could not go.

Both pass pyzmq plain int flags, part by part: recv_multipart and send_multipart combine pyzmq's enum flags on
every call, which costs more than the message itself (measured: about 40% of a receive, 75% of a send), and a
gateway with many small publishers (issue #32) receives a command and sends a confirm per record.

With ROUTER_MANDATORY a reply to a peer that left raises EHOSTUNREACH instead of vanishing, and one to a peer
whose queue is full raises EAGAIN (NOBLOCK) before any part is queued: the caller decides what each costs
(the gateway and the replay sidecar count both; a leader's peer link says the same again later).
"""

from __future__ import annotations

from typing import Literal

import zmq

Outcome = Literal["sent", "unread", "gone"]
_FIRST = int(zmq.NOBLOCK | zmq.SNDMORE)
_LAST = _NOBLOCK = int(zmq.NOBLOCK)
_RCVMORE = int(zmq.RCVMORE)


def take(sock: zmq.Socket) -> list[bytes] | None:
    """The next message's frames (the sender's identity first), or None when none is queued."""
    try:
        identity = sock.recv(_NOBLOCK)
    except zmq.Again:
        return None
    # A ROUTER puts the identity in front of a message of at least one part, so one part always follows it; the
    # parts of a message arrive together: these never wait. (Each get() builds a pyzmq enum: one saved a message.)
    frames = [identity, sock.recv(_NOBLOCK)]
    while sock.get(_RCVMORE):
        frames.append(sock.recv(_NOBLOCK))
    return frames


def route(sock: zmq.Socket, identity: bytes, frame: bytes) -> Outcome:
    """Send `frame` to `identity`: "sent"; "unread" when its queue is full (it reads nothing); "gone"."""
    try:
        sock.send(identity, _FIRST)  # refused here, before any part is queued; the last part then cannot be
        sock.send(frame, _LAST)
    except zmq.Again:
        return "unread"
    except zmq.ZMQError as exc:
        if exc.errno != zmq.EHOSTUNREACH:
            raise
        return "gone"
    return "sent"
