"""`zeps keygen`: a stream key for multicast, CURVE certificates for TCP, TLS certificates for a group's nodes."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "keygen",
        help="make a stream key (multicast HMAC), a CURVE key pair (TCP), or a group's TLS certificates",
        description="--stream-key FILE writes 32 random bytes (hex) readable by the owner only: give the same "
        "file to the gateway and every subscriber (--stream-key). --curve DIR/NAME writes DIR/NAME.key (public: "
        "give it to the peers) and DIR/NAME.key_secret (owner only: keep it where it was made), in ZeroMQ's "
        "certificate format. --tls-ca DIR/CA makes a group's CA (DIR/CA.crt, DIR/CA.key) unless it exists, and "
        "each --tls-node DIR/NAME a node's certificate signed by it (DIR/NAME.crt, DIR/NAME.key), for the peer link "
        "and etcd; --tls-host adds a host name or address etcd's clients reach the node by. Needs the `openssl` "
        "command. Existing files are never overwritten. See docs/security.md.",
    )
    p.add_argument("--stream-key", type=Path, metavar="FILE", help="write a new stream key to FILE")
    p.add_argument("--curve", type=Path, metavar="DIR/NAME", help="write a new CURVE key pair as DIR/NAME.key[_secret]")
    p.add_argument(
        "--tls-ca", type=Path, metavar="DIR/CA", help="the group's CA: made as DIR/CA.crt and .key if absent"
    )
    p.add_argument(
        "--tls-node",
        type=Path,
        action="append",
        default=[],
        metavar="DIR/NAME",
        help="a node's certificate (repeatable); NAME must be the node's --node name: the peer link checks it",
    )
    p.add_argument(
        "--tls-host", action="append", default=[], metavar="HOST", help="a name or address in every --tls-node's"
    )
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from gateway.errors import AuthError
    from gateway.transport.curve import create_curve_certificates
    from gateway.wire.streamkey import StreamKey

    if args.stream_key is None and args.curve is None and args.tls_ca is None:
        raise AuthError("give --stream-key FILE, --curve DIR/NAME or --tls-ca DIR/CA [--tls-node DIR/NAME ...]")
    if (args.tls_node or args.tls_host) and args.tls_ca is None:
        raise AuthError("--tls-node and --tls-host need --tls-ca DIR/CA: the CA that signs the nodes' certificates")
    if args.stream_key is not None:
        key = StreamKey.generate()
        key.save(args.stream_key)
        print(f"stream key {key.id:08x} written to {args.stream_key}: give it to the gateway and its subscribers")
    if args.curve is not None:
        public, secret = create_curve_certificates(args.curve)
        print(f"CURVE key pair: {public} (public, for the peers), {secret} (secret, stays here)")
    if args.tls_ca is not None:
        from gateway.transport.tls import make_ca, make_node

        ca = make_ca(args.tls_ca)
        print(f"TLS CA: {ca[0]} (for every node), {ca[1]} (secret: signs the nodes' certificates)")
        for node in args.tls_node:
            crt, secret = make_node(node, ca, args.tls_host)
            print(f"TLS node {node.name}: {crt}, {secret} (secret, for that node only)")
    return 0
