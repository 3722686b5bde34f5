"""The opening of every ZEPS client session, ATTACH then EXTEND: one machine for the Publisher and the ReplayClient.

Rules
=====

1. Sans-IO: `start(now)` returns the ATTACH to send; the caller feeds every command the server sends while the
   session opens to `handle(cmd, now)` and does what comes back (`Reply`: send it). No sockets, no clocks.
2. Every state change is in TRANSITIONS (end of module), in the table form of `gateway.machine`;
   docs/client-sessions.md embeds `describe_transitions()` and a test keeps them equal.
3. The opening ends OPEN (with the features granted) or REFUSED (with the server's reason); which refusals
   are final, and what follows, is the caller's business (a Publisher tries its next endpoint, a ReplayClient
   raises). A deadline passed is the caller's to see with `expired(now)`; the machine only keeps it.
4. A command that is no answer to ATTACH or EXTEND (PING, an answer of an earlier session) changes nothing:
   `handle` returns None and `consumed` is False, so the caller can treat it as its own.

Theory of operation
===================

ATTACHING
    ATTACH is out. ATTACH-OK: EXTEND (the features wanted) goes out, EXTENDING; with none wanted, OPEN at once.
    INVALID is the server's refusal (unknown stream, protocol version): REFUSED.
EXTENDING
    EXTEND-OK: OPEN with the features it grants. INVALID: a plain ZEPS server that knows no extension, OPEN with
    none; except a refusal that sends the client elsewhere ("retry later", "not the leader"), which answers an
    earlier session's request sent down the same connection, not EXTEND: it is passed over; and "... before
    ATTACH": the server ended the session after ATTACH-OK (a leader stepping down ends every session), REFUSED
    with that reason, which its caller takes for a drop (attach again), never for a server without extensions.
OPEN, REFUSED
    Ended: every command is the caller's.

Deadlines: ATTACHING waits `attach_s` from start(); EXTENDING waits `extend_s` from ATTACH-OK (None: the attach
deadline covers both steps).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gateway import machine
from gateway.wire import protocol as P
from gateway.wire.reasons import names_not_leading, retries_later, session_lost


class Step(enum.Enum):
    ATTACHING = "attaching"
    EXTENDING = "extending"
    OPEN = "open"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class Reply:
    """Send this command to the server."""

    command: P.Command


def sends_elsewhere(reason: str) -> bool:
    """An INVALID that sends a client to another node (or back later) rather than refusing it: "retry later" (a
    follower's refusal, which may name the leader's endpoint, says it too), or a promotion asked of a node that no
    longer leads (gateway.wire.reasons)."""
    return retries_later(reason) or names_not_leading(reason)


def attach_failed(stream: str, endpoint: str, why: str) -> str:
    """The one text every client gives for an ATTACH that did not succeed."""
    return f"ATTACH to stream {stream!r} at {endpoint}: {why}"


class Opening:
    """ATTACH -> EXTEND of one connection (the module docstring). Its table is TRANSITIONS."""

    def __init__(self, stream: str, wanted: tuple[str, ...], *, attach_s: float, extend_s: float | None) -> None:
        self.stream = stream
        self.wanted = wanted
        self.step = Step.ATTACHING
        self.features: frozenset[str] = frozenset()  # granted, once OPEN
        self.reason = ""  # the refusal, once REFUSED
        self.deadline = 0.0
        self.consumed = False  # the last command fed was part of the opening
        self._attach_s, self._extend_s = attach_s, extend_s
        self._now = 0.0
        self._reply: Reply | None = None
        self._answer: P.Command | None = None

    def start(self, now: float) -> P.Attach:
        self.deadline = now + self._attach_s
        return P.Attach(P.PROTOCOL, P.VERSION, self.stream)

    @property
    def over(self) -> bool:
        return self.step in (Step.OPEN, Step.REFUSED)

    def expired(self, now: float) -> bool:
        return not self.over and now >= self.deadline

    def waiting_for(self) -> str:
        return "ATTACH-OK" if self.step is Step.ATTACHING else "EXTEND-OK"

    def handle(self, cmd: P.Command, now: float) -> Reply | None:
        """Feed one command from the server; a reply to send, if any (`step`, `consumed` say the rest)."""
        self._now, self._reply, self._answer, before = now, None, cmd, self.step
        self.step = machine.settle(self, TRANSITIONS, self.step, cmd)
        self.consumed = self.step is not before
        return self._reply

    # --- guards ---------------------------------------------------------------------------------------

    def _attached(self) -> bool:
        return isinstance(self._answer, P.AttachOk)

    def _attached_wanting_extensions(self) -> bool:
        return self._attached() and bool(self.wanted)

    def _granted(self) -> bool:
        return isinstance(self._answer, P.ExtendOk)

    def _refused(self) -> bool:
        return isinstance(self._answer, P.Invalid)

    def _extensions_unknown(self) -> bool:
        """An INVALID to EXTEND from a server that does not know it (the session stays, without extensions)."""
        answer = self._answer
        return isinstance(answer, P.Invalid) and not sends_elsewhere(answer.reason) and not session_lost(answer.reason)

    def _session_ended(self) -> bool:
        """The server ended the session between ATTACH-OK and EXTEND: not a server without extensions (taken for
        one, a Publisher that asked for confirms failed for good when a leader stepped down at that moment)."""
        return isinstance(self._answer, P.Invalid) and session_lost(self._answer.reason)

    # --- actions --------------------------------------------------------------------------------------

    def _send_extend(self) -> None:
        self._reply = Reply(P.Extend(self.wanted))
        if self._extend_s is not None:
            self.deadline = self._now + self._extend_s

    def _take_features(self) -> None:
        assert isinstance(self._answer, P.ExtendOk)
        self.features = frozenset(self._answer.features)

    def _take_reason(self) -> None:
        assert isinstance(self._answer, P.Invalid)
        self.reason = self._answer.reason


Go = machine.Go[Opening, Step]
Row = machine.Row[Opening, Step]
M = Opening
_ANSWERS: dict[type, None] = {P.AttachOk: None, P.ExtendOk: None, P.Invalid: None}

TRANSITIONS: dict[Step, Row] = {
    Step.ATTACHING: Row(
        on=_ANSWERS,
        go=(
            Go(M._attached_wanting_extensions, Step.EXTENDING, M._send_extend),
            Go(M._attached, Step.OPEN),
            Go(M._refused, Step.REFUSED, M._take_reason),
        ),
    ),
    Step.EXTENDING: Row(
        on=_ANSWERS,
        go=(
            Go(M._granted, Step.OPEN, M._take_features),
            Go(M._session_ended, Step.REFUSED, M._take_reason),
            Go(M._extensions_unknown, Step.OPEN),
        ),
    ),
    Step.OPEN: Row(on={}),
    Step.REFUSED: Row(on={}),
}
del M

EVENT_KINDS = (P.AttachOk, P.ExtendOk, P.Invalid)


def describe_transitions() -> str:
    """TRANSITIONS as Markdown (docs/client-sessions.md embeds it; a test keeps them equal)."""
    return machine.describe(TRANSITIONS, EVENT_KINDS)
