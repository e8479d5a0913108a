"""The ``gridrpc`` command: daemons (ma, la, sed), client tools (call,
services, discover), ``demo``, ``deploy``, ``experiment``, ``loadtest``, ``bench``.

Exit status: 0 success, 1 the operation failed, 2 usage or configuration
error (including a daemon that cannot start), 130 interrupted (Ctrl-C).
Addresses (``--ma``, ``--parent``, ``GRIDRPC_MA``) are read by
:mod:`gridrpc.address`: ``host:port``, ``tcp://host:port`` or ``ipc://path``.

Layout: :mod:`gridrpc.cli.daemons` (ma, la, sed), :mod:`gridrpc.cli.client`
(call, services, discover), :mod:`gridrpc.cli.security` (security and access
options), :mod:`gridrpc.cli.values` (how results and numbers are printed);
the other commands register their own parsers (``add_parser`` of the module
:data:`COMMAND_MODULES` names). A command builds only its own parser, so
``gridrpc call`` imports nothing of deploy, sim or the dashboard; the help
builds them all. Every name is importable from here.
"""
from __future__ import annotations

import argparse
import os
import sys

from .client import DEFAULT_MA, add_client_parsers, cmd_call, cmd_client, cmd_discover, cmd_services
from .daemons import LOG_LEVELS, add_daemon_parsers, cmd_daemon
from .daemons import ready_writer, setup_logging  # noqa: F401 - gridrpc.experiments uses them
from .values import format_number, format_value, to_json

__all__ = ["COMMAND_MODULES", "DEFAULT_MA", "INTERRUPTED", "LOG_LEVELS", "build_parser", "cmd_call", "cmd_daemon",
           "cmd_discover", "cmd_services", "format_number", "format_value", "main", "to_json"]

INTERRUPTED = 130          # 128 + SIGINT, what shells report for Ctrl-C


#: the commands whose parsers their own modules add (``add_parser(sub)``): command -> module under
#: ``gridrpc``. A command's module is imported only to run that command or to print ``gridrpc --help``.
COMMAND_MODULES = {
    "deploy": "deploy.cli", "experiment": "experiments.cli", "loadtest": "loadtest.cli", "bench": "bench",
    "keys": "keys_cli", "sim": "sim.cli", "workflow": "workflow.cli", "top": "dashboard.top",
    "events": "dashboard.follow",
}
_DAEMONS = ("ma", "la", "sed")
_CLIENTS = ("call", "services", "discover")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``gridrpc`` parser: every command, or only ``command`` (and only
    its module imported) when it names one."""
    known = (*_DAEMONS, *_CLIENTS, "demo", *COMMAND_MODULES)
    wanted = (lambda name: name == command) if command in known else (lambda name: True)
    ap = argparse.ArgumentParser(prog="gridrpc", description="GridRPC middleware: agent trees over ZeroMQ.")
    ap.add_argument("--version", action="version", version="gridrpc " + _version())
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND")
    add_daemon_parsers(sub, [name for name in _DAEMONS if wanted(name)])
    if any(map(wanted, _CLIENTS)):
        add_client_parsers(sub)
    if wanted("demo"):
        p = sub.add_parser("demo", help="start a small tree here, run a sample workload, stop")
        p.add_argument("--calls", type=int, default=40)
    for name, mod in COMMAND_MODULES.items():
        if not wanted(name):
            continue
        try:
            __import__(f"gridrpc.{mod}", fromlist=["add_parser"]).add_parser(sub)
        except ImportError:
            if command == name:
                raise
    return ap


def _command(argv: list[str]) -> str | None:
    """The command named by ``argv``: its first word not starting with '-'
    (the top-level parser has no option that takes a value); None when
    ``-h`` comes first (the help lists every command)."""
    for word in argv:
        if word in ("-h", "--help"):
            return None
        if not word.startswith("-"):
            return word
    return None


def _version() -> str:
    from .. import __version__
    return __version__


def _quiet_stdout() -> None:
    """The reader of our stdout went away (``gridrpc ... | head``): send the
    rest to /dev/null so the interpreter's final flush does not complain."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        try:
            print("\ngridrpc: interrupted", file=sys.stderr)
        except (OSError, ValueError):
            pass
        _interrupt_handled()
        return INTERRUPTED
    except BrokenPipeError:
        _quiet_stdout()
        return 141                  # 128 + SIGPIPE, as `yes | head` reports


def _interrupt_handled() -> None:
    """Tell CPython that the Ctrl-C was handled. A KeyboardInterrupt raised
    while code compiled from a string runs (``exec(str)``: a namedtuple or a
    dataclass being made, as a module imported when first needed does) sets
    a flag that only the next such ``exec`` clears; under ``python -m`` the
    interpreter then ends by SIGINT (status -2) instead of exiting with 130.
    Running one such ``exec`` clears it."""
    exec("")


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = _command(argv)
    try:
        ap = build_parser(command)
    except ImportError as exc:      # an optional dependency of this command's module is missing
        print(f"gridrpc {command}: error: this command needs {exc.name or exc}, which is not installed",
              file=sys.stderr)
        return 2
    a = ap.parse_args(argv)
    if a.cmd is None:
        ap.print_help(sys.stderr)
        return 2
    if a.cmd in ("ma", "la", "sed"):
        return cmd_daemon(a)
    if a.cmd in ("call", "services", "discover"):
        return cmd_client(a)
    if a.cmd == "demo":
        from ..demo import run_demo
        return run_demo(calls=a.calls)
    if hasattr(a, "func"):
        return a.func(a)
    ap.print_help(sys.stderr)
    return 2
