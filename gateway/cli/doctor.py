"""`zeps doctor`: check this machine for what ZEPS needs, one line a finding, with the fix."""

from __future__ import annotations

import argparse

from gateway.cli import discovery_opts, tls_opts


def register(commands: argparse._SubParsersAction) -> None:
    from gateway.tools.doctor import TRANSPORTS

    p = commands.add_parser(
        "doctor",
        help="check this machine: engines, compiled loops, multicast, socket buffers, etcd; say what to fix",
        description="Checks the libraries and settings ZEPS uses here and prints one line a finding, with the "
        "command that fixes it. Exit status 1 when something the transports given with --transport (or the "
        "etcd given with --etcd) need is missing; the other findings are hints.",
    )
    p.add_argument(
        "--transport",
        action="append",
        choices=TRANSPORTS,
        default=[],
        help="a transport this machine will use (repeatable): what it needs becomes required",
    )
    p.add_argument("--etcd", action="append", metavar="URL", help="check that this etcd answers (repeatable)")
    tls_opts.add_etcd_options(p)
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from gateway.tools.doctor import check

    tls_opts.check_etcd_options(args)
    findings = check(args.transport, discovery_opts.etcd_urls(args.etcd), tls_opts.etcd_tls(args))
    for f in findings:
        mark = "ok  " if f.ok else ("FAIL" if f.needed else "hint")
        print(f"{mark} {f.name:<16} {f.line}")
    return 1 if any(f.needed and not f.ok for f in findings) else 0
