"""Discovery options shared by the commands (docs/discovery.md): where servers announce, where clients look."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gateway.cli import tls_opts

if TYPE_CHECKING:  # the library is imported when a command runs, not for `zeps --help`
    from gateway.client.directory import Directory
    from gateway.discovery.announcer import Discovery
    from gateway.wire.streamkey import StreamKey

_WHERE = "discovery group and port (default 239.192.0.1:5569)"
ETCD_SERVER_HELP = "also register in the directory kept in etcd at URL (repeatable or comma-separated: one cluster)"


def add_server_options(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--announce-interface", action="append", metavar="IF", help=f"announce here (repeatable; {default})")
    p.add_argument("--discovery", metavar="GROUP:PORT", help=_WHERE)
    p.add_argument("--announce-ms", type=int, help="announcement interval (default 1000; 0: do not announce)")
    p.add_argument(
        "--node", help="node name announced (default: the host name); with --etcd, this node's name in its group"
    )


def add_client_options(p: argparse.ArgumentParser, *, timeout: bool = True) -> None:
    p.add_argument("--interface", metavar="IF", help="find the stream by its announcements heard on this interface")
    p.add_argument("--discovery", metavar="GROUP:PORT", help=_WHERE)
    p.add_argument(
        "--etcd", action="append", metavar="URL", help="find the stream in the directory kept in etcd (repeatable)"
    )
    tls_opts.add_etcd_options(p)
    p.add_argument("--directory", metavar="FILE", help="find the stream in this TOML/JSON file (docs/discovery.md)")
    if timeout:
        p.add_argument("--discovery-timeout", type=float, default=3.0, help="wait this long for announcements (3 s)")


def server_discovery(settings: dict[str, Any]) -> Discovery:
    """The Discovery for `zeps gateway`/`zeps replay` settings (CLI and TOML keys alike)."""
    from gateway.discovery.announcer import Discovery, parse_group

    given: dict[str, Any] = {}
    if settings.get("announce_interface"):
        interfaces = settings["announce_interface"]
        given["interfaces"] = (interfaces,) if isinstance(interfaces, str) else tuple(interfaces)
    if settings.get("discovery"):
        given["group"], given["port"] = parse_group(settings["discovery"])
    if settings.get("announce_ms") is not None:
        given["interval_ms"] = settings["announce_ms"]
    if settings.get("node"):
        given["node"] = settings["node"]
    return Discovery(**given)


def etcd_urls(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """--etcd as given (repeated, comma-separated, or a TOML string or list): the URLs, checked (ConfigError)."""
    from gateway.errors import ConfigError, CoordinatorError
    from gateway.transport.etcd import check_url

    given = [value] if isinstance(value, str) else list(value or ())
    urls = tuple(url.strip() for text in given for url in text.split(",") if url.strip())
    try:
        return tuple(check_url(url) for url in urls)
    except CoordinatorError as exc:
        raise ConfigError(str(exc)) from None


def client_directory(args: argparse.Namespace, keys: Sequence[StreamKey]) -> Directory | None:
    """Where to resolve stream names: etcd (--etcd), else a file (--directory), else the LAN's announcements on
    --interface (which, with the others, is where channels are joined); None with none of them."""
    from gateway.client.directory import LanDirectory
    from gateway.discovery.announcer import parse_group
    from gateway.wire.announce import DISCOVERY_GROUP, DISCOVERY_PORT

    if args.etcd:
        from gateway.client.etcd_directory import EtcdDirectory
        from gateway.transport.etcd import Cluster

        return EtcdDirectory(Cluster(etcd_urls(args.etcd), tls_opts.etcd_tls(args)), keys=keys)
    if args.directory:
        from gateway.client.file_directory import FileDirectory

        return FileDirectory(args.directory)
    if not args.interface:
        return None
    group, port = parse_group(args.discovery) if args.discovery else (DISCOVERY_GROUP, DISCOVERY_PORT)
    return LanDirectory(args.interface, group=group, port=port, keys=keys)
