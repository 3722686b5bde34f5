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
transition is in TRANSITIONS, in the table form of `gateway.machine` (EXTEND is one kind, every other command
another); `describe_transitions()` renders it for docs/protocol.md, and a test keeps the two equal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import Enum
from typing import NamedTuple, TypeVar

from gateway import machine
from gateway.wire import protocol as P
from gateway.wire.reasons import before_attach


class Phase(Enum):
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
    return Answer(P.Invalid(before_attach(cmd.NAME)), False)


class Handshake:
    """One session's handshake: its phase and the features granted. Its table is TRANSITIONS."""

    def __init__(self, grants: Callable[[frozenset[str]], frozenset[str]]) -> None:
        """`grants`: what the server grants of the features a client wants (a feature may need another)."""
        self.grants = grants
        self.phase = Phase.ATTACHED
        self.features: frozenset[str] = frozenset()
        self._answer: Outcome = PASS

    def on(self, cmd: P.Command) -> Outcome:
        """One command from the client: the handshake's answer, or PASS (the server's rules take it)."""
        self._answer = PASS
        kind = P.Extend if isinstance(cmd, P.Extend) else P.Command
        self.phase = machine.settle(self, TRANSITIONS, self.phase, cmd, kind)
        return self._answer

    # --- handlers, in TRANSITIONS ------------------------------------------------------------------------

    def _extend(self, cmd: P.Extend) -> None:
        self.features = self.grants(frozenset(cmd.features))
        self._answer = Answer(P.ExtendOk(tuple(sorted(self.features))), True)

    def _refuse_extend(self, cmd: P.Extend) -> None:
        self._answer = Answer(P.Invalid("EXTEND is allowed once, as the first command after ATTACH-OK"), False)


Go = machine.Go[Handshake, Phase]
Row = machine.Row[Handshake, Phase]
EVENT_KINDS = (P.Extend, P.Command)  # EXTEND, and every other command alike

TRANSITIONS: dict[Phase, Row] = {
    Phase.ATTACHED: Row(on={P.Extend: Handshake._extend, P.Command: None}, go=(Go(machine.always, Phase.NEGOTIATED),)),
    Phase.NEGOTIATED: Row(on={P.Extend: Handshake._refuse_extend, P.Command: None}),
}


M = TypeVar("M")
S = TypeVar("S", bound=Enum)


class CommandKinds:
    """The command kinds a server's table names (`events`); every other command is of kind P.Command."""

    def __init__(self, *named: type[P.Command]) -> None:
        self.events: tuple[type[P.Command], ...] = (*named, P.Command)
        self._named = frozenset(named)

    def of(self, cmd: P.Command) -> type[P.Command]:
        kind = type(cmd)
        return kind if kind in self._named else P.Command

    def describe(self, table: Mapping[S, machine.Row[M, S]]) -> str:
        """`table` as Markdown, each kind by its command's name."""
        names = {kind: kind.NAME for kind in self._named}
        return machine.describe(table, self.events, {**names, P.Command: "any other"})


def describe_transitions() -> str:
    """TRANSITIONS as Markdown (docs/protocol.md embeds this text; a test keeps them equal)."""
    return machine.describe(TRANSITIONS, EVENT_KINDS, {P.Extend: "EXTEND", P.Command: "any other command"})
