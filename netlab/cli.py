"""``netlab`` command: bring labs up and down, show them, run commands inside their hosts.

Labs made here persist after the command exits; their records in /run/netlab let later commands (and
other processes) find them. One function per subcommand, registered in :func:`build_parser`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Sequence
from typing import Any

from netlab import dockerlab, packets, state
from netlab import impair as impair_mod
from netlab import lab as lab_mod
from netlab import sites as sites_mod
from netlab.dockerlab import DockerLab
from netlab.lab import ExtraMissing, Lab, LabError, down_all
from netlab.sites import ROUTER, Sites


def _hosts_arg(value: str) -> int | list[str]:
    """``--hosts 3`` (h1..h3) or ``--hosts pub,sub1,sub2``."""
    if value.isdigit():
        return int(value)
    return _names_arg(value)


def _names_arg(value: str) -> list[str]:
    """``pub,sub1,sub2``."""
    names = [n for n in value.split(",") if n]
    if not names:
        raise argparse.ArgumentTypeError("give comma-separated host names")
    return names


def resolve_host(spec: str, records: Sequence[dict[str, Any]]) -> tuple[str, str]:
    """``LAB/HOST`` or ``HOST`` (when exactly one lab has such a host) -> (lab name, host name)."""
    lab_name, _, host = spec.rpartition("/")
    matches = [
        (r["name"], host)
        for r in records
        if (not lab_name or lab_name in (r["name"], r["id"])) and host in {h["name"] for h in r["hosts"]}
    ]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise LabError(f"no host {spec!r} in any lab; see netlab status")
    labs = ", ".join(m[0] for m in matches)
    raise LabError(f"host {host!r} exists in several labs ({labs}): say which, e.g. {matches[0][0]}/{host}")


_UNITS: dict[str, dict[str, float]] = {
    "time": {"us": 0.001, "ms": 1.0, "s": 1000.0},
    "rate": {"kbit": 1, "mbit": 1000, "gbit": 1_000_000},
}


def _quantity(kind: str, default_unit: str) -> Any:
    """argparse type for ``2ms`` / ``500us`` (-> ms) or ``10mbit`` / ``64kbit`` (-> kbit); a bare number means
    ``default_unit``."""
    units = _UNITS[kind]

    def parse(text: str) -> float:
        m = re.fullmatch(r"([0-9]*\.?[0-9]+)([a-z]*)", text.strip().lower())
        if not m or (m.group(2) or default_unit) not in units:
            raise argparse.ArgumentTypeError(f"{text!r}: give a number with one of {', '.join(units)}")
        return float(m.group(1)) * units[m.group(2) or default_unit]

    return parse


def _percent(text: str) -> float:
    """argparse type for ``5%`` or ``5``."""
    try:
        return float(text.strip().removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage such as 5%") from None


def _group_port(text: str) -> tuple[str, int]:
    group, _, port = text.rpartition(":")
    if not group or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: give GROUP:PORT, e.g. 239.192.7.1:5555")
    return group, int(port)


def _load(name: str) -> Lab:
    """The lab called ``name``, as an object of its backend's class (Docker labs run commands in containers)."""
    records = [r for r in state.load_all() if name in (r["name"], r["id"])]
    if records and records[0].get("backend") == dockerlab.BACKEND:
        return DockerLab.load(name)
    return Lab.load(name)


def _load_host(spec: str) -> tuple[Lab, str]:
    lab_name, host = resolve_host(spec, state.load_all())
    return _load(lab_name), host


def _owner_text(record: dict[str, Any]) -> str:
    owner = record.get("owner")
    if owner is None:
        return "persistent"
    return f"pid {owner['pid']}" + ("" if state.owner_alive(owner) else " (gone: netlab down --all)")


def _print_lab(record: dict[str, Any]) -> None:
    docker = f"  docker image {record['image']}" if record.get("backend") == dockerlab.BACKEND else ""
    print(
        f"{record['name']}  id {record['id']}  subnet {record['subnet']}  bridge {record['bridge']}"
        f"  owner {_owner_text(record)}{docker}"
    )
    try:
        lab = Lab.load(record["id"])
    except LabError:  # removed since the records were read: labs of running programs come and go
        print("  (removed meanwhile)")
        return
    for h in record["hosts"]:
        line = f"  {h['name']:<12} {h['ip']:<15} netns {h['netns']:<20} if {h['ifname']}"
        try:
            impaired = impair_mod.summary(lab, h["name"])
        except (LabError, OSError) as exc:  # a half-removed lab: status must still list it
            impaired = f"impairments unreadable: {exc}"
        print(f"{line}  [{impaired}]" if impaired else line)


def _only_lab() -> str:
    names = [r["name"] for r in state.load_all()]
    if len(names) != 1:
        raise LabError(f"{len(names)} labs are up ({', '.join(names) or 'none'}): say which, netlab down NAME")
    return names[0]


def cmd_up(args: argparse.Namespace) -> int:
    backend = DockerLab if args.backend == dockerlab.BACKEND else Lab
    lab = backend(args.hosts, args.name, persistent=True).up()
    _print_lab(lab.to_record())
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    records = state.load_all()
    present = lab_mod.lab_ids_present() | dockerlab.lab_ids_present(dockerlab.running_client())
    leftovers = sorted(present - {r["id"] for r in records})
    if args.json:
        print(json.dumps({"labs": records, "leftovers": leftovers}, indent=2))
        return 0
    if not records:
        print("no labs")
    for record in records:
        _print_lab(record)
    if leftovers:
        print(f"leftovers of crashed labs: {', '.join(leftovers)} (remove: netlab down --all)")
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise LabError("no command given: netlab exec HOST -- CMD [ARG...]")
    lab_name, host = resolve_host(args.host, state.load_all())
    try:
        proc = _load(lab_name).popen(host, command)
    except OSError as exc:  # exit codes as a shell gives them: not found 127, not executable 126
        print(f"netlab: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    # The terminal delivers Ctrl-C to the child too; wait for it and report its status.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    code = proc.wait()
    return 128 - code if code < 0 else code


def _impairment_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The Impairment fields given on the command line (see `_impairment_options`)."""
    fields = {
        "loss_pct": args.loss,
        "loss_burst": args.burst,
        "delay_ms": args.delay,
        "jitter_ms": args.jitter,
        "reorder_pct": args.reorder,
        "duplicate_pct": args.duplicate,
        "rate_kbit": None if args.rate is None else max(1, round(args.rate)),
    }
    return {k: v for k, v in fields.items() if v is not None}


def cmd_impair(args: argparse.Namespace) -> int:
    lab, host = _load_host(args.host)
    given = _impairment_fields(args)
    if args.clear and given:
        raise LabError("--clear removes every impairment; give it alone (with --dir at most)")
    if args.clear:
        impair_mod.clear(lab, host, args.dir or "both")
    elif given:
        impair_mod.impair(lab, host, impair_mod.Impairment(**given), args.dir or "in")
    for direction in impair_mod.DIRECTIONS:
        imp = impair_mod.current(lab, host, direction)
        print(f"{args.host} {direction}: {imp.describe() if imp else 'none'}")
    return 0


def cmd_drop(args: argparse.Namespace) -> int:
    lab, host = _load_host(args.host)
    impair_mod.drop_next(lab, host, args.count, udp_port=args.udp_port, direction=args.dir)
    what = f"UDP packets to port {args.udp_port}" if args.udp_port else "packets"
    print(f"{args.host}: the next {args.count} {what} ({args.dir}) will be dropped")
    return 0


def cmd_partition(args: argparse.Namespace) -> int:
    lab, host = _load_host(args.host)
    impair_mod.partition(lab, host)
    print(f"{args.host} is cut off (netlab heal {args.host} to undo)")
    return 0


def cmd_heal(args: argparse.Namespace) -> int:
    lab, host = _load_host(args.host)
    impair_mod.heal(lab, host)
    print(f"{args.host} is back on the LAN")
    return 0


def cmd_capture(args: argparse.Namespace) -> int:
    lab, host = _load_host(args.host)
    sniffer = packets.start_sniff(lab, host, seconds=args.seconds, count=args.count, bpf=args.filter, pcap=args.out)
    print(f"capturing on {args.host} for up to {args.seconds:g} s (Ctrl-C stops)", file=sys.stderr)
    try:
        capture = sniffer.result(args.seconds + 30)
    except KeyboardInterrupt:
        sniffer.stop()
        capture = sniffer.result(30)
    print(f"{capture.packets} frames in {capture.seconds:g} s" + (f", written to {args.out}" if args.out else ""))
    for f in capture.flows:
        ports = f" {f.sport} -> {f.dport}" if f.proto == 17 else ""
        print(f"  {f.source} -> {f.group} proto {f.proto}{ports}: {f.packets} packets, {f.bytes} bytes")
    return 0


def cmd_inject(args: argparse.Namespace) -> int:
    lab, host = _load_host(args.host)
    group, port = args.target
    src, _, sport = (args.src or "").partition(":")
    sent = packets.inject(
        lab, host, group, port, count=args.count, size=args.size, src=src or None, sport=int(sport or 0), pps=args.pps
    )
    print(f"sent {sent} datagrams to {group}:{port} from {args.host}")
    return 0


def cmd_sites_up(args: argparse.Namespace) -> int:
    given = _impairment_fields(args)
    wan = impair_mod.Impairment(**given) if given else None
    sites = Sites(args.a, args.b, args.name, wan=wan, persistent=True).up()
    for lab in (sites.a, sites.b):
        _print_lab(lab.to_record())
    link = f"{sites.b.name}/{ROUTER}"
    print(f"WAN: the link of {link} (out: a-to-b, in: b-to-a); change it with: netlab impair {link} --dir both ...")
    return 0


def cmd_sites_down(args: argparse.Namespace) -> int:
    names = sites_mod.present(args.name)
    if not names:
        raise LabError(f"no sites named {args.name!r} (labs {' and '.join(sites_mod.lab_names(args.name))}); "
                       "see netlab status")  # fmt: skip
    for name in names:
        Lab.load(name).down()
    print(f"removed {', '.join(names)}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    if args.all and args.name:
        raise LabError("give a lab NAME or --all, not both")
    if not args.all:
        name = args.name or _only_lab()
        _load(name).down()
        print(f"removed {name}")
        return 0
    removed = down_all(lab_mod.PREFIX, force=args.force) + dockerlab.down_all(dockerlab.PREFIX, force=args.force)
    print(f"removed {', '.join(removed)}" if removed else "nothing to remove")
    kept = [r["name"] for r in state.load_all()]
    if kept:
        print(f"kept labs of running programs: {', '.join(kept)} (add --force to remove them too)")
    return 0


def _impairment_options(parser: argparse.ArgumentParser, what: str = "") -> None:
    """The options of an Impairment (read back by `_impairment_fields`)."""
    parser.add_argument("--loss", type=_percent, help=f"{what}random loss, e.g. 5%%")
    parser.add_argument("--burst", type=float, help="with --loss: mean burst length in packets (Gilbert model)")
    parser.add_argument("--delay", type=_quantity("time", "ms"), help=f"{what}e.g. 20ms")
    parser.add_argument("--jitter", type=_quantity("time", "ms"), help="uniform +- this, e.g. 2ms")
    parser.add_argument("--reorder", type=_percent, help="share of packets that skip the delay, e.g. 1%%")
    parser.add_argument("--duplicate", type=_percent, help="e.g. 1%%")
    parser.add_argument("--rate", type=_quantity("rate", "kbit"), help=f"{what}e.g. 10mbit, 512kbit")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="netlab",
        description="Throw-away LANs of network namespaces or Docker containers for multicast tests (needs root).",
    )
    sub = parser.add_subparsers(dest="command_name", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="create a lab that stays up after this command")
    up.add_argument("--hosts", type=_hosts_arg, default=2, help="host count (h1..hN) or names: pub,sub (default 2)")
    up.add_argument("--name", help="lab name (default: its id, e.g. zl3a9)")
    up.add_argument(
        "--backend",
        choices=["netns", dockerlab.BACKEND],
        default="netns",
        help="hosts are network namespaces (default) or Docker containers of an image built from this project",
    )
    up.set_defaults(func=cmd_up)

    status = sub.add_parser("status", help="list labs, their hosts and addresses")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)

    exe = sub.add_parser("exec", help="run a command inside a lab host; its exit code is passed through")
    exe.add_argument("host", metavar="HOST", help="LAB/HOST, or HOST when only one lab has that host")
    exe.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="command and arguments")
    exe.set_defaults(func=cmd_exec)

    down = sub.add_parser("down", help="remove a lab, or all labs and leftovers of crashed runs")
    down.add_argument("name", nargs="?", metavar="NAME", help="lab name or id (optional when one lab is up)")
    down.add_argument("--all", action="store_true", help="every netlab lab except those of running programs")
    down.add_argument("--force", action="store_true", help="with --all: also labs of running programs")
    down.set_defaults(func=cmd_down)

    host_help = "LAB/HOST, or HOST when only one lab has that host"
    dir_help = "in: what the host receives (its bridge-side veth), out: what it sends, both"
    imp = sub.add_parser(
        "impair",
        help="set, change, show or clear impairments of a host's link",
        description="Replaces the host's impairment in that direction; with no options, shows it.",
    )
    imp.add_argument("host", metavar="HOST", help=host_help)
    _impairment_options(imp)
    imp.add_argument("--dir", choices=["in", "out", "both"], help=f"{dir_help} (default: in; --clear: both)")
    imp.add_argument("--clear", action="store_true", help="remove all impairments, partition included")
    imp.set_defaults(func=cmd_impair)

    sites = sub.add_parser(
        "sites",
        help="two LANs (site A, site B) joined by a router over an impaired WAN",
        description="Labs NAME-a and NAME-b; the router is host 'router' of NAME-b, its link there is the WAN.",
    )
    sites_sub = sites.add_subparsers(dest="sites_command", required=True, metavar="SITES_COMMAND")
    sites_up = sites_sub.add_parser("up", help="create the two sites; they stay up after this command")
    sites_up.add_argument("--name", default="sites", help="labs NAME-a and NAME-b (default: sites)")
    sites_up.add_argument("--a", type=_names_arg, default=["a1", "a2"], help="site A's hosts (default a1,a2)")
    sites_up.add_argument("--b", type=_names_arg, default=["b1", "b2"], help="site B's hosts (default b1,b2)")
    _impairment_options(sites_up, "the WAN, both directions: ")
    sites_up.set_defaults(func=cmd_sites_up)
    sites_down = sites_sub.add_parser("down", help="remove both sites")
    sites_down.add_argument("name", nargs="?", default="sites", metavar="NAME", help="(default: sites)")
    sites_down.set_defaults(func=cmd_sites_down)

    drop = sub.add_parser("drop", help="drop exactly the next N packets on a host's link")
    drop.add_argument("host", metavar="HOST", help=host_help)
    drop.add_argument("count", type=int, metavar="N")
    drop.add_argument("--udp-port", type=int, help="count only UDP datagrams to this port")
    drop.add_argument("--dir", choices=["in", "out", "both"], default="in", help=dir_help)
    drop.set_defaults(func=cmd_drop)

    part = sub.add_parser("partition", help="drop all traffic to and from a host (netlab heal undoes it)")
    part.add_argument("host", metavar="HOST", help=host_help)
    part.set_defaults(func=cmd_partition)

    heal = sub.add_parser("heal", help="undo netlab partition")
    heal.add_argument("host", metavar="HOST", help=host_help)
    heal.set_defaults(func=cmd_heal)

    cap = sub.add_parser("capture", help="capture on a host's interface: multicast summary and a pcap file")
    cap.add_argument("host", metavar="HOST", help=host_help)
    cap.add_argument("--out", metavar="FILE.pcap", help="write the frames here")
    cap.add_argument("--seconds", type=float, default=10.0, help="stop after this long (default 10)")
    cap.add_argument("--count", type=int, default=0, help="stop after this many frames")
    cap.add_argument("--filter", metavar="BPF", help="capture filter, e.g. 'udp port 5555'")
    cap.set_defaults(func=cmd_capture)

    inj = sub.add_parser("inject", help="send junk UDP datagrams to a multicast group from a host")
    inj.add_argument("host", metavar="HOST", help=host_help)
    inj.add_argument("target", type=_group_port, metavar="GROUP:PORT")
    inj.add_argument("--count", type=int, default=10)
    inj.add_argument("--size", type=int, default=64, help="payload bytes (default 64)")
    inj.add_argument("--src", metavar="IP[:PORT]", help="forged source, e.g. the real publisher's")
    inj.add_argument("--pps", type=float, default=1000.0, help="datagrams per second (default 1000)")
    inj.set_defaults(func=cmd_inject)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log = logging.getLogger("netlab")
    if not log.handlers:  # show the progress of long work, such as building the Docker image
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("netlab: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    if os.geteuid() != 0:
        print(f"netlab: {lab_mod.ROOT_MESSAGE}", file=sys.stderr)
        return 1
    try:
        return int(args.func(args))
    except ExtraMissing as exc:  # an install short of the lab extra: exit 2, as every zeps command says it
        print(f"netlab: {exc}", file=sys.stderr)
        return 2
    except (LabError, ValueError) as exc:
        print(f"netlab: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `netlab status | head`: the reader has gone; quiet, as a shell tool is
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
