"""deploy/: the systemd units' command lines, the TOML files and the subscriber's environment file are read by
the commands' own parsers (gateway.cli.config for TOML), so an example that drifts from the options fails here."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from gateway.cli import config
from gateway.cli.main import build_parser

DEPLOY = Path(__file__).parents[2] / "deploy"


def exec_start(unit: str) -> list[str]:
    lines = [line for line in (DEPLOY / unit).read_text().splitlines() if line.startswith("ExecStart=")]
    assert len(lines) == 1, unit
    argv = shlex.split(lines[0].removeprefix("ExecStart="))
    assert argv[0].endswith("/zeps"), argv
    return argv[1:]


def environment(name: str) -> dict[str, str]:
    lines = [line for line in (DEPLOY / name).read_text().splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


@pytest.mark.parametrize(
    ("unit", "toml"), [("zeps-gateway.service", "gateway.toml"), ("zeps-replay.service", "replay.toml")]
)
def test_a_server_unit_runs_its_toml_and_every_key_is_an_option(unit: str, toml: str) -> None:
    args = build_parser().parse_args(exec_start(unit))
    assert args.config == Path("/etc/zeps") / toml
    settings = config.load(DEPLOY / toml, args.parser)
    config.merge(args, settings)
    args.parser.finish(args, environ={})
    assert str(args.journal) == "/var/lib/zeps/journal" and args.metrics


def test_the_subscriber_unit_runs_with_its_environment_file() -> None:
    argv = exec_start("zeps-subscriber.service")
    env = environment("subscriber.env")
    args = build_parser().parse_args(argv)
    assert set(env) <= {opt.var for opt in args.parser.env_options}, "a variable zeps subscribe does not read"
    args.parser.finish(args, environ=env)
    assert args.stream == "px" and args.replay and args.multicast and args.checkpoint
