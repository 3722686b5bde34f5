"""`zeps` as a new user meets it: every subcommand and option family through bad input, and the conventions
(env vars, -v/-q anywhere, --format, --from -N / --since, journal repair, closed pipes) against real servers.

Every error must be one line on stderr naming the offending value, with exit status 2 for usage and config
errors and 1 for failures at run time, and never a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.servers import STREAM, GatewayProcess, Stream, free_port, start_sidecar

from gateway.journal import JournalReader, verify_root
from gateway.wire.batch import HEADER_SIZE

ZEPS = [sys.executable, "-m", "gateway.cli"]
DEAD = "tcp://127.0.0.1:1"  # nothing listens there
# a gateway whose options are refused before it binds anything
A_GATEWAY = ("gateway", "--stream", "s", "--journal", "j", "--ingest", "tcp://1.2.3.4:1")
GROUP_NODE = (*A_GATEWAY, "--etcd", "http://1.2.3.4:1")
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("ZEPS_")}


def zeps(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*ZEPS, *args], capture_output=True, text=True, timeout=60, env=CLEAN_ENV | (env or {}), input=stdin
    )


def one_line_error(done: subprocess.CompletedProcess, code: int, *named: str) -> None:
    """Exit status `code`, no traceback, and one line on stderr that names every string in `named`."""
    assert done.returncode == code, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if " WARNING " not in line]  # plain-TCP warnings
    assert len(lines) == 1, done.stderr
    for text in named:
        assert text in lines[0], (text, lines[0])


# --- usage errors: found at parse time, before anything starts -------------------------------------------------

PUB = ("publish", "--ingest", DEAD, "--stream", "s")
HIST = ("history", "--replay", DEAD, "--stream", "s")
SUB = ("subscribe", "--replay", DEAD, "--stream", "s")

USAGE = [
    # endpoints
    ((*PUB[:2], "127.0.0.1:5570", *PUB[3:], "--body", "x"), ["--ingest", "'127.0.0.1:5570'", "tcp://127.0.0.1:5570"]),
    (("publish", "--ingest", "udp://1.2.3.4:5", "--stream", "s", "--body", "x"), ["'udp://1.2.3.4:5'", "tcp://"]),
    (("history", "--replay", "tcp://host", "--stream", "s"), ["'tcp://host'", "tcp://HOST:PORT"]),
    (("subscribe", "--multicast", "239.1.1.1:5555", "--stream", "s"), ["'239.1.1.1:5555'", "epgm://"]),
    (("subscribe", "--multicast", "epgm://eth0;10.0.0.1:5555", "--stream", "s"), ["10.0.0.1", "multicast"]),
    ((*SUB, "--metrics", "9100"), ["--metrics", "'9100'", "127.0.0.1:9100"]),
    (("gateway", "--ingest", "localhost:5570"), ["--ingest", "'localhost:5570'"]),
    (("replay", "--bind", "5571"), ["--bind", "'5571'"]),
    # counts, sizes, rates, durations
    ((*PUB, "--count", "3", "--keys", "0"), ["--keys", "0 is below the minimum 1"]),
    ((*PUB, "--count", "-5"), ["--count", "-5"]),
    ((*PUB, "--count", "five"), ["--count", "'five' is not a whole number"]),
    ((*PUB, "--count", "1", "--size", "2000000000"), ["--size", "2000000000 is above the maximum"]),
    ((*PUB, "--count", "1", "--size", "12 parsecs"), ["--size", "'12 parsecs' is not a byte size"]),
    ((*PUB, "--count", "1", "--rate", "0"), ["--rate", "must be more than 0"]),
    ((*PUB, "--body", "x", "--ttl", "soon"), ["--ttl", "'soon' is not a duration"]),
    ((*HIST, "--timeout", "-1"), ["--timeout", "'-1'"]),
    ((*SUB, "--max-lag", "0"), ["--max-lag", "0 is below the minimum 1"]),
    (("gateway", "--heartbeat-ms", "0"), ["--heartbeat-ms", "0 is below the minimum 1"]),
    (("gateway", "--max-message-bytes", "1TB"), ["--max-message-bytes", "'1TB'"]),
    (("gateway", "--fsync", "sometimes"), ["--fsync", "'sometimes'", "always"]),
    (("gateway", "--retention-s", "a week"), ["--retention-s", "'a week'"]),
    (("replay", "--max-clients", "-1"), ["--max-clients", "-1"]),
    (("replay", "--max-command-bytes", "10"), ["--max-command-bytes", "10 is below the minimum 1024"]),
    (("analyze", "--journal", "j", "--stream", "s", "--top", "0"), ["--top", "0"]),
    (("demo", "--loss", "150"), ["--loss", "150 is above the maximum 100"]),
    (("bench", "nosuch"), ["'nosuch'"]),
    # positions and times
    ((*HIST, "--from", "yesterday"), ["--from", "'yesterday'", "--since"]),
    ((*HIST, "--from", "2026-05-01T09:30:00"), ["--from", "'2026-05-01T09:30:00' names no time zone", "Z"]),
    ((*SUB, "--from", "tomorrow"), ["--from", "'tomorrow'", "earliest"]),
    ((*SUB, "--from", "-0"), ["--from", "'-0'", "N >= 1"]),
    ((*HIST, "--since", "5 fortnights"), ["--since", "'5 fortnights'"]),
    ((*HIST, "--from", "10", "--to", "5"), ["--from 10 is after --to 5"]),
    ((*HIST, "--from", "3", "--since", "5m"), ["--since", "not allowed with argument --from"]),
    (("export", "--journal", "j", "--stream", "s", "--to", "o", "--from", "noon"), ["--from", "'noon'"]),
    # combinations
    ((*PUB, "--body", "x", "--count", "5"), ["--count", "not allowed with argument --body"]),
    ((*PUB, "--size", "10"), ["--size", "--count"]),
    ((*PUB, "--count", "2", "--key", "k"), ["--key", "--keys"]),
    ((*HIST, "--topic", "a", "--topic", "b"), ["--topic", "given twice", "'b'"]),
    ((*HIST, "--stream", "t"), ["--stream", "given twice"]),
    (("subscribe", "--stream", "s"), ["--multicast", "--replay", "ZEPS_REPLAY"]),
    (("subscribe", "--multicast", "epgm://10.0.0.1;239.1.1.1:5555", "--stream", "s", "--from", "-10"), ["--replay"]),
    (("publish", "--stream", "s", "--body", "x"), ["--ingest", "ZEPS_INGEST"]),
    (("history", "--replay", DEAD), ["--stream", "ZEPS_STREAM"]),
    (("publish", "--ingest", DEAD, "--stream", "a/b", "--body", "x"), ["--stream", "a/b"]),
    (("gateway", "--stream", "s", "--journal", "j"), ["missing --ingest"]),
    (("replay", "--journal", "j"), ["missing --bind"]),
    (("journal",), ["ACTION"]),
    (("journal", "fix", "j"), ["'fix'"]),
    (("keygen",), ["--stream-key FILE, --curve DIR/NAME"]),
    (("ha", "status", "--stream", "s"), ["--etcd"]),
    (("ha",), ["ACTION"]),
    (("ha", "check", "--stream", "s"), ["--journal"]),
    ((*GROUP_NODE, "--node", "a"), ["--replay-endpoint"]),
    ((*A_GATEWAY, "--curve-key", "k"), ["--curve-key and --curve-server are a group node's", "--etcd and --node"]),
    (
        (*GROUP_NODE, "--node", "a", "--replay-endpoint", "tcp://1.2.3.4:2", "--peer-endpoint", "udp://x:1"),
        ["peer link endpoint 'udp://x:1'", "tcp://HOST:PORT"],
    ),
    (
        (*GROUP_NODE, "--node", "a", "--peer-tls-cert", "n.crt", "--peer-tls-key", "n.key", "--peer-tls-ca", "ca.crt"),
        ["--peer-tls-ca ca.crt: no such file", "zeps keygen --tls-ca"],
    ),
    ((*A_GATEWAY, "--peer-tls-cert", "n.crt"), ["missing --peer-tls-key, --peer-tls-ca", "together"]),
    ((*A_GATEWAY, "--etcd-ca", "a", "--etcd-cert", "b", "--etcd-key", "c"), ["--etcd https://HOST:PORT"]),
    (("nosuch",), ["'nosuch'"]),
    (("histroy",), ["invalid choice: 'histroy'", "did you mean history?"]),
    (("journal", "verfiy", "j"), ["'verfiy'", "did you mean verify?"]),
    (("doctor", "--transport", "pigeon"), ["--transport", "'pigeon'", "epgm"]),
    (("doctor", "--etcd", "localhost"), ["etcd URL 'localhost'", "http://HOST:PORT"]),
    ((*HIST, "--strem", "t"), ["unrecognized arguments: --strem t", "did you mean --stream?"]),
    (("subscribe", "--replay", DEAD, "--strem=s"), ["zeps subscribe:", "did you mean --stream?"]),
    (("gateway", "--journal", __file__), ["--journal", "is a file, not a directory"]),
    (("replay", "--journal", __file__), ["--journal", "is a file, not a directory"]),
    # discovery, zeps top, snapshots
    (("streams",), ["--interface"]),
    (("streams", "--interface", "lo", "--discovery", "239.1.1.1"), ["239.1.1.1", "GROUP:PORT"]),
    (("streams", "--interface", "lo", "--wait", "-1"), ["--wait", "'-1'"]),
    (("subscribe", "--stream", "s", "--interface", "lo", "--discovery", "1.2.3.4:x"), ["1.2.3.4:x"]),
    (("gateway", "--multicast", "bad name=udp://lo;239.1.1.1:5555"), ["--multicast", "bad name"]),
    (("top",), ["--gateway, --replay, --subscriber or --mirror"]),
    (("top", "--gateway", "9100"), ["--gateway", "'9100'", "127.0.0.1:9100"]),
    (("top", "--replay", "127.0.0.1:9", "--interval", "soon"), ["--interval", "'soon'"]),
    (("snapshot", "--replay", "127.0.0.1:1", "--stream", "s"), ["--replay", "tcp://127.0.0.1:1"]),
    # site mirroring
    (("mirror", "--source", DEAD, "--stream", "s"), ["--to"]),
    (("mirror", "--source", f"{DEAD},a:1", "--to", DEAD, "--stream", "s"), ["--source", "'a:1'", "tcp://"]),
    (("mirror", "promote", "--stream", "s", "--gateway", DEAD), ["--source", "--force"]),
    (("gateway", "--stream", "s", "--journal", "j", "--ingest", DEAD, "--mirror", "t"), ["--mirror t", "--stream t"]),
]


def test_the_walk_covers_every_subcommand() -> None:
    from gateway.cli import MODULES

    walked = {argv[0] for argv, _ in USAGE}
    assert set(MODULES) <= walked, f"subcommands without a bad-input case: {sorted(set(MODULES) - walked)}"


@pytest.mark.parametrize(("argv", "named"), USAGE, ids=[" ".join(a) for a, _ in USAGE])
def test_usage_errors_are_one_line_exit_2_naming_the_value(argv: tuple[str, ...], named: list[str]) -> None:
    one_line_error(zeps(*argv), 2, *named)


# --- config files ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('stream = ["a"\n', ["not valid TOML", "Unclosed array"]),
        ('heartbeat_ms = "fast"\n', ["'heartbeat_ms'", "'fast' is not a whole number"]),
        ("heartbeat_ms = 0\n", ["'heartbeat_ms'", "below the minimum 1"]),
        ("hearbeat_ms = 50\n", ["unknown key 'hearbeat_ms'", "did you mean 'heartbeat_ms'?"]),
        ('fsync = "sometimes"\n', ["'fsync'", "one of always, group, never"]),
        ("multicast = [1, 2]\n", ["'multicast'", "'1' has no transport"]),
        ('ingest = "127.0.0.1:5570"\n', ["'ingest'", "tcp://127.0.0.1:5570"]),
        ("stream = { a = 1 }\n", ["'stream'", "a table is not allowed"]),
        ('accept-corrupt-tail = "yes"\n', ["'accept-corrupt-tail'", "true or false"]),
    ],
)
def test_gateway_config_errors_name_file_key_and_allowed_values(tmp_path: Path, text: str, named: list[str]) -> None:
    config = tmp_path / "gw.toml"
    config.write_text(f'journal = "{tmp_path}"\n{text}')
    one_line_error(zeps("gateway", "--config", str(config)), 2, f"config {config}", *named)
    assert not (tmp_path / "a").exists()  # nothing started


def test_replay_config_file_and_its_errors(tmp_path: Path) -> None:
    config = tmp_path / "rp.toml"
    config.write_text("max_clients = -1\n")
    one_line_error(zeps("replay", "--config", str(config)), 2, "'max_clients'", "-1 is below the minimum 1")
    config.write_text("snapshot = false\n")
    one_line_error(zeps("replay", "--config", str(config)), 2, "unknown key 'snapshot'", "no_snapshots")
    one_line_error(zeps("replay", "--config", str(tmp_path / "none.toml")), 2, "none.toml", "no such file")


def test_gateway_config_values_are_used_and_the_command_line_wins(tmp_path: Path) -> None:
    config = tmp_path / "gw.toml"
    config.write_text(f'stream = ["{STREAM}"]\nmax-message-bytes = "1KiB"\n')
    gw = GatewayProcess(tmp_path / "j", "--config", str(config), streams=())
    try:
        one_line_error(zeps("publish", "--ingest", gw.ingest, "--stream", STREAM, "--count", "1", "--size", "2KiB"),
                       1, "over the limit of 1024")  # fmt: skip
        assert zeps("publish", "--ingest", gw.ingest, "--stream", STREAM, "--body", "small").returncode == 0
    finally:
        err = gw.stop()
    assert f"listening on {gw.ingest}" in err and err.count("listening on") == 1


# --- failures at run time: exit 1, one line -------------------------------------------------------------------


def test_runtime_failures_are_one_line_exit_1(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path / "j", streams=(STREAM,))
    try:
        taken = zeps("gateway", "--journal", str(tmp_path / "k"), "--stream", "s", "--ingest", gw.ingest)
        one_line_error(taken, 1, "Address already in use", gw.ingest, "choose another port")
        # A record over the limit the publisher knows is refused before it is sent: the input's fault, exit 2.
        big = zeps("publish", "--ingest", gw.ingest, "--stream", STREAM, "--count", "1", "--size", "3MiB")
        one_line_error(big, 2, "3145734 bytes", "--max-message-bytes")
        over = zeps("publish", "--ingest", gw.ingest, "--stream", STREAM, "--count", "1", "--size", "1100KiB")
        one_line_error(over, 2, "over the gateway's limit of 1048576")
        unknown = zeps("publish", "--ingest", gw.ingest, "--stream", "nope", "--body", "x")
        one_line_error(unknown, 1, "'nope'")
    finally:
        gw.stop()
    one_line_error(zeps("history", "--replay", DEAD, "--stream", "s", "--timeout", "300ms"), 1, "zeps replay")
    # A refused connection is an answer: a one-shot read fails at once, not after its --timeout (1 h here, longer
    # than zeps()'s own 60 s limit), and names the endpoint and the fix.
    for argv in (HIST, ("snapshot", *HIST[1:]), (*HIST, "--from", "-5")):
        refused = zeps(*argv, "--timeout", "1h")
        one_line_error(refused, 1, f"nothing listens at {DEAD} (connection refused)", "zeps replay")
    # A typo'd endpoint is said at once (a warning naming it), and scripts get a bound.
    waited = zeps(*SUB, "--connect-timeout", "1500ms")
    one_line_error(waited, 1, f"no answer from the replay sidecar at {DEAD} for 1.", "check --replay")
    assert f"waiting for the replay sidecar at {DEAD}: no answer for 0.5 s" in waited.stderr, waited.stderr
    one_line_error(zeps("journal", "inspect", str(tmp_path / "missing")), 2, "missing is not a directory")


# --- conventions, against a gateway and a sidecar on loopback --------------------------------------------------


@pytest.fixture
def servers(tmp_path: Path):
    root = tmp_path / "journal"
    gw = GatewayProcess(root, streams=(STREAM,))
    try:
        done = zeps("publish", "--count", "50", "--keys", "5", "--size", "12",
                    env={"ZEPS_INGEST": gw.ingest, "ZEPS_STREAM": STREAM})  # fmt: skip
        assert done.returncode == 0 and "published 50 records, last sequence 50" in done.stderr, done.stderr
        with start_sidecar(root) as side:
            yield gw, side
    finally:
        gw.stop()


def test_env_vars_fill_options_and_explicit_options_win(servers) -> None:
    _, side = servers
    env = {"ZEPS_REPLAY": side.endpoint, "ZEPS_STREAM": STREAM}
    assert len(zeps("history", env=env).stdout.splitlines()) == 50
    last5 = zeps("history", "--from", "-5", env=env)  # the sidecar's head asked first
    assert [json.loads(line)["seq"] for line in last5.stdout.splitlines()] == [46, 47, 48, 49, 50], last5.stderr
    wrong = env | {"ZEPS_REPLAY": DEAD}
    assert len(zeps("history", "--replay", side.endpoint, env=wrong).stdout.splitlines()) == 50  # option wins
    one_line_error(zeps("history", env={"ZEPS_REPLAY": "localhost:1", "ZEPS_STREAM": STREAM}), 2, "ZEPS_REPLAY")
    sub = zeps("subscribe", "--from", "earliest", "--count", "3", env=env)
    assert sub.returncode == 0 and len(sub.stdout.splitlines()) == 3, sub.stderr


@pytest.mark.parametrize(
    ("env", "argv", "named"),
    [
        ({"ZEPS_MULTICAST": "epgm://eth0;239.1.1.1:5555,239.1.1.2:5555"}, ("subscribe", "--stream", "s"),
         ["ZEPS_MULTICAST", "'239.1.1.2:5555' has no transport"]),
        ({"ZEPS_INGEST": "127.0.0.1:5570"}, ("publish", "--stream", "s", "--body", "x"), ["ZEPS_INGEST", "tcp://"]),
        ({"ZEPS_STREAM": "a b"}, ("history", "--replay", DEAD), ["ZEPS_STREAM", "'a b'"]),
        ({"ZEPS_CURVE_KEY": "/nonexistent/c.key_secret"}, (*HIST, "--timeout", "1s"), ["--curve-server"]),
    ],
)  # fmt: skip
def test_env_var_errors_name_the_variable(env: dict[str, str], argv: tuple[str, ...], named: list[str]) -> None:
    one_line_error(zeps(*argv, env=env), 2, *named)


def test_verbose_and_quiet_anywhere_on_the_line(servers) -> None:
    gw, side = servers
    publish = ("publish", "--ingest", gw.ingest, "--stream", STREAM, "--body", "x")
    assert "published 1 records" in zeps(*publish).stderr
    for argv in (("-q", *publish), (*publish, "-q"), (*publish, "--quiet")):
        done = zeps(*argv)
        assert done.returncode == 0 and done.stderr == "", (argv, done.stderr)
    history = ("history", "--replay", side.endpoint, "--stream", STREAM, "--from", "-2")
    assert zeps(*history).stderr == ""
    for argv in (("-v", *history), (*history, "-v"), (*history, "--verbose")):
        assert zeps(*argv).stderr == "zeps history: 2 records\n", argv
    failed = zeps("-v", "history", "--replay", DEAD, "--stream", STREAM, "--timeout", "300ms", "-v")  # -vv
    assert failed.returncode == 1 and " DEBUG gateway.cli zeps history failed" in failed.stderr  # for bug reports


def test_formats_last_n_and_since(servers) -> None:
    _, side = servers
    hist = ("history", "--replay", side.endpoint, "--stream", STREAM)
    raw = subprocess.run([*ZEPS, *hist, "--from", "-3", "--format", "raw"], capture_output=True, timeout=60)
    assert raw.returncode == 0 and raw.stdout == b"47:xxxxxxxxx\n48:xxxxxxxxx\n49:xxxxxxxxx\n", raw.stderr
    text = zeps(*hist, "--from", "-1", "--format", "text").stdout.split()
    assert text[0] == "50" and text[1].endswith("Z") and text[2:] == ["key004", "49:xxxxxxxxx"]
    lines = zeps(*hist, "--from", "-2").stdout.splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [49, 50]
    assert len(zeps(*hist, "--since", "10m").stdout.splitlines()) == 50
    assert zeps(*hist, "--since", "1ms").stdout == ""  # journaled more than 1 ms ago
    sub = zeps("subscribe", "--replay", side.endpoint, "--stream", STREAM, "--from", "-4", "--timeout", "1s",
               "--format", "text")  # fmt: skip
    assert [line.split()[0] for line in sub.stdout.splitlines()] == ["47", "48", "49", "50"], sub.stderr


def test_subscribe_summary_counts_what_it_printed(servers) -> None:
    _, side = servers
    sub = zeps("subscribe", "--replay", side.endpoint, "--stream", STREAM, "--from", "earliest", "--count", "5")
    assert sub.returncode == 0 and len(sub.stdout.splitlines()) == 5
    assert "records=5, from_live=0, from_replay=5, from_snapshot=0" in sub.stderr, sub.stderr


@pytest.mark.parametrize("command", ["subscribe", "history"])
def test_a_closed_pipe_ends_quietly(servers, command: str) -> None:
    gw, side = servers
    more = zeps("publish", "--ingest", gw.ingest, "--stream", STREAM, "--count", "3000")  # more than a pipe holds
    assert more.returncode == 0, more.stderr
    argv = [*ZEPS, command, "--replay", side.endpoint, "--stream", STREAM, "--from", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=CLEAN_ENV)  # `| head -1`
    assert proc.stdout is not None and proc.stdout.readline()
    proc.stdout.close()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and b"Broken pipe" not in err and b"Traceback" not in err, err


def test_doctor_says_one_line_a_finding_and_fails_on_what_is_needed() -> None:
    done = zeps("doctor", "--transport", "epgm", "--transport", "norm")
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and done.stderr == "", done.stderr  # this machine runs the project's tests
    assert [line.split()[1] for line in lines][:5] == ["openpgm", "libnorm", "pyzmq", "record", "pgm"]
    assert all(line.startswith(("ok ", "hint ")) for line in lines), lines
    dead = zeps("doctor", "--etcd", DEAD.replace("tcp", "http"))
    assert dead.returncode == 1 and dead.stdout.splitlines()[-1].startswith("FAIL etcd"), dead.stdout
    assert "does not answer" in dead.stdout and "start it, or check the URL" in dead.stdout


def test_history_at_the_ingest_port_says_it_is_not_a_sidecar(servers) -> None:
    gw, _ = servers
    done = zeps("history", "--replay", gw.ingest, "--stream", STREAM)
    one_line_error(done, 1, gw.ingest, "not a replay sidecar", "the gateway's ingest", "`zeps replay`")


def test_replay_says_at_once_what_it_waits_for_and_again_with_the_time(tmp_path: Path) -> None:
    root = tmp_path / "typo"
    argv = [*ZEPS, "replay", "--journal", str(root), "--bind", f"tcp://127.0.0.1:{free_port()}"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=CLEAN_ENV)
    try:
        assert proc.stderr is not None
        began = time.monotonic()
        while f"{root} does not exist yet" not in (line := proc.stderr.readline()):
            assert line, "zeps replay ended without saying what it waits for"
        assert time.monotonic() - began < 5.0  # at start, not after a retry
        while "still no journal" not in (line := proc.stderr.readline()):
            assert line, "zeps replay ended without saying it again"
        assert f"at {root} after 5 s" in line and f"--journal {root}" in line, line
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_replay_quiet_prints_nothing(tmp_path: Path) -> None:
    argv = [*ZEPS, "replay", "-q", "--journal", str(tmp_path), "--bind", f"tcp://127.0.0.1:{free_port()}"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=CLEAN_ENV)
    time.sleep(2.0)
    assert proc.poll() is None, proc.communicate()
    proc.terminate()
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out == "" and err == "", (out, err)


# --- journals: repair, a corrupt tail, a corrupt middle ------------------------------------------------------


def _journal(root: Path, batches: int = 6) -> tuple[Stream, Path]:
    s = Stream(root, STREAM)
    s.write(batches, per_batch=10)
    s.writer.close()
    return s, s.writer.directory / "00000000000000000001.seg"


def test_gateway_refuses_a_corrupt_tail_until_repaired(tmp_path: Path) -> None:
    root = tmp_path / "journal"
    s, seg = _journal(root)
    data = bytearray(seg.read_bytes())
    last = len(data) - len(s.batches[-1])
    data[last + HEADER_SIZE + 5] ^= 0x40  # the last batch, whole, with a bad CRC: damage, not a torn write
    seg.write_bytes(bytes(data))
    start = ("gateway", "--journal", str(root), "--stream", STREAM, "--ingest", f"tcp://127.0.0.1:{free_port()}")
    one_line_error(zeps(*start), 1, f"{seg} @ byte {last}", "CRC32C", f"zeps journal repair {root}", "--accept-corrupt")
    assert seg.stat().st_size == len(data)  # nothing changed

    asked = zeps("journal", "repair", str(root), stdin="")
    assert asked.returncode == 2 and "pass --yes" in asked.stderr and f"{seg.name} byte {last}" in asked.stdout
    assert seg.stat().st_size == len(data)
    done = zeps("journal", "repair", str(root), "--yes")
    assert done.returncode == 0 and "the last good sequence is 50" in done.stdout, done.stdout + done.stderr
    assert seg.stat().st_size == last and verify_root(root).clean

    gw = GatewayProcess(root, streams=(STREAM,))  # starts now; the cut sequences are never reused
    try:
        assert zeps("publish", "--ingest", gw.ingest, "--stream", STREAM, "--body", "after").returncode == 0
    finally:
        gw.stop()
    with JournalReader(root, STREAM).cursor(61) as cursor:
        batch = cursor.next_batch()
    assert batch is not None and [(r.seq, r.body) for r in batch.records()] == [(61, b"after")]


def test_repair_rebuilds_a_bad_index_and_says_clean(tmp_path: Path) -> None:
    """A bad index is rebuilt from its segment, not only deleted: verify is clean after, and repair exits 0."""
    root = tmp_path / "journal"
    _, seg = _journal(root)
    idx = seg.with_suffix(".idx")
    good = idx.read_bytes()
    idx.write_bytes(good[:8] + bytes(8) + good[16:])  # an entry's sequence zeroed: it names no batch
    assert not verify_root(root).clean
    done = zeps("journal", "repair", str(root), "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"rebuilt {idx}" in done.stdout and "clean:" in done.stdout.splitlines()[-1]
    assert verify_root(root).clean and idx.read_bytes()
    with JournalReader(root, STREAM).cursor(1) as cursor:
        assert [r.seq for b in iter(cursor.next_batch, None) for r in b.records()] == list(range(1, 61))


def test_torn_tails_need_nothing_and_accept_corrupt_tail_cuts_damage(tmp_path: Path) -> None:
    root = tmp_path / "journal"
    s, seg = _journal(root)
    whole = seg.stat().st_size
    with seg.open("ab") as f:  # a torn write (a crash mid-write): half a batch at the end
        f.write(s.batches[0][: len(s.batches[0]) // 2])
    GatewayProcess(root, streams=(STREAM,)).stop()
    assert seg.stat().st_size == whole and verify_root(root).clean
    data = bytearray(seg.read_bytes())
    data[len(data) - 3] ^= 0x01  # damage in the last batch
    seg.write_bytes(bytes(data))
    GatewayProcess(root, "--accept-corrupt-tail", streams=(STREAM,)).stop()
    assert seg.stat().st_size == whole - len(s.batches[-1])


def test_corrupt_middle_reason_reaching_clients_is_short_and_whole(tmp_path: Path) -> None:
    root = tmp_path / "journal"
    s, seg = _journal(root)
    data = bytearray(seg.read_bytes())
    data[len(s.batches[0]) + HEADER_SIZE + 5] ^= 0x40  # the second of six batches
    seg.write_bytes(bytes(data))
    with start_sidecar(root) as side:
        done = zeps("history", "--replay", side.endpoint, "--stream", STREAM)
    assert done.returncode == 1 and len(done.stdout.splitlines()) in (0, 10)  # the first batch at most
    one_line_error(done, 1, "journal corrupt: 00000000000000000001.seg byte", "CRC32C", "the sidecar's log says more")
    assert done.stderr.rstrip().endswith("how to repair it")  # not cut mid-word
    report = zeps("journal", "verify", str(root), "--json")
    assert report.returncode == 1 and json.loads(report.stdout)["problems"][0]["offset"] == len(s.batches[0])
    info = json.loads(zeps("journal", "inspect", str(root), "--json").stdout)
    assert (info["stream"], info["first_seq"], info["segments"]) == (STREAM, 1, 1)
