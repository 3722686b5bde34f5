"""Where a Subscriber's replay link stands (connecting, ready, retrying, failed), as one table.

Rules
=====

1. Every change of the link's state is listed in TRANSITIONS, in the table form of `gateway.machine` (the
   input is the event, and each transition's guard names the input that takes it); nothing else sets it. The
   IO (gateway.client.replay_link) observes its connections and feeds an input; the table says the next
   state. An input no transition of the state takes leaves it where it is.
2. Sans-IO: no sockets, no clocks. The link acts on the state it is in (requests only while not RETRYING or
   FAILED; a reconnect only when RETRYING and its backoff is over).

Theory of operation
===================

CONNECTING
    A connection to the current sidecar is handshaking (or about to be made). Its answer: READY. A request
    that went unanswered there past the reconciler's first-answer deadline is ``LOST`` as in READY (with
    several sidecars): silence is silence whether or not the handshake is over.
READY
    The sidecar answered; requests go out as the reconciler makes them. A heartbeat of a newer epoch naming
    another sidecar (``LEADER``, gateway.client.leader_sidecar) moves the link to that leader's sidecar: its
    connections are closed, the reconciler is told ``ReplayLost`` then ``ReplayRestored`` at once (no backoff:
    nothing failed) and the new connection handshakes: CONNECTING. In CONNECTING the same move leaves the state
    as it is, and in RETRYING the next try goes to the leader's sidecar, at once. A request that the leader's
    sidecar answered short (``SHORT``: it has not committed that far yet, gateway.client.leader_sidecar) leaves
    the link READY where it is: the reconciler asks again there after its backoff. A short answer from any
    other sidecar, or no progress by a deadline (silence), is ``LOST``.
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

from gateway import machine


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
    LEADER = "a newer epoch's leader names another sidecar: the link moves there"
    SHORT = "the leader's sidecar answered a request short: it is asked again there"


CONNECTING, READY, RETRYING, FAILED = LinkState
ANSWERED, LOST, RETRY, REFUSED, LEADER, SHORT = LinkInput


def step(state: LinkState, given: LinkInput) -> LinkState:
    """The state after `given` (the same state when no transition of the state's row takes it)."""
    return machine.settle(given, TRANSITIONS, state, given, given)


# --- guards: which input came -------------------------------------------------------------------------


def _answered(given: LinkInput) -> bool:
    return given is ANSWERED


def _lost(given: LinkInput) -> bool:
    return given is LOST


def _retry(given: LinkInput) -> bool:
    return given is RETRY


def _refused(given: LinkInput) -> bool:
    return given is REFUSED


def _leader(given: LinkInput) -> bool:
    return given is LEADER


Go = machine.Go[LinkInput, LinkState]
Row = machine.Row[LinkInput, LinkState]

TRANSITIONS: dict[LinkState, Row] = {
    CONNECTING: Row(
        on={ANSWERED: None, LOST: None, REFUSED: None, LEADER: None},
        go=(Go(_answered, READY), Go(_lost, RETRYING), Go(_refused, FAILED)),
    ),
    READY: Row(
        on={LOST: None, REFUSED: None, LEADER: None, SHORT: None},
        go=(Go(_lost, RETRYING), Go(_refused, FAILED), Go(_leader, CONNECTING)),
    ),
    RETRYING: Row(
        on={LOST: None, RETRY: None, REFUSED: None, LEADER: None},
        go=(Go(_retry, CONNECTING), Go(_refused, FAILED)),
    ),
    FAILED: Row(on={}),
}


def describe_transitions() -> str:
    """TRANSITIONS as Markdown (docs/client.md embeds this text; a test keeps them equal)."""
    return machine.describe(TRANSITIONS, tuple(LinkInput))
