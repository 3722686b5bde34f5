"""Smart batching in the gateway: whether more publishes are already queued on the ingest sockets.

The gateway reads whatever its ingest holds in one drain and gathers single records into their stream's batch.
When the drain finds nothing more queued, waiting on the linger timer would only delay those records: nobody
else is about to join their batch. So the batch leaves at once, sequenced, journaled and multicast in the same
pass (the way Aeron's publications and the LMAX Disruptor batch: take what is queued, never wait on a timer),
and `--linger-ms` only bounds how long a batch may grow while publishes keep arriving. Under load the drains find
more every time and batches grow to their limits; when load is light a lone record leaves with no wait.
"""

from __future__ import annotations

import zmq

_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)  # plain ints: pyzmq's enum arithmetic costs more than the look


def ingest_ready(*sockets: zmq.Socket | None) -> bool:
    """Whether any of `sockets` (None: not configured) has a message waiting to be read. ZMQ_EVENTS is the
    socket's own queue, no system call; it also processes pending commands, as libzmq asks after a read. Asked
    once or twice a pass of the loop (per batch at a low rate): a plain loop, no generator."""
    for sock in sockets:  # noqa: SIM110 (any() over a generator costs more than the looks)
        if sock is not None and int(sock.get(_EVENTS)) & _POLLIN:
            return True
    return False
