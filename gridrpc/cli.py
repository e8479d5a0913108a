"""The ``gridrpc`` command: daemons (ma, la, sed), client tools (call,
services, discover), ``demo``, ``deploy``, ``experiment``, ``loadtest``, ``bench``.

Exit status: 0 success, 1 the operation failed, 2 usage or configuration
error (including a daemon that cannot start), 130 interrupted (Ctrl-C).
Addresses (``--ma``, ``--parent``, ``GRIDRPC_MA``) are read by
:mod:`gridrpc.address`: ``host:port``, ``tcp://host:port`` or ``ipc://path``.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import errno
import json
import logging
import math
import os
import sys

DEFAULT_MA = "tcp://127.0.0.1:5555"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
INTERRUPTED = 130          # 128 + SIGINT, what shells report for Ctrl-C


def _log_level(text: str) -> str:
    level = str(text).strip().upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a log level; use one of {', '.join(LOG_LEVELS)} "
                                         "(any case)")
    return level


def _ma_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ma", default=None, metavar="ADDR",
                   help="master agent: host:port, tcp://host:port or ipc://path; several comma-separated "
                        f"(default: $GRIDRPC_MA, else {DEFAULT_MA})")
    p.add_argument("--keys", metavar="DIR", default=os.environ.get("GRIDRPC_KEYS"),
                   help="CURVE key directory of a secure tree (env GRIDRPC_KEYS); see docs/security.md")
    p.add_argument("--key", metavar="NAME", help="your key pair's name in --keys (default: your user name)")
    p.add_argument("--ma-key", metavar="NAME|FILE|KEY",
                   help="the MA's public key: element name in --keys (default MA), a .key file, or the key")


def _client_security(a: argparse.Namespace) -> dict:
    """Client keywords from --keys/--key/--ma-key (empty without --keys)."""
    if not getattr(a, "keys", None):
        return {}
    out = {"keys": a.keys}
    if a.key:
        out["key"] = a.key
    if a.ma_key:
        out["ma_key"] = a.ma_key
    return out


def _element_name(text: str) -> str:
    from .core.messages import valid_name
    if not valid_name(text):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a letter or digit, then up to 63 letters, digits, '_', '.', '-' "
            "(names end up in URLs, HTML and metrics)")
    return text


def _common_daemon(p: argparse.ArgumentParser, default_port: int) -> None:
    p.add_argument("--name", type=_element_name, required=default_port != 5555,
                   default="MA" if default_port == 5555 else None,
                   help="element name, unique in the tree (letters, digits, '_', '.', '-')")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=default_port, help=f"port to bind (0 = any free; default {default_port})")
    p.add_argument("--hb-interval", type=float, default=1.0, help="heartbeat interval, s (default 1)")
    p.add_argument("--hb-timeout", type=float, default=3.0,
                   help="a peer silent this long is lost, s (default 3)")
    p.add_argument("--ready-file", help="write {name, address, pid} as JSON here once serving")
    p.add_argument("--log-level", type=_log_level, default=os.environ.get("GRIDRPC_LOG", "INFO"),
                   help="DEBUG, INFO, WARNING or ERROR, any case (default INFO, or $GRIDRPC_LOG)")
    g = p.add_argument_group("security (docs/security.md)")
    g.add_argument("--secure", action="store_true", default=os.environ.get("GRIDRPC_SECURE") == "1",
                   help="CurveZMQ on every link: only keys of --keys are accepted (env GRIDRPC_SECURE=1)")
    g.add_argument("--keys", metavar="DIR", default=os.environ.get("GRIDRPC_KEYS"),
                   help="key directory (gridrpc keys create ...; env GRIDRPC_KEYS)")
    g.add_argument("--parent-key", metavar="NAME|FILE|KEY",
                   help="the parent's public key: its element name in --keys, a .key file, "
                        "or 40 z85 characters (needed with --secure --parent)")
    g.add_argument("--insecure", action="store_true",
                   help="serve WITHOUT authentication on a non-loopback address (anyone who reaches the "
                        "port can register, call and read): only on a private, trusted network")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE:CLASS",
                   help="register an aggregator class (repeatable); requests may then name it")


def _child_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parent", help="parent agent address: host:port, tcp://host:port or ipc://path; "
                                    "several comma-separated (attached to each: several master agents)")
    p.add_argument("--orphan-timeout", type=float, default=None,
                   help="exit when the parent stays gone this long and nothing runs (s)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gridrpc", description="GridRPC middleware: agent trees over ZeroMQ.")
    ap.add_argument("--version", action="version", version="gridrpc " + _version())
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND")

    p = sub.add_parser("ma", help="run a Master Agent (root of the tree)")
    _common_daemon(p, 5555)
    p.add_argument("--http-port", type=int, default=None, help="serve the HTTP status API on this port")
    p.add_argument("--http-host", default="127.0.0.1",
                   help="address of the HTTP API (default 127.0.0.1; anything else needs --http-token-file)")
    p.add_argument("--http-token-file", metavar="FILE",
                   help="the HTTP API requires this token (Authorization: Bearer TOKEN, or ?token= once)")
    p.add_argument("--events-file", metavar="FILE", help="also write the tree's events here (JSON lines)")
    p.add_argument("--rebuild-time", type=float, default=None,
                   help="after start, answer 'rebuilding' (clients retry) instead of 'service not found' "
                        "for this long, s (default hb-timeout + hb-interval)")
    p.add_argument("--peer", action="append", default=[], metavar="ADDR",
                   help="a federated master agent of another tree (repeatable): discoveries for services "
                        "this tree lacks are forwarded there")

    p = sub.add_parser("la", help="run a Local Agent")
    _common_daemon(p, 0)
    _child_opts(p)

    p = sub.add_parser("sed", help="run a SeD (server daemon) offering services")
    _common_daemon(p, 0)
    _child_opts(p)
    p.add_argument("--service", action="append", default=[], metavar="[NAME=]MODULE:FUNC[,OPTION=VALUE]",
                   help="a service to offer (repeatable), e.g. gridrpc.examples.services:add; options: "
                        "idempotent=false (never re-run after its server died mid-call), "
                        "on_orphan=kill|finish|auto (a call whose client is gone)")
    p.add_argument("--examples", action="store_true", help="offer every example service")
    p.add_argument("--max-concurrent", type=int, default=1, help="calls running at once per SeD (default 1)")
    p.add_argument("--queue", default="fcfs", help="queue policy: fcfs (default) or ethic")
    p.add_argument("--kill-grace", type=float, default=None,
                   help="ethic queue: seconds a new mandatory call waits before preempting optional ones")
    p.add_argument("--replicas", type=int, default=1, help="run N SeDs in this process (names NAME-1..N)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default replicas*max-concurrent)")
    p.add_argument("--isolation", choices=["process", "inline"], default="process",
                   help="process: each call in a killable worker process (default); inline: in the SeD")
    p.add_argument("--max-message-size", type=int, default=512 * 1024 * 1024,
                   help="largest call accepted, bytes (default 512 MiB)")
    p.add_argument("--allow", action="append", default=[], metavar="SERVICE=USERS",
                   help="only these users (comma-separated; @group allowed) may call SERVICE ('*': every "
                        "service not listed); repeatable. The user is the key's user under --secure")
    p.add_argument("--group", action="append", default=[], metavar="NAME=USERS", help="a group for --allow")
    p.add_argument("--max-calls-per-user", type=int, default=None, metavar="N",
                   help="calls in flight (queued or running) per user on this SeD")
    p.add_argument("--result-cache-bytes", type=int, default=64 * 1024 * 1024,
                   help="answers kept for repeated request ids, bytes (default 64 MiB)")
    p.add_argument("--orphan-call-timeout", type=float, default=30.0,
                   help="a call whose client sent nothing (no ping) for this long is orphaned: killed or "
                        "left to finish per its service's on_orphan policy, s (default 30)")
    from .sed.cloud.cli import add_cloud_arguments
    add_cloud_arguments(p)
    from .sed.batch.cli import add_batch_arguments
    add_batch_arguments(p)

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

    p = sub.add_parser("demo", help="start a small tree here, run a sample workload, stop")
    p.add_argument("--calls", type=int, default=40)

    from .deploy.cli import add_deploy_parser
    add_deploy_parser(sub)
    for mod in ("experiments.cli", "loadtest.cli", "bench", "keys_cli", "sim.cli", "workflow.cli",
                "dashboard.top", "dashboard.follow"):
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
    from .address import parse_address
    from .errors import ConfigError, GridRPCError
    _setup_logging(a.log_level)
    address = f"tcp://{a.host}:{a.port}"
    hb = dict(hb_interval=a.hb_interval, hb_timeout=a.hb_timeout)
    try:
        from .address import parse_addresses
        parent = (",".join(parse_addresses(a.parent, what="--parent")) if getattr(a, "parent", None) else None)
        from .plugins import load_aggregator_plugins
        load_aggregator_plugins(a.plugin)
        hb.update(_security_kwargs(a, parent))
        if a.cmd == "ma":
            from .master_agent import MasterAgent
            peers = [p for text in a.peer for p in parse_addresses(text, what="--peer")]
            token = None
            if a.http_token_file:
                try:
                    token = open(a.http_token_file).read().strip()
                except OSError as exc:
                    raise ConfigError(f"cannot read --http-token-file {a.http_token_file}: {exc}") from None
                if len(token) < 16:
                    raise ConfigError(f"the HTTP token in {a.http_token_file} is too short (16 characters at least)")
            d = MasterAgent(name=a.name, address=address, http_port=a.http_port, http_host=a.http_host,
                            http_token=token, events_file=a.events_file,
                            rebuild_time=a.rebuild_time, peers=peers, **hb)
        elif a.cmd == "la":
            if not parent:
                print("gridrpc la: error: --parent is required", file=sys.stderr)
                return 2
            from .local_agent import LocalAgent
            d = LocalAgent(name=a.name, parent=parent, address=address, orphan_timeout=a.orphan_timeout, **hb)
        else:
            a.parent = parent
            hb["access"] = _access_rules(a)
            if getattr(a, "batch", None):
                from .sed.batch.cli import make_batch_sed
                d = make_batch_sed(a, address, hb)
            elif getattr(a, "cloud_config", None) or getattr(a, "cloud", None):
                from .sed.cloud.cli import make_cloud_sed
                d = make_cloud_sed(a, address, hb)
            else:
                d = _plain_sed(a, address, hb)
                if d is None:
                    return 2
        run_daemon(d, ready=_ready_writer(a.ready_file))
    except GridRPCError as exc:
        print(f"gridrpc {a.cmd}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:          # e.g. the MA's HTTP port (aiohttp) is taken
        print(f"gridrpc {a.cmd}: error: {_os_error_text(a, exc)}", file=sys.stderr)
        return 2
    return 0


def _access_rules(a: argparse.Namespace):
    from .errors import ConfigError
    from .sed.access import AccessRules

    def pairs(items, flag):
        out = {}
        for item in items:
            k, sep, v = item.partition("=")
            if not sep or not k:
                raise ConfigError(f"{flag} expects NAME=USER1,USER2, got {item!r}")
            out[k] = [x for x in v.split(",") if x]
        return out
    return AccessRules.build(pairs(a.allow, "--allow"), pairs(a.group, "--group"), a.max_calls_per_user)


def _security_kwargs(a: argparse.Namespace, parent: str | None) -> dict:
    """The daemon's CURVE settings from --secure/--keys/--parent-key; refuses
    to serve unauthenticated on a non-loopback address without --insecure."""
    from .errors import ConfigError
    from .transport.security import KeyStore, Security, is_loopback, public_key_from
    if not a.secure:
        if not is_loopback(a.host):
            if not a.insecure:
                raise ConfigError(
                    f"refusing to serve on {a.host} without authentication: anyone who reaches the port could "
                    "join the tree, impersonate users and run calls. Give --secure --keys DIR (docs/security.md), "
                    "or --insecure on a private network you trust")
            logging.getLogger("gridrpc.security").warning(
                "SECURITY IS OFF on %s (--insecure): no authentication, no encryption; any host that reaches "
                "this port can register elements, call services and read arguments and results", a.host)
        return {}
    if not a.keys:
        raise ConfigError("--secure needs a key directory: --keys DIR (or GRIDRPC_KEYS); "
                          "create keys with: gridrpc keys create NAME --element --dir DIR")
    store = KeyStore(a.keys)
    sec = Security(keys=store, name=a.name, role="element")
    sec.pair                                    # a missing key: a clear error now, not at the first peer
    kw: dict = {"security": sec}
    if parent:
        if not a.parent_key:
            raise ConfigError("--secure with --parent needs the parent's public key: --parent-key NAME "
                              "(its element name in --keys), a .key file, or the key itself")
        keys = []
        for spec in a.parent_key.split(","):          # one per parent (several MAs: --parent a,b)
            try:
                keys.append(store.public(spec.strip(), "element"))
            except ConfigError:
                keys.append(public_key_from(spec.strip()))
        kw["parent_key"] = keys[0] if len(keys) == 1 else keys
    return kw


def _plain_sed(a: argparse.Namespace, address: str, hb: dict):
    from .sed import SeD
    opts = {}
    if a.kill_grace is not None:
        opts["kill_grace"] = a.kill_grace
    d = SeD(a.name, a.parent, address=address, max_concurrent=a.max_concurrent, queue=a.queue,
            replicas=a.replicas, workers=a.workers, isolation=a.isolation,
            max_message_size=a.max_message_size, orphan_timeout=a.orphan_timeout,
            result_cache_bytes=a.result_cache_bytes, orphan_call_timeout=a.orphan_call_timeout,
            queue_options=opts, **hb)
    specs = list(a.service)
    if a.examples:
        from .examples.services import ALL
        specs += [f"gridrpc.examples.services:{s}" for s in ALL]
    if not specs:
        print("gridrpc sed: error: give at least one --service MODULE:FUNC (or --examples)", file=sys.stderr)
        return None
    from .sed.services import split_spec_options
    for spec in specs:
        spec, options = split_spec_options(spec)     # [NAME=]MODULE:FUNC[,idempotent=false][,on_orphan=kill]
        name, _, target = spec.rpartition("=")
        d.add_service(name or target.rsplit(":", 1)[-1], target, **options)
    return d


def _os_error_text(a: argparse.Namespace, exc: OSError) -> str:
    """One line for a start-up OSError: which port, what to do."""
    if exc.errno == errno.EADDRINUSE and a.cmd == "ma" and a.http_port is not None:
        return (f"cannot serve HTTP on {a.http_host}:{a.http_port}: address already in use "
                "(another MA or program has it; choose another --http-port)")
    if exc.errno in (errno.EADDRNOTAVAIL, errno.EACCES) and a.cmd == "ma" and a.http_port is not None:
        return f"cannot serve HTTP on {a.http_host}:{a.http_port}: {os.strerror(exc.errno).lower()}"
    return str(exc)


def _parse_value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def _resolve_ma(a: argparse.Namespace):
    """``--ma``, else ``$GRIDRPC_MA``, else the default: one address (str) or several (list)."""
    from .address import parse_addresses
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
    from .client import AsyncClient
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
        async with gridrpc.AsyncClient(a.ma, user=a.user, timeout=a.timeout, **_client_security(a)) as c:
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


# -- values, for people and for programs -----------------------------------------
def format_value(value) -> str:
    """A result as people read it: strings as they are, numbers as Python
    prints them, numpy arrays as numpy prints them (``[0.5 0.5]``),
    containers as JSON (arrays inside as lists), bytes as ``b'...'``."""
    import numpy as np
    if isinstance(value, str):
        return value
    if isinstance(value, np.ndarray):
        return str(value.item()) if value.ndim == 0 else np.array2string(value, separator=" ")
    if isinstance(value, np.generic):
        return format_value(value.item())
    if value is None or isinstance(value, (bool, int, float, complex, bytes, bytearray)):
        return repr(value) if not isinstance(value, bytearray) else repr(bytes(value))
    if isinstance(value, (list, tuple, dict)):
        try:
            return json.dumps(value, default=_human_default, ensure_ascii=False)
        except (TypeError, ValueError):
            pass
    import pprint
    return pprint.pformat(value)


def _human_default(v):
    import numpy as np
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (bytes, bytearray)):
        return repr(bytes(v))
    if isinstance(v, complex):
        return str(v)
    if hasattr(v, "__fspath__"):
        return os.fspath(v)
    raise TypeError(type(v).__name__)


def _jsonable(v):
    """Strict JSON for any value a service may return (see ``to_json``)."""
    import numpy as np
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        if math.isfinite(v):
            return v
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    if isinstance(v, complex):
        return {"real": _jsonable(v.real), "imag": _jsonable(v.imag)}
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, np.ndarray):
        return _jsonable(v.tolist())
    if isinstance(v, np.generic):
        return _jsonable(v.item())
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "__fspath__"):
        return os.fspath(v)
    return str(v)


def to_json(value) -> str:
    """A result as strict JSON, for programs (``gridrpc call --json``):
    numpy arrays and tuples as (nested) lists, numpy scalars as numbers,
    bytes as ``{"base64": "..."}``, complex as ``{"real": x, "imag": y}``,
    non-finite floats as the strings ``"NaN"``, ``"Infinity"``,
    ``"-Infinity"`` (as in protobuf's JSON mapping), files as their path."""
    return json.dumps(_jsonable(value), allow_nan=False, ensure_ascii=False)


def _num(v) -> str:
    """Numbers in tables: 4 significant digits (``0.427``, ``1.235e+04``)."""
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def cmd_services(a: argparse.Namespace) -> int:
    import gridrpc

    async def go():
        async with gridrpc.AsyncClient(a.ma, discovery_timeout=5, **_client_security(a)) as c:
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
        async with gridrpc.AsyncClient(a.ma, **_client_security(a)) as c:
            return await c.discover(a.service, a.max_servers, aggregator=agg)

    try:
        servers = asyncio.run(go())
    except gridrpc.GridRPCError as exc:
        print(f"gridrpc discover: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps([{"name": s.name, "address": s.address, "estimation": _jsonable(s.estimation)}
                          for s in servers], indent=2))
        return 0
    if not servers:
        print(f"no server offers {a.service!r}")
    for i, s in enumerate(servers, 1):
        est = s.estimation
        print(f"{i:3d}. {s.name:20s} {s.address:28s} tcomp={_num(est.get('tcomp', 0))} "
              f"waiting={_num(est.get('num_waiting'))} running={_num(est.get('num_running'))} "
              f"free_cpu={_num(est.get('free_cpu'))}")
    return 0


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
        from .errors import ConfigError
        try:
            a.ma = _resolve_ma(a)
        except ConfigError as exc:
            print(f"gridrpc {a.cmd}: error: {exc}", file=sys.stderr)
            return 2
        a.ma = _ma_for_client(a)
        return {"call": cmd_call, "services": cmd_services, "discover": cmd_discover}[a.cmd](a)
    if a.cmd == "demo":
        from .demo import run_demo
        return run_demo(calls=a.calls)
    if hasattr(a, "func"):
        return a.func(a)
    ap.print_help(sys.stderr)
    return 2
