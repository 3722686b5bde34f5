"""`zeps`: the command line. Each subcommand lives in `gateway.cli` as a thin shell over the library.

Exit status, everywhere: 0 success, 1 a failure at run time (a peer gone, a port taken, a corrupt journal),
2 a usage or configuration error (found before anything starts), 130 Ctrl-C. Every error is one line on
stderr naming the cause and the fix; no traceback reaches the user (-vv logs one, for bug reports). A closed
stdout (`zeps subscribe | head -1`) ends the command quietly with status 0.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence

from gateway import __version__
from gateway.cli import MODULES
from gateway.cli.options import Parser

log = logging.getLogger("gateway.cli")


def build_parser() -> Parser:
    parser = Parser(
        prog="zeps",
        description="Reliable multicast pub-sub: gateway, replay sidecar, reconciling subscriber, tools. "
        "-v and -q go anywhere on the line. Exit status: 0 success, 1 failure, 2 usage or config error.",
    )
    parser.add_argument("--version", action="version", version=f"zeps {__version__}")
    _verbosity(parser, "verbose", "quiet", 0)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in MODULES:
        importlib.import_module(f"gateway.cli.{name}").register(commands)
    _prepare(commands)
    return parser


def _verbosity(p: argparse.ArgumentParser, verbose: str, quiet: str, default: object) -> None:
    p.add_argument("-v", "--verbose", dest=verbose, action="count", default=default, help="more log (-vv: debug)")
    p.add_argument("-q", "--quiet", dest=quiet, action="count", default=default, help="errors only")


def _prepare(commands: argparse._SubParsersAction) -> None:
    """-v/-q on every subcommand too (after it on the line), and each subcommand's parser in its namespace, so
    that main() can run its after-parse checks. Nested subcommands (journal ACTION) set theirs last."""
    for sub in commands.choices.values():
        _verbosity(sub, "sub_verbose", "sub_quiet", argparse.SUPPRESS)
        sub.set_defaults(parser=sub)
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                _prepare(action)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version, a usage error: argparse has said it; the status is returned
        return exc.code if isinstance(exc.code, int) else 2
    args.verbosity = args.verbose + getattr(args, "sub_verbose", 0) - args.quiet - getattr(args, "sub_quiet", 0)
    level = (
        logging.ERROR if args.verbosity < 0 else (logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbosity, 2)]
    )
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr)
    try:
        args.parser.finish(args)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    name = f"zeps {args.command}"
    try:
        code = args.handler(args)
        sys.stdout.flush()
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _stdout_gone()
        return 0
    except Exception as exc:
        code, message = _explain(exc)
        log.debug("%s failed", name, exc_info=True)
        print(f"{name}: {message}", file=sys.stderr)
        return code


def _explain(exc: Exception) -> tuple[int, str]:
    """(exit status, one line) for an error that ended a command."""
    import zmq

    from gateway.cli import extras
    from gateway.errors import NotAJournal, ZepsError

    if isinstance(exc, ModuleNotFoundError) and (line := extras.explain(exc)) is not None:
        return 2, line  # an installation short of an extra: found before the command could do anything
    if isinstance(exc, zmq.ZMQError):
        return 1, _zmq_message(exc)
    if isinstance(exc, ValueError | NotAJournal):
        return 2, str(exc)  # bad input the parser could not see (a key file's content, a journal path)
    if isinstance(exc, ZepsError):
        return 1, str(exc)
    if isinstance(exc, OSError):
        return 1, _os_message(exc)
    return 1, f"unexpected {type(exc).__name__}: {exc} (a bug: please report it with the output of -vv)"


def _zmq_message(exc: Exception) -> str:
    text = str(exc)
    if getattr(exc, "errno", None) == errno.EADDRINUSE:
        return f"{text}: another process listens there; stop it, or choose another port"
    if getattr(exc, "errno", None) == errno.EADDRNOTAVAIL:
        return f"{text}: that address is not one of this host's; bind to one of its addresses, or 0.0.0.0"
    return text


# The fix for an operating-system error that ended a command, by errno: the network refusing a send or a
# connect (a firewall, a route, a link), or a file the command may not use.
_OS_FIXES = {
    errno.EPERM: "the system refused it: a firewall rule (iptables -S, nft list ruleset) or missing rights",
    errno.EACCES: "permission denied: check the rights of the user running zeps, and firewall rules",
    errno.ENETUNREACH: "no route to that network: check the interface is up and has a route (ip route, ip link)",
    errno.EHOSTUNREACH: "that host cannot be reached: check routes and firewalls between here and there",
    errno.ENETDOWN: "the network interface is down: bring it up (ip link set DEV up)",
    errno.ENOBUFS: "the kernel ran out of buffer space: lower the rate, or raise net.core.wmem_max",
    errno.ECONNREFUSED: "nothing listens there: start it, or check the address and port",
    errno.ENOENT: "no such file or directory: check the path",
    errno.ENOSPC: "the disk is full: free space, or move the journal",
}


def _os_message(exc: OSError) -> str:
    """What was being done (the innermost zeps function, and the file it concerned), the errno and its fix."""
    name = errno.errorcode.get(exc.errno or 0, "no errno")
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f"{os.sep}gateway{os.sep}" in f.filename]
    doing = f"{frames[-1].name} ({_module(frames[-1].filename)}:{frames[-1].lineno})" if frames else "a system call"
    target = f" on {exc.filename}" if exc.filename else ""
    fix = _OS_FIXES.get(exc.errno or 0, "see the log with -vv for where it happened, and report it if unclear")
    return f"{doing} failed{target}: {exc.strerror or exc} ({name}); {fix}"


def _module(path: str) -> str:
    return "gateway" + path.rsplit(f"{os.sep}gateway", 1)[-1].removesuffix(".py").replace(os.sep, ".")


def _stdout_gone() -> None:
    """The reader of stdout went away: point stdout at /dev/null so the interpreter's last flush stays quiet."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
