"""The one rule for a ZeroMQ TCP endpoint written by a person: tcp://HOST:PORT, checked before any socket.

libzmq refuses a malformed endpoint with a bare "Invalid argument" at connect time; this names the mistake and
the fix instead, for the command line and the Python API alike.
"""

from __future__ import annotations

from gateway.errors import ConfigError


def check_tcp_endpoint(text: str) -> str:
    """`text` if it is tcp://HOST:PORT (port * or 0 where a server binds to any free port), else ConfigError."""
    if "://" not in text:
        raise ConfigError(f"{text!r} has no transport: write tcp://{text}")
    scheme, _, rest = text.partition("://")
    if scheme != "tcp":
        raise ConfigError(f"{text!r}: only tcp:// is served here (e.g. tcp://127.0.0.1:5570)")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not (port == "*" or (port.isdigit() and 0 <= int(port) < 65536)):
        raise ConfigError(f"{text!r} is not tcp://HOST:PORT (e.g. tcp://127.0.0.1:5570)")
    return text
