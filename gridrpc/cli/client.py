"""The client commands: ``gridrpc call``, ``gridrpc services``, ``gridrpc
discover``: their arguments, the master agent they ask (``--ma``, else
``$GRIDRPC_MA``, else the default), and what they print."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from .security import client_security_options, add_client_key_arguments
from .values import jsonable, format_number, format_value, to_json

DEFAULT_MA = "tcp://127.0.0.1:5555"


def _ma_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ma", default=None, metavar="ADDR",
                   help="master agent: host:port, tcp://host:port or ipc://path; several comma-separated "
                        f"(default: $GRIDRPC_MA, else {DEFAULT_MA})")
    add_client_key_arguments(p)


def add_client_parsers(sub) -> None:
    """``gridrpc call``, ``gridrpc services``, ``gridrpc discover``."""
    p = sub.add_parser("call", help="call a service and print the result")
    p.add_argument("service")
    p.add_argument("args", nargs="*", help="arguments, as JSON when they parse (1, 2.5, \"s\", [1,2]) else strings")
    _ma_option(p)
    p.add_argument("--server", help="call this SeD directly (no discovery)")
    p.add_argument("--user")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--optional", action="store_true")
    p.add_argument("--kw", action="append", default=[], metavar="NAME=VALUE", help="keyword argument")
    p.add_argument("--json", action="store_true",
                   help="print the result as JSON: arrays as nested lists, bytes as {\"base64\": ...}, "
                        "complex as {\"real\", \"imag\"}, inf/nan as \"Infinity\"/\"NaN\" (see the README)")

    p = sub.add_parser("services", help="list the services of a tree")
    _ma_option(p)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("discover", help="rank the servers for a service")
    p.add_argument("service")
    p.add_argument("-k", "--max-servers", type=int, default=10)
    p.add_argument("--aggregator", help="aggregator name or JSON spec")
    _ma_option(p)
    p.add_argument("--json", action="store_true", help="print the ranked servers as JSON")


def cmd_client(a: argparse.Namespace) -> int:
    """Run a client command: its master agent resolved first."""
    from ..errors import ConfigError
    try:
        a.ma = _resolve_ma(a)
    except ConfigError as exc:
        print(f"gridrpc {a.cmd}: error: {exc}", file=sys.stderr)
        return 2
    a.ma = _ma_for_client(a)
    return {"call": cmd_call, "services": cmd_services, "discover": cmd_discover}[a.cmd](a)


def _parse_value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def _resolve_ma(a: argparse.Namespace):
    """``--ma``, else ``$GRIDRPC_MA``, else the default: one address (str) or several (list)."""
    from ..address import parse_addresses
    if a.ma is not None:
        addrs = parse_addresses(a.ma, what="--ma")
    elif os.environ.get("GRIDRPC_MA"):
        addrs = parse_addresses(os.environ["GRIDRPC_MA"], what="GRIDRPC_MA")
    else:
        addrs = [DEFAULT_MA]
    return addrs[0] if len(addrs) == 1 else addrs


def _client_takes_several() -> bool:
    """Whether this AsyncClient accepts a list of master agents (api.md: the
    several-MA addition); until it does, the CLI uses the first one."""
    import inspect
    from ..client import AsyncClient
    ann = inspect.signature(AsyncClient.__init__).parameters["master_agent"].annotation
    return any(word in str(ann) for word in ("list", "Sequence", "Iterable"))


def _ma_for_client(a: argparse.Namespace):
    if isinstance(a.ma, list) and not _client_takes_several():
        print(f"gridrpc {a.cmd}: several master agents given; this client uses the first, {a.ma[0]}",
              file=sys.stderr)
        return a.ma[0]
    return a.ma


def _ndarray_params(meta: dict | None) -> set[str]:
    return {p.get("name") for p in (meta or {}).get("params", []) if "ndarray" in str(p.get("type", ""))}


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

    async def go():
        async with gridrpc.AsyncClient(a.ma, user=a.user, timeout=a.timeout, **client_security_options(a)) as c:
            if any(isinstance(v, list) for v in [*args, *kwargs.values()]):
                _lists_to_arrays(a.service, args, kwargs, (await c.services()).get(a.service))
            call = await c.submit(a.service, *args, server=a.server, optional=a.optional, **kwargs)
            try:
                return await call, call.server
            except asyncio.CancelledError:      # Ctrl-C: stop the work on the server too
                try:
                    await asyncio.wait_for(call.acancel(), 5)
                except (Exception, asyncio.CancelledError):  # noqa: BLE001 - best effort on the way out
                    pass
                raise

    try:
        value, server = asyncio.run(go())
    except gridrpc.RemoteError as exc:
        print(f"remote error on {exc.server}: {exc}\n{exc.remote_traceback}", file=sys.stderr)
        return 1
    except gridrpc.GridRPCError as exc:
        print(f"gridrpc call: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(to_json(value) if a.json else format_value(value), flush=True)
    print(f"(ran on {server})", file=sys.stderr)
    return 0


def _lists_to_arrays(service: str, args: list, kwargs: dict, meta: dict | None) -> None:
    """JSON has no arrays: a list given for a parameter the service declares
    as ``np.ndarray`` is sent as one (the SeD checks the type)."""
    wanted = _ndarray_params(meta)
    if not wanted:
        return
    import numpy as np
    positional = [p.get("name") for p in (meta or {}).get("params", [])
                  if p.get("kind") in ("positional_only", "positional_or_keyword")]
    for i, v in enumerate(args):
        if i < len(positional) and positional[i] in wanted and isinstance(v, list):
            args[i] = np.asarray(v)
    for k, v in kwargs.items():
        if k in wanted and isinstance(v, list):
            kwargs[k] = np.asarray(v)


def cmd_services(a: argparse.Namespace) -> int:
    import gridrpc

    async def go():
        async with gridrpc.AsyncClient(a.ma, discovery_timeout=5, **client_security_options(a)) as c:
            return await c.services()

    try:
        cat = asyncio.run(go())
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

    async def go():
        async with gridrpc.AsyncClient(a.ma, **client_security_options(a)) as c:
            return await c.discover(a.service, a.max_servers, aggregator=agg)

    try:
        servers = asyncio.run(go())
    except gridrpc.GridRPCError as exc:
        print(f"gridrpc discover: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps([{"name": s.name, "address": s.address, "estimation": jsonable(s.estimation)}
                          for s in servers], indent=2))
        return 0
    if not servers:
        print(f"no server offers {a.service!r}")
    for i, s in enumerate(servers, 1):
        est = s.estimation
        print(f"{i:3d}. {s.name:20s} {s.address:28s} tcomp={format_number(est.get('tcomp', 0))} "
              f"waiting={format_number(est.get('num_waiting'))} running={format_number(est.get('num_running'))} "
              f"free_cpu={format_number(est.get('free_cpu'))}")
    return 0
