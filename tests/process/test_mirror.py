"""Site mirroring on loopback (docs/mirroring.md): a source site (gateway + sidecar) and a mirror site (a gateway
with --mirror + sidecar), `zeps mirror` between them, all real processes.

What is proved: the mirror site's journal equals the source's over the mirrored range (the `zeps ha check`
comparison: one content per sequence, journal times included, no gap), batch for batch (the same boundaries and
bytes; not after a --paths N catch-up), the datagram tail's parts joined; a subscriber at the mirror site gets
1..N exactly once; a mirror killed -9 resumes exactly; two mirrors at once duplicate nothing; an ordinary
publisher at the mirror site is refused with the line; records gone at the source stop the mirror naming them;
promotion is refused while the source answers, and fences the old source for good (across a restart); `zeps top`
shows the mirror's lag, growing while the mirror site is down.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.servers import STREAM, GatewayProcess, Side, free_port, journal_batches, journal_records, side, zeps_client

from gateway.client.publisher import Publisher
from gateway.client.subscriber import Subscriber
from gateway.journal import JournalReader
from gateway.journal.crosscheck import check_group
from gateway.journal.layout import write_head
from gateway.tools.top import Top, targets
from gateway.wire import protocol as P

WAIT_S = 60.0


@dataclass
class Sites:
    tmp: Path
    a_root: Path
    b_root: Path
    a: GatewayProcess
    a_side: Side
    b: GatewayProcess
    b_side: Side
    sent: int = 0

    def publish(self, n: int) -> None:
        """n more records at the source, confirmed; bodies are numbered from 1 across calls."""
        with Publisher(self.a.ingest, STREAM, confirm=True, timeout=20) as pub:
            for i in range(self.sent + 1, self.sent + n + 1):
                pub.publish(f"k{i % 5}", b"record %d" % i)
            assert pub.flush() == self.sent + n
        self.sent += n

    def mirror(self, name: str = "mirror", *extra: str) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - the process writes it until it ends
        argv = [sys.executable, "-m", "gateway.cli", "mirror", "-v", "--source", self.a_side.endpoint,
                "--to", self.b.ingest, "--stream", STREAM, "--timeout", "3s", "--log-every", "1s", *extra]  # fmt: skip
        return subprocess.Popen(argv, stderr=log)

    def mirror_once(self, n: int) -> None:
        """Publish n records at the source, mirror them, stop the mirror."""
        self.publish(n)
        mirror = self.mirror()
        self.wait_mirrored(self.sent)
        assert stop(mirror) == 0, self.log()

    def log(self, name: str = "mirror") -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def wait_started(self, name: str) -> None:
        """Until the mirror `name` has learnt the mirror site's head and subscribed at the source."""
        deadline = time.monotonic() + WAIT_S
        while "from sequence" not in self.log(name):
            assert time.monotonic() < deadline, self.log(name)
            time.sleep(0.05)

    def wait_mirrored(self, head: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while JournalReader(self.b_root, STREAM).last_seq < head:
            assert time.monotonic() < deadline, f"the mirror site holds {head_of(self.b_root)} of {head}"
            time.sleep(0.05)

    def assert_equal_journals(self, batches: bool = True) -> None:
        """The `zeps ha check` comparison, and with `batches` batch for batch (not after a --paths N catch-up:
        its FETCH ranges cut the source batch that straddles a range's edge in two)."""
        result = check_group([self.a_root, self.b_root], STREAM)
        assert result.violation is None, result.plain()
        heads = {r.head for r in result.nodes.values()}
        assert heads == {self.sent}, result.plain()
        records = journal_records(self.b_root)
        assert [seq for seq, _, _ in records] == list(range(1, self.sent + 1))
        assert [body for _, _, body in records] == [b"record %d" % i for i in range(1, self.sent + 1)]
        if batches:
            self.assert_equal_batches()

    def assert_equal_batches(self) -> None:
        """Batch for batch: the mirror site journaled the source's batches as they are (boundaries and bytes)."""
        a, b = journal_batches(self.a_root), journal_batches(self.b_root)
        assert len(b) == len(a) and b == a, f"A has {len(a)} batches, B {len(b)}; first differing: " + str(
            next(((x, y) for x, y in zip(a, b, strict=False) if x != y), None)
        )


def head_of(root: Path) -> int:
    return JournalReader(root, STREAM).last_seq


def zeps(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True, timeout=timeout)


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
        raise


@pytest.fixture
def sites(tmp_path: Path) -> Iterator[Sites]:
    a_root, b_root = tmp_path / "a", tmp_path / "b"
    a_root.mkdir()
    b_root.mkdir()
    a = GatewayProcess(a_root, streams=(STREAM,))
    b = GatewayProcess(b_root, "--mirror", STREAM, streams=(STREAM,))
    try:
        with side(a_root) as a_side, side(b_root) as b_side:
            yield Sites(tmp_path, a_root, b_root, a, a_side, b, b_side)
    finally:
        a.stop()
        b.stop()


@pytest.mark.parametrize("paths", [1, 3])
def test_the_mirror_copies_sequence_for_sequence_and_resumes_after_kill_9(sites: Sites, paths: int) -> None:
    """With 3 paths, the history (several FETCH chunks) is striped over three sessions and put back in order."""
    sites.publish(15_000)  # history to catch up with
    mirror = sites.mirror("mirror", "--paths", str(paths))
    try:
        sites.wait_mirrored(500)
        mirror.kill()  # -9, mid-run: anything in flight is B's to keep or refuse
        mirror.wait(5)
        sites.publish(2000)
        mirror = sites.mirror("mirror", "--paths", str(paths))
        for _ in range(5):  # the live tail, while the mirror runs
            sites.publish(400)
        sites.wait_mirrored(sites.sent)
        level = f"head={sites.sent} source_head={sites.sent} lag_records=0 lag_seconds=0.000"
        deadline = time.monotonic() + 10
        while level not in sites.log():  # the status line (every second here) says the mirror is level
            assert time.monotonic() < deadline and mirror.poll() is None, sites.log()
            time.sleep(0.1)
    finally:
        assert stop(mirror) in (0, -signal.SIGKILL), sites.log()
    sites.assert_equal_journals(batches=paths == 1)
    with Subscriber(STREAM, replay=sites.b_side.endpoint, start="earliest") as sub:
        got = [(rec.seq, bytes(rec.body)) for rec in (sub.next(timeout=10.0) for _ in range(sites.sent)) if rec]
    assert got == [(i, b"record %d" % i) for i in range(1, sites.sent + 1)]


@pytest.mark.parametrize("paths", [1, 3])
def test_the_mirror_resumes_across_restarts_of_either_site(sites: Sites, paths: int) -> None:
    """kill -9 of the mirror site's gateway, then of the source's sidecar (every path's), each restarted at its
    address."""
    sites.publish(2000)
    mirror = sites.mirror("mirror", "--paths", str(paths))
    try:
        sites.wait_mirrored(300)
        sites.b.kill9()
        sites.publish(500)
        sites.b.restart()
        sites.wait_mirrored(2300)
        sites.a_side.kill9()
        sites.publish(500)
        sites.a_side.start()
        sites.publish(500)
        sites.wait_mirrored(sites.sent)
        assert mirror.poll() is None, sites.log()
    finally:
        assert stop(mirror) == 0, sites.log()
    sites.assert_equal_journals(batches=paths == 1)
    assert "resumes=0" not in sites.log().splitlines()[-1], sites.log()


def test_two_mirrors_at_once_duplicate_nothing(sites: Sites) -> None:
    sites.publish(1000)
    first, second = sites.mirror("first"), sites.mirror("second")
    try:
        sites.wait_started("first")
        sites.wait_started("second")
        for _ in range(10):  # live: each batch reaches both mirrors, and both send it
            sites.publish(300)
        sites.wait_mirrored(sites.sent)
        time.sleep(0.5)  # anything either still sends is refused, not journaled
    finally:
        codes = stop(first), stop(second)
    assert codes == (0, 0), sites.log("first") + sites.log("second")
    sites.assert_equal_journals()
    assert "not contiguous: this mirror's head is" in sites.log("first") + sites.log("second"), "they raced"


def test_an_ordinary_publisher_at_the_mirror_site_is_refused(sites: Sites) -> None:
    sock = zeps_client(sites.b.ingest)
    sock.send(P.encode(P.Attach("ZEPS", 1, STREAM)))
    assert isinstance(P.decode(sock.recv()), P.AttachOk)
    sock.send(P.encode(P.Publish("k", b"v")))
    answer = P.decode(sock.recv())
    assert answer == P.Invalid(
        f"stream {STREAM} is a mirror of another site: publish at the source, or promote this site with "
        f"`zeps mirror promote --stream {STREAM}`"
    )
    sock.close()
    assert head_of(sites.b_root) == 0


def test_a_batch_that_does_not_continue_the_head_is_refused_naming_both(sites: Sites) -> None:
    sites.mirror_once(10)
    with JournalReader(sites.a_root, STREAM).cursor(1) as cursor:
        old = cursor.next_batch()  # starts at 1: B's head is 10
    assert old is not None
    sock = zeps_client(sites.b.ingest)
    for cmd in (P.Attach("ZEPS", 1, STREAM), P.Extend(("batch", "confirm", "mirror")), P.Mirror()):
        sock.send(P.encode(cmd))
        answer = P.decode(sock.recv())
    assert isinstance(answer, P.MirrorOk) and answer.head == 10 and answer.head_ts_ns > 0
    sock.send(P.encode(P.PublishBatch(old.buf)))
    assert P.decode(sock.recv()) == P.Invalid(
        "not contiguous: this mirror's head is 10, the batch starts at 1; resume from 11"
    )
    sock.close()
    sites.assert_equal_journals()


def test_records_gone_at_the_source_stop_the_mirror_naming_them(tmp_path: Path) -> None:
    a_root, b_root = tmp_path / "a", tmp_path / "b"
    (a_root / STREAM).mkdir(parents=True)
    b_root.mkdir()
    write_head(a_root / STREAM, 1001, 0)  # the source's journal begins at 1001: 1..1000 are gone
    a = GatewayProcess(a_root, streams=(STREAM,))
    b = GatewayProcess(b_root, "--mirror", STREAM, streams=(STREAM,))
    try:
        with Publisher(a.ingest, STREAM, confirm=True) as pub:
            pub.publish("k", b"first kept")
            assert pub.flush() == 1001
        with side(a_root) as a_side:
            done = zeps("mirror", "-q", "--source", a_side.endpoint, "--to", b.ingest, "--stream", STREAM)
    finally:
        a.stop()
        b.stop()
    assert done.returncode == 1, done.stderr
    assert f"records 1..1000 are gone from the source's journal at {a_side.endpoint}" in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert head_of(b_root) == 0


def test_promotion_is_refused_while_the_source_answers_and_fences_it_for_good(sites: Sites) -> None:
    sites.publish(500)
    mirror = sites.mirror()
    sites.wait_mirrored(500)
    refused = zeps(
        "mirror", "promote", "--stream", STREAM, "--gateway", sites.b.ingest, "--source", sites.a_side.endpoint
    )
    assert refused.returncode == 1, refused.stderr
    assert f"the source sidecar at {sites.a_side.endpoint} still answers" in refused.stderr
    forced = zeps("mirror", "promote", "--stream", STREAM, "--gateway", sites.b.ingest, "--force")
    assert forced.returncode == 0, forced.stderr
    assert "promoted at sequence 500" in forced.stdout
    with Publisher(sites.b.ingest, STREAM, confirm=True) as pub:
        pub.publish("k", b"after promotion")
        assert pub.flush() == 501  # the sequence continues from the mirrored head
    sites.publish(100)  # the old source goes on: its batches are refused now
    assert mirror.wait(20) == 1, sites.log()
    fenced = "this site was promoted at sequence 500; it no longer accepts mirror batches"
    assert fenced in sites.log()
    sites.b.stop()
    sites.b.restart()  # the fence is in B's journal
    again = zeps("mirror", "--source", sites.a_side.endpoint, "--to", sites.b.ingest, "--stream", STREAM)
    assert again.returncode == 1 and fenced in again.stderr, again.stderr
    assert head_of(sites.b_root) == 501


def test_promotion_with_the_source_down_needs_no_force(sites: Sites) -> None:
    sites.mirror_once(200)
    sites.a_side.stop()
    dead = f"tcp://127.0.0.1:{free_port()}"  # and a sidecar that never was
    done = zeps("mirror", "promote", "--stream", STREAM, "--gateway", sites.b.ingest,
                "--source", f"{sites.a_side.endpoint},{dead}")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "promoted at sequence 200" in done.stdout
    sites.a_side.start()  # for the fixture's stop


def test_a_mirror_into_a_stream_that_is_no_mirror_stops_naming_the_option(sites: Sites) -> None:
    sites.publish(5)
    done = zeps("mirror", "-q", "--source", sites.a_side.endpoint, "--to", sites.a.ingest, "--stream", STREAM)
    assert done.returncode == 1, done.stderr
    assert f"stream {STREAM} is not a mirror at this gateway: start the gateway with --mirror {STREAM}" in done.stderr
    assert head_of(sites.a_root) == 5


@pytest.mark.parametrize(("again", "named"), [(150, "sequence 100 has journal time"), (50, "source's head is 50")])
def test_a_source_whose_journal_started_again_is_not_mirrored(sites: Sites, again: int, named: str) -> None:
    """The source lost its journal and took new records under the old numbers: mirroring them would mix two
    histories at the mirror site, so the mirror stops, naming it."""
    sites.mirror_once(100)
    sites.a_side.stop()
    sites.a.stop()
    shutil.rmtree(sites.a_root / STREAM)
    sites.a.restart()
    sites.a_side.start()
    sites.sent = 0
    sites.publish(again)
    done = zeps("mirror", "-q", "--source", sites.a_side.endpoint, "--to", sites.b.ingest, "--stream", STREAM)
    assert done.returncode == 1, done.stderr
    assert "different histories" in done.stderr and named in done.stderr, done.stderr
    assert head_of(sites.b_root) == 100


def mirror_lag(port: int, wanted: Callable[[dict], bool]) -> dict:
    """`zeps top`'s view of the mirror serving metrics on `port` (its one stream), once `wanted(view)`."""
    top, deadline = Top(targets((), (), (), [f"127.0.0.1:{port}"])), time.monotonic() + WAIT_S
    try:
        while not wanted(got := top.view()["mirror"][0].get("streams", {}).get(STREAM, {})):
            assert time.monotonic() < deadline, got
            time.sleep(0.2)
        return got
    finally:
        top.close()


def test_zeps_top_shows_the_mirror_behind_while_the_mirror_site_is_down(sites: Sites) -> None:
    port = free_port()
    sites.publish(1000)
    mirror = sites.mirror("mirror", "--metrics", f"127.0.0.1:{port}")
    try:
        level = mirror_lag(port, lambda s: s.get("source_head") == 1000 and s.get("head") == 1000)
        assert (level["lag_records"], level["lag_seconds"], level["mirrored_records"]) == (0, 0.0, 1000)
        sites.b.kill9()
        sites.publish(500)  # the source goes on without the mirror site
        mirror_lag(port, lambda s: s.get("source_head") == 1500)  # asked between the mirror's rounds
        done = zeps("top", "--once", "--json", "--interval", "1", "--mirror", f"127.0.0.1:{port}")
        assert done.returncode == 0, done.stderr
        [entry] = json.loads(done.stdout)["mirror"]
        behind = entry["streams"][STREAM]
        assert (behind["head"], behind["source_head"], behind["lag_records"]) == (1000, 1500, 500), behind
        assert behind["lag_seconds"] > 0 and behind["resumes"] >= 1, behind
        assert entry["up"] and entry["problems"] == []
        sites.b.restart()
        caught_up = mirror_lag(port, lambda s: s.get("head") == 1500)
        assert caught_up["lag_records"] == 0 and caught_up["lag_seconds"] == 0.0, caught_up
    finally:
        assert stop(mirror) == 0, sites.log()
    sites.assert_equal_journals()


def test_zeps_top_shows_each_of_the_mirrors_paths_and_their_records_sum_to_those_mirrored(sites: Sites) -> None:
    """`--paths 2`: the catch-up striped over both paths, then the live tail on both (the first copy wins); per
    path (`zeps_mirror_path_*`), the records taken from it add up to the records mirrored."""
    port = free_port()
    sites.publish(20_000)  # history: several FETCH chunks, over both paths
    mirror = sites.mirror("mirror", "--paths", "2", "--metrics", f"127.0.0.1:{port}")
    try:
        mirror_lag(port, lambda s: s.get("head") == sites.sent)
        sites.publish(1000)  # the live tail
        got = mirror_lag(port, lambda s: s.get("head") == sites.sent)
        paths = got["paths"]
        assert list(paths) == ["1", "2"], got
        assert sum(p["records"] for p in paths.values()) == got["mirrored_records"] == sites.sent, got
        assert all(p["records"] > 0 and p["bytes"] > 0 and p["up"] for p in paths.values()), got
        assert sum(p["first_arrivals"] for p in paths.values()) >= 1000, got  # the records published once level
        assert all(p["reconnects"] == 0 for p in paths.values()), got
    finally:
        assert stop(mirror) == 0, sites.log()
    sites.assert_equal_journals(batches=False)


@pytest.mark.parametrize("options", [("xor:4",), ("repeat:1",), ("xor:4", "--paths", "3")], ids=" ".join)
def test_the_datagram_tail_carries_the_live_tail_and_the_mirror_resumes_after_kill_9(
    sites: Sites, options: tuple[str, ...]
) -> None:
    """With --datagram-tail the live tail comes as datagrams too (the status line counts those forwarded), also
    beside several paths; the mirror killed -9 mid-run and restarted still leaves equal journals, every record
    once."""
    sites.publish(3000)  # history: over TCP
    mirror = sites.mirror("mirror", "--datagram-tail", *options)
    try:
        sites.wait_mirrored(3000)
        for _ in range(5):
            sites.publish(400)
        mirror.kill()  # -9, mid-run
        mirror.wait(5)
        sites.publish(1000)
        mirror = sites.mirror("again", "--datagram-tail", *options)
        sites.wait_started("again")
        for _ in range(5):  # the live tail
            sites.publish(400)
        sites.wait_mirrored(sites.sent)
        deadline = time.monotonic() + 10
        while not re.search(r"lag_records=0 .* tail_records=[1-9]", sites.log("again")):
            assert time.monotonic() < deadline and mirror.poll() is None, sites.log("again")
            time.sleep(0.1)
    finally:
        assert stop(mirror) in (0, -signal.SIGKILL), sites.log("again")
    sites.assert_equal_journals()  # batch for batch too (history < a FETCH range): datagram parts were joined
