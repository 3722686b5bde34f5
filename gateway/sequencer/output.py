"""One multicast output of the gateway: its sender, a bounded queue of batches, and the last sequence sent; the
fan-out of a committed batch to the outputs, and their heartbeats."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

import zmq

from gateway.mcast import Endpoint
from gateway.sequencer.lane import Journaled
from gateway.sequencer.metrics import OutputSeries
from gateway.transport.norm import NormSender
from gateway.transport.pgm import PgmSender
from gateway.transport.udp import UdpSender
from gateway.wire import batch as B
from gateway.wire.streamkey import StreamKey, message

REFUSED_MULTICAST = "dropped like a lost packet; subscribers fetch what they miss from the replay sidecar"
STUCK_S = 5.0  # a transport that takes nothing for this long while batches wait is said once (and its recovery)

log = logging.getLogger(__name__)


class McastOutput:
    """One multicast endpoint: its sender, a bounded queue of batches, and the last sequence sent.

    Every transport limits its own rate (PGM's ZMQ_RATE, NORM's fixed transmit rate, UDP's pacing) and answers
    zmq.Again when full: the batch then stays queued, and a long queue stops the gateway reading publishers
    (`run`). A datagram output queues each batch as parts that fit a datagram. A transport that takes nothing
    for STUCK_S while batches wait is logged once, and again when it takes batches again: its publishers wait
    meanwhile, and nothing else would say why (a PGM sender whose clock stood still did that: docs/pgm.md).
    """

    RETRY_S = 0.001  # how soon a full transport is tried again
    PUMP_S = 0.005  # one pump ends after this long (checked every PUMP_CHECK sends): the loop's pass stays short
    PUMP_CHECK = 64

    def __init__(
        self,
        sock: zmq.Socket | NormSender | UdpSender | PgmSender,
        endpoint: Endpoint,
        heads: dict[str, int],
        rooms: dict[str, int],
        series: OutputSeries,
        max_queue: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sock = sock
        self.max_queue = max_queue  # a queue this long stops the gateway reading publishers
        self.endpoint = endpoint
        self.queue: deque[tuple[tuple[bytes, ...], int]] = deque()  # (message frames, last_seq)
        self.sent_head = heads  # per stream; what earlier runs journaled counts as sent (replay has it)
        self.rooms = rooms  # per stream, the largest batch a datagram transport sends whole (others: empty)
        self.series = series  # its metrics
        series.queued.set_function(self.queue.__len__)
        self._clock = clock
        self._stuck_since: float | None = None  # the transport has taken nothing since then (None: it takes)
        self._stuck_said = False

    def pump(self) -> float | None:
        """Send what the transport takes, for PUMP_S at most; return seconds until it should be tried again (0:
        at once, more is queued), None when idle."""
        if not self.queue and self._stuck_since is None and not isinstance(self.sock, NormSender):
            return None  # idle, as on most passes of the loop: nothing to send, track or push
        until, sent = self._clock() + self.PUMP_S, 0
        while self.queue:
            frames, last = self.queue[0]
            try:
                self.sock.send_multipart(frames, zmq.NOBLOCK, copy=len(frames[1]) < 8192)
            except zmq.Again:
                self._track(sent)
                return self.RETRY_S
            except OSError as exc:  # refused by the network: dropped like a lost packet (replay has it)
                self.series.send_errors.refused("multicast", self.series.endpoint, exc, REFUSED_MULTICAST)
            else:
                self.series.send_errors.sent("multicast", self.series.endpoint)
            self.queue.popleft()
            self.sent_head[frames[0].decode()] = last
            sent += 1
            if sent % self.PUMP_CHECK == 0 and self.queue and self._clock() > until:
                self._track(sent)
                return 0.0
        self._track(sent)
        # NORM takes part of a message that does not fit and the rest only when asked again.
        if isinstance(self.sock, NormSender) and not self.sock.push():
            return self.RETRY_S
        return None

    def _track(self, sent: int) -> None:
        """A pump ended, having sent `sent` batches: how long has the transport taken none while batches wait."""
        if sent or not self.queue:
            if self._stuck_said and self._stuck_since is not None:
                stuck_s = self._clock() - self._stuck_since
                log.warning("multicast %s takes batches again, after %.1f s", self.endpoint, stuck_s)
            self._stuck_since, self._stuck_said = None, False
            return
        now = self._clock()
        if self._stuck_since is None:
            self._stuck_since = now
        elif not self._stuck_said and now - self._stuck_since >= STUCK_S:
            self._stuck_said = True
            log.warning(
                "multicast %s: the transport has taken nothing for %.1f s (%d batches wait), so publishers wait. "
                "Check its rate (--rate-kbps) and link; a PGM sender whose clock stands still does this "
                "(docs/pgm.md, 'Clock')",
                self.endpoint,
                now - self._stuck_since,
                len(self.queue),
            )

    @property
    def full(self) -> bool:
        return len(self.queue) >= self.max_queue

    def beat(self, stream: str, frames: tuple[bytes, ...]) -> None:
        """Send one heartbeat of `stream` now: a full transport skips it, and so does the network refusing it (the
        next one comes)."""
        try:
            self.sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            return
        except OSError as exc:
            self.series.send_errors.refused("heartbeat", self.series.endpoint, exc, REFUSED_MULTICAST)
            return
        self.series.send_errors.sent("heartbeat", self.series.endpoint)
        self.series.heartbeats[stream].inc()


def fan_out(outs: list[McastOutput], key: StreamKey | None, stream: str, journaled: Journaled) -> None:
    """Queue a committed batch of `stream` on `outs` (cut to size for datagram ones), and send it at once on
    an output that had nothing queued: smart batching, as at the ingest. Left for the loop's next pump, it
    waited for the rest of the ingest drain and of the loop's pass (about 30 µs at p50: docs/benchmarks.md,
    "Sub-hops"); an output with batches queued is behind (at its rate, or the pass is busy), and the loop's
    pump drains it."""
    batch, sealed, last, ts = journaled
    name = stream.encode()
    frames = message(key, name, sealed)  # signed once, for every output that sends it whole
    cut: dict[int, list[tuple[tuple[bytes, ...], int]]] = {}  # datagram outputs: the parts, by size
    for out in outs:
        idle = not out.queue
        room = out.rooms.get(stream)
        out.series.bytes[stream].add(len(sealed))
        if room is None or len(sealed) <= room:
            out.queue.append((frames, last))
            out.series.messages[stream].add(1)
        else:
            if room not in cut:
                # `sealed` is `batch` resequenced, records byte for byte: its view needs no second walk.
                first = last - batch.count + 1
                whole = B.Batch(memoryview(sealed), batch.count, first, last, ts, batch.flags)
                cut[room] = [(message(key, name, part), part_last) for part_last, part in whole.split(room)]
            out.queue.extend(cut[room])
            out.series.messages[stream].add(len(cut[room]))
        if idle:
            out.pump()  # what the transport does not take now stays queued for the loop's pump
