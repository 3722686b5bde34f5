"""The INVALID reasons a client acts on: each built by one function here and recognised by the predicate beside it.

An INVALID carries a reason string only (gateway.wire.protocol), written for a person; a client still branches on
three kinds of it. So the server builds each of those with the function here and the client tests it with the
predicate next to it, and the text cannot drift from the test (tests/unit/test_reasons.py recognises every one).
The texts are those of earlier versions, so an earlier client reads them as it did.

- `retry_later(why)` / `retries_later(reason)`: the server cannot take it now, or not here (a follower, a full
  server, a stream being promoted): the client may try again after a backoff, at another endpoint if it has one.
  The mark ends the reason, so the reason is cut in `why`, never in the mark (`protocol.invalid` cuts at the end).
- `before_attach(command)` / `session_lost(reason)`: a command of a session the server does not hold (it ended
  every session, stepping down or restarting): the client attaches again; nothing was refused.
- `not_leading(node)` / `names_not_leading(reason)`: a node asked to promote a stream no longer leads its group:
  promote at the group's leader. Quoted inside the promotion's refusal, so it is found anywhere in a reason.
"""

from __future__ import annotations

import re

from gateway.wire.protocol import MAX_STRING, RETRY_LATER, printable

_RETRY_TAIL = f"; {RETRY_LATER}"
SESSION_LOST = "before ATTACH"
_SESSION_LOST = re.compile(rf"[A-Z][A-Z-]* {SESSION_LOST}: ")
NOT_LEADING = "no longer leads the group: promote at its leader"


def retry_later(why: str) -> str:
    """`why`, marked as worth trying again later (or elsewhere), cut to fit an INVALID with the mark kept."""
    text, room = printable(why), MAX_STRING - len(_RETRY_TAIL)
    return (text if len(text) <= room else text[: room - 3] + "...") + _RETRY_TAIL


def retries_later(reason: str) -> bool:
    return reason.endswith(RETRY_LATER)


def before_attach(command: str) -> str:
    """The answer to `command` (a command's NAME) from a client that holds no session."""
    return (
        f"{command} {SESSION_LOST}: send ATTACH with a stream name first (a session ends when the server restarts "
        "or closes the connection, e.g. for a frame over its size limit)"
    )


def session_lost(reason: str) -> bool:
    return _SESSION_LOST.match(reason) is not None


def not_leading(node: str) -> str:
    """Why gateway node `node`, which led its group no longer, did not promote a stream."""
    return f"gateway node {node} {NOT_LEADING}"


def names_not_leading(reason: str) -> bool:
    return NOT_LEADING in reason
