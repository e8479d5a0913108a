"""The ``gridrpc`` command: daemons (ma, la, sed), client tools (call,
services, discover), ``demo``, ``deploy``, ``experiment``, ``loadtest``, ``bench``.

Exit status: 0 success, 1 the operation failed, 2 usage or configuration
error (including a daemon that cannot start), 130 interrupted (Ctrl-C).
Addresses (``--ma``, ``--parent``, ``GRIDRPC_MA``) are read by
:mod:`gridrpc.address`: ``host:port``, ``tcp://host:port`` or ``ipc://path``.

Layout: :mod:`gridrpc.cli.daemons` (ma, la, sed), :mod:`gridrpc.cli.client`
(call, services, discover), :mod:`gridrpc.cli.security` (security and access
options), :mod:`gridrpc.cli.values` (how results are printed); the other
commands register their own parsers (``add_parser``). Every name is
importable from here.
"""
from __future__ import annotations

import argparse
import os
import sys

from .client import DEFAULT_MA, add_client_parsers, cmd_call, cmd_client, cmd_discover, cmd_services
from .daemons import LOG_LEVELS, add_daemon_parsers, cmd_daemon
from .daemons import _ready_writer, _setup_logging  # noqa: F401 - gridrpc.experiments uses them
from .values import format_value, to_json

__all__ = ["DEFAULT_MA", "INTERRUPTED", "LOG_LEVELS", "build_parser", "cmd_call", "cmd_daemon", "cmd_discover",
           "cmd_services", "format_value", "main", "to_json"]

INTERRUPTED = 130          # 128 + SIGINT, what shells report for Ctrl-C


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gridrpc", description="GridRPC middleware: agent trees over ZeroMQ.")
    ap.add_argument("--version", action="version", version="gridrpc " + _version())
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND")
    add_daemon_parsers(sub)
    add_client_parsers(sub)

    p = sub.add_parser("demo", help="start a small tree here, run a sample workload, stop")
    p.add_argument("--calls", type=int, default=40)

    from ..deploy.cli import add_deploy_parser
    add_deploy_parser(sub)
    for mod in ("experiments.cli", "loadtest.cli", "bench", "keys_cli", "sim.cli", "workflow.cli",
                "dashboard.top", "dashboard.follow"):
        try:
            __import__(f"gridrpc.{mod}", fromlist=["add_parser"]).add_parser(sub)
        except ImportError:
            pass
    return ap


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
        return INTERRUPTED
    except BrokenPipeError:
        _quiet_stdout()
        return 141                  # 128 + SIGPIPE, as `yes | head` reports


def _main(argv: list[str] | None) -> int:
    ap = build_parser()
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
