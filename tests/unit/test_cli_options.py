"""The types and rules of `zeps` options (gateway.cli.options) and config files (gateway.cli.config)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gateway.cli import config
from gateway.cli.main import build_parser
from gateway.cli.options import byte_size, duration, host_port, position, tcp_endpoint
from gateway.client.start_point import parse_time
from gateway.errors import ConfigError


def test_byte_sizes_take_units() -> None:
    parse = byte_size(1)
    assert [parse(t) for t in ("1500", "64KiB", "1.5MiB", "2GB", "64k", "1 mib")] == [
        1500, 65536, 1572864, 2 * 10**9, 64000, 1 << 20,
    ]  # fmt: skip
    for bad in ("0", "-5", "1TB", "MiB", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(bad)


def test_durations_take_units_and_must_be_positive() -> None:
    assert [duration(t) for t in ("30", "1.5s", "250ms", "5m", "2h", "1d")] == [30, 1.5, 0.25, 300, 7200, 86400]
    for bad in ("0", "-1", "soon", "5y"):
        with pytest.raises(argparse.ArgumentTypeError):
            duration(bad)


def test_positions_and_times() -> None:
    parse = position(("earliest",))
    assert parse("earliest").word == "earliest" and parse("42").seq == 42 and parse("-10").back == 10
    assert parse("1970-01-01T00:00:01Z").time_ns == 10**9
    assert parse_time("1970-01-01T01:00:01+01:00") == 10**9
    with pytest.raises(argparse.ArgumentTypeError, match="names no time zone"):
        parse("2026-05-01T09:30:00")
    with pytest.raises(argparse.ArgumentTypeError, match="N >= 1"):
        parse("-0")


def test_endpoints() -> None:
    assert tcp_endpoint("tcp://127.0.0.1:0") == "tcp://127.0.0.1:0" and tcp_endpoint("tcp://*:5570")
    for bad, said in (("127.0.0.1:5570", "write tcp://127.0.0.1:5570"), ("tcp://h", "tcp://HOST:PORT"),
                      ("tcp://h:70000", "tcp://HOST:PORT"), ("ipc:///x", "only tcp://")):  # fmt: skip
        with pytest.raises(argparse.ArgumentTypeError, match=said):
            tcp_endpoint(bad)
    assert host_port("127.0.0.1:9108") and host_port("[::1]:9108")
    with pytest.raises(argparse.ArgumentTypeError, match=r"127\.0\.0\.1:9100"):
        host_port("9100")


def _subparser(name: str) -> argparse.ArgumentParser:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices[name]


def test_config_schema_is_the_parser(tmp_path: Path) -> None:
    replay = _subparser("replay")
    path = tmp_path / "rp.toml"
    path.write_text('no-snapshots = true\nmax_clients = 9\nclient_timeout = "2m"\nbind = "tcp://127.0.0.1:0"\n')
    assert config.load(path, replay) == {"snapshots": False, "max_clients": 9, "client_timeout": 120.0,
                                         "bind": "tcp://127.0.0.1:0"}  # fmt: skip
    gateway = _subparser("gateway")
    path.write_text('stream = "one"\nmulticast = ["udp://10.0.0.1;239.192.1.1:5555"]\nmax_message_bytes = "4MiB"\n')
    assert config.load(path, gateway) == {
        "stream": ["one"], "multicast": ["udp://10.0.0.1;239.192.1.1:5555"], "max_message_bytes": 4 << 20,
    }  # fmt: skip
    assert "verbose" not in config.schema(gateway) and "help" not in config.schema(gateway)
    path.write_text("rate_kbps = true\n")
    with pytest.raises(ConfigError, match="'rate_kbps' = True: bool is not allowed here: expected multicast rate"):
        config.load(path, gateway)


def test_command_line_wins_over_the_config_file() -> None:
    args = argparse.Namespace(max_clients=5, stream=[], journal=None)
    config.merge(args, {"max_clients": 9, "stream": ["a"], "journal": Path("/j")})
    assert (args.max_clients, args.stream, args.journal) == (5, ["a"], Path("/j"))


def test_pgm_engine_chooses_who_drives_pgm(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.cli.gateway import configure

    monkeypatch.delenv("ZEPS_PGM_ENGINE", raising=False)
    base = ["gateway", "--stream", "px", "--journal", "/nonexistent", "--ingest", "tcp://127.0.0.1:5570"]
    assert configure(build_parser().parse_args(base)).tuning.libzmq_pgm is False
    assert configure(build_parser().parse_args([*base, "--pgm-engine", "libzmq"])).tuning.libzmq_pgm is True
    monkeypatch.setenv("ZEPS_PGM_ENGINE", "libzmq")  # the option wins over the environment
    assert configure(build_parser().parse_args([*base, "--pgm-engine", "openpgm"])).tuning.libzmq_pgm is False
    args = build_parser().parse_args(["subscribe", "--stream", "px", "--replay", "tcp://127.0.0.1:5580"])
    assert (args.pgm_engine, args.fill_udp) == (None, None)


def test_suspect_ms_sets_the_followers_suspicion_timeout() -> None:
    from gateway.cli.gateway import configure

    base = ["gateway", "--stream", "px", "--journal", "/nonexistent", "--ingest", "tcp://127.0.0.1:5570"]
    assert configure(build_parser().parse_args(base)).ha_suspect_s == 0.3
    assert configure(build_parser().parse_args([*base, "--suspect-ms", "150"])).ha_suspect_s == 0.15
    with pytest.raises(SystemExit):
        build_parser().parse_args([*base, "--suspect-ms", "0"])
