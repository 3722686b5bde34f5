"""netlab's Docker backend on a real engine: the whole system across containers, impairments and captures on
container links, commands inside containers, the CLI, and cleanup that leaves nothing behind, even after a
failure or a crash.

The first run on a machine builds the image (debootstrap, about a minute); later runs reuse it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest
from conftest import NEEDS_ROOT
from support.feedlab import BODY, KEYS, STREAM, deploy, expected

from gateway.tools.deployment import wait_ping
from netlab import DockerLab, Impairment, LabError, dockerimage, dockerlab, firewall, impair, ns, packets, state

pytestmark = pytest.mark.lab

NETLAB_CLI = Path(sys.executable).parent / "netlab"
JOURNAL = Path("/var/lib/zeps/journal")  # inside the gateway's container
COUNT = 6000
RATE = 2000.0  # records/s: the feed lasts 3 s


@pytest.fixture(scope="session")
def engine() -> docker.DockerClient:
    """The local engine; the suite fails (never skips) without it."""
    if os.geteuid() != 0:
        pytest.fail(NEEDS_ROOT, pytrace=False)
    try:
        return dockerlab.client()
    except LabError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def image(engine: docker.DockerClient) -> str:
    return dockerimage.ensure_image(engine)


@pytest.fixture
def docker_lab(image: str) -> Iterator[Callable[..., DockerLab]]:
    """Factory of Docker labs that are up; all are removed at test end, pass or fail."""
    with contextlib.ExitStack() as labs:
        yield lambda hosts=2, name=None: labs.enter_context(DockerLab(hosts, name, image=image))


def leftovers(engine: docker.DockerClient, lab_id: str) -> set[str]:
    """Every object of ``lab_id`` still on the machine, by kind. Docker adds its own ACCEPT rule for the bridge:
    the lab's, which lets multicast pass Docker's isolation rules, is the same rule, first in the chain."""
    label = {"label": f"{dockerlab.LABEL_ID}={lab_id}"}
    found = [f"container {c.name}" for c in engine.containers.list(all=True, filters=label)]
    found += [f"network {n.name}" for n in engine.networks.list(filters=label)]
    found += [f"netns {n}" for n in ns.list_netns() if n.startswith(f"{lab_id}-")]
    found += [f"rule {b}" for b in firewall.bridges_with_rules() if b.startswith(f"{lab_id}-")]
    return set(found + [f"record {r['id']}" for r in state.load_all() if r["id"] == lab_id])


def zeps(*args: str) -> list[str]:
    """A zeps command line; DockerLab.popen runs sys.executable as the image's python3."""
    return [sys.executable, "-m", "gateway.cli", *args]


def wait_joined(group: str, timeout: float) -> None:
    """Inside a host: until a socket there has joined ``group`` (the kernel's list, /proc/net/igmp, is per netns)."""
    wanted = socket.inet_aton(group)[::-1].hex().upper()  # the file shows groups as little-endian hex
    deadline = time.monotonic() + timeout
    while wanted not in Path("/proc/net/igmp").read_text():
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing joined {group} within {timeout} s")
        time.sleep(0.05)


def netlab_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(NETLAB_CLI), *args], capture_output=True, text=True, timeout=240)
    assert not check or done.returncode == 0, done.stderr
    return done


def test_gateway_feed_crosses_containers_exactly_once(docker_lab: Callable[..., DockerLab]) -> None:
    """zeps gateway + replay in one container, publish in another, subscribe (epgm + replay) in a third."""
    lab = docker_lab(["gw", "pub", "sub"])
    deployment = deploy(lab, JOURNAL)
    group, port = lab.group(1), 5555
    try:
        sniffer = packets.start_sniff(lab, "sub", seconds=60, bpf=f"udp port {port}")
        multicast = [arg for ep in deployment.for_host("sub") for arg in ("--multicast", ep)]
        sub = lab.popen(
            "sub",
            zeps("subscribe", "--stream", STREAM, *multicast, "--replay", deployment.replay, "--from", "earliest",
                 "--count", str(COUNT), "--timeout", "60"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        lab.run("sub", wait_joined, group, 30.0, timeout=40)
        pub = lab.popen(
            "pub",
            zeps("publish", "--ingest", deployment.ingest, "--stream", STREAM, "--count", str(COUNT),
                 "--size", str(BODY), "--keys", str(KEYS), "--rate", str(RATE), "--confirm"),
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        _, pub_err = pub.communicate(timeout=120)
        assert pub.returncode == 0, pub_err
        assert f"published {COUNT} records, last sequence {COUNT}" in pub_err
        out, sub_err = sub.communicate(timeout=120)
        sniffer.stop()
        capture = sniffer.result()
    finally:
        problems = deployment.close()
    assert sub.returncode == 0, sub_err
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["seq"] for r in records] == list(range(1, COUNT + 1))  # all, in order, once
    assert [(r["seq"], base64.b64decode(r["body_b64"])) for r in records] == expected(1, COUNT)
    summary = dict(item.split("=") for item in sub_err.strip().splitlines()[-1].split(": ", 1)[1].split(", "))
    assert int(summary["from_live"]) > COUNT // 2, summary  # the multicast carried the feed, replay the rest
    assert int(summary["from_live"]) + int(summary["from_replay"]) == COUNT, summary
    flow = capture.flow(group, port)
    assert flow is not None and flow.source == lab.host("gw").ip, capture.flows  # PGM from gw seen on sub's link
    assert problems == []


def test_impairments_and_probes_work_on_container_links(docker_lab: Callable[..., DockerLab]) -> None:
    """Loss in the root namespace's tc hook, delay by NFQUEUE and a delay process inside the container."""
    lab = docker_lab(["pub", "sub"])
    imp = Impairment(loss_pct=20, delay_ms=10)
    impair.impair(lab, "sub", imp)
    assert impair.current(lab, "sub") == imp
    result = packets.probe(lab, "pub", "sub", count=2000, pps=4000)
    assert 15 <= 100 * len(result.lost()) / result.sent <= 25
    assert 9 <= statistics.median(result.delays_ms()) <= 20
    impair.clear(lab, "sub")
    assert impair.current(lab, "sub") is None
    clean = packets.probe(lab, "pub", "sub", count=1000, pps=4000)
    assert clean.lost() == [] and statistics.median(clean.delays_ms()) < 5


def test_commands_run_inside_the_container(docker_lab: Callable[..., DockerLab]) -> None:
    lab = docker_lab(["h1"])
    probe = "import socket, sys, zmq; print(open('/etc/debian_version').read().strip(), socket.gethostname(), sys.executable, zmq.has('pgm'))"  # noqa: E501
    proc = lab.popen("h1", [sys.executable, "-c", probe], stdout=subprocess.PIPE, text=True, env={"X": "1"})
    out, _ = proc.communicate(timeout=30)
    version, hostname, python, pgm = out.split()
    assert version.startswith("12.") and hostname == "h1" and python == "/usr/bin/python3" and pgm == "True"
    shell = lab.popen("h1", ["sh", "-c", 'echo "$X $PWD"; exit 3'], stdout=subprocess.PIPE, text=True,
                      env={"X": "set"}, cwd="/tmp")  # fmt: skip
    assert shell.communicate(timeout=30)[0] == "set /tmp\n" and shell.returncode == 3
    missing = lab.popen("h1", ["no-such-program"], stderr=subprocess.PIPE, text=True)
    assert missing.wait(30) == 127 and "no-such-program" in missing.communicate()[1]
    sleeper = lab.popen("h1", ["sleep", "60"])
    ps = lab.popen("h1", ["ps", "-eo", "comm"], stdout=subprocess.PIPE, text=True)
    assert "sleep" in ps.communicate(timeout=30)[0].split()  # a process of the container's pid namespace
    sleeper.send_signal(signal.SIGTERM)  # relayed to the command
    assert sleeper.wait(10) == -signal.SIGTERM


def test_down_removes_everything_even_after_a_failure(engine: docker.DockerClient, image: str) -> None:
    lab = DockerLab(["a", "b"], image=image)
    with pytest.raises(RuntimeError, match="boom"), lab:
        sleeper = lab.popen("a", ["sleep", "600"])
        i = lab.id
        made = {f"container {i}-a", f"container {i}-b", f"netns {i}-a", f"netns {i}-b", f"network {i}", f"record {i}"}
        assert leftovers(engine, i) == made | {f"rule {i}-br"}
        raise RuntimeError("boom")
    assert leftovers(engine, lab.id) == set()
    assert sleeper.poll() is not None
    lab.down()  # idempotent

    broken = DockerLab(["a"], image=f"{dockerimage.IMAGE}:no-such-tag")
    with pytest.raises(docker.errors.ImageNotFound):
        broken.up()
    assert broken.id and leftovers(engine, broken.id) == set()  # the network made before the failure is gone


CRASHER = """
import sys, time
from netlab import DockerLab
lab = DockerLab(["a"], image=sys.argv[1]).up()
print(lab.id, flush=True)
time.sleep(600)
"""


def test_down_all_removes_the_lab_of_a_crashed_program(engine: docker.DockerClient, image: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", CRASHER, image], stdout=subprocess.PIPE, text=True)
    try:
        lab_id = proc.stdout.readline().strip() if proc.stdout else ""
        assert lab_id.startswith(dockerlab.PREFIX), "the crashing program did not bring its lab up"
        assert dockerlab.down_all(lab_id) == []  # its owner still runs: kept
    finally:
        proc.kill()
        proc.wait(10)
    status = netlab_cli("status").stdout
    assert f"pid {proc.pid} (gone" in status
    assert dockerlab.down_all(lab_id) == [lab_id]
    assert leftovers(engine, lab_id) == set()


def test_cli_up_status_exec_impair_down(engine: docker.DockerClient, image: str) -> None:
    name = f"zdcli{os.getpid() % 10000}"
    up = netlab_cli("up", "--hosts", "h1,h2", "--backend", "docker", "--name", name)
    try:
        assert f"docker image {image}" in up.stdout
        record = next(r for r in json.loads(netlab_cli("status", "--json").stdout)["labs"] if r["name"] == name)
        assert record["backend"] == "docker" and [h["name"] for h in record["hosts"]] == ["h1", "h2"]
        h2 = record["hosts"][1]["ip"]
        ping = netlab_cli("exec", f"{name}/h1", "--", "ping", "-c", "1", "-W", "5", h2)
        assert "1 received" in ping.stdout
        assert netlab_cli("exec", f"{name}/h1", "--", "sh", "-c", "exit 7", check=False).returncode == 7
        netlab_cli("impair", f"{name}/h2", "--loss", "5%")
        assert "in: loss 5%" in netlab_cli("status").stdout
        capture = netlab_cli("capture", f"{name}/h2", "--seconds", "1")
        assert "frames in" in capture.stdout
    finally:
        down = netlab_cli("down", name, check=False)
    assert down.returncode == 0 and f"removed {name}" in down.stdout, down.stderr
    assert leftovers(engine, record["id"]) == set()


def test_containers_find_streams_by_name(docker_lab: Callable[..., DockerLab]) -> None:
    """Discovery across containers: only the gateway's and sidecar's own flags name an address; the publisher,
    `zeps streams` and the subscriber are given a stream name and their interface (docs/discovery.md)."""
    lab = docker_lab(["gw", "pub", "sub"])
    gw, ifname = lab.host("gw"), lab.host("sub").ifname
    px, tr = f"{lab.group(11)}:5011", f"{lab.group(12)}:5012"
    count = 2000
    gateway = lab.popen("gw", zeps("gateway", "--stream", "px", "--stream", "tr", "--journal", str(JOURNAL),
                                   "--ingest", "tcp://*:5570", "--multicast", f"px=udp://{gw.ifname};{px}",
                                   "--multicast", f"tr=udp://{gw.ifname};{tr}"),
                        stderr=subprocess.PIPE, text=True)  # fmt: skip
    lab.run("gw", wait_ping, f"tcp://{gw.ip}:5570", 30.0, timeout=40)  # the journal exists: the sidecar may start
    sidecar = lab.popen("gw", zeps("replay", "--journal", str(JOURNAL), "--bind", f"tcp://{gw.ip}:5580",
                                   "--announce-interface", gw.ifname),
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        lab.run("gw", wait_ping, f"tcp://{gw.ip}:5580", 30.0, timeout=40)
        sub = lab.popen(
            "sub",
            zeps("subscribe", "--stream", "px", "--interface", ifname, "--from", "earliest", "--count", str(count),
                 "--timeout", "60", "--discovery-timeout", "30"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        lab.run("sub", wait_joined, lab.group(11), 40.0, timeout=50)
        pub = lab.popen(
            "pub",
            zeps("publish", "--stream", "px", "--interface", ifname, "--count", str(count), "--confirm",
                 "--discovery-timeout", "30"),
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        _, pub_err = pub.communicate(timeout=120)
        out, sub_err = sub.communicate(timeout=120)
        listing = lab.popen("pub", zeps("streams", "--interface", ifname, "--json"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
        rows_out, rows_err = listing.communicate(timeout=60)
    finally:
        for proc in (gateway, sidecar):
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
    assert pub.returncode == 0, pub_err
    assert sub.returncode == 0, sub_err
    assert [json.loads(line)["seq"] for line in out.splitlines()] == list(range(1, count + 1)), sub_err
    rows = {row["stream"]: row for row in map(json.loads, rows_out.splitlines())}
    assert listing.returncode == 0, rows_err
    assert rows["px"]["channels"] == [f"udp://{px}"] and rows["tr"]["channels"] == [f"udp://{tr}"]
    assert rows["px"]["ingest"] == f"tcp://{gw.ip}:5570" and rows["px"]["sidecar"] == f"tcp://{gw.ip}:5580"
    assert rows["px"]["head"] == count
