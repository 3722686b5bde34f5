"""The mirror's end of the datagram tail (`zeps mirror --datagram-tail`): a UDP socket and its decoder.

`request()` makes a new tail: a fresh random token (datagrams of an earlier tail, or forged ones, are not
taken), a new decoder (gateway.wire.tail), and the TAIL-UDP arguments to send on a session with the source
sidecar, which sends the datagrams to this host's address as that session's peer. `receive()` reads what
has arrived without waiting: only datagrams from the sidecar's host are looked at, and only those carrying the
token and a batch whose CRC holds are used; the rest are counted in `stats.rejected`. The pieces (a journal
batch, or a part of one naming it) go to the mirror's merge (gateway.client.mirror_paths, `Datagram`), which
joins a batch's parts: the TCP subscription stays the reliable copy.

Threading: the mirror's thread alone.
"""

from __future__ import annotations

import secrets
import socket

from gateway.transport.udp import MAX_DATAGRAM
from gateway.wire import tail as T


class DatagramTail:
    """A tail's socket, bound to `bind` (host, port; port 0: any), taking datagrams from the host `expect` named."""

    def __init__(
        self, redundancy: T.Redundancy, *, bind: tuple[str, int] = ("0.0.0.0", 0), rcvbuf: int = 4 << 20
    ) -> None:
        self.redundancy = redundancy
        self.source_ip = ""
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.bind(bind)
        self.sock.setblocking(False)
        self.port: int = self.sock.getsockname()[1]
        self.stats = T.DecoderStats()  # across this mirror's tails
        self.decoder = T.TailDecoder(secrets.randbits(64), self.stats)
        self.foreign = 0  # datagrams from another host

    def fileno(self) -> int:
        return self.sock.fileno()

    def expect(self, endpoint: str) -> None:
        """Take datagrams from the host of the sidecar at `endpoint` (tcp://HOST:PORT) only, from now on."""
        host = endpoint.removeprefix("tcp://").rpartition(":")[0].strip("[]")
        self.source_ip = socket.gethostbyname(host)

    def request(self) -> tuple[int, int, str]:
        """A new tail: (port, token, mode) for ReplayClient.tail_udp."""
        self.decoder = T.TailDecoder(secrets.randbits(64), self.stats)
        return self.port, self.decoder.token, str(self.redundancy)

    def receive(self, limit: int = 512) -> list[T.Piece]:
        out: list[T.Piece] = []
        for _ in range(limit):
            try:
                data, source = self.sock.recvfrom(MAX_DATAGRAM)
            except BlockingIOError:
                break
            except OSError:  # an ICMP error for nothing we sent: nothing to do
                continue
            if source[0] != self.source_ip:
                self.foreign += 1
                continue
            out += self.decoder.receive(data)
        return out

    def close(self) -> None:
        self.sock.close()
