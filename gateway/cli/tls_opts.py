"""TLS options of a group's TCP (docs/security.md, "The group's TCP"): the peer link between its nodes
(--peer-tls-*) and etcd's client connections (--etcd-ca, --etcd-cert, --etcd-key). Each set is all or nothing."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the library is imported when a command runs, not for `zeps --help`
    from gateway.transport.tls import EtcdTls, PeerTls

PEER = ("peer_tls_cert", "peer_tls_key", "peer_tls_ca")
ETCD = ("etcd_ca", "etcd_cert", "etcd_key")


def add_etcd_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--etcd-ca", metavar="FILE", help="etcd over https://: the CA its members' certificates are of")
    p.add_argument("--etcd-cert", metavar="FILE", help="etcd with --client-cert-auth: this client's certificate")
    p.add_argument("--etcd-key", metavar="FILE", help="with --etcd-cert: its private key")


def add_gateway_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--peer-tls-cert",
        metavar="FILE",
        help="a group node: TLS on the peer link, this node's certificate (signed by --peer-tls-ca; zeps keygen "
        "--tls-node); without the three: plain TCP",
    )
    p.add_argument("--peer-tls-key", metavar="FILE", help="with --peer-tls-cert: its private key")
    p.add_argument(
        "--peer-tls-ca", metavar="FILE", help="with --peer-tls-cert: the group's CA, which signs every node's"
    )
    add_etcd_options(p)


def _given(args: argparse.Namespace, names: tuple[str, ...]) -> bool:
    """Whether the set `names` is given; ConfigError if only a part of it is."""
    from gateway.errors import ConfigError

    given = [n for n in names if getattr(args, n, None)]
    if given and len(given) < len(names):
        missing = ", ".join("--" + n.replace("_", "-") for n in names if n not in given)
        raise ConfigError(f"missing {missing}: give {', '.join('--' + n.replace('_', '-') for n in names)} together")
    return bool(given)


def check_gateway_options(args: argparse.Namespace) -> None:
    from gateway.errors import ConfigError

    if _given(args, PEER) and not (args.etcd and args.node):
        raise ConfigError(
            "--peer-tls-cert, --peer-tls-key and --peer-tls-ca are a group node's (with --etcd and --node)"
        )
    check_etcd_options(args)


def check_etcd_options(args: argparse.Namespace) -> None:
    from gateway.errors import ConfigError

    if _given(args, ETCD) and not args.etcd:
        raise ConfigError("--etcd-ca, --etcd-cert and --etcd-key are for etcd: give --etcd https://HOST:PORT too")


def peer_tls(args: argparse.Namespace) -> PeerTls | None:
    from gateway.transport.tls import PeerTls

    return PeerTls.load(args.peer_tls_cert, args.peer_tls_key, args.peer_tls_ca) if _given(args, PEER) else None


def etcd_tls(args: argparse.Namespace) -> EtcdTls | None:
    from gateway.transport.tls import EtcdTls

    return EtcdTls.load(args.etcd_ca, args.etcd_cert, args.etcd_key) if _given(args, ETCD) else None
