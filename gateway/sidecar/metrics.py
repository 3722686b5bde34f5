"""The replay sidecar's Prometheus metrics (`zeps_replay_*`; conventions in gateway.transport.metrics).

Streams are the journal's: those under the root at start are exported at 0 from the start, one created later
from its first ATTACH. Counters move once per client turn, not per record. Clients, clients at the tail and
the credit they hold are counted by the server's loop (`update_sessions`) and read when scraped.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from prometheus_client import Counter, Gauge

from gateway.sidecar.fills import DROP_REASONS as FILL_DROP_REASONS
from gateway.sidecar.session import Session
from gateway.transport.metrics import Metrics, precreate
from gateway.transport.send_errors import SendErrors

# Commands and connections refused, by kind: auth (a connection refused by CURVE), no-signature (not ZEPS),
# frames (not one command per message), decode (a malformed command), state (a command before ATTACH),
# attach (ATTACH refused: version, unknown stream, too many clients), command (refused by the session).
REJECTED_KINDS = ("auth", "no-signature", "frames", "decode", "state", "attach", "command")
# Why sessions ended: detach and shutdown are normal; disconnected (the client went without DETACH), timeout
# (silent too long), not-reading (sends commands, reads no answers), error (the journal failed it).
ENDED_REASONS = ("detach", "shutdown", "disconnected", "timeout", "not-reading", "error")


class StreamSeries:
    """One stream's children, looked up once."""

    def __init__(self, m: ReplayMetrics, stream: str) -> None:
        self.sessions = m.sessions.labels(stream)
        self.tail_sessions = m.tail_sessions.labels(stream)
        self.credit = m.credit.labels(stream)
        self.served_records = m.served_records.labels(stream)
        self.served_bytes = m.served_bytes.labels(stream)
        self.credit_stalls = m.credit_stalls.labels(stream)
        self.send_stalls = m.send_stalls.labels(stream)
        self.fetches = m.fetches.labels(stream)
        self.snapshot_keys = m.snapshot_keys.labels(stream)


class ReplayMetrics(Metrics):
    def __init__(self, journal: Path) -> None:
        super().__init__()
        r = self.registry
        s = ["stream"]
        self.sessions = Gauge("zeps_replay_sessions", "Attached replay clients, per stream", s, registry=r)
        self.tail_sessions = Gauge(
            "zeps_replay_tail_sessions", "Clients at the journal's end, following it live, per stream", s, registry=r
        )
        self.credit = Gauge(
            "zeps_replay_credit_bytes", "Credit clients have granted and not yet used, per stream", s, registry=r
        )
        self.served_records = Counter(
            "zeps_replay_served_records", "Records sent to clients, per stream", s, registry=r
        )
        self.served_bytes = Counter(
            "zeps_replay_served_bytes", "Bytes of DELIVER and DELIVER-BATCH sent, per stream", s, registry=r
        )
        self.fetches = Counter(
            "zeps_replay_fetches", "FETCH requests accepted (clients repairing gaps), per stream", s, registry=r
        )
        self.credit_stalls = Counter(
            "zeps_replay_credit_stalls",
            "Times a client ran out of credit with more to send, per stream",
            s,
            registry=r,
        )
        self.send_stalls = Counter(
            "zeps_replay_send_stalls", "Sends refused by a full pipe (a slow client), per stream", s, registry=r
        )
        self.snapshot_keys = Gauge("zeps_replay_snapshot_keys", "Keys in a stream's snapshot index", s, registry=r)
        self.rejected = Counter(
            "zeps_replay_rejected_messages",
            "Commands refused, by kind (auth: connections refused by CURVE)",
            ["kind"],
            registry=r,
        )
        self.ended = Counter("zeps_replay_sessions_ended", "Sessions ended, by reason", ["reason"], registry=r)
        self.fill_datagrams = Counter(
            "zeps_replay_fill_datagrams", "Answer datagrams sent from the fill port (gap fills)", registry=r
        )
        self.fill_dropped = Counter(
            "zeps_replay_fill_dropped", "Fill requests dropped unanswered, by reason", ["reason"], registry=r
        )
        # What the sidecar sends that the network may refuse: fill answers, announcements, etcd requests (its TCP
        # sessions are ZeroMQ's: libzmq drops and reconnects them itself)
        self.send_errors = SendErrors("replay", ("fill-answer", "tail-datagram", "announce", "etcd"), r)
        precreate(self.fill_dropped, *((k,) for k in FILL_DROP_REASONS))
        precreate(self.rejected, *((k,) for k in REJECTED_KINDS))
        precreate(self.ended, *((k,) for k in ENDED_REASONS))
        self.streams: dict[str, StreamSeries] = {}
        # The streams journaled so far, at 0 from the start (a root that does not exist yet has none).
        for path in sorted(journal.iterdir()) if journal.is_dir() else ():
            if path.is_dir():
                self.stream(path.name)

    def stream(self, name: str) -> StreamSeries:
        """The stream's series, created (at 0) on first use."""
        series = self.streams.get(name)
        if series is None:
            series = self.streams[name] = StreamSeries(self, name)
        return series

    def update_sessions(self, sessions: Iterable[Session]) -> None:
        """Count clients, clients at the tail and their credit per stream (from the server's loop)."""
        counts = {name: [0, 0, 0] for name in self.streams}
        for s in sessions:
            c = counts.setdefault(s.stream, [0, 0, 0])
            c[0] += 1
            c[1] += s.at_tail
            c[2] += s.credit
        for name, (clients, tail, credit) in counts.items():
            series = self.stream(name)
            series.sessions.set(clients)
            series.tail_sessions.set(tail)
            series.credit.set(credit)
