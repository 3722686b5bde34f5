"""TOML config files for the servers (`zeps gateway --config`, `zeps replay --config`), checked like the command line.

The schema is the command's own parser: a key is a long option (`max-message-bytes` or `max_message_bytes`),
and its value goes through the option's type and choices, so a value means the same in the file as on the
command line and is refused for the same reasons. Unknown keys are refused (a misspelt key would otherwise
leave a default in force without a word), naming the nearest known key. Every error is a ConfigError (exit
status 2) of one line that names the file, the key, what is wrong and what is allowed.
"""

from __future__ import annotations

import argparse
import difflib
import tomllib
from pathlib import Path
from typing import Any

from gateway.errors import ConfigError

_NOT_KEYS = frozenset({"help", "config", "verbose", "quiet", "sub_verbose", "sub_quiet"})


def schema(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Config keys (long option names with '_') -> the option they set."""
    keys = {}
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and action.dest not in _NOT_KEYS and not isinstance(action, argparse._VersionAction):
            keys[longs[0][2:].replace("-", "_")] = action
    return keys


def load(path: Path, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The settings of a config file as {dest: checked value}. ConfigError for anything wrong in it."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config {path}: no such file: give the path of a TOML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config {path}: cannot be read ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {path}: not valid TOML: {exc}") from None
    keys = schema(parser)
    settings = {}
    for raw_key, value in data.items():
        key = raw_key.replace("-", "_")
        action = keys.get(key)
        if action is None:
            near = difflib.get_close_matches(key, keys, n=1)
            hint = f"did you mean '{near[0]}'? " if near else ""
            raise ConfigError(f"config {path}: unknown key '{raw_key}': {hint}known keys: {', '.join(sorted(keys))}")
        settings[action.dest] = _value(path, raw_key, value, action)
    return settings


def _value(path: Path, key: str, value: Any, action: argparse.Action) -> Any:
    where = f"config {path}: key '{key}' = {value!r}"
    if action.nargs == 0:  # a flag
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false")
        return value if action.const else not value  # store_true, or store_false (--no-snapshots)
    many = isinstance(action, argparse._AppendAction)
    values = value if many and isinstance(value, list) else [value]
    out = [_one(where, item, action) for item in values]
    return out if many else out[0]


def _one(where: str, value: Any, action: argparse.Action) -> Any:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        kind = "a list" if isinstance(value, list) else "a table" if isinstance(value, dict) else type(value).__name__
        raise ConfigError(f"{where}: {kind} is not allowed here: expected {_expected(action)}")
    text = str(value)
    try:
        converted = action.type(text) if callable(action.type) else text
    except (argparse.ArgumentTypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if action.choices is not None and converted not in action.choices:
        raise ConfigError(f"{where}: expected one of {', '.join(map(str, action.choices))}")
    return converted


def _expected(action: argparse.Action) -> str:
    if action.choices is not None:
        return "one of " + ", ".join(map(str, action.choices))
    return (action.help or "a value").split(" (")[0]


def merge(args: argparse.Namespace, settings: dict[str, Any]) -> None:
    """Fill the options not given on the command line from the file's settings: the command line wins."""
    for dest, value in settings.items():
        if getattr(args, dest, None) in (None, []):
            setattr(args, dest, value)
