"""``netlab`` command: bring labs up and down, show them, run commands inside their hosts.

Labs made here persist after the command exits; their records in /run/netlab let later commands (and
other processes) find them. One function per subcommand, registered in :func:`build_parser`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from netlab import lab as lab_mod
from netlab import state
from netlab.lab import Lab, LabError, down_all


def _hosts_arg(value: str) -> int | list[str]:
    """``--hosts 3`` (h1..h3) or ``--hosts pub,sub1,sub2``."""
    if value.isdigit():
        return int(value)
    names = [n for n in value.split(",") if n]
    if not names:
        raise argparse.ArgumentTypeError("give a host count or comma-separated host names")
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


def _owner_text(record: dict[str, Any]) -> str:
    owner = record.get("owner")
    if owner is None:
        return "persistent"
    return f"pid {owner['pid']}" + ("" if state.owner_alive(owner) else " (gone: netlab down --all)")


def _print_lab(record: dict[str, Any]) -> None:
    print(
        f"{record['name']}  id {record['id']}  subnet {record['subnet']}  bridge {record['bridge']}"
        f"  owner {_owner_text(record)}"
    )
    for h in record["hosts"]:
        print(f"  {h['name']:<12} {h['ip']:<15} netns {h['netns']:<20} if {h['ifname']}")


def _only_lab() -> str:
    names = [r["name"] for r in state.load_all()]
    if len(names) != 1:
        raise LabError(f"{len(names)} labs are up ({', '.join(names) or 'none'}): say which, netlab down NAME")
    return names[0]


def cmd_up(args: argparse.Namespace) -> int:
    lab = Lab(args.hosts, args.name, persistent=True).up()
    _print_lab(lab.to_record())
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    records = state.load_all()
    leftovers = sorted(lab_mod.lab_ids_present() - {r["id"] for r in records})
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
        proc = Lab.load(lab_name).popen(host, command)
    except OSError as exc:  # exit codes as a shell gives them: not found 127, not executable 126
        print(f"netlab: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    # The terminal delivers Ctrl-C to the child too; wait for it and report its status.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    code = proc.wait()
    return 128 - code if code < 0 else code


def cmd_down(args: argparse.Namespace) -> int:
    if args.all and args.name:
        raise LabError("give a lab NAME or --all, not both")
    if not args.all:
        name = args.name or _only_lab()
        Lab.load(name).down()
        print(f"removed {name}")
        return 0
    removed = down_all(lab_mod.PREFIX, force=args.force)
    print(f"removed {', '.join(removed)}" if removed else "nothing to remove")
    kept = [r["name"] for r in state.load_all()]
    if kept:
        print(f"kept labs of running programs: {', '.join(kept)} (add --force to remove them too)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="netlab", description="Throw-away LANs of network namespaces for multicast tests (needs root)."
    )
    sub = parser.add_subparsers(dest="command_name", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="create a lab that stays up after this command")
    up.add_argument("--hosts", type=_hosts_arg, default=2, help="host count (h1..hN) or names: pub,sub (default 2)")
    up.add_argument("--name", help="lab name (default: its id, e.g. zl3a9)")
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if os.geteuid() != 0:
        print(f"netlab: {lab_mod.ROOT_MESSAGE}", file=sys.stderr)
        return 1
    try:
        return int(args.func(args))
    except (LabError, ValueError) as exc:
        print(f"netlab: {exc}", file=sys.stderr)
        return 1
