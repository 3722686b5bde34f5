"""The journal on a filesystem that fills up: a size- and inode-limited tmpfs that this test mounts.

Writer level: appends fail with ENOSPC at every point of a write (the batch, its index entry, the head file,
a new segment), and the journal stays whole: every append that returned is there, every one that raised
left nothing behind, `verify` is clean, and writing resumes once space is freed.
Gateway level: publishers see an error naming the full journal, heartbeats and replay carry on, and
publishing resumes on its own once space comes back; nothing accepted is lost.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from support.feedlab import STREAM

from gateway.client.publisher import Publisher
from gateway.client.replay_client import history
from gateway.errors import PublishError
from gateway.journal import JournalReader, JournalWriter, verify_root
from gateway.mcast import Endpoint, Tuning, open_sub
from gateway.tools.deployment import Deployment
from gateway.tools.load import generated
from gateway.wire.batch import Batch, encode
from gateway.wire.heartbeat import Heartbeat, parse_payload
from netlab.procs import MP

SEED = 20_251_121
SEGMENT = 96 * 1024


@contextlib.contextmanager
def small_filesystem(path: Path, size: str, inodes: int | None = None) -> Iterator[Path]:
    """A tmpfs of `size` (and `inodes` files at most) mounted at `path`, unmounted at the end, pass or fail."""
    if os.geteuid() != 0:
        pytest.fail("mounting a tmpfs needs root: run the tests as root", pytrace=False)
    path.mkdir()
    options = f"size={size},mode=0755" + (f",nr_inodes={inodes}" if inodes else "")
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], check=False).returncode:
            subprocess.run(["umount", "--lazy", str(path)], check=True)


class Filler:
    """Takes up a filesystem's free space (a file written until ENOSPC) and inodes, and gives them back."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir()
        self.directory = directory
        self.path = directory / "filler"
        self.path.touch()
        self.inodes: list[Path] = []

    def fill(self) -> None:
        with open(self.path, "ab", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)

    def free(self, nbytes: int) -> None:
        os.truncate(self.path, max(0, self.path.stat().st_size - nbytes))

    def take_inodes(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                path = self.directory / f"inode-{len(self.inodes)}"
                path.touch()
                self.inodes.append(path)

    def give_inodes(self, n: int) -> None:
        for _ in range(min(n, len(self.inodes))):
            self.inodes.pop().unlink()

    def remove(self) -> None:
        self.give_inodes(len(self.inodes))
        self.path.unlink()


def _batch(rng: random.Random, tag: int) -> Batch:
    n = rng.randrange(1, 30)
    return Batch.parse(encode(0, [(tag, b"k%d" % i, b"%d:%d;" % (tag, i) * rng.randrange(2, 20)) for i in range(n)]))


def _sizes(directory: Path) -> dict[str, int]:
    """Segment files and their sizes (indexes are derived data and may grow by an entry owed earlier)."""
    return {p.name: p.stat().st_size for p in directory.glob("*.seg")}


def _journal(root: Path, stream: str) -> list[tuple[int, bytes]]:
    with JournalReader(root, stream).cursor(1) as cursor:
        out: list[tuple[int, bytes]] = []
        while (batch := cursor.next_batch()) is not None:
            out.extend((seq, bytes(body)) for seq, _, _, body in batch.raw())
        return out


def test_the_writer_keeps_the_journal_whole_while_the_disk_fills_and_empties(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    with small_filesystem(tmp_path / "disk", "4m", inodes=96) as disk:
        root, filler = disk / "journal", Filler(disk / "filler")
        writer = JournalWriter.open(root, "s", segment_bytes=SEGMENT, index_interval=1024)
        expected: list[tuple[int, bytes]] = []
        refused = torn = rolls_refused = 0
        for tag in range(800):
            if tag % 40 == 0:
                filler.fill()  # full again: the next appends fail at whatever point space runs out
            if tag % 80 == 20:
                filler.take_inodes()  # no inode for the next segment (or for its index)
            batch = _batch(rng, tag)
            before = _sizes(root / "s")
            # Room for part of the batch: free pages, and the unused end of the active segment's last page.
            room = os.statvfs(disk).f_bavail * 4096 + -before[max(before)] % 4096 if before else 0
            try:
                data = writer.append(batch)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                after = _sizes(root / "s")
                # Nothing of the batch stays; the segment it was to start may (the roll is done, it did not fit).
                assert {name: after[name] for name in before} == before, "a refused append left bytes behind"
                assert all(after[name] == 0 for name in after.keys() - before.keys())
                refused += 1
                rolls_refused += exc.filename is not None  # os.open of the next segment (or its index) failed
                torn += exc.filename is None and room > 0  # part of the batch was written, then cut back
                filler.free(rng.choice((4096, 8192, 16384)))
                filler.give_inodes(rng.randrange(0, 2))
            else:
                expected.extend((seq, bytes(body)) for seq, _, _, body in Batch.parse(data).raw())
            writer.maybe_sync()
            if tag % 250 == 0:
                assert _journal(root, "s") == expected
        filler.remove()
        for tag in range(800, 820):
            writer.append(_batch(rng, tag))
        writer.close()
        report = verify_root(root)
        assert report.clean, report.describe()
        reopened = JournalWriter.open(root, "s", segment_bytes=SEGMENT, index_interval=1024)
        assert reopened.recovery is None, reopened.recovery  # no torn batch was ever left behind
        assert reopened.last_seq == len(_journal(root, "s"))
        reopened.close()
        journal = _journal(root, "s")
        assert journal[: len(expected)] == expected, "an append that returned is missing or altered"
        assert [seq for seq, _ in journal] == list(range(1, len(journal) + 1))
        assert refused >= 100 and torn >= 10 and rolls_refused >= 5, (refused, torn, rolls_refused)


# --- the gateway in a lab: publishers refused with a reason, heartbeats and replay unaffected -----------------

RETRY_MS = 300
BEFORE, DURING, AFTER = 3000, 50, 2000  # records published before the disk fills, per refused try, after


def listen(endpoint: str, stop: Any, ready: Any) -> list[tuple[float, str, int]]:
    """Inside a lab host: (wall time, "hb" or "batch", head or last sequence) of everything multicast."""
    seen: list[tuple[float, str, int]] = []
    with zmq.Context() as ctx, open_sub(ctx, Endpoint.parse(endpoint), Tuning(), [STREAM]) as sock:
        while not stop.is_set():
            if not sock.poll(50):
                continue
            item = parse_payload(sock.recv_multipart()[1])
            if isinstance(item, Heartbeat):
                if not seen:
                    ready.put("up")
                seen.append((time.time(), "hb", item.head))
            else:
                seen.append((time.time(), "batch", item.last_seq))
    return seen


def attempts(ingest: str, skip: int, count: int, seconds: float, until_ok: bool) -> list[tuple[float, str]]:
    """Inside a lab host: publish records skip..skip+count-1 (confirmed), again and again for `seconds` (or until
    accepted), each time with a new Publisher; (wall time, "ok" or the PublishError reason) per try."""
    bodies = list(generated(skip + count, 100, 100, 0))[skip:]
    outcomes: list[tuple[float, str]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (until_ok and outcomes and outcomes[-1][1] == "ok"):
        try:
            with Publisher(ingest, STREAM, confirm=True, timeout=5, linger_ms=60_000) as pub:  # one batch
                for key, body in bodies:
                    pub.publish(key, body)
                pub.flush()
            outcomes.append((time.time(), "ok"))
        except PublishError as exc:
            outcomes.append((time.time(), exc.reason))
            time.sleep(0.1)
    return outcomes


def publish(ingest: str, skip: int, count: int) -> int | None:
    """Inside a lab host: publish records skip..skip+count-1 of the generated load, confirmed; the last sequence."""
    with Publisher(ingest, STREAM, confirm=True, timeout=10) as pub:
        for key, body in list(generated(skip + count, 100, 100, 0))[skip:]:
            pub.publish(key, body)
        return pub.flush()


def replayed(replay: str) -> list[tuple[int, bytes]]:
    """Inside a lab host: the whole journal as the replay sidecar serves it."""
    return [(r.seq, r.body) for r in history(replay, STREAM, timeout=10)]


def metrics(url: str) -> dict[str, float]:
    """Inside a lab host: the gateway's Prometheus samples."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {m[1]: float(m[2]) for m in re.finditer(r"^(\S+) (\S+)$", text, re.M)}


def test_a_full_journal_refuses_publishes_with_a_reason_and_serves_on(make_lab, tmp_path: Path) -> None:
    lab = make_lab(["pub", "gw", "sub"])
    metrics_url = f"http://{lab.host('gw').ip}:9108/metrics"
    with small_filesystem(tmp_path / "disk", "16m") as disk:
        filler = Filler(disk / "filler")
        gateway_args = ["--journal-retry-ms", str(RETRY_MS), "--metrics", f"{lab.host('gw').ip}:9108"]
        dep = Deployment(lab, disk / "journal", STREAM, gateway_args=gateway_args)
        try:
            stop, ready = MP.Event(), MP.Queue()
            listener = lab.start("sub", listen, dep.for_host("sub")[0], stop, ready)
            ready.get(timeout=30)
            assert lab.run("pub", publish, dep.ingest, 0, BEFORE) == BEFORE

            filler.fill()
            full_at = time.time()
            refused = lab.run("pub", attempts, dep.ingest, BEFORE, DURING, 1.5, False)
            during = lab.run("sub", replayed, dep.replay)
            full_metrics = lab.run("sub", metrics, metrics_url)
            filler.remove()
            freed_at = time.time()
            resumed = lab.run("pub", attempts, dep.ingest, BEFORE, DURING, 10.0, True)
            assert lab.run("pub", publish, dep.ingest, BEFORE + DURING, AFTER) == BEFORE + DURING + AFTER
            time.sleep(0.3)  # a few heartbeats announce the new head
            stop.set()
            seen = listener.result(timeout=30)
            after_metrics = lab.run("sub", metrics, metrics_url)
        finally:
            gateway, dep.gateway = dep.gateway, None
            gateway_log = _stop(gateway)
            assert not dep.close()
        journal = _journal(disk / "journal", STREAM)
        report = verify_root(disk / "journal")

    # Publishers are refused, each time, with the cause; none of the refused records was journaled.
    assert len(refused) >= 3 and all("is full (No space left on device)" in why for _, why in refused), refused
    # Publishing resumes by itself once space is back, within about one retry interval.
    assert resumed[-1][1] == "ok" and resumed[-1][0] - freed_at < RETRY_MS / 1000 + 2.0, resumed
    expected = [(i + 1, body) for i, (_, body) in enumerate(generated(BEFORE + DURING + AFTER, 100, 100, 0))]
    assert journal == expected, "records lost, altered, or a refused one journaled"
    assert report.clean, report.describe()
    # Replay served everything accepted while the disk was full.
    assert during == expected[:BEFORE]
    # Heartbeats went on while the disk was full, announcing the head that was accepted.
    beats = [head for t, kind, head in seen if kind == "hb" and full_at <= t <= freed_at]
    assert len(beats) >= (freed_at - full_at) / 0.05 / 2 and set(beats) == {BEFORE}, beats[:20]
    assert max(last for _, kind, last in seen if kind == "batch") == len(expected)
    # The state is visible in metrics and in the log, which names the cause and the fix.
    assert full_metrics[f'zeps_gateway_journal_full{{stream="{STREAM}"}}'] == 1
    refused_metric = f'zeps_gateway_refused_records_total{{reason="journal-full",stream="{STREAM}"}}'
    assert full_metrics[refused_metric] >= len(refused) * DURING
    assert after_metrics[f'zeps_gateway_journal_full{{stream="{STREAM}"}}'] == 0
    assert "journal disk full (No space left on device)" in gateway_log and "Fix: free space" in gateway_log
    assert "takes writes again" in gateway_log


def _stop(proc: subprocess.Popen | None) -> str:
    """SIGTERM a `zeps` process, wait, and return its stderr (it must exit cleanly)."""
    assert proc is not None
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return err
