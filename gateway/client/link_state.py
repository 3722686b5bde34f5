"""Where a Subscriber's replay link stands (connecting, ready, retrying, failed), as one table.

Rules
=====

1. Every change of the link's state is listed in TRANSITIONS, per state and per input; nothing else sets
   it. The IO (gateway.client.replay_link) observes its connections and feeds an input; the table says the
   next state. An input a state does not list leaves it where it is.
2. Sans-IO: no sockets, no clocks. The link acts on the state it is in (requests only while not RETRYING or
   FAILED; a reconnect only when RETRYING and its backoff is over).

Theory of operation
===================

CONNECTING
    A connection to the current sidecar is handshaking (or about to be made). Its answer: READY.
READY
    The sidecar answered; requests go out as the reconciler makes them.
RETRYING
    The sidecar in use failed (no answer by the handshake deadline, a connection that ended, a refusal that
    retrying may cure): every connection is closed, the reconciler is told ``ReplayLost`` and the next sidecar
    is tried after a backoff (``RETRY``: CONNECTING, and the reconciler re-issues what it still needs).
FAILED
    A refusal retrying cannot cure (unknown stream, keys refused; with several sidecars, once each has
    refused since the last success). Final: the application gets the error from ``next()``.

Every state is reported to ``on_replay_state`` by its value ("connecting", "ready", "retrying", "failed").
"""

from __future__ import annotations

from enum import Enum, StrEnum


class LinkState(StrEnum):
    CONNECTING = "connecting"
    READY = "ready"
    RETRYING = "retrying"
    FAILED = "failed"


class LinkInput(Enum):
    ANSWERED = "the sidecar completed a handshake or answered"
    LOST = "a connection failed, timed out or was refused for now"
    RETRY = "the backoff is over: a new connection is made"
    REFUSED = "a refusal that retrying cannot cure"


CONNECTING, READY, RETRYING, FAILED = LinkState
ANSWERED, LOST, RETRY, REFUSED = LinkInput

TRANSITIONS: dict[LinkState, dict[LinkInput, LinkState]] = {
    CONNECTING: {ANSWERED: READY, LOST: RETRYING, REFUSED: FAILED},
    READY: {LOST: RETRYING, REFUSED: FAILED},
    RETRYING: {LOST: RETRYING, RETRY: CONNECTING, REFUSED: FAILED},
    FAILED: {},
}


def step(state: LinkState, given: LinkInput) -> LinkState:
    """The state after `given` (the same state when the table lists nothing for it)."""
    return TRANSITIONS[state].get(given, state)


def describe_transitions() -> str:
    """TRANSITIONS as a Markdown table (docs/client.md embeds this text; a test keeps them equal)."""
    lines = ["| state | " + " | ".join(i.name for i in LinkInput) + " |", "|---" * (len(LinkInput) + 1) + "|"]
    for state, row in TRANSITIONS.items():
        cells = [row[i].name if i in row else "—" for i in LinkInput]
        lines.append(f"| {state.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
