"""A rogue sender on a feed's multicast group and port, for the demo and the security tests.

It does what anyone on the LAN can: join the group, listen, and send from its own PGM session to the same
group and port. Its messages are built to pass every check but the authenticator: batches continuing the
stream just past its head (valid CRC, plausible sequences and keys) and heartbeats announcing a head far
ahead with a replay endpoint of its own, sent unsigned, with a forged tag under the real key id, or signed
with a key of its own. It also sends again genuine signed messages it captured (a replay attack), which a
keyed subscriber accepts as authentic and then drops as duplicates, by their sequences.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Sequence

import zmq

from gateway.errors import McastError
from gateway.mcast import Endpoint, McastReceiver, Tuning, open_pub, open_sub
from gateway.wire import batch as B
from gateway.wire.heartbeat import Heartbeat, parse_payload
from gateway.wire.streamkey import AUTH, AUTH_MAGIC, AUTH_VERSION, StreamKey

KINDS = ("unsigned", "bad-tag", "own-key", "heartbeat", "replayed")
FORGED = KINDS[:-1]  # the kinds no keyed subscriber may accept
Frames = Sequence[bytes | memoryview]  # one multipart message as sent or captured


def attack(endpoint: str, stream: str, count: int, rate: float = 200.0, listen_s: float = 1.0) -> dict[str, int]:
    """Listen to the feed for `listen_s` seconds (longer if nothing was heard), then send `count` messages of
    the KINDS in turn at `rate` a second; return how many of each kind were sent ("replayed" only if a genuine
    batch was captured)."""
    ep = Endpoint.parse(endpoint)
    name = stream.encode()
    own = StreamKey.generate()
    sent: Counter[str] = Counter()
    with zmq.Context() as ctx:
        sub = open_sub(ctx, ep, Tuning(), [stream])
        pub = open_pub(ctx, ep, Tuning())
        try:
            head, key_id, captured = _listen(sub, name, listen_s)
            kinds = KINDS if captured else FORGED
            start = time.monotonic()
            for i in range(count):
                kind = kinds[i % len(kinds)]
                frames: Frames
                if kind == "replayed":
                    frames = captured[i % len(captured)]
                else:
                    head += 10
                    frames = _forge(kind, name, head, key_id, own)
                pub.send_multipart(frames)
                sent[kind] += 1
                time.sleep(max(0.0, start + (i + 1) / rate - time.monotonic()))
        finally:
            sub.close(linger=0)
            pub.close()  # lingers (Tuning.linger_ms) until what was sent has left
    return dict(sent)


def _listen(sub: McastReceiver, name: bytes, seconds: float) -> tuple[int, int, list[Frames]]:
    """(the stream's head, the key id the gateway signs with, genuine batches captured) from the feed, heard
    for `seconds`, or up to five times as long until a batch has been captured."""
    head, key_id = 0, 0
    captured: list[Frames] = []
    start = time.monotonic()
    while (now := time.monotonic()) < start + seconds or (not captured and now < start + 5 * seconds):
        if not sub.poll(50):
            continue
        frames = sub.recv_multipart()
        if len(frames) < 2 or frames[0] != name:
            continue
        try:
            item = parse_payload(frames[1])
        except McastError:
            continue
        if len(frames) == 3 and len(frames[2]) == AUTH.size:
            key_id = AUTH.unpack(frames[2])[2]
        if isinstance(item, Heartbeat):
            head = max(head, item.head)
        else:
            head = max(head, item.last_seq)
            if len(captured) < 50:
                captured.append(frames)
    return head, key_id, captured


def _forge(kind: str, name: bytes, head: int, key_id: int, own: StreamKey) -> tuple[bytes, ...]:
    if kind == "heartbeat":
        payload = Heartbeat(head + 10**9, time.time_ns(), "tcp://127.0.0.1:1", 0x0BAD).encode()
    else:
        now = time.time_ns()
        payload = B.encode(head + 1, [(now, b"key%03d" % i, b"forged %d" % i) for i in range(10)], ts_ns=now)
    if kind == "unsigned":
        return name, payload
    if kind == "own-key":
        return own.frames(name, payload)
    return name, payload, AUTH.pack(AUTH_MAGIC, AUTH_VERSION, key_id, os.urandom(16))
