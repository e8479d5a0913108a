"""The ``gridrpc`` command: daemons (ma, la, sed), client tools (call,
services), ``demo``, ``deploy``, ``experiment``, ``loadtest``, ``bench``."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

DEFAULT_MA = os.environ.get("GRIDRPC_MA", "tcp://127.0.0.1:5555")


def _common_daemon(p: argparse.ArgumentParser, default_port: int) -> None:
    p.add_argument("--name", required=default_port != 5555, default="MA" if default_port == 5555 else None,
                   help="element name, unique in the tree")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=default_port, help=f"port to bind (0 = any free; default {default_port})")
    p.add_argument("--hb-interval", type=float, default=1.0, help="heartbeat interval, s (default 1)")
    p.add_argument("--hb-timeout", type=float, default=3.0,
                   help="a peer silent this long is lost, s (default 3)")
    p.add_argument("--ready-file", help="write {name, address, pid} as JSON here once serving")
    p.add_argument("--log-level", default=os.environ.get("GRIDRPC_LOG", "INFO"),
                   help="DEBUG, INFO, WARNING (default INFO)")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE:CLASS",
                   help="register an aggregator class (repeatable); requests may then name it")


def _child_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parent", help="parent agent address, e.g. tcp://127.0.0.1:5555")
    p.add_argument("--orphan-timeout", type=float, default=None,
                   help="exit when the parent stays gone this long and nothing runs (s)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gridrpc", description="GridRPC middleware: agent trees over ZeroMQ.")
    ap.add_argument("--version", action="version", version="gridrpc " + _version())
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND")

    p = sub.add_parser("ma", help="run a Master Agent (root of the tree)")
    _common_daemon(p, 5555)
    p.add_argument("--http-port", type=int, default=None, help="serve the HTTP status API on this port")
    p.add_argument("--http-host", default="127.0.0.1")

    p = sub.add_parser("la", help="run a Local Agent")
    _common_daemon(p, 0)
    _child_opts(p)

    p = sub.add_parser("sed", help="run a SeD (server daemon) offering services")
    _common_daemon(p, 0)
    _child_opts(p)
    p.add_argument("--service", action="append", default=[], metavar="[NAME=]MODULE:FUNC",
                   help="a service to offer (repeatable), e.g. gridrpc.examples.services:add")
    p.add_argument("--examples", action="store_true", help="offer every example service")
    p.add_argument("--max-concurrent", type=int, default=1, help="calls running at once per SeD (default 1)")
    p.add_argument("--queue", default="fcfs", help="queue policy: fcfs (default) or ethic")
    p.add_argument("--kill-grace", type=float, default=None,
                   help="ethic queue: seconds a new mandatory call waits before preempting optional ones")
    p.add_argument("--replicas", type=int, default=1, help="run N SeDs in this process (names NAME-1..N)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default replicas*max-concurrent)")
    p.add_argument("--isolation", choices=["process", "inline"], default="process",
                   help="process: each call in a killable worker process (default); inline: in the SeD")
    p.add_argument("--max-message-size", type=int, default=512 * 1024 * 1024)
    from .sed.cloud.cli import add_cloud_arguments
    add_cloud_arguments(p)
    from .sed.batch.cli import add_batch_arguments
    add_batch_arguments(p)

    p = sub.add_parser("call", help="call a service and print the result")
    p.add_argument("service")
    p.add_argument("args", nargs="*", help="arguments, as JSON when they parse (1, 2.5, \"s\", [1,2]) else strings")
    p.add_argument("--ma", default=DEFAULT_MA, help=f"master agent address (default {DEFAULT_MA}, env GRIDRPC_MA)")
    p.add_argument("--server", help="call this SeD directly (no discovery)")
    p.add_argument("--user")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--optional", action="store_true")
    p.add_argument("--kw", action="append", default=[], metavar="NAME=VALUE", help="keyword argument")

    p = sub.add_parser("services", help="list the services of a tree")
    p.add_argument("--ma", default=DEFAULT_MA)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("discover", help="rank the servers for a service")
    p.add_argument("service")
    p.add_argument("-k", "--max-servers", type=int, default=10)
    p.add_argument("--aggregator", help="aggregator name or JSON spec")
    p.add_argument("--ma", default=DEFAULT_MA)

    p = sub.add_parser("demo", help="start a small tree here, run a sample workload, stop")
    p.add_argument("--calls", type=int, default=40)

    from .deploy.cli import add_deploy_parser
    add_deploy_parser(sub)
    for mod in ("experiments.cli", "loadtest.cli", "bench", "keys_cli"):
        try:
            __import__(f"gridrpc.{mod}", fromlist=["add_parser"]).add_parser(sub)
        except ImportError:
            pass
    return ap


def _version() -> str:
    from . import __version__
    return __version__


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, str(level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def _ready_writer(path: str | None):
    def ready(d):
        info = {"name": d.name, "address": d.address, "pid": os.getpid()}
        http = getattr(d, "http", None)
        if http is not None:
            info["http"] = http.url
        print(f"READY {json.dumps(info)}", flush=True)
        if path:
            tmp = path + ".tmp"
            with open(tmp, "w") as fh:
                json.dump(info, fh)
            os.replace(tmp, path)
    return ready


def cmd_daemon(a: argparse.Namespace) -> int:
    from ._run import run_daemon
    from .errors import GridRPCError
    _setup_logging(a.log_level)
    address = f"tcp://{a.host}:{a.port}"
    hb = dict(hb_interval=a.hb_interval, hb_timeout=a.hb_timeout)
    try:
        from .plugins import load_aggregator_plugins
        load_aggregator_plugins(a.plugin)
        if a.cmd == "ma":
            from .master_agent import MasterAgent
            d = MasterAgent(name=a.name, address=address, http_port=a.http_port, http_host=a.http_host, **hb)
        elif a.cmd == "la":
            if not a.parent:
                raise SystemExit("gridrpc la: --parent is required")
            from .local_agent import LocalAgent
            d = LocalAgent(name=a.name, parent=a.parent, address=address, orphan_timeout=a.orphan_timeout, **hb)
        elif getattr(a, "batch", None):
            from .sed.batch.cli import make_batch_sed
            d = make_batch_sed(a, address, hb)
        elif getattr(a, "cloud_config", None) or getattr(a, "cloud", None):
            from .sed.cloud.cli import make_cloud_sed
            d = make_cloud_sed(a, address, hb)
        else:
            from .sed import SeD
            opts = {}
            if a.kill_grace is not None:
                opts["kill_grace"] = a.kill_grace
            d = SeD(a.name, a.parent, address=address, max_concurrent=a.max_concurrent, queue=a.queue,
                    replicas=a.replicas, workers=a.workers, isolation=a.isolation,
                    max_message_size=a.max_message_size, orphan_timeout=a.orphan_timeout,
                    queue_options=opts, **hb)
            specs = list(a.service)
            if a.examples:
                from .examples.services import ALL
                specs += [f"gridrpc.examples.services:{s}" for s in ALL]
            if not specs:
                raise SystemExit("gridrpc sed: give at least one --service MODULE:FUNC (or --examples)")
            for spec in specs:
                name, _, target = spec.rpartition("=")
                d.add_service(name or target.rsplit(":", 1)[-1], target)
        run_daemon(d, ready=_ready_writer(a.ready_file))
    except GridRPCError as exc:
        print(f"gridrpc {a.cmd}: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _parse_value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def cmd_call(a: argparse.Namespace) -> int:
    import gridrpc
    args = [_parse_value(x) for x in a.args]
    kwargs = {}
    for kv in a.kw:
        k, sep, v = kv.partition("=")
        if not sep:
            print(f"gridrpc call: --kw expects NAME=VALUE, got {kv!r}", file=sys.stderr)
            return 2
        kwargs[k] = _parse_value(v)
    try:
        with gridrpc.Client(a.ma, user=a.user, timeout=a.timeout) as c:
            call = c.submit(a.service, *args, server=a.server, optional=a.optional, **kwargs)
            value = call.result()
            print(_show(value))
            print(f"(ran on {call.server})", file=sys.stderr)
    except gridrpc.RemoteError as exc:
        print(f"remote error on {exc.server}: {exc}\n{exc.remote_traceback}", file=sys.stderr)
        return 1
    except gridrpc.GridRPCError as exc:
        print(f"gridrpc call: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


def _show(value) -> str:
    try:
        import numpy as np
        if isinstance(value, np.ndarray):
            return repr(value)
    except ImportError:  # pragma: no cover
        pass
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def cmd_services(a: argparse.Namespace) -> int:
    import gridrpc
    try:
        with gridrpc.Client(a.ma, discovery_timeout=5) as c:
            cat = c.services()
    except gridrpc.GridRPCError as exc:
        print(f"gridrpc services: {exc}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(cat, indent=2))
        return 0
    if not cat:
        print("no services registered")
    for name, meta in sorted(cat.items()):
        params = ", ".join(p.get("name", "?") + (":" + p["type"] if p.get("type") not in (None, "any") else "")
                           for p in meta.get("params", []))
        doc = (meta.get("doc") or "").splitlines()[0] if meta.get("doc") else ""
        print(f"{name}({params})  [{len(meta.get('servers', []))} server(s)]  {doc}")
    return 0


def cmd_discover(a: argparse.Namespace) -> int:
    import gridrpc
    agg = _parse_value(a.aggregator) if a.aggregator else None
    try:
        with gridrpc.Client(a.ma) as c:
            servers = c.discover(a.service, a.max_servers, aggregator=agg)
    except gridrpc.GridRPCError as exc:
        print(f"gridrpc discover: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    for i, s in enumerate(servers, 1):
        est = s.estimation
        print(f"{i:3d}. {s.name:20s} {s.address:28s} tcomp={est.get('tcomp', 0):.4f} "
              f"waiting={est.get('num_waiting')} running={est.get('num_running')} "
              f"free_cpu={est.get('free_cpu')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.cmd is None:
        ap.print_help()
        return 0
    if a.cmd in ("ma", "la", "sed"):
        return cmd_daemon(a)
    if a.cmd == "call":
        return cmd_call(a)
    if a.cmd == "services":
        return cmd_services(a)
    if a.cmd == "discover":
        return cmd_discover(a)
    if a.cmd == "demo":
        from .demo import run_demo
        return run_demo(calls=a.calls)
    if hasattr(a, "func"):
        return a.func(a)
    ap.print_help()
    return 2
