"""`Endpoints`: several servers that can each do a client's job, tried in turn (sans-IO).

The servers are the nodes of a replicated gateway (whichever leads takes ingest) or several replay sidecars
(any of them serves the stream). A client uses the `current` one until it fails it, then moves on:

- in order: the first listed, then on each failure the next, wrapping around. A refusal that names another
  listed endpoint (a follower naming the leader) sends the client there next instead;
- waiting between tries with capped exponential backoff and jitter (`Backoff`) that grows once per *round*
  (every endpoint tried and failed once), not per try: a client whose server died goes on to the next one
  after the first delay, while a client cut off from them all does not knock on every door at full speed.
  A server that answers "not me, try elsewhere" (a follower while the group elects its leader) is alive:
  that answer starts the rounds again from the first delay, so the client finds the new leader within about
  that delay of its election rather than after a wait that grew during it;
- an endpoint that failed without an answer (killed, paused, cut off) is passed over while others answer:
  after the leader went silent and the followers said "none is elected yet", a publisher went back to the
  paused old leader, whose kernel takes the connection while the process answers nothing, and waited there
  for its handshake deadline while a follower was elected (a second of a SIGSTOP's silence). It is tried
  again when a server names it, or when every other endpoint has failed without an answer too, and then the
  one that failed longest ago first (the one that failed last is the likeliest still down). A success at
  another endpoint does not clear it (it says nothing of that one: a publisher attached to the new leader,
  sent on when that leader was deposed in turn, went back to the old one, still paused, and waited 0.6 s).
  `unanswered(endpoint)` counts its failures without an answer in a row, for a caller whose wait at such an
  endpoint should be short (a follower that has not yet noticed its leader's pause names it);
- a refusal (the server answered "no": unknown stream, keys refused, not the leader) is remembered per
  endpoint until a success; `all_refused` says every endpoint has refused since, which is when a refusal
  becomes final for a caller that has never succeeded. A connection that fails without an answer (nothing
  listening, killed, silent) refuses nothing: that server may come back.

`succeeded()` after a handshake ends well resets the rounds and the refusals. One endpoint behaves as the
clients did before lists: every failure is a round of its own, and its first refusal is all of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.client.backoff import Backoff
from gateway.errors import ConfigError
from gateway.transport import connect_retry
from gateway.transport.tcp_endpoint import check_tcp_endpoint

# With other endpoints to try, a TCP connect unanswered this long is given up (libzmq's CONNECT_TIMEOUT; the
# monitor's CONNECT_RETRIED makes it a failure): else a connect to a host cut off, or whose SYN or SYN-ACK was
# lost, waits on the kernel's SYN back-off (1 s, 3 s, 7 s) while another server could answer. A publisher
# cut from a healthy leader so reached it up to a second after the cut healed, and a subscriber's replay link
# waited seconds for one sidecar while the others held what it needed. A LAN connect takes a millisecond.
CONNECT_TIMEOUT_MS = 500
# ... and the first try of a round waits less, as a follower's connect to its leader does: a SYN or SYN-ACK
# lost (1-5% loss) cost a publisher 0.5 s at a healthy new leader before it moved on. Each round in which
# nothing answered doubles it, up to CONNECT_TIMEOUT_MS, so a longer path still connects.
FIRST_CONNECT_TIMEOUT_MS = round(connect_retry.FIRST_S * 1000)
CONNECT_WAITS = connect_retry.ConnectWaits(FIRST_CONNECT_TIMEOUT_MS / 1000, CONNECT_TIMEOUT_MS / 1000)


class Endpoints:
    """A rotation over endpoints with per-round backoff and per-endpoint refusals. Not thread-safe."""

    def __init__(self, endpoints: str | Sequence[str], *, first: float, cap: float) -> None:
        listed = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        if any(not isinstance(e, str) or not e for e in listed):
            raise ConfigError(f"endpoints {endpoints!r} must be non-empty strings, e.g. tcp://10.0.0.1:5570")
        for endpoint in listed:
            check_tcp_endpoint(endpoint)
        self.all = list(dict.fromkeys(listed))  # listed order, each once
        self.at = 0
        self.backoff = Backoff(first, cap)
        self.refusals: dict[str, str] = {}  # endpoint -> its latest refusal, since the last success
        # endpoints that failed without an answer since they last answered -> when (a count of such failures)
        self.silent: dict[str, int] = {}
        self._silences = 0
        self._unanswered: dict[str, int] = {}  # endpoint -> its failures without an answer in a row
        self._tried = 0  # failures in this round
        self._delay = 0.0

    @property
    def current(self) -> str | None:
        return self.all[self.at] if self.all else None

    @property
    def several(self) -> bool:
        return len(self.all) > 1

    @property
    def connect_timeout_ms(self) -> int:
        """How long the next TCP connect may go unanswered (with other endpoints to try): FIRST_CONNECT_TIMEOUT_MS,
        doubled for each whole round of failures since an endpoint last answered, up to CONNECT_TIMEOUT_MS."""
        rounds = self._tried // len(self.all) if self.all else 0
        return round(CONNECT_WAITS.after(rounds) * 1000)

    def unanswered(self, endpoint: str) -> int:
        """How many times in a row `endpoint` failed without an answer (0: it answered since, or never failed)."""
        return self._unanswered.get(endpoint, 0)

    @property
    def all_refused(self) -> bool:
        return bool(self.all) and all(e in self.refusals for e in self.all)

    def refused(self, reason: str) -> bool:
        """The current endpoint answered no: remembered until a success. True if every endpoint has now."""
        if self.current is not None:
            self.refusals[self.current] = reason
        return self.all_refused

    def failed(self, hint: str = "", *, answered: bool = False) -> float:
        """The current endpoint failed: move to the next one (to a listed endpoint that `hint`, the server's
        reason, names, if any); the delay before trying it, in seconds. `answered`: it is up and sent the
        client elsewhere (the backoff starts again)."""
        current = self.current
        if current is None:
            return self.backoff.next()
        if answered:
            self.backoff.reset()
            self._tried = 0
        if answered or hint:  # it answered (a refusal is an answer)
            self.silent.pop(current, None)
            self._unanswered.pop(current, None)
        else:
            self._silences += 1
            self.silent[current] = self._silences
            self._unanswered[current] = self._unanswered.get(current, 0) + 1
        if self._tried % len(self.all) == 0:  # a new round
            self._delay = self.backoff.next()
        self._tried += 1
        named = next((i for i, e in enumerate(self.all) if e != current and _names(hint, e)), None)
        self.at = named if named is not None else self._next_answering()
        return self._delay

    def _next_answering(self) -> int:
        """The next other endpoint in order that has not failed without an answer; if all have, the one whose
        silence is oldest (never the current one again, while there is another: a server that keeps refusing
        must not hide the others for good)."""
        n = len(self.all)
        others = [(self.at + i) % n for i in range(1, n)]
        if not others:
            return self.at
        answering = [i for i in others if self.all[i] not in self.silent]
        return answering[0] if answering else min(others, key=lambda i: self.silent[self.all[i]])

    def succeeded(self) -> None:
        """The current endpoint did the job: the rounds and the refusals start again; the endpoints that went
        silent stay passed over until they answer or are named."""
        self.backoff.reset()
        self.refusals.clear()
        self.silent.pop(self.all[self.at], None)
        self._unanswered.pop(self.all[self.at], None)
        self._tried = 0

    def add(self, endpoint: str) -> None:
        """Add `endpoint` at the end if it is new (one learnt from the servers); it is current if it is the first."""
        if endpoint not in self.all:
            self.all.append(endpoint)

    def move_to(self, endpoint: str) -> None:
        """Make `endpoint` current (added at the end if it is new): one that a directory names."""
        self.add(endpoint)
        self.at = self.all.index(endpoint)

    def refused_text(self) -> str:
        """Every refusal, one clause per endpoint (named, unless the refusal does)."""
        return "; ".join(why if e in why else f"{e}: {why}" for e, why in self.refusals.items())


def _names(text: str, endpoint: str) -> bool:
    """`text` names `endpoint` (tcp://h:5570 is not named by tcp://h:55700)."""
    at = text.find(endpoint)
    while at >= 0:
        end = at + len(endpoint)
        if end == len(text) or not text[end].isdigit():
            return True
        at = text.find(endpoint, at + 1)
    return False
