"""The server side of the ZEPS session handshake, sans-IO: ATTACH, then EXTEND once (docs/protocol.md).

Both servers (the gateway's ingest, gateway.sequencer; the replay sidecar, gateway.replay) keep these rules
with this one machine, so a client meets one handshake with one set of answers wherever it attaches.

Rules
=====

1. A connection without a session (DETACHED) is answered here: PING with PING-OK (a client may probe before it
   attaches), ATTACH by the server (`attach_refusal` first: a version this server does not speak is refused
   naming the one it speaks), anything else with INVALID naming ATTACH.
2. An accepted ATTACH makes a new `Handshake` in ATTACHED: nothing granted. A second ATTACH is the server's
   (it starts over, perhaps on another stream), and makes a new one.
3. In ATTACHED, EXTEND may come once, as the first command after ATTACH-OK: it grants the features named that
   the server grants (its `grants` policy), answered with EXTEND-OK (possibly empty). Any other command ends the
   negotiation as well. Either way the handshake is then NEGOTIATED, where EXTEND is refused.
4. Every command but EXTEND is passed to the server's own rules (`Pass`); the handshake answers only EXTEND.
5. Nothing here does I/O or reads a clock.

Theory of operation
===================

A server keeps one `Handshake` per session and calls `on(cmd)` for every command from an attached client:
the answer is either a reply to send (`Answer`) or `PASS`, and the server's rules take the command. Every
transition is in TRANSITIONS (state -> command kind -> handler, next state); `describe_transitions()` renders
it for docs/protocol.md, and a test keeps the two equal.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import NamedTuple

from gateway.wire import protocol as P


class Phase(enum.Enum):
    ATTACHED = "attached"  # ATTACH-OK sent: EXTEND may come, once, first
    NEGOTIATED = "negotiated"  # extended, or another command came first: the features are fixed


class Answer(NamedTuple):
    """The handshake answers the command itself: send `reply`; `accepted` is False for an INVALID."""

    reply: P.Command
    accepted: bool


PASS = None  # the command is the server's to handle
Outcome = Answer | None


def attach_refusal(version: int) -> str | None:
    """Why an ATTACH of `version` is refused by this server, or None (the server's own checks come next)."""
    if version != P.VERSION:
        return f"ZEPS version {version} is not served; this server speaks {P.VERSION}"
    return None


def detached(cmd: P.Command) -> Answer:
    """The answer to a command other than ATTACH from a client without a session (rule 1)."""
    if isinstance(cmd, P.Ping):
        return Answer(P.PingOk(), True)
    reason = (
        f"{cmd.NAME} before ATTACH: send ATTACH with a stream name first (a session ends when the server "
        "restarts or closes the connection, e.g. for a frame over its size limit)"
    )
    return Answer(P.Invalid(reason), False)


class Handshake:
    """One session's handshake: its phase and the features granted."""

    def __init__(self, grants: Callable[[frozenset[str]], frozenset[str]]) -> None:
        """`grants`: what the server grants of the features a client wants (a feature may need another)."""
        self.grants = grants
        self.phase = Phase.ATTACHED
        self.features: frozenset[str] = frozenset()

    def on(self, cmd: P.Command) -> Outcome:
        """One command from the client: the handshake's answer, or PASS (the server's rules take it)."""
        kind = P.Extend if isinstance(cmd, P.Extend) else P.Command
        handler, self.phase = TRANSITIONS[self.phase][kind]
        return handler(self, cmd)

    # --- handlers, in TRANSITIONS ------------------------------------------------------------------------

    def _extend(self, cmd: P.Command) -> Outcome:
        assert isinstance(cmd, P.Extend)
        self.features = self.grants(frozenset(cmd.features))
        return Answer(P.ExtendOk(tuple(sorted(self.features))), True)

    def _refuse_extend(self, cmd: P.Command) -> Outcome:
        return Answer(P.Invalid("EXTEND is allowed once, as the first command after ATTACH-OK"), False)

    def _pass(self, cmd: P.Command) -> Outcome:
        return PASS


Handler = Callable[[Handshake, P.Command], Outcome]

#: state -> command kind (EXTEND, or any other command) -> (handler, next state)
TRANSITIONS: Mapping[Phase, Mapping[type, tuple[Handler, Phase]]] = {
    Phase.ATTACHED: {
        P.Extend: (Handshake._extend, Phase.NEGOTIATED),
        P.Command: (Handshake._pass, Phase.NEGOTIATED),
    },
    Phase.NEGOTIATED: {
        P.Extend: (Handshake._refuse_extend, Phase.NEGOTIATED),
        P.Command: (Handshake._pass, Phase.NEGOTIATED),
    },
}


def describe_transitions() -> str:
    """TRANSITIONS as a Markdown table (docs/protocol.md embeds this text; a test keeps them equal)."""
    kinds = {P.Extend: "EXTEND", P.Command: "any other command"}
    lines = ["| state | command | handler | next state |", "|---|---|---|---|"]
    for phase, row in TRANSITIONS.items():
        for i, (kind, (handler, target)) in enumerate(row.items()):
            name = handler.__name__.lstrip("_")
            lines.append(f"| {phase.name if i == 0 else ''} | {kinds[kind]} | `{name}` | {target.name} |")
    return "\n".join(lines) + "\n"
