"""Site mirroring tested the way it will be used (issue #35): two LANs joined by a router whose WAN link delays
each packet 30 ms and loses 1% each way; site A runs the stream, site B a gateway with `--mirror` and its own
sidecar, and `zeps mirror` on b-spare reads A's sidecar across the WAN and writes B's ingest. All real processes.

- Restarts anywhere: the mirror killed -9 and restarted, then B's gateway killed -9 and started on its journal,
  while A publishes: B's journal equals A's record for record (`zeps ha check`'s comparison, and sequences, keys
  and bodies read back) and batch for batch, and a subscriber on B's LAN gets 1..N exactly once, in order. The
  same with the live tail as datagrams too (`--datagram-tail xor:4`: FEC over the lossy WAN, TCP the fallback),
  which must have carried records, a journal batch's parts joined before B.
- Promotion: refused while A's sidecar answers across the WAN, accepted (no `--force`) once A is cut off at the
  router (an iptables DROP of all it forwards: no RST, a connect to A hangs), its probe ending within its
  deadline; publishing at B continues at H + 1; when the WAN heals, the mirror is refused by B with the
  promotion line, B's journal untouched by it. The same with site B a group of two (etcd and two nodes).
- A subscriber given both sites' sidecars moves from A to B when A disappears (B's sidecar is down until then,
  so it reads at A first), without a gap or duplicate.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.feedlab import STREAM, check_all, expected, publish, subscribe
from support.servers import journal_batches, journal_records
from support.sitelab import WAN, deployed, two_sites

from gateway.cli.mirror import PROBE_S
from gateway.journal import JournalReader
from gateway.journal.crosscheck import check_group
from gateway.journal.promotion import read_promotion
from gateway.tools import hagroup
from gateway.tools.deployment import Deployment
from netlab import MP, Sites

METRICS = "127.0.0.1:9110"  # the mirror's metrics, on b-spare's own loopback (a namespace of the lab's)

pytestmark = pytest.mark.lab

RATE = 2_000.0  # records/s at the source
WAIT_S = 120.0  # the machine is shared and loaded: generous
FENCED = "this site was promoted at sequence {}; it no longer accepts mirror batches"
PROBE_SLACK_S = 1.0  # what a loaded machine may add to the probe's deadline (threads waiting for a core)
GROUP_NODES = ("b-n1", "b-n2")


def head_of(root: Path) -> int:
    return JournalReader(root, STREAM).last_seq


def wait_head(root: Path, head: int, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while head_of(root) < head:
        assert time.monotonic() < deadline, f"{root} holds {head_of(root)} of {head}"
        time.sleep(0.05)


class Mirror:
    """`zeps mirror` on b-spare from A's sidecar to B's ingest(s) `to`; its stderr in a log file (a status line a
    second)."""

    def __init__(self, sites: Sites, a: Deployment, to: str, log: Path, *extra: str) -> None:
        self.sites, self.log_path = sites, log
        self.argv = [sys.executable, "-m", "gateway.cli", "mirror", "-v", "--source", a.replay, "--to", to,
                     "--stream", STREAM, "--timeout", "3s", "--log-every", "1s", *extra]  # fmt: skip
        self.proc: subprocess.Popen[Any] | None = None
        self.start()

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = self.sites.popen("b-spare", self.argv, stderr=log)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float = WAIT_S) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> int:
        """SIGTERM; its exit code (0, or 1 if it had ended on a refusal)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise

    def max_lag(self, since: int = 0) -> tuple[int, float]:
        """The largest lag_records and lag_seconds its status lines reported (from character ``since`` of the log)."""
        lags = re.findall(r"lag_records=(\d+) lag_seconds=([\d.]+)", self.log()[since:])
        return max((int(r) for r, _ in lags), default=0), max((float(s) for _, s in lags), default=0.0)


@pytest.fixture
def mirrored(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Sites, Deployment, Deployment, Mirror]]:
    """The two sites over the issue's WAN, a deployment on each (B's a mirror of the stream), the mirror running
    (with the options of an indirect parameter, if any)."""
    with (
        two_sites(WAN) as sites,
        deployed(sites, "a", tmp_path / "a") as a,
        deployed(sites, "b", tmp_path / "b", gateway_args=["--mirror", STREAM]) as b,
    ):
        mirror = Mirror(sites, a, b.ingest, tmp_path / "mirror.log", *getattr(request, "param", ()))
        try:
            yield sites, a, b, mirror
        finally:
            mirror.stop()


@pytest.mark.parametrize("mirrored", [(), ("--datagram-tail", "xor:4")], indirect=True, ids=["tcp", "datagram-tail"])
def test_b_equals_a_after_the_mirror_and_bs_gateway_are_killed(
    mirrored: tuple[Sites, Deployment, Deployment, Mirror],
) -> None:
    sites, a, b, mirror = mirrored
    count = 20_000  # 10 s at RATE
    ready = MP.Queue()
    sub = sites.start("b-sub", subscribe, b.for_host("b-sub"), b.replay, "earliest", count, ready)
    assert ready.get(timeout=60) == "up"
    publisher = sites.start("a-spare", publish, a.ingest, 0, count, RATE)

    wait_head(b.journal, 3_000)
    steady = mirror.max_lag()  # before any fault
    mirror.kill9()  # mid-run: whatever it had in flight is B's to keep or refuse
    mirror.start()
    wait_head(b.journal, 9_000)
    b.kill9("gateway")  # and B's gateway, started again on its journal at its address
    b.start_gateway()

    assert publisher.result(timeout=WAIT_S) == count
    wait_head(b.journal, count)
    lag = mirror.max_lag()
    assert mirror.proc is not None and mirror.proc.poll() is None, mirror.log()

    result = check_group([a.journal, b.journal], STREAM)  # `zeps ha check`: one content per sequence, times too
    assert result.violation is None, result.plain()
    assert {r.head for r in result.nodes.values()} == {count}, result.plain()
    assert journal_records(b.journal, STREAM) == journal_records(a.journal, STREAM)  # sequences, keys, bodies
    assert journal_batches(b.journal, STREAM) == journal_batches(a.journal, STREAM)  # batch for batch (parts joined)
    check_all(sub.result(timeout=WAIT_S), count)  # B's LAN: 1..N exactly once, in order
    tail = [int(n) for n in re.findall(r"tail_records=(\d+)", mirror.log())]
    if "--datagram-tail" in mirror.argv:
        assert max(tail, default=0) > 0, mirror.log()  # the datagrams carried records (the rest came by TCP)
    print(f"\nmirror lag (status lines, once a second): before the faults at most {steady[0]} records, "
          f"{steady[1]:.3f} s; over the run, restarts included, at most {lag[0]} records, {lag[1]:.3f} s; "
          f"records forwarded from datagrams (last round): {tail[-1] if tail else 0}")  # fmt: skip


def busiest_connection(sites: Sites, host: str, peer: str) -> int:
    """The local port of `host`'s established TCP connection to `peer` (tcp://IP:PORT) that received the most
    bytes over one second (`ss -tni`, twice): a path carrying the live tail now. (The most bytes in all would
    be a path that carried the striped catch-up and may carry nothing since.)"""
    ip, port = peer.removeprefix("tcp://").rsplit(":", 1)

    def received() -> dict[int, int]:
        ss = sites.popen(host, ["ss", "-Htni", "state", "established", "dst", f"{ip}:{port}"],
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
        out, _ = ss.communicate(timeout=30)
        ports = [int(m[1]) for m in re.finditer(r"^\S+\s+\S+\s+\S+:(\d+)\s", out, re.M)]
        counts = [int(m[1]) for m in re.finditer(r"bytes_received:(\d+)", out)]
        assert len(ports) == len(counts) >= 2, out  # several paths, each with its counters
        return dict(zip(ports, counts, strict=True))

    before = received()
    time.sleep(1.0)
    after = received()
    return max((count - before.get(p, 0), p) for p, count in after.items())[1]


@contextlib.contextmanager
def cut_connection(sites: Sites, host: str, port: int) -> Iterator[None]:
    """Every segment of `host`'s connection from local `port` dropped, both ways (iptables in its namespace)."""
    rules = [["INPUT", "-p", "tcp", "--dport", str(port), "-j", "DROP"],
             ["OUTPUT", "-p", "tcp", "--sport", str(port), "-j", "DROP"]]  # fmt: skip
    added = []
    try:
        for rule in rules:
            assert sites.popen(host, ["iptables", "-I", *rule]).wait(30) == 0
            added.append(rule)
        yield
    finally:
        for rule in added:
            sites.popen(host, ["iptables", "-D", *rule]).wait(30)


def test_the_mirror_goes_on_exactly_once_when_one_of_its_paths_is_cut(tmp_path: Path) -> None:
    """`zeps mirror --paths 3`: the catch-up striped over three sessions, the live tail on two; the busiest
    connection cut mid-run (its segments dropped both ways in b-spare): the other copy carries the tail, the
    stalled path is replaced, and B's journal still equals A's, B's subscriber gets 1..N exactly once."""
    count = 20_000
    with (
        two_sites(WAN) as sites,
        deployed(sites, "a", tmp_path / "a") as a,
        deployed(sites, "b", tmp_path / "b", gateway_args=["--mirror", STREAM]) as b,
    ):
        assert sites.run("a-spare", publish, a.ingest, 0, 5_000, 0.0, timeout=WAIT_S) == 5_000  # to catch up with
        mirror = Mirror(sites, a, b.ingest, tmp_path / "mirror.log", "--paths", "3", "--metrics", METRICS)
        try:
            ready = MP.Queue()
            sub = sites.start("b-sub", subscribe, b.for_host("b-sub"), b.replay, "earliest", count, ready)
            assert ready.get(timeout=60) == "up"
            publisher = sites.start("a-spare", publish, a.ingest, 5_000, count - 5_000, RATE)
            wait_head(b.journal, 9_000)
            before = len(mirror.log())
            with cut_connection(sites, "b-spare", busiest_connection(sites, "b-spare", a.replay)):
                wait_head(b.journal, 15_000)
            assert publisher.result(timeout=WAIT_S) == count
            wait_head(b.journal, count)
            assert mirror.proc is not None and mirror.proc.poll() is None, mirror.log()
            assert "replacing it" in mirror.log()[before:], mirror.log()
            lag = mirror.max_lag(before)
            view = mirrored_view(sites, count)  # per path: which one was replaced, what each one carried
            paths = view["paths"]
            assert list(paths) == ["1", "2", "3"], view
            taken = sum(p["records"] for p in paths.values())  # a round that failed had some taken again
            assert taken == count if view["resumes"] == 0 else taken >= count, view
            assert sum(p["reconnects"] for p in paths.values()) >= 1, paths
            assert sum(p["first_arrivals"] for p in paths.values()) > 0, paths
        finally:
            mirror.stop()
        result = check_group([a.journal, b.journal], STREAM)
        assert result.violation is None, result.plain()
        assert {r.head for r in result.nodes.values()} == {count}, result.plain()
        assert journal_records(b.journal, STREAM) == journal_records(a.journal, STREAM)
        check_all(sub.result(timeout=WAIT_S), count)
    per_path = ", ".join(f"#{n} {p['records']} taken, {p['first_arrivals']} first, {p['reconnects']} reconnects"
                         for n, p in paths.items())  # fmt: skip
    print(f"\nwith one of 3 paths cut: mirror lag (status lines, once a second) at most {lag[0]} records, "
          f"{lag[1]:.3f} s; per path: {per_path}")  # fmt: skip


def mirrored_view(sites: Sites, mirrored: int) -> dict[str, Any]:
    """`zeps top --once --json` in b-spare, of the mirror's metrics, once it says `mirrored` records were
    mirrored (its confirms may come a moment after B's journal has them): its stream's view."""
    deadline = time.monotonic() + WAIT_S
    while True:
        done = zeps_on(sites, "b-spare", "top", "--once", "--json", "--interval", "0.5", "--mirror", METRICS)
        assert done.returncode == 0, done.stderr
        got = json.loads(done.stdout)["mirror"][0]["streams"][STREAM]
        if got["mirrored_records"] == mirrored:
            return dict(got)
        assert time.monotonic() < deadline, got
        time.sleep(0.5)


def promote_and_publish(gateway: str, source: str, skip: int) -> dict[str, Any]:
    """In a site B host: `zeps mirror promote` (no --force), then one confirmed publish at B (the generated
    load's record skip + 1); the exit, the output, the seconds from the command to the publish's confirm, and
    how long the command says its probe of the source took."""
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "mirror", "promote", "--stream", STREAM, "--gateway", gateway,
         "--source", source],
        capture_output=True, text=True, timeout=WAIT_S,
    )  # fmt: skip
    promoted = time.monotonic() - t0
    seq = publish(gateway.split(","), skip, 1, 0.0) if done.returncode == 0 else None
    probed = re.search(r"no source sidecar answered \(probed for ([\d.]+) s\)", done.stderr)
    return {"code": done.returncode, "stdout": done.stdout, "stderr": done.stderr, "promoted_s": promoted,
            "first_publish_s": time.monotonic() - t0, "seq": seq,
            "probe_s": float(probed[1]) if probed else None}  # fmt: skip


def zeps_on(sites: Sites, host: str, *args: str) -> subprocess.CompletedProcess[str]:
    proc = sites.popen(host, [sys.executable, "-m", "gateway.cli", *args], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)  # fmt: skip
    out, err = proc.communicate(timeout=WAIT_S)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@contextlib.contextmanager
def a_cut_off(sites: Sites) -> Iterator[None]:
    """Site A cut off at the router for the block (an iptables DROP in its FORWARD chain); the rule removed when
    the block ends, however it ends."""
    sites.cut_wan("drop")
    try:
        yield
    finally:
        sites.heal_wan()


def promote_cut_off(sites: Sites, host: str, gateway: str, source: str, head: int) -> dict[str, Any]:
    """Promotion on `host` of the mirror site at `gateway` while A is cut off at the router: it succeeds without
    --force at `head`, its probe of `source` ends within the probe's deadline (a loaded machine's slack
    allowed), and B's next publish gets head + 1."""
    done = sites.run(host, promote_and_publish, gateway, source, head, timeout=WAIT_S)
    assert done["code"] == 0, done["stderr"]
    assert f"promoted at sequence {head}" in done["stdout"]
    assert f"waiting at most {PROBE_S:g} s (--probe-timeout) for the source sidecar(s) {source}" in done["stderr"]
    assert done["probe_s"] is not None and done["probe_s"] < PROBE_S + PROBE_SLACK_S, done["stderr"]
    assert done["seq"] == head + 1  # publishers at B continue from the mirrored head
    return dict(done)


def test_promotion_when_a_is_cut_off_and_a_fenced_out_when_it_returns(
    mirrored: tuple[Sites, Deployment, Deployment, Mirror],
) -> None:
    sites, a, b, mirror = mirrored
    mirrored_head = 2_000
    assert sites.run("a-spare", publish, a.ingest, 0, mirrored_head, RATE, timeout=WAIT_S) == mirrored_head
    wait_head(b.journal, mirrored_head)

    refused = zeps_on(sites, "b-spare", "mirror", "promote", "--stream", STREAM, "--gateway", b.ingest,
                      "--source", a.replay)  # fmt: skip
    assert refused.returncode == 1, refused.stderr
    assert f"the source sidecar at {a.replay} still answers" in refused.stderr

    with a_cut_off(sites):
        done = promote_cut_off(sites, "b-spare", b.ingest, a.replay, mirrored_head)
        more = 999
        got = sites.run("b-spare", publish, b.ingest, mirrored_head + 1, more, RATE, timeout=WAIT_S)
        assert got == mirrored_head + 1 + more
        head = mirrored_head + 1 + more
        assert sites.run("a-spare", publish, a.ingest, 0, 500, 0.0, timeout=WAIT_S) == mirrored_head + 500  # A on
        before = journal_records(b.journal, STREAM)

    assert mirror.wait(WAIT_S) == 1, mirror.log()  # healed: it ends on B's refusal
    assert FENCED.format(mirrored_head) in mirror.log(), mirror.log()
    mirror.start()  # started again: refused at once, with the same line
    assert mirror.wait(WAIT_S) == 1
    assert mirror.log().count(FENCED.format(mirrored_head)) >= 2, mirror.log()
    assert journal_records(b.journal, STREAM) == before
    assert [body for _, _, body in before] == [body for _, body in expected(1, head)]
    assert journal_records(a.journal, STREAM)[:mirrored_head] == before[:mirrored_head]
    print(f"\npromotion, A cut off at the router: the probe took {done['probe_s']:.2f} s, the command "
          f"{done['promoted_s']:.2f} s, the first publish at B was confirmed {done['first_publish_s']:.2f} s after "
          "it began")  # fmt: skip


def test_a_group_of_two_is_promoted_when_a_is_cut_off_and_fences_a_out_when_it_returns(tmp_path: Path) -> None:
    """Site B a replicated group (etcd and two nodes, the mirror writing to both): the promotion given both nodes
    while A is cut off at the router; the group continues at H + 1 and, healed, refuses the mirror."""
    with (
        two_sites(WAN, b=("b-etcd", *GROUP_NODES, "b-spare")) as sites,
        deployed(sites, "a", tmp_path / "a") as a,
    ):
        b = sites.lab("b")
        etcd_proc, etcd = hagroup.start_etcd(b, tmp_path / "etcd", host="b-etcd")
        channel = f"udp://{b.group(2)}:{hagroup.MCAST_PORT}"
        options = (*hagroup.NODE_OPTIONS, "--mirror", STREAM)
        nodes = [hagroup.Node(b, tmp_path, name, etcd, channel, stream=STREAM, options=options)
                 for name in GROUP_NODES]  # fmt: skip
        mirror = None
        try:
            for node in nodes:
                node.start()
            for node in nodes:
                node.wait_ready()
            ingests = ",".join(node.ingest for node in nodes)
            mirror = Mirror(sites, a, ingests, tmp_path / "mirror.log")
            mirrored_head = 2_000
            assert sites.run("a-spare", publish, a.ingest, 0, mirrored_head, RATE, timeout=WAIT_S) == mirrored_head
            for node in nodes:
                wait_head(node.journal, mirrored_head)

            with a_cut_off(sites):
                done = promote_cut_off(sites, "b-spare", ingests, a.replay, mirrored_head)
                assert sites.run("a-spare", publish, a.ingest, 0, 500, 0.0, timeout=WAIT_S) == mirrored_head + 500

            assert mirror.wait(WAIT_S) == 1, mirror.log()  # healed: the group's leader refuses it
            assert FENCED.format(mirrored_head) in mirror.log(), mirror.log()
            for node in nodes:  # every node holds the mark (the follower within about a second)
                deadline = time.monotonic() + WAIT_S
                while (mark := read_promotion(node.journal / STREAM)) is None:
                    assert time.monotonic() < deadline, f"{node.name} has no promotion mark"
                    time.sleep(0.2)
                assert mark.head == mirrored_head
                wait_head(node.journal, mirrored_head + 1)  # B's first publish, on both (--min-insync 1)
                assert [body for _, _, body in journal_records(node.journal, STREAM)] == [
                    body for _, body in expected(1, mirrored_head + 1)
                ]
        finally:
            if mirror is not None:
                mirror.stop()
            for node in nodes:
                node.kill9()
            etcd_proc.kill()
            etcd_proc.wait(10)
    print(f"\npromotion of a group of two, A cut off at the router: the probe took {done['probe_s']:.2f} s, the "
          f"command {done['promoted_s']:.2f} s, the first publish at B was confirmed {done['first_publish_s']:.2f} "
          "s after it began")  # fmt: skip


def test_a_subscriber_with_both_sidecars_moves_to_b_when_a_disappears(
    mirrored: tuple[Sites, Deployment, Deployment, Mirror],
) -> None:
    sites, a, b, _ = mirrored
    at_a, at_b = 6_000, 2_000
    b.kill9("sidecar")  # until A is gone: the subscriber can read at A only
    ready = MP.Queue()
    sub = sites.start("b-sub", subscribe, [], [a.replay, b.replay], "earliest", at_a + at_b, ready)  # TCP only
    assert ready.get(timeout=60) == "up"
    assert sites.run("a-spare", publish, a.ingest, 0, at_a, RATE, timeout=WAIT_S) == at_a
    wait_head(b.journal, at_a)  # the mirror keeps B current up to the cut

    sites.cut_wan()  # site A disappears
    b.start_replay()
    done = sites.run("b-spare", promote_and_publish, b.ingest, a.replay, at_a, timeout=WAIT_S)
    assert done["code"] == 0 and done["seq"] == at_a + 1, done
    assert sites.run("b-spare", publish, b.ingest, at_a + 1, at_b - 1, RATE, timeout=WAIT_S) == at_a + at_b

    result = sub.result(timeout=WAIT_S)  # records after at_a are at B only: it moved
    check_all(result, at_a + at_b)  # no gap, no duplicate: the sequence numbers agree
    assert set(result["sources"]) == {"replay"}, result["sources"]
    assert result["summary"]["replay_retries"] >= 1, result["summary"]  # A's sidecar failed it once at least
