"""Chaos: a replicated group under a seeded nemesis of combined, overlapping faults, and a checker of the whole
history (issue #34).

A namespace lab: etcd on a host of its own, three nodes (a gateway and its sidecar each, `--min-insync 1`)
multicasting on one group of the chosen transport, a paced confirming Publisher given every ingest on host
"pub" (RATE records a second, CHUNK per publish_many, paced; confirms read off its counters, never waited
for), a reconciling Subscriber given the group and every sidecar on host "sub". Throughout: random loss (1-5%,
from the seed) of everything reaching the subscriber and each node, junk datagrams (random bytes) sent to
the group's port from host "pub", and steps of one node's wall clock at a time (netlab.WallClock: back or
forward by up to CLOCK_STEP_S, every few seconds, from the seed; the nodes' authority runs on the monotonic
clock, their journal times on the wall clock). The nemesis (gateway.bench.nemesis) runs its schedule, one step after 100
more confirmed records and at least STEP_GAP_S after the previous step healed, each step healed before the
next. Then the publisher stops and the subscriber reads up to the last confirmed sequence.

The checker (`check`): `zeps ha check` over every node's journal (each a prefix-consistent copy: one content
per sequence, no gap); every confirmed record in every node's journal exactly once, no record twice; the
subscriber got 1..head in order, each with the journal's content at that sequence (so nothing a deposed
leader sent that the group did not commit was accepted), every confirmed record among them, no loss
reported; no node's journal time goes back; no process exited on its own. Per fault: the outage (fault ->
the subscriber's first record published after it) and the longest silence (the longest wait between
deliveries within OUTAGE_WINDOW_S of the fault), as p50/p99/max.
"""

from __future__ import annotations

import itertools
import logging
import math
import random
import socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.bench import BenchError, nemesis
from gateway.bench.failover import keep_logs
from gateway.bench.runner import Progress, Result, Settings, Table, Target, stop
from gateway.client.publisher import Publisher
from gateway.journal import JournalReader
from gateway.journal.crosscheck import check_group
from gateway.tools import hagroup
from gateway.tools.hagroup import MCAST_PORT, WAIT_S, Node, journal_records, outage
from netlab import MP, Impairment, Lab, WallClock, impair

TITLE = "Chaos: a group of 3 under a seeded nemesis of combined faults; the whole history checked"
STREAM = "chaos"
NODES = ("n1", "n2", "n3")
OUTAGE_WINDOW_S = 10.0
JUNK_RATE = 20.0  # junk datagrams a second on the group's port
TARGET_SILENCE_S = 1.0
RATE = 5_000  # records a second the publisher offers (issue #30 asks for 5,000)
CHUNK = 50  # records per publish_many call: one Python call per record tops out near 500 a second here
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"  # the clients' logs, read against the nodes'
CLOCK_STEP_S = 120.0  # the largest step of a node's wall clock, back or forward
CLOCK_EVERY_S = (2.0, 6.0)  # seconds between two steps (uniform, from the seed)
STEP_GAP_S = 2.0  # healthy time between a step's healing and the next step: the silences after it are measured


def estimate(settings: Settings) -> float:
    return 60 + settings.size(settings.chaos_faults, 5) * 7


def run(settings: Settings) -> Result:
    progress = Progress("chaos")
    seed = settings.chaos_seed if settings.chaos_seed is not None else random.SystemRandom().randrange(2**31)
    transport, count = settings.transport, settings.size(settings.chaos_faults, 5)
    rate = round(settings.rate or RATE)
    drawn_from, overlap = settings.chaos_kinds or nemesis.KINDS, settings.chaos_overlap
    drawn = (f" --kinds {','.join(drawn_from)}" if settings.chaos_kinds else "") + ("" if overlap else " --no-overlap")
    progress(f"{transport}://, {count} faults, {rate} records/s, seed {seed} (zeps bench chaos --transport "
             f"{transport} --faults {count} --rate {rate} --seed {seed}{drawn} repeats it)")  # fmt: skip
    with Lab(["etcd", *NODES, "pub", "sub"]) as lab, tempfile.TemporaryDirectory(dir=settings.tmp) as tmp:
        try:
            got = campaign(
                lab, Path(tmp), transport, count, seed, progress, rate=rate, kinds=drawn_from, overlap=overlap
            )
        except BenchError as exc:
            kept_now = keep_logs(Path(tmp), settings.tmp)
            raise BenchError(f"seed {seed}: {exc}\n(the nodes' and etcd's logs are kept in {kept_now})") from exc
        # --quick proves the harness: its silences mean nothing, so only a problem keeps its logs there
        keep = got["problems"] or (got["long"] and not settings.quick)
        kept = keep_logs(Path(tmp), settings.tmp) if keep else None
    problems, stats = got["problems"], got["stats"]
    rows = [(transport, seed, got["faults"], got["steps"], f"{got['loss_pct']:.1f}%", got["clock_steps"], got["rate"],
             got["confirmed"], got["head"], *(stats[k] for k in ("outage", "silence")), len(problems))]  # fmt: skip
    kinds = [(kind, n, *(f"{v:.2f}" for v in _pcts(s))) for kind, (n, s) in sorted(got["by_kind"].items())]
    worst = max(got["silences"], default=0.0)
    return Result(
        "chaos",
        TITLE,
        method=__doc__.split("\n\n", 1)[1].strip(),
        tables=[
            Table(
                "the campaign",
                (
                    "transport",
                    "seed",
                    "faults",
                    "steps",
                    "loss",
                    "clock steps",
                    "records/s",
                    "records confirmed",
                    "head",
                    "outage p50/p99/max (s)",
                    "longest silence p50/p99/max (s)",
                    "problems",
                ),
                rows,
            ),
            Table("longest silence per fault kind", ("fault", "count", "p50 (s)", "p99 (s)", "max (s)"), kinds),
        ],
        targets=[
            Target(
                "every confirmed record exactly once, in order, journal content",
                f"{len(problems)} problems",
                not problems,
            ),
            Target(
                f"longest silence after any fault < {TARGET_SILENCE_S:g} s", f"{worst:.2f} s", worst < TARGET_SILENCE_S
            ),
        ],
        notes=[f"seed {seed}" + (f"; the nodes' and etcd's logs are kept in {kept}" if kept else ""), *problems]
        + [f"{t:.2f} s silence after: {what}" for t, what in got["long"]],
        runs=1,
        seconds=time.monotonic() - progress.start,
        issue=34,
    )


def _pcts(values: list[float]) -> tuple[float, float, float]:
    s = sorted(values)
    if not s:
        return (float("nan"),) * 3
    return s[len(s) // 2], s[min(len(s) - 1, int(len(s) * 0.99))], s[-1]


def campaign(
    lab: Lab,
    root: Path,
    transport: str,
    count: int,
    seed: int,
    say: Callable[[str], None] = print,
    *,
    rate: int = RATE,
    kinds: tuple[str, ...] = nemesis.KINDS,
    overlap: bool = True,
) -> dict[str, Any]:
    """The whole run on `lab` (hosts etcd, n1..n3, pub, sub): the group, the load (`rate` records a second),
    `count` faults of the schedule of (`seed`, `kinds`, `overlap`), then `check`. Returns what was measured
    and the checker's problems (empty: it held)."""
    steps = nemesis.schedule(seed, count, kinds, overlap)
    loss = round(random.Random(seed).uniform(1.0, 5.0), 1)
    for host in ("sub", *NODES):
        impair.impair(lab, host, Impairment(loss_pct=loss))
    etcd_proc, etcd = hagroup.start_etcd(lab, root / "etcd")
    channel = f"{transport}://{lab.group(1)}:{MCAST_PORT}"
    clocks = {n: WallClock(root / "clocks" / n) for n in NODES}
    nodes = {n: Node(lab, root, n, etcd, channel, stream=STREAM, env=clocks[n].env()) for n in NODES}
    group = nemesis.Group(lab, root, nodes, etcd_proc, etcd, STREAM, MP.Value("q", 0), MP.Value("q", 0))
    sub = pub = junk = None
    stopping, steps_taken = MP.Event(), list[str]()
    try:
        for node in nodes.values():
            node.start()
        for node in nodes.values():
            node.wait_ready()
        ready, until = MP.Queue(), MP.Queue()
        multicast = f"{transport}://{lab.host('sub').ip};{lab.group(1)}:{MCAST_PORT}"
        deadline = 120.0 + 15.0 * len(steps)
        sub = lab.start("sub", subscribe, multicast, [n.replay for n in nodes.values()], STREAM, ready, until,
                        deadline)  # fmt: skip
        ready.get(timeout=WAIT_S)
        junk = lab.start("pub", send_junk, lab.group(1), MCAST_PORT, seed, stopping, deadline)
        threading.Thread(target=step_clocks, args=(clocks, seed, stopping, steps_taken, root / "clocks.log"),
                         daemon=True).start()  # fmt: skip
        pub = lab.start("pub", publish, [n.ingest for n in nodes.values()], stopping, group.progress, group.offered,
                        rate)  # fmt: skip
        healed = time.monotonic()
        for i, step in enumerate(steps):
            hagroup.wait_confirmed(group.progress, group.progress.value + 100, timeout=60, publisher=pub)
            time.sleep(max(0.0, healed + STEP_GAP_S - time.monotonic()))
            second = f" + {step.second} at {step.delay_s} s" if step.second else ""
            say(f"step {i + 1}/{len(steps)} at {time.strftime('%H:%M:%S')}: {step.first}{second}")
            group.step = i
            nemesis.apply(group, step)
            healed = time.monotonic()
            for what in [w for _, _, w, s in group.marks if s == i]:  # to read the clients' logs against
                say(f"step {i + 1}: {what}")
            if exited := group.exited():
                group.restarts.append(f"after step {i + 1}: exited on their own {exited}")
                raise BenchError(f"processes exited on their own after step {i + 1}: {exited}\n{_logs(group)}")
        hagroup.wait_confirmed(group.progress, group.progress.value + 100, timeout=60, publisher=pub)
        stopping.set()
        confirmed, head = pub.result(WAIT_S + 10)  # its last flush may take WAIT_S
        until.put(head)
        got = sub.result(WAIT_S + 10)
        heads = _wait_synced(nodes)
    except Exception as exc:
        raise BenchError(f"{type(exc).__name__}: {exc}\n{_logs(group)}") from exc
    finally:
        stopping.set()
        stop(*(h for h in (pub, sub, junk) if h is not None))
        for node in nodes.values():
            node.kill9()
        group.etcd_proc.kill()
        group.etcd_proc.wait(10)
    problems = check([n.journal for n in nodes.values()], got, confirmed, head)
    say(f"wall clocks stepped {len(steps_taken)} times: {', '.join(steps_taken[:8])}{' ...' * (len(steps_taken) > 8)}")
    if heads:
        problems.append(f"the journals' heads differ at the end: {heads}")
    return {"problems": problems, "steps": len(steps), "faults": sum(s.faults() for s in steps), "loss_pct": loss,
            "rate": rate, "confirmed": len(confirmed), "head": head, "clock_steps": len(steps_taken),
            "summary": got["summary"], "marks": group.marks, **_outages(got, group.marks)}  # fmt: skip


def step_clocks(clocks: dict[str, WallClock], seed: int, stop_event: Any, taken: list[str], log: Path) -> None:
    """Until `stop_event`: every CLOCK_EVERY_S, one node's wall clock stepped back or forward by up to
    CLOCK_STEP_S, drawn from `seed`; what was done appended to `taken` ("n2 -31.4 s") and, with the true time
    and the node's offset since, to `log` (kept with the nodes' logs, whose times carry that offset)."""
    rng = random.Random(seed ^ 0xC10C)
    while not stop_event.wait(rng.uniform(*CLOCK_EVERY_S)):
        name = rng.choice(sorted(clocks))
        seconds = round(rng.uniform(-CLOCK_STEP_S, CLOCK_STEP_S), 1)
        clocks[name].step(seconds)
        taken.append(f"{name} {seconds:+.1f} s")
        with log.open("a") as out:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S") + f",{int(time.time() * 1000) % 1000:03d}"
            off = clocks[name].offset_s
            out.write(f"{stamp} {name} wall clock {seconds:+.1f} s: its log's times are {off:+.1f} s off\n")


def publish(ingests: list[str], stop_event: Any, progress: Any, offered: Any, rate: int) -> tuple[list[int], int]:
    """In host pub: "record-N" (N = 1, 2, ...) at `rate` a second, CHUNK per publish_many, through one confirming
    Publisher given every ingest, until `stop_event`; then flush. (numbers confirmed, the last sequence
    confirmed). `offered` counts the records handed over, `progress` those confirmed: a Publisher confirms in
    order, so its `confirmed` count N means records 1..N. The session's reconnects are logged (time stamped, on
    stderr) to read a failover from the client's side against the nodes' logs."""
    logging.basicConfig(format=LOG_FORMAT)
    logging.getLogger("gateway.client").setLevel(logging.INFO)
    n = 0
    with Publisher(ingests, STREAM, confirm=True, timeout=WAIT_S) as pub:
        start = time.monotonic()
        while not stop_event.is_set():
            ahead = start + n / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            elif ahead < -1.0:  # this process was starved: go on at the pace, no burst to catch up
                start -= ahead
            pub.publish_many(["k"] * CHUNK, [f"record-{i}".encode() for i in range(n + 1, n + CHUNK + 1)])
            n += CHUNK
            offered.value, progress.value = n, pub.confirmed
        head = pub.flush()
        progress.value = pub.confirmed
        assert head is not None and pub.confirmed == n
    return list(range(1, n + 1)), head


def subscribe(*args: Any) -> dict[str, Any]:
    """In host sub: hagroup.subscribe_all, with the Subscriber's log (its reconciler's states, replay links that
    moved, fills that made no progress) time-stamped on stderr, to read against the nodes' logs."""
    logging.basicConfig(format=LOG_FORMAT)
    logging.getLogger("gateway.client").setLevel(logging.INFO)
    return hagroup.subscribe_all(*args)


def send_junk(group: str, port: int, seed: int, stop_event: Any, limit_s: float) -> int:
    """In a lab host: random datagrams (1..1400 random bytes) to `group`:`port`, JUNK_RATE a second, until
    `stop_event` is set or `limit_s`; how many were sent."""
    rng, sent = random.Random(seed ^ 0x5EED), 0
    deadline = time.monotonic() + limit_s
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
        while not stop_event.is_set() and time.monotonic() < deadline:
            try:
                sock.sendto(rng.randbytes(rng.randint(1, 1400)), (group, port))
                sent += 1
            except OSError:
                pass  # the lab's host is cut too: junk is best effort
            time.sleep(1 / JUNK_RATE)
    return sent


def _wait_synced(nodes: dict[str, Node], timeout: float = WAIT_S) -> dict[str, int]:
    """Until every node's journal holds the same head; {} then, else the heads at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        heads = {name: _head(node.journal) for name, node in nodes.items()}
        if len(set(heads.values())) == 1:
            return {}
        if time.monotonic() > deadline:
            return heads
        time.sleep(0.1)


def _head(journal: Path) -> int:
    from gateway.journal import JournalReader

    return JournalReader(journal, STREAM).last_seq if (journal / STREAM).is_dir() else 0


def check(journals: list[Path], got: dict[str, Any], confirmed: list[int], head: int) -> list[str]:
    """Everything wrong with a run's history (empty: it held): see the module's doc."""
    problems = []
    group = check_group(journals, STREAM)
    if group.violation is not None:
        problems.append(f"zeps ha check: {group.violation} {group.divergence or ''}")
    content: dict[int, bytes] = {}
    for journal in journals:
        records = journal_records(journal, STREAM)
        seqs = [seq for seq, _, _ in records]
        if seqs != list(range(1, len(seqs) + 1)) or len(seqs) < head:
            problems.append(f"{journal.name}: not sequences 1..{len(seqs)} (>= {head})")
        counts = Counter(body for _, _, body in records)
        if twice := [body for body, n in counts.items() if n > 1]:
            problems.append(f"{journal.name}: records journaled twice: {twice[:5]}")
        if missing := [i for i in confirmed if counts[f"record-{i}".encode()] != 1]:
            problems.append(f"{journal.name}: {len(missing)} confirmed records not once: {missing[:10]}")
        for seq, _, body in records:
            if content.setdefault(seq, body) != body:
                problems.append(f"sequence {seq} reused with other content on {journal.name}")
    problems += [f"{journal.name}: journal time goes back at sequence {back}" for journal in journals
                 if (back := _time_goes_back(journal)) is not None]  # fmt: skip
    problems += hagroup.exactly_once_problems(got, confirmed, head)
    wrong = [(seq, body) for seq, body in got["records"] if content.get(seq) != body]
    if wrong:
        problems.append(f"delivered records no journal holds there (a deposed leader's?): {wrong[:5]}")
    return problems


def _time_goes_back(journal: Path) -> int | None:
    """The first sequence whose batch has an earlier journal time than the batch before it, or None."""
    reader, last = JournalReader(journal, STREAM), 0
    with reader.cursor(reader.first_seq) as cursor:
        while (batch := cursor.next_batch()) is not None:
            if batch.ts_ns < last:
                return batch.first_seq
            last = batch.ts_ns
    return None


def _outages(got: dict[str, Any], marks: list[tuple[float, int, str, int]]) -> dict[str, Any]:
    """Per fault: outage (hagroup.outage) and longest silence from the fault until OUTAGE_WINDOW_S after it or
    the next step's first fault, whichever is first (both faults of a step share it; with no delivery in it,
    until the first one after); their p50/p99/max, per kind, and the faults followed by a silence past
    TARGET_SILENCE_S."""
    arrived = got["arrived"]
    outages, silences, long = [], [], []
    by_kind: dict[str, tuple[int, list[float]]] = {}
    for when, before, what, step in marks:
        end = min([when + OUTAGE_WINDOW_S, *(t for t, _, _, s in marks if s > step)])
        times = [when] + [t for t in arrived if when < t <= end]
        if len(times) == 1:  # nothing came before the next step: the silence runs to the first delivery
            times.append(next((t for t in arrived if t > end), float("inf")))
        silence, began = max(((b - a, a) for a, b in itertools.pairwise(times)), default=(float("inf"), when))
        silences.append(silence)
        outages.append(outage(got, when, before))
        kind = what.split(":", 1)[0]
        n, values = by_kind.get(kind, (0, []))
        by_kind[kind] = (n + 1, [*values, silence])
        if silence > TARGET_SILENCE_S:  # when it began and ended, to read the logs at
            long.append((silence, f"step {step + 1}, {what} (silent {_wall(began)} to {_wall(began + silence)})"))
    stats = {k: "/".join(f"{v:.2f}" for v in _pcts(vs)) for k, vs in (("outage", outages), ("silence", silences))}
    return {"outages": outages, "silences": silences, "by_kind": by_kind, "stats": stats, "long": long}


def _wall(monotonic: float) -> str:
    """A time.monotonic() reading (the clock of every namespace) as the wall clock's HH:MM:SS.mmm ("never" for
    the end of a silence that nothing ended)."""
    if not math.isfinite(monotonic):
        return "never"
    wall = time.time() - time.monotonic() + monotonic
    return time.strftime("%H:%M:%S", time.localtime(wall)) + f".{int(wall * 1000) % 1000:03d}"


def _logs(group: nemesis.Group) -> str:
    tail = [f"--- {n.name}\n{n.log.read_text()[-3000:]}" for n in group.nodes.values() if n.log.exists()]
    return "\n".join(tail)
