"""The daemon commands: ``gridrpc ma``, ``gridrpc la``, ``gridrpc sed``
(plain, batch, cloud, or any kind of SeD registered in
:mod:`gridrpc.sed.backends.registry`, which brings its own flags and builds
its SeD): their arguments, and running one until it is stopped. The
security and access options are in :mod:`gridrpc.cli.security`."""
from __future__ import annotations

import argparse
import errno
import json
import logging
import math
import os
import sys

from .security import access_rules, security_kwargs, add_access_arguments, add_daemon_security_arguments

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _log_level(text: str) -> str:
    level = str(text).strip().upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a log level; use one of {', '.join(LOG_LEVELS)} "
                                         "(any case)")
    return level


def _element_name(text: str) -> str:
    from ..core.messages import valid_name
    if not valid_name(text):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a letter or digit, then up to 63 letters, digits, '_', '.', '-' "
            "(names end up in URLs, HTML and metrics)")
    return text


def _seconds(text: str) -> float:
    """A finite, non-negative number of seconds (NaN, infinities and
    negative values are refused)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a finite number of seconds, 0 or more")
    return v


def _view_opts(p: argparse.ArgumentParser, root: bool) -> None:
    """Discovery from the pushed view (docs/architecture.md, "Discovery
    from the view"): on by default."""
    if root:
        p.add_argument("--no-view", dest="view", action="store_false",
                       help="answer every discovery by the fan-out to the tree (DIET's way), never from the "
                            "SeDs' pushed state; the snapshots children push are dropped unread")
        p.add_argument("--view-max-age", type=_seconds, default=None, metavar="SECONDS",
                       help="a discovery is answered from the view when every SeD offering the service pushed "
                            "or confirmed its state within this many seconds, else by the fan-out (default 1.5; "
                            "0: always the fan-out; a request's own max_age wins)")
    else:
        p.add_argument("--no-view", dest="view", action="store_false",
                       help="keep no view of the subtree and push none to the parent: the parent finds the "
                            "SeDs under this agent by the fan-out")


def _common_daemon(p: argparse.ArgumentParser, default_port: int) -> None:
    p.add_argument("--cpus", default=None, metavar="LIST",
                   help="run this process (and, for a SeD, its worker processes) on these CPUs only, e.g. "
                        "1 or 0,2-3 (like taskset; docs/performance.md, 'CPU binding'); default: any")
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
    add_daemon_security_arguments(p)
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE:CLASS",
                   help="register an aggregator class (repeatable); requests may then name it")


def _child_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parent", help="parent agent address: host:port, tcp://host:port or ipc://path; "
                                    "several comma-separated (attached to each: several master agents)")
    p.add_argument("--orphan-timeout", type=float, default=None,
                   help="exit when the parent stays gone this long and nothing runs (s)")


def add_daemon_parsers(sub, commands=("ma", "la", "sed")) -> None:
    """``gridrpc ma``, ``gridrpc la``, ``gridrpc sed`` (those of ``commands``)."""
    if "ma" in commands:
        _add_ma_parser(sub)
    if "la" in commands:
        p = sub.add_parser("la", help="run a Local Agent")
        _common_daemon(p, 0)
        _child_opts(p)
        _view_opts(p, root=False)
    if "sed" in commands:
        _add_sed_parser(sub)


def _add_ma_parser(sub) -> None:
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
                        "this tree lacks are forwarded there (docs/reliability.md, Federation)")
    p.add_argument("--peer-key", action="append", default=[], metavar="KEY",
                   help="with --secure: the public key of each --peer, in the same order (its element name "
                        "in --keys, a .key file, or the key itself)")
    p.add_argument("--peer-hops", type=int, default=2, metavar="N",
                   help="how far a discovery may travel from peer to peer (default 2, at most 4)")
    p.add_argument("--peer-busy-wait", type=float, default=None, metavar="S",
                   help="also ask the peers when every local server of the service would make a call wait "
                        "more than S seconds (est_wait); default: only for services this tree lacks")
    _view_opts(p, root=True)


def _add_sed_parser(sub) -> None:
    p = sub.add_parser("sed", help="run a SeD (server daemon) offering services")
    _common_daemon(p, 0)
    _child_opts(p)
    p.add_argument("--service", action="append", default=[], metavar="[NAME=]MODULE:FUNC[,OPTION=VALUE]",
                   help="a service to offer (repeatable), e.g. gridrpc.examples.services:add; options: "
                        "idempotent=false (never re-run after its server died mid-call), "
                        "on_orphan=kill|finish|auto (a call whose client is gone)")
    p.add_argument("--examples", action="store_true", help="offer every example service")
    p.add_argument("--max-concurrent", type=int, default=1, help="calls running at once per SeD (default 1)")
    p.add_argument("--queue", default="fcfs", help="queue policy: fcfs (default: first come, first served per user, users in turn), ethic (fair optional computations) or fifo (one arrival order for all users)")
    p.add_argument("--kill-grace", type=float, default=None,
                   help="ethic queue: seconds a new mandatory call waits before preempting optional ones")
    p.add_argument("--gather", type=float, default=None, metavar="SECONDS",
                   help="ethic queue: an idle SeD starts no optional call while they keep arriving less than "
                        "SECONDS apart (at most 0.5 s), so users arriving together are ranked together "
                        "(default 0; docs/optional-computations.md)")
    p.add_argument("--replicas", type=int, default=1, help="run N SeDs in this process (names NAME-1..N)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default replicas*max-concurrent)")
    p.add_argument("--prestart-workers", type=int, default=1, metavar="N",
                   help="worker processes forked at start (default 1; the others are forked when first needed, "
                        "~5 ms of the SeD's time each, ~4 MB of private memory each once forked): set it to "
                        "--workers for bursts of calls on many replicas")
    p.add_argument("--isolation", choices=["process", "inline"], default="process",
                   help="process: each call in a killable worker process (default); inline: in the SeD")
    p.add_argument("--max-message-size", type=int, default=512 * 1024 * 1024,
                   help="largest call accepted, bytes (default 512 MiB)")
    p.add_argument("--max-arg-bytes-per-user", type=int, default=None, metavar="N",
                   help="bytes of arguments one user may have in calls queued or running on this SeD "
                        "(default: --max-message-size)")
    add_access_arguments(p)
    g = p.add_argument_group("data held on this SeD (docs/data.md)")
    g.add_argument("--data-memory-bytes", type=int, default=None, metavar="N",
                   help="bytes of data references held in memory (default 2 GiB)")
    g.add_argument("--data-disk-bytes", type=int, default=None, metavar="N",
                   help="spill space past it, bytes (default 0: evict instead)")
    g.add_argument("--data-policy", choices=["lru", "lfu", "fifo"], default=None,
                   help="what is evicted first (default lru; sticky and pending data never)")
    g.add_argument("--data-dir", metavar="DIR", default=None, help="spill directory (default: the SeD's temp dir)")
    g.add_argument("--data-bytes-per-user", type=int, default=None, metavar="N",
                   help="data one user may hold on this SeD, bytes (default: no limit)")
    p.add_argument("--result-cache-bytes", type=int, default=64 * 1024 * 1024,
                   help="answers kept for repeated request ids, bytes (default 64 MiB)")
    p.add_argument("--orphan-call-timeout", type=float, default=30.0,
                   help="a call whose client sent nothing (no ping) for this long is orphaned: killed or "
                        "left to finish per its service's on_orphan policy, s (default 30)")
    from ..sed.backends.registry import kinds
    for kind in kinds():                # each kind of SeD adds its flags (--batch, --cloud-config, ...)
        if kind.add_arguments is not None:
            kind.add_arguments(p)


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, str(level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def ready_writer(path: str | None):
    def ready(d):
        info = {**d.ready_info(), "pid": os.getpid()}
        print(f"READY {json.dumps(info)}", flush=True)
        if path:
            tmp = path + ".tmp"
            with open(tmp, "w") as fh:
                json.dump(info, fh)
            os.replace(tmp, path)
    return ready


def _peer_keys(security, peers: list[str], specs: list[str]) -> dict:
    """--peer-key, one per --peer in order: an element name in the key
    directory, a .key file, or the key itself."""
    from ..errors import ConfigError
    from ..transport.security import public_key_from
    specs = [s.strip() for text in specs for s in text.split(",") if s.strip()]
    if len(specs) != len(peers):
        raise ConfigError(f"--secure with {len(peers)} --peer needs as many --peer-key (got {len(specs)}), "
                          "in the same order")
    keys = {}
    for addr, spec in zip(peers, specs):
        try:
            keys[addr] = security.keys.public(spec, "element")
        except ConfigError:
            keys[addr] = public_key_from(spec)
    return keys


def cmd_daemon(a: argparse.Namespace) -> int:
    from .._run import run_daemon
    from ..errors import ConfigError, GridRPCError
    setup_logging(a.log_level)
    address = f"tcp://{a.host}:{a.port}"
    hb = dict(hb_interval=a.hb_interval, hb_timeout=a.hb_timeout)
    try:
        if a.cpus is not None:
            from ..affinity import bind_cpus
            bind_cpus(a.cpus)           # before any worker is forked: they inherit it
        from ..address import parse_addresses
        parent = (",".join(parse_addresses(a.parent, what="--parent")) if getattr(a, "parent", None) else None)
        from ..plugins import load_aggregator_plugins
        load_aggregator_plugins(a.plugin)
        hb.update(security_kwargs(a, parent))
        if a.cmd == "ma":
            from ..master_agent import MasterAgent
            peers = [p for text in a.peer for p in parse_addresses(text, what="--peer")]
            if not 0 <= a.peer_hops <= 4:
                raise ConfigError(f"--peer-hops must be 0..4, not {a.peer_hops}")
            if not a.view and a.view_max_age is not None:
                raise ConfigError("--view-max-age with --no-view: no discovery is answered from the view "
                                  "(give one or the other)")
            if "security" in hb:
                hb["peer_keys"] = _peer_keys(hb["security"], peers, a.peer_key)
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
                            rebuild_time=a.rebuild_time, peers=peers, peer_hops=a.peer_hops,
                            peer_busy_wait=a.peer_busy_wait, view=a.view, view_max_age=a.view_max_age, **hb)
        elif a.cmd == "la":
            if not parent:
                print("gridrpc la: error: --parent is required", file=sys.stderr)
                return 2
            from ..local_agent import LocalAgent
            d = LocalAgent(name=a.name, parent=parent, address=address, orphan_timeout=a.orphan_timeout,
                           view=a.view, **hb)
        else:
            a.parent = parent
            hb["access"] = access_rules(a)
            data = {k: v for k, v in (("memory_bytes", a.data_memory_bytes), ("disk_bytes", a.data_disk_bytes),
                                      ("policy", a.data_policy), ("directory", a.data_dir),
                                      ("max_bytes_per_user", a.data_bytes_per_user)) if v is not None}
            if data:
                from ..sed.data.store import DataConfig
                hb["data"] = DataConfig(**data)
            from ..sed.backends.registry import kind_for_args
            d = kind_for_args(a).build(a, address, hb)      # plain, batch, cloud... (the flags given)
        run_daemon(d, ready=ready_writer(a.ready_file))
    except GridRPCError as exc:
        print(f"gridrpc {a.cmd}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:          # e.g. the MA's HTTP port (aiohttp) is taken
        print(f"gridrpc {a.cmd}: error: {_os_error_text(a, exc)}", file=sys.stderr)
        return 2


def _os_error_text(a: argparse.Namespace, exc: OSError) -> str:
    """One line for a start-up OSError: which port, what to do."""
    if exc.errno == errno.EADDRINUSE and a.cmd == "ma" and a.http_port is not None:
        return (f"cannot serve HTTP on {a.http_host}:{a.http_port}: address already in use "
                "(another MA or program has it; choose another --http-port)")
    if exc.errno in (errno.EADDRNOTAVAIL, errno.EACCES) and a.cmd == "ma" and a.http_port is not None:
        return f"cannot serve HTTP on {a.http_host}:{a.http_port}: {os.strerror(exc.errno).lower()}"
    return str(exc)
