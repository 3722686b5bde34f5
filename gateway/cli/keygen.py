"""`zeps keygen`: a stream key for multicast, CURVE certificates for TCP."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "keygen",
        help="make a stream key (multicast HMAC) or a CURVE key pair (TCP)",
        description="--stream-key FILE writes 32 random bytes (hex) readable by the owner only: give the same "
        "file to the gateway and every subscriber (--stream-key). --curve DIR/NAME writes DIR/NAME.key (public: "
        "give it to the peers) and DIR/NAME.key_secret (owner only: keep it where it was made), in ZeroMQ's "
        "certificate format. Existing files are never overwritten. See docs/security.md.",
    )
    p.add_argument("--stream-key", type=Path, metavar="FILE", help="write a new stream key to FILE")
    p.add_argument("--curve", type=Path, metavar="DIR/NAME", help="write a new CURVE key pair as DIR/NAME.key[_secret]")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from gateway.errors import AuthError
    from gateway.transport.curve import create_curve_certificates
    from gateway.wire.streamkey import StreamKey

    if args.stream_key is None and args.curve is None:
        raise AuthError("give --stream-key FILE, --curve DIR/NAME, or both")
    if args.stream_key is not None:
        key = StreamKey.generate()
        key.save(args.stream_key)
        print(f"stream key {key.id:08x} written to {args.stream_key}: give it to the gateway and its subscribers")
    if args.curve is not None:
        public, secret = create_curve_certificates(args.curve)
        print(f"CURVE key pair: {public} (public, for the peers), {secret} (secret, stays here)")
    return 0
