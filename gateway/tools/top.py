"""`zeps top`'s model: scrape a deployment's metrics endpoints and make one view of it, as plain data.

The view is what the terminal shows (gateway.tools.top_view) and what `zeps top --once --json` prints:

- per gateway, per stream: the head, records and bytes journaled per second, ZEPS publishers attached, whether
  the journal is full; per multicast endpoint and stream: the sequence sent, how far it is behind the head,
  messages per second, and the endpoint's queue;
- per replay sidecar, per stream: clients (and those following the tail live), the credit they hold, records
  and bytes served per second, gap-fill requests (FETCH) per second, stalls;
- per subscriber: state, head, lag, records delivered per second and by source, gaps detected and repaired
  from replay, records lost, messages rejected, replay reconnects;
- per site mirror (`zeps mirror --metrics`), per stream: the mirror site's head and the source's, how far
  behind the source it is in records and seconds, records mirrored per second, and its resumes; per path to
  the source (`--paths`): whether it is up, records taken from it per second, the live tail's first arrivals
  it carried, seconds since its last batch, and its reconnects;
- for every target, `problems`: each error counter that is not 0 (empty in a healthy deployment).

Rates are the difference between two scrapes over the time between them (None after the first, or when a
counter went down: the process restarted). Names are the exported ones (docs/operations.md).
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

KINDS = ("gateway", "replay", "subscriber", "mirror")

Labels = frozenset[tuple[str, str]]
Samples = dict[str, list[tuple[dict[str, str], float]]]  # sample name -> (labels, value) for each series

# Error counters, per kind of target: (sample name, label, the values of it that count; None: all).
ERRORS: dict[str, tuple[tuple[str, str, frozenset[str] | None], ...]] = {
    "gateway": (
        ("zeps_gateway_rejected_messages_total", "kind", None),
        ("zeps_gateway_replies_dropped_total", "reason", None),
        ("zeps_gateway_refused_records_total", "reason", None),
        ("zeps_gateway_journal_full", "stream", None),
    ),
    "replay": (
        ("zeps_replay_rejected_messages_total", "kind", None),
        ("zeps_replay_sessions_ended_total", "reason", frozenset({"timeout", "not-reading", "error"})),
    ),
    "subscriber": (
        ("zeps_subscriber_lost_records_total", "stream", None),
        ("zeps_subscriber_rejected_messages_total", "reason", None),
    ),
    "mirror": (),  # its failures end it (exit 1) or show as resumes and lag
}


@dataclass(frozen=True)
class Target:
    """A metrics endpoint: `HOST:PORT` (or a full http:// URL) and what serves it."""

    kind: str
    address: str

    @property
    def url(self) -> str:
        return self.address if "://" in self.address else f"http://{self.address}/metrics"


def scrape(target: Target, timeout: float = 2.0) -> Samples:
    """The target's samples; raises OSError (unreachable) or ValueError (not Prometheus text)."""
    with urllib.request.urlopen(target.url, timeout=timeout) as page:
        text = page.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


class _Scrape:
    """One target's samples, with the previous scrape's for rates."""

    def __init__(self, now: Samples, before: Samples | None, dt: float) -> None:
        self.now, self.before, self.dt = now, before, dt

    @staticmethod
    def _sum(samples: Samples, name: str, labels: dict[str, str]) -> float:
        return sum(v for have, v in samples.get(name, ()) if all(have.get(k) == x for k, x in labels.items()))

    def get(self, name: str, **labels: str) -> float:
        """The sum of the series of `name` that have these labels (all of them, given none)."""
        return self._sum(self.now, name, labels)

    def count(self, name: str, **labels: str) -> int:
        return int(self.get(name, **labels))

    def rate(self, name: str, **labels: str) -> float | None:
        """Per second since the previous scrape; None without one, or across a restart."""
        if self.before is None or self.dt <= 0:
            return None
        delta = self.get(name, **labels) - self._sum(self.before, name, labels)
        return None if delta < 0 else delta / self.dt

    def values(self, name: str, label: str) -> list[str]:
        """The values `label` takes in the series of `name`, sorted."""
        return sorted({have[label] for have, _ in self.now.get(name, ()) if label in have})

    def problems(self, kind: str) -> list[str]:
        out = []
        for name, label, counted in ERRORS[kind]:
            for have, v in self.now.get(name, ()):
                if v and (counted is None or have.get(label) in counted):
                    shown = ",".join(f"{k}={x}" for k, x in sorted(have.items()))
                    out.append(f"{name.removeprefix('zeps_')}{{{shown}}} {v:g}")
        return out


def _gateway(s: _Scrape) -> dict[str, Any]:
    streams = {}
    heads = {}
    for name in s.values("zeps_gateway_head_sequence", "stream"):
        heads[name] = s.count("zeps_gateway_head_sequence", stream=name)
        streams[name] = {
            "head": heads[name],
            "records_per_s": s.rate("zeps_gateway_journaled_records_total", stream=name),
            "bytes_per_s": s.rate("zeps_gateway_journaled_bytes_total", stream=name),
            "published_records": s.count("zeps_gateway_published_records_total", stream=name),
            "journaled_records": s.count("zeps_gateway_journaled_records_total", stream=name),
            "journaled_bytes": s.count("zeps_gateway_journaled_bytes_total", stream=name),
            "publishers": s.count("zeps_gateway_publishers", stream=name),
            "journal_full": bool(s.get("zeps_gateway_journal_full", stream=name)),
            "refused_records": s.count("zeps_gateway_refused_records_total", stream=name),
        }
    multicast = []
    for endpoint in s.values("zeps_gateway_multicast_queue_messages", "endpoint"):
        per_stream = {}
        for name in streams:
            sent = s.count("zeps_gateway_multicast_head_sequence", endpoint=endpoint, stream=name)
            per_stream[name] = {
                "sent_head": sent,
                "behind_records": max(0, heads[name] - sent),
                "messages_per_s": s.rate("zeps_gateway_multicast_messages_total", endpoint=endpoint, stream=name),
                "bytes_per_s": s.rate("zeps_gateway_multicast_bytes_total", endpoint=endpoint, stream=name),
            }
        multicast.append(
            {
                "endpoint": endpoint,
                "queue_messages": s.count("zeps_gateway_multicast_queue_messages", endpoint=endpoint),
                "streams": per_stream,
            }
        )
    return {"streams": streams, "multicast": multicast}


def _replay(s: _Scrape) -> dict[str, Any]:
    streams = {}
    for name in s.values("zeps_replay_sessions", "stream"):
        streams[name] = {
            "clients": s.count("zeps_replay_sessions", stream=name),
            "tail_clients": s.count("zeps_replay_tail_sessions", stream=name),
            "credit_bytes": s.count("zeps_replay_credit_bytes", stream=name),
            "records_per_s": s.rate("zeps_replay_served_records_total", stream=name),
            "bytes_per_s": s.rate("zeps_replay_served_bytes_total", stream=name),
            "fetches_per_s": s.rate("zeps_replay_fetches_total", stream=name),
            "served_records": s.count("zeps_replay_served_records_total", stream=name),
            "fetches": s.count("zeps_replay_fetches_total", stream=name),
            "credit_stalls": s.count("zeps_replay_credit_stalls_total", stream=name),
            "send_stalls": s.count("zeps_replay_send_stalls_total", stream=name),
            "snapshot_keys": s.count("zeps_replay_snapshot_keys", stream=name),
        }
    return {"streams": streams}


def _subscriber(s: _Scrape) -> dict[str, Any]:
    streams = {}
    for name in s.values("zeps_subscriber_lag_records", "stream"):
        states = [
            have["zeps_subscriber_state"]
            for have, v in s.now.get("zeps_subscriber_state", ())
            if v and have.get("stream") == name
        ]
        delivered = "zeps_subscriber_delivered_records_total"
        streams[name] = {
            "state": states[0] if states else None,
            "head": s.count("zeps_subscriber_head_sequence", stream=name),
            "lag_records": s.count("zeps_subscriber_lag_records", stream=name),
            "records_per_s": s.rate(delivered, stream=name),
            "delivered_records": s.count(delivered, stream=name),
            "delivered_by_source": {
                src: s.count(delivered, stream=name, source=src) for src in s.values(delivered, "source")
            },
            "gaps_detected": s.count("zeps_subscriber_gaps_detected_total", stream=name),
            "gaps_filled": s.count("zeps_subscriber_gaps_filled_total", stream=name),
            "lost_records": s.count("zeps_subscriber_lost_records_total", stream=name),
            "rejected_messages": s.count("zeps_subscriber_rejected_messages_total", stream=name),
            "replay_reconnects": s.count("zeps_subscriber_replay_reconnects_total", stream=name),
            "buffered_bytes": s.count("zeps_subscriber_buffered_bytes", stream=name),
        }
    return {"streams": streams}


def _mirror(s: _Scrape) -> dict[str, Any]:
    streams = {}
    for name in s.values("zeps_mirror_head_sequence", "stream"):
        streams[name] = {
            "head": s.count("zeps_mirror_head_sequence", stream=name),
            "source_head": s.count("zeps_mirror_source_head_sequence", stream=name),
            "lag_records": s.count("zeps_mirror_lag_records", stream=name),
            "lag_seconds": s.get("zeps_mirror_lag_seconds", stream=name),
            "records_per_s": s.rate("zeps_mirror_mirrored_records_total", stream=name),
            "mirrored_records": s.count("zeps_mirror_mirrored_records_total", stream=name),
            "resumes": s.count("zeps_mirror_resumes_total", stream=name),
            "paths": {
                path: {
                    "up": bool(s.get("zeps_mirror_path_up", stream=name, path=path)),
                    "records_per_s": s.rate("zeps_mirror_path_records_total", stream=name, path=path),
                    "records": s.count("zeps_mirror_path_records_total", stream=name, path=path),
                    "first_arrivals": s.count("zeps_mirror_path_first_arrivals_total", stream=name, path=path),
                    "bytes": s.count("zeps_mirror_path_bytes_total", stream=name, path=path),
                    "idle_seconds": s.get("zeps_mirror_path_idle_seconds", stream=name, path=path),
                    "reconnects": s.count("zeps_mirror_path_reconnects_total", stream=name, path=path),
                }
                for path in sorted(s.values("zeps_mirror_path_up", "path"), key=int)
            },
        }
    return {"streams": streams}


_VIEWS = {"gateway": _gateway, "replay": _replay, "subscriber": _subscriber, "mirror": _mirror}


class Top:
    """Scrapes the targets (all at once, each bounded by `timeout`) and keeps the last scrape for rates."""

    def __init__(self, targets: Sequence[Target], timeout: float = 2.0) -> None:
        self.targets = list(targets)
        self.timeout = timeout
        self._last: dict[Target, tuple[float, Samples]] = {}
        self._pool = ThreadPoolExecutor(max_workers=min(8, len(self.targets)), thread_name_prefix="zeps-top")

    def _fetch(self, target: Target) -> tuple[float, Samples | str]:
        try:
            return time.monotonic(), scrape(target, self.timeout)
        except (OSError, ValueError) as exc:
            return time.monotonic(), _why(exc)

    def view(self) -> dict[str, Any]:
        """One scrape of every target, as the view described in the module docstring."""
        out: dict[str, Any] = {"time": time.time(), **{kind: [] for kind in KINDS}}
        for target, (at, got) in zip(self.targets, self._pool.map(self._fetch, self.targets), strict=True):
            entry: dict[str, Any] = {"address": target.address, "up": not isinstance(got, str)}
            if isinstance(got, str):
                entry["error"] = got
                self._last.pop(target, None)
            else:
                before = self._last.get(target)
                s = _Scrape(got, before[1] if before else None, at - before[0] if before else 0.0)
                entry.update(_VIEWS[target.kind](s))
                entry["problems"] = s.problems(target.kind)
                self._last[target] = (at, got)
            out[target.kind].append(entry)
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def targets(
    gateways: Iterable[str], replays: Iterable[str], subscribers: Iterable[str], mirrors: Iterable[str] = ()
) -> list[Target]:
    return [
        *(Target("gateway", a) for a in gateways),
        *(Target("replay", a) for a in replays),
        *(Target("subscriber", a) for a in subscribers),
        *(Target("mirror", a) for a in mirrors),
    ]


def _why(exc: Exception) -> str:
    reason = getattr(exc, "reason", None)  # urllib wraps the socket error
    return str(reason if reason is not None else exc)
