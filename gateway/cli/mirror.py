"""`zeps mirror`: copy a stream from one site's sidecar(s) into another site's gateway; `zeps mirror promote`:
make the mirror site the primary (docs/mirroring.md)."""

from __future__ import annotations

import argparse
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from gateway.cli import keyopts
from gateway.cli.options import Parser, duration, host_port, integer, positive, say, stream_name, tcp_endpoint

if TYPE_CHECKING:
    from gateway.transport.curve import CurveClientKeys
    from gateway.wire.tail import Redundancy

# A source sidecar that neither answers nor takes the connection this long is gone (promote). It must exceed the
# WAN's round trip, or a live source looks gone and the promotion forks the stream: 0.5 s sees one at up to 0.3 s
# (a lost SYN included: the last of PROBES starts at 0.2 s) and, without loss, at up to about 0.46 s (measured),
# which covers terrestrial WANs; 0.3 s missed a live source at 0.4 s. It costs 0.5 s when the source is gone.
PROBE_S = 0.5
PROBES, PROBE_STAGGER = 3, 0.2  # connections per source sidecar, started this share of PROBE_S apart


def endpoints(text: str) -> list[str]:
    """tcp://H:P[,tcp://H:P...]: several endpoints of one site (sidecars, or the nodes of a group)."""
    return [tcp_endpoint(part.strip()) for part in text.split(",") if part.strip()]


def redundancy(text: str) -> Redundancy:
    """--datagram-tail's value: repeat:N or xor:K (gateway.wire.tail)."""
    from gateway.wire.tail import Redundancy

    try:
        return Redundancy.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(commands: argparse._SubParsersAction) -> None:
    p: Parser = commands.add_parser(
        "mirror",
        help="copy a stream from one site's replay sidecar into another site's gateway, sequence for sequence",
        description="Reads --stream from the source site's sidecar(s) (catch-up, then the live tail) and writes "
        "its journal batches, sequences and times kept, into the gateway at --to, which serves the stream with "
        "--mirror. Resumes from that gateway's head after any restart; exits 1 naming the records if the source "
        "no longer holds what the mirror needs. `zeps mirror promote` makes the mirror site the primary.",
    )
    p.add_argument(
        "--source",
        action="append",
        type=endpoints,
        metavar="ENDPOINT[,...]",
        help="the source site's replay sidecar(s), e.g. tcp://a-gw:5571 (repeatable, comma-separated)",
    )
    p.add_argument(
        "--to",
        action="append",
        type=endpoints,
        metavar="ENDPOINT[,...]",
        help="the mirror site's gateway ingest(s), e.g. tcp://b-gw:5570 (a group's nodes: several)",
    )
    p.add_argument("--stream", type=stream_name, help="the stream to mirror")
    p.add_argument("--window", type=positive, default=64, help="batches sent and not yet confirmed, at most (64)")
    p.add_argument("--timeout", type=duration, default=5.0, help="longest wait for any answer (default 5s)")
    p.add_argument("--paths", type=positive, default=1,
                   help="TCP sessions with the source sidecar (default 1): several for a lossy WAN, where one TCP "
                   "connection is the limit: the catch-up striped over all, the live tail on two at once, "
                   "first arrival wins (4 over a 30 ms, 1%% loss link; docs/mirroring.md)")  # fmt: skip
    p.add_argument("--datagram-tail", type=redundancy, metavar="repeat:N|xor:K",
                   help="the live tail as UDP datagrams from the source sidecar too, with this redundancy (each "
                   "datagram sent N more times, or one XOR parity per K): a single loss repaired with no round "
                   "trip; the TCP path(s) still fill whatever they miss (xor:4 over a 30 ms, 1%% loss link; "
                   "docs/mirroring.md). The sidecar sends to this host's address as its TCP peer")  # fmt: skip
    p.add_argument("--datagram-tail-port", type=integer(0, 65535), default=0, metavar="PORT",
                   help="the UDP port the tail's datagrams are received at (default 0: any free one)")  # fmt: skip
    p.add_argument("--metrics", type=host_port, help="serve Prometheus metrics (zeps_mirror_*) at HOST:PORT")
    p.add_argument("--log-every", type=duration, default=10.0, help="a status line this often, with -v (10s)")
    keyopts.add_client_options(p)
    p.add_argument("--to-curve-server", metavar="FILE",
                   help="CURVE: the mirror site's gateway's public NAME.key (default: --curve-server)")  # fmt: skip
    p.require("source", "to", "stream")
    p.set_defaults(handler=_run)
    actions = p.add_subparsers(dest="mirror_command", metavar="ACTION")
    promote: Parser = actions.add_parser(
        "promote",
        help="make the mirror site the stream's primary (disaster recovery)",
        description="Turns the mirror at --gateway into the primary: publishers are accepted and sequences "
        "continue from the mirrored head. Refused while a source sidecar given by --source still answers "
        "(all are probed at once, for --probe-timeout; --force skips the probe). The promotion is persisted in "
        "that gateway's journal (a group's: in etcd too, for every node): from then on it refuses every mirror "
        "batch. Prints the sequence it was promoted at.",
    )
    promote.add_argument("--stream", type=stream_name, required=True, help="the mirrored stream")
    promote.add_argument("--gateway", type=endpoints, required=True, metavar="ENDPOINT[,...]",
                         help="the mirror site's gateway ingest (the nodes of a group: several)")  # fmt: skip
    promote.add_argument("--source", type=endpoints, metavar="ENDPOINT[,...]",
                         help="the source site's sidecar(s): promotion is refused while one answers")  # fmt: skip
    promote.add_argument("--force", action="store_true", help="promote even if the source answers (or is not named)")
    promote.add_argument("--probe-timeout", type=duration, default=PROBE_S,
                         help="how long a source sidecar has to answer (or take the TCP connection) to count as "
                         "still there (default 0.5s, for WAN round trips up to 0.3s; a longer round trip needs more, "
                         "or a live source looks gone)")  # fmt: skip
    promote.add_argument("--timeout", type=duration, default=3.0,
                         help="longest wait for each --gateway node (default 3s): the command ends within "
                         "--probe-timeout plus this per node")  # fmt: skip
    keyopts.add_client_options(promote)
    promote.check(_source_or_force)
    promote.set_defaults(handler=_promote)


def _source_or_force(args: argparse.Namespace) -> str | None:
    if not args.source and not args.force:
        return "name the source's sidecar (--source, which must no longer answer) or promote with --force"
    return None


def _run(args: argparse.Namespace) -> int:
    from gateway.client.mirror import Mirror, MirrorConfig
    from gateway.client.mirror_metrics import MirrorMetrics
    from gateway.transport.curve import client_keys

    source_curve = keyopts.client_curve(args)
    target_curve = client_keys(args.curve_key, args.to_curve_server) if args.to_curve_server else source_curve
    config = MirrorConfig(
        stream=args.stream,
        sources=tuple(e for group in args.source for e in group),
        targets=tuple(e for group in args.to for e in group),
        source_curve=source_curve,
        target_curve=target_curve,
        window=args.window,
        timeout_s=args.timeout,
        log_s=args.log_every,
        paths=args.paths,
        datagram_tail=args.datagram_tail,
        tail_bind=("0.0.0.0", args.datagram_tail_port),
    )
    mirror = Mirror(config)
    metrics = MirrorMetrics(mirror) if args.metrics else None
    if metrics is not None:
        metrics.serve(args.metrics)
    signal.signal(signal.SIGTERM, lambda *_: mirror.stop())
    signal.signal(signal.SIGINT, lambda *_: mirror.stop())
    say(args, f"zeps mirror: stream {args.stream} from {','.join(config.sources)} to {','.join(config.targets)}")
    try:
        mirror.run()
    finally:
        if metrics is not None:
            metrics.close()
    return 0


def _still_there(
    source: str, stream: str, start: float, deadline: float, refused: threading.Event, curve: CurveClientKeys | None
) -> str | None:
    """Why the source sidecar at `source` counts as still there, or None if it is gone: asked at `start`, it
    answers ATTACH (or refuses it), or its host takes the TCP connection (a process that is there, if slow),
    before `deadline` (both monotonic times). `refused`: set once its host refused a connection (nothing listens
    there: no later probe is needed)."""
    from gateway.client.replay_client import ReplayClient
    from gateway.errors import ReplayError, ReplayRefused

    if refused.wait(max(0.0, start - time.monotonic())):
        return None
    client = ReplayClient(source, stream, timeout=max(0.0, deadline - time.monotonic()), curve=curve,
                          fail_unreachable=True)  # fmt: skip
    try:
        client.wait_ready()
        return "still answers"
    except ReplayRefused:
        return "still answers"  # and refuses: it is there
    except ReplayError:  # down, unreachable or silent: as a source that is gone looks, unless it took the connection
        client.handshake.explain()
        if client.handshake.established or client.handshake.connected:
            return "still answers (it took the connection, but not ATTACH before the probe's deadline)"
        if client.handshake.unreachable:
            refused.set()
        return None
    finally:
        client.close()


def _promote(args: argparse.Namespace) -> int:
    from gateway.client.mirror_target import MirrorTarget
    from gateway.errors import MirrorError, PublishError

    curve = keyopts.client_curve(args)
    # Every source at once, each over PROBES connections PROBE_STAGGER of the deadline apart (so that one lost SYN,
    # which TCP sends again only after 1 s, does not make a live source look gone): the wait is one deadline, one
    # instant for all, counted once the probe's module is imported (tens of ms on a loaded machine, not the
    # sources' time: it made the probe overrun its deadline by as much).
    import gateway.client.replay_client  # noqa: F401

    until = args.probe_timeout
    refused = {source: threading.Event() for source in args.source or ()}
    sources = [] if args.force else list(refused)
    if sources:
        say(args, f"zeps mirror promote: waiting at most {until:g} s (--probe-timeout) for the source sidecar(s) "
                  f"{','.join(sources)}: one that answers refuses the promotion")  # fmt: skip
    t0 = time.monotonic()
    probes = [(s, t0 + i * until * PROBE_STAGGER) for s in sources for i in range(PROBES)]
    with ThreadPoolExecutor(max(1, len(probes))) as pool:
        answers = list(pool.map(lambda p: _still_there(p[0], args.stream, p[1], t0 + until, refused[p[0]], curve),
                                probes))  # fmt: skip
    for (source, _), why in zip(probes, answers, strict=True):
        if why is not None:
            raise MirrorError(
                f"the source sidecar at {source} {why}: promoting now would fork stream {args.stream}. Promote once "
                "the source site is gone, or stop its publishers and add --force"
            )
    if sources:
        say(args, f"zeps mirror promote: no source sidecar answered (probed for {time.monotonic() - t0:.2f} s)")
    error: PublishError | None = None
    for endpoint in args.gateway:
        say(args, f"zeps mirror promote: asking the gateway at {endpoint} to promote, at most {args.timeout:g} s "
                  "(--timeout)")  # fmt: skip
        target = MirrorTarget(endpoint, args.stream, timeout_s=args.timeout, curve=curve)
        try:
            head = target.promote()
        except PublishError as exc:  # not the leader, no answer: the next node
            error = exc
            continue
        finally:
            target.close()
        print(f"stream {args.stream} promoted at sequence {head} at {endpoint}; publishes continue at {head + 1}")
        return 0
    assert error is not None
    raise error
