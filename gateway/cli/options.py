"""How input enters `zeps`: the argument types, the parser rules, and environment variables, in one place.

Every value is checked where it enters, so a mistake ends at parse time in one line naming the value, the
rule and the fix, with exit status 2 (argparse's own for usage errors), before any socket or file is opened:

- `type=` functions below turn text into checked values (endpoints, counts, byte sizes, durations, positions)
  and raise argparse.ArgumentTypeError with the reason; argparse adds the option's name.
- `Parser` refuses a single-valued option given twice (argparse would keep the last one in silence), runs the
  checks a command registers on combinations of options, and fills options from environment variables:
  an option given on the command line always wins over its variable.
- The TOML config files of the servers go through the same types (gateway.cli.config).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from gateway.client.start_point import StartPoint, parse_start
from gateway.errors import ConfigError

Check = Callable[[argparse.Namespace], str | None]  # a rule over several options: the error, or None

# --- types -------------------------------------------------------------------------------------------------

_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 10**6, "mb": 10**6, "mib": 1 << 20}
_SIZE_UNITS |= {"g": 10**9, "gb": 10**9, "gib": 1 << 30}
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_NUMBER_UNIT = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")
_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")  # argparse's words (3.11)
_HOST_PORT = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+|\*):(\d+|\*)$")


def add_pgm_engine(p: argparse.ArgumentParser) -> None:
    """--pgm-engine: which engine drives epgm:// and pgm:// in this process (gateway.mcast.Tuning.libzmq_pgm)."""
    from gateway.mcast import PGM_ENGINE_ENV, PGM_ENGINES

    p.add_argument(
        "--pgm-engine",
        choices=PGM_ENGINES,
        help=f"who drives epgm:// and pgm://: libzmq (its fixed NAK timers) or openpgm (NAKs in milliseconds; "
        f"docs/pgm.md says when to choose which); default: ${PGM_ENGINE_ENV}, else openpgm",
    )


def integer(low: int | None = None, high: int | None = None, what: str = "") -> Callable[[str], int]:
    """An int within low..high (either bound optional); `what` names the unit in the message."""

    def parse(text: str) -> int:
        try:
            value = int(text.replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number{_unit(what)}") from None
        _check_range(text, value, low, high, what)
        return value

    parse.__name__ = "integer"  # argparse names the type in "invalid <name> value" messages
    return parse


def number(low: float | None = None, high: float | None = None, what: str = "", *, above: bool = False):
    """A float within low..high; `above` makes low exclusive (a rate or a time that must be > 0)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number{_unit(what)}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if above and low is not None and value <= low:
            raise argparse.ArgumentTypeError(f"{text} must be more than {low:g}{_unit(what)}")
        _check_range(text, value, None if above else low, high, what)
        return value

    parse.__name__ = "number"
    return parse


def _unit(what: str) -> str:
    return f" ({what})" if what else ""


def _check_range(text: str, value: float, low: float | None, high: float | None, what: str) -> None:
    if low is not None and value < low:
        raise argparse.ArgumentTypeError(f"{text} is below the minimum {_show(low)}{_unit(what)}")
    if high is not None and value > high:
        raise argparse.ArgumentTypeError(f"{text} is above the maximum {_show(high)}{_unit(what)}")


def _show(bound: float) -> str:
    return str(int(bound)) if bound == int(bound) else f"{bound:g}"


positive = integer(1)
nonnegative = integer(0)


def byte_size(low: int = 0, high: int | None = None) -> Callable[[str], int]:
    """Bytes, as a number with an optional unit: 1500, 64k, 64KiB, 1.5MiB, 2G (k/M/G are powers of 1000)."""

    def parse(text: str) -> int:
        match = _NUMBER_UNIT.match(text)
        unit = match.group(2).lower() if match else ""
        if not match or unit not in _SIZE_UNITS:
            raise argparse.ArgumentTypeError(f"{text!r} is not a byte size (e.g. 1500, 64KiB, 1MiB, 2GB)")
        value = int(float(match.group(1)) * _SIZE_UNITS[unit])
        _check_range(text, value, low, high, "bytes")
        return value

    parse.__name__ = "byte size"
    return parse


def duration(text: str) -> float:
    """Seconds, from a number with an optional unit: 30, 1.5s, 250ms, 5m, 2h, 1d (no unit: seconds)."""
    match = _NUMBER_UNIT.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or (unit and unit not in _DURATION_UNITS):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 30s, 250ms, 5m, 2h, 1d)")
    value = float(match.group(1)) * _DURATION_UNITS.get(unit, 1.0)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive duration")
    return value


def host_port(text: str) -> str:
    """HOST:PORT for an HTTP listener (metrics): a port alone is refused, since it would bind every interface."""
    match = _HOST_PORT.match(text)
    if not match or not 0 < int(match.group(1)) < 65536:
        hint = f"127.0.0.1:{text}" if text.isdigit() else "127.0.0.1:9108"
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT: e.g. {hint}")
    return text


def tcp_endpoint(text: str) -> str:
    """A ZeroMQ TCP endpoint, tcp://HOST:PORT (port * or 0 where a server binds to any free port)."""
    from gateway.errors import ConfigError
    from gateway.transport.tcp_endpoint import check_tcp_endpoint

    try:
        return check_tcp_endpoint(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def mcast_endpoint(text: str) -> str:
    """A multicast endpoint: epgm://IFACE;GROUP:PORT, norm://..., udp://... (gateway.mcast parses the rest)."""
    if "://" not in text:
        raise argparse.ArgumentTypeError(f"{text!r} has no transport: write epgm://IFACE;{text}, norm:// or udp://")
    from gateway.errors import McastError
    from gateway.mcast import Endpoint

    try:
        Endpoint.parse(text)
    except (McastError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def mcast_channel(text: str) -> str:
    """`[STREAM=]ENDPOINT`: a multicast endpoint carrying every stream, or one stream (gateway.sequencer.channels)."""
    head, sep, _ = text.partition("://")
    stream, eq, _transport = head.rpartition("=")
    if sep and eq:
        stream_name(stream)
        mcast_endpoint(text[len(stream) + 1 :])
        return text
    return mcast_endpoint(text)


def stream_name(text: str) -> str:
    from gateway.errors import ProtocolError
    from gateway.wire.protocol import validate_stream_name

    try:
        validate_stream_name(text)
    except (ProtocolError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def position(words: Sequence[str] = ()) -> Callable[[str], StartPoint]:
    """A start position (gateway.client.start_point): SEQ, -N (the last N records), an ISO-8601 time with a
    zone, or one of `words`."""

    def parse(text: str) -> StartPoint:
        try:
            return parse_start(text, words, hint="for a relative time use --since 5m")
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = "position"
    return parse


def journal_root(text: str) -> Path:
    """A journal root: a directory, or a path that does not exist yet (the gateway creates it); not a file."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text!r} is a file, not a directory: give the journal root (a subdirectory per stream; made if missing)"
        )
    return path


# --- the parser --------------------------------------------------------------------------------------------


class _StoreOnce(argparse._StoreAction):
    """A single-valued option given twice is a mistake (argparse would keep the last one in silence)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        seen = namespace.__dict__.setdefault("_given", set())
        if self.dest in seen:
            raise argparse.ArgumentError(self, f"given twice ({values!r} the second time): {self.dest} takes one value")
        seen.add(self.dest)
        super().__call__(parser, namespace, values, option_string)


@dataclass(frozen=True)
class EnvOption:
    dest: str
    var: str
    required: bool
    many: bool  # an append option: the variable holds a comma-separated list


class Parser(argparse.ArgumentParser):
    """argparse with the rules of every `zeps` command (module docstring). Subcommands get this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)
        self.env_options: list[EnvOption] = []
        self.checks: list[Check] = []
        self.required_options: list[str] = []  # dests to name when missing (not argparse-required: env may fill)

    def error(self, message: str) -> NoReturn:
        """One line (argparse prints the whole usage first): the error, the choice probably meant (a mistyped
        subcommand or choice), and where to read more."""
        if m := _INVALID_CHOICE.search(message):
            choices = [c.strip(" '") for c in m.group(2).split(",")]
            close = difflib.get_close_matches(m.group(1), choices, n=1, cutoff=0.6)
            message += f"; did you mean {close[0]}?" if close else ""
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        """argparse's, with unknown options refused by the (sub)command that was given them, with a suggestion:
        `zeps history --strem s` says "did you mean --stream?" (argparse's own message names neither)."""
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            parser = getattr(parsed, "parser", self)
            parser.error(f"unrecognized arguments: {' '.join(unknown)}{parser.suggest(unknown)}")
        return parsed

    def suggest(self, unknown: Sequence[str]) -> str:
        """ "; did you mean --x?" for the first unknown option close to one of this parser's, else ""."""
        known = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
        for word in unknown:
            if word.startswith("--"):
                close = difflib.get_close_matches(word.partition("=")[0], known, n=1, cutoff=0.6)
                if close:
                    return f"; did you mean {close[0]}?"
        return ""

    def from_env(self, action: argparse.Action, var: str, *, required: bool = False) -> None:
        """Fill `action` from environment variable `var` when the option is not given."""
        many = isinstance(action, argparse._AppendAction)
        self.env_options.append(EnvOption(action.dest, var, required, many))
        action.help = f"{action.help or ''} [env {var}]".strip()

    def require(self, *dests: str) -> None:
        self.required_options.extend(dests)

    def check(self, rule: Check) -> None:
        self.checks.append(rule)

    def finish(self, args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> None:
        """After parsing: environment variables for options not given, required options, then the checks."""
        actions = {a.dest: a for a in self._actions}
        for opt in self.env_options:
            action = actions[opt.dest]
            if getattr(args, opt.dest) not in (None, []) or not environ.get(opt.var):
                continue
            texts = [t.strip() for t in environ[opt.var].split(",") if t.strip()] if opt.many else [environ[opt.var]]
            values = []
            for text in texts:
                try:
                    values.append(action.type(text) if callable(action.type) else text)
                except argparse.ArgumentTypeError as exc:
                    self.error(f"environment variable {opt.var}: {exc}")
            setattr(args, opt.dest, values if opt.many else values[0])
        env_of = {o.dest: o.var for o in self.env_options}
        for dest in self.required_options:
            if getattr(args, dest) in (None, []):
                flag = "--" + dest.replace("_", "-")
                also = f" (or set {env_of[dest]})" if dest in env_of else ""
                self.error(f"the following arguments are required: {flag}{also}")
        for rule in self.checks:
            if (message := rule(args)) is not None:
                self.error(message)


def option(p: argparse.ArgumentParser, dest: str) -> argparse.Action:
    """The action of `p` that stores into `dest`."""
    return next(a for a in p._actions if a.dest == dest)


def say(args: argparse.Namespace, text: str) -> None:
    """An informational line on stderr (summaries, "listening on"), unless -q."""
    if getattr(args, "verbosity", 0) >= 0:
        print(text, file=sys.stderr, flush=True)
