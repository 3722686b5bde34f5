"""The directory kept in etcd: streams resolved by name where multicast announcements do not reach.

Gateways and sidecars run with `--etcd` keep, under /zeps/directory/STREAM/ROLE.NODEID, the announcement of
each stream they serve, bound to their lease (gateway.discovery.registrar). An `EtcdDirectory` reads that prefix
and merges what it finds by the LAN's rules (gateway.client.directory.merged): channels, ingest and head from
gateways, sidecars announcing themselves first, newest node (highest create revision) first. With stream keys
an entry must be signed by one of them and name the stream of its key; the rest (a forged or unsigned entry
written by whoever can write to etcd) are counted in `dropped` and ignored.

Threading contract: one poller thread reads the prefix every `poll_s` (each request bounded by the client's
timeout) and, when what it read differs from the last read (or etcd stops or starts answering), keeps the
result and signals an eventfd. Everything else runs in the user's thread: `fileno()` is that eventfd, so it
is readable exactly when `drain()` has something to take in; `drain()` never waits; `wait()` waits on the fd
no longer than the caller's deadline. While etcd is unreachable the last entries read stay in force (clients
keep what they knew), and `wait()` names the URLs and the fix when it gives up.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from gateway.client.directory import StreamInfo, count_drop, merged, wait_until
from gateway.errors import CoordinatorError, DiscoveryError, McastError, Unauthenticated
from gateway.transport.etcd import Entry, Etcd
from gateway.transport.pollable import PolledByFd
from gateway.wire import announce as A
from gateway.wire.streamkey import StreamKey

DEFAULT_POLL_S = 0.5


class EtcdDirectory(PolledByFd):
    """The directory in etcd at `urls` (members of one cluster); see the module docstring.

    keys: the stream keys whose signatures are accepted (an announcement signed with another is dropped);
    poll_s: how often etcd is read.
    """

    def __init__(self, urls: Sequence[str], *, keys: Iterable[StreamKey] = (), poll_s: float = DEFAULT_POLL_S) -> None:
        self._etcd = Etcd(urls, timeout_s=min(1.0, max(0.2, poll_s)))  # bad URLs raise here, in the caller's thread
        self.where = f"etcd at {','.join(self._etcd.urls)}"
        self.keys = list(keys)
        self.poll_s = poll_s
        self.dropped: dict[str, int] = {}
        self.error: str | None = None  # why the last read failed (None: etcd answered it)
        self.answered = False  # etcd has answered at least once
        self._said: dict[str, tuple[int, A.Announcement]] = {}  # etcd key -> (create revision, announcement)
        self._decoded: dict[str, tuple[int, A.Announcement | None]] = {}  # etcd key -> (mod revision, result)
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        # --- shared with the poller thread, under _lock ---
        self._lock = threading.Lock()
        self._read: list[Entry] | str | None = None  # the last read: entries, or why it failed; None: taken
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zeps-etcd-directory", daemon=True)
        self._thread.start()

    def fileno(self) -> int:
        return self._fd

    def _run(self) -> None:
        last: list[Entry] | str | None = None
        while True:
            result: list[Entry] | str
            try:
                result = self._etcd.get_prefix(A.ETCD_PREFIX)
            except CoordinatorError as exc:
                result = str(exc)
            if result != last:
                last = result
                with self._lock:
                    self._read = result
                    if self._stop.is_set():
                        return
                    os.eventfd_write(self._fd, 1)  # under the lock: close() cannot have closed the fd
            if self._stop.wait(self.poll_s):
                return

    def drain(self) -> None:
        try:
            os.eventfd_read(self._fd)
        except BlockingIOError:
            return
        with self._lock:
            read, self._read = self._read, None
        if read is None:
            return
        if isinstance(read, str):
            self.error = read
            return
        self.error, self.answered = None, True
        said = {}
        for entry in read:
            ann = self._decode(entry)
            if ann is not None:
                said[entry.key] = (entry.create_revision, ann)
        self._said = said
        present = {entry.key for entry in read}
        self._decoded = {k: v for k, v in self._decoded.items() if k in present}

    def _decode(self, entry: Entry) -> A.Announcement | None:
        """The announcement of `entry` (decoded once per revision), or None, counted, when it is refused."""
        known = self._decoded.get(entry.key)
        if known is not None and known[0] == entry.mod_revision:
            return known[1]
        ann: A.Announcement | None = None
        stream = entry.key[len(A.ETCD_PREFIX) :].split("/", 1)[0]
        try:
            ann = A.decode(entry.value, self.keys)
        except McastError as exc:
            kind = exc.kind if isinstance(exc, Unauthenticated) else "malformed"
            count_drop(self.dropped, self.where, kind, f"{entry.key}: {exc}")
        else:
            if [ad.name for ad in ann.streams] != [stream]:
                count_drop(self.dropped, self.where, "misplaced", f"{entry.key}: it announces another stream")
                ann = None
        self._decoded[entry.key] = (entry.mod_revision, ann)
        return ann

    def lookup(self, stream: str) -> StreamInfo | None:
        self.drain()
        said = sorted((s for s in self._said.values() if s[1].streams[0].name == stream), key=lambda s: -s[0])
        return merged(stream, [(ann, ann.streams[0]) for _, ann in said]) if said else None

    def streams(self) -> list[StreamInfo]:
        self.drain()
        names = sorted({ann.streams[0].name for _, ann in self._said.values()})
        return [info for name in names if (info := self.lookup(name)) is not None]

    def wait(self, stream: str, deadline: float, need: Callable[[StreamInfo], bool]) -> StreamInfo:
        return wait_until(self, stream, deadline, need, self._missing)

    def _missing(self, stream: str) -> str:
        if not self.answered:
            why = self.error or f"no answer within {self._etcd.timeout_s:g} s"
            return f"stream {stream!r} not resolved: {why}"
        registered = ", ".join(info.name for info in self.streams()) or "nothing"
        signed = " signed with the stream key given" if self.keys else ""
        stale = f" (etcd unreachable since: {self.error})" if self.error else ""
        return (
            f"stream {stream!r} is not registered{signed} in {self.where} (registered: {registered}){stale}: is "
            "its gateway running with --etcd? Or give its endpoints (--multicast, --replay, --ingest)"
        )

    def listen(self, seconds: float) -> list[StreamInfo]:
        """Every stream registered, once etcd has answered (or `seconds` passed: DiscoveryError if it never did)."""
        deadline = time.monotonic() + seconds
        while not self.answered and (left := deadline - time.monotonic()) > 0:
            select.select([self._fd], [], [], left)
            self.drain()
        if not self.answered:
            raise DiscoveryError(f"{self.where}: {self.error or f'no answer within {seconds:g} s'}")
        return self.streams()

    def close(self) -> None:
        self._stop.set()
        with self._lock:  # the thread writes the fd under the lock, and not once _stop is set
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> EtcdDirectory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
