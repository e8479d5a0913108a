"""``gridrpc loadtest FILE_OR_ADDR``: a headless, bounded locust run.

The target is a master agent address (``tcp://host:port``, or ``host:port``)
or a deployment file (YAML): the deployment is started, loaded, and stopped
again. Locust runs in child processes (it monkey-patches for gevent; this
process stays plain): one local runner, or with ``--workers N`` a master and
N workers (distributed locust on this machine; ``--workers auto``: one worker
per core but one, at least one). Every run is bounded: by ``--run-time``
and by ``--max-requests`` (the users stop once that many requests have
started), and a run that overstays its time is killed.

While it runs it prints progress every few seconds (requests, failures,
rate) on stderr; at the end a table per request type and service (locust's
numbers and the client's own), writes ``--csv``/``--html``/``--json`` when asked, and exits
with 1 when the failure ratio exceeds ``--fail-ratio`` (or nothing ran), 2 on
a usage or deployment error, 0 otherwise.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..address import parse_address, parse_addresses
from ..affinity import usable_cores
from ..errors import ConfigError, GridRPCError
from .config import format_mix, parse_args, parse_mix

LOCUSTFILE = str(Path(__file__).with_name("locustfile.py"))
PROGRESS_EVERY = 3.0      # s between progress lines
INSTALL_HINT = "pip install 'gridrpc[load]'"
# locust's console table (every 2 s, headless): the "Aggregated" row
_AGGREGATED = re.compile(r"^\s*Aggregated\s+(\d+)\s+(\d+)\([\d.]+%\)\s*\|.*\|\s*([\d.]+)\s+([\d.]+)\s*$", re.M)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("loadtest", help="run a bounded, headless locust load test against a tree",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="FILE_OR_ADDR",
                   help="MA address (tcp://127.0.0.1:5555) or a deployment file to start, load and stop")
    p.add_argument("-u", "--users", type=int, default=4, help="concurrent simulated users (default 4)")
    p.add_argument("-r", "--spawn-rate", type=float, default=None, help="users started per second (default: all at once)")
    p.add_argument("-t", "--run-time", default="10s", help="stop after this long: 30s, 2m, 1m30s (default 10s)")
    p.add_argument("-n", "--max-requests", type=int, default=10000,
                   help="stop once this many requests have started (default 10000; bounded runs only)")
    p.add_argument("--mix", default="add",
                   help="what users do, weighted: 'add:3,sleep:1', modes NAME/call|discover|bound (default add)")
    p.add_argument("--args", dest="call_args", default=None,
                   help="arguments per service: JSON {\"add\": [1, 2]} or 'add=[1,2];sleep=[0.01]'")
    p.add_argument("-k", type=int, default=1, help="servers asked by 'discover' entries (default 1)")
    p.add_argument("--wait", type=float, default=0.0, help="pause of a user between requests, s (default 0)")
    p.add_argument("--timeout", type=float, default=30.0, help="timeout of one request, s (default 30)")
    p.add_argument("--reuse-discovery", type=float, default=0.01, metavar="S",
                   help="s a user's 'call' entries reuse a view answer of the MA (default 0.01; 0: every call "
                        "asks the MA)")
    p.add_argument("--fail-ratio", type=float, default=0.01,
                   help="exit 1 when failures/requests exceeds this (default 0.01)")
    p.add_argument("--workers", type=workers_arg, default=0, metavar="N|auto",
                   help="distributed locust on this machine: a master and N worker processes; auto: one per core "
                        "but one (at least 1) (default 0: one process)")
    p.add_argument("--csv", metavar="PREFIX", help="locust's CSV files: PREFIX_stats.csv, _stats_history.csv, _failures.csv")
    p.add_argument("--html", metavar="PATH", help="locust's HTML report")
    p.add_argument("--json", metavar="PATH", help="write the summary (locust's and the client's numbers) as JSON")
    p.add_argument("--locustfile", default=LOCUSTFILE, help="a locustfile of your own (default: gridrpc's)")
    p.add_argument("-v", "--verbose", action="store_true", help="show locust's own output")
    p.set_defaults(func=run)
    return p


def auto_workers() -> int:
    """Locust workers for ``--workers auto``: the cores this process may use,
    minus one for the master and the tree, at least one."""
    return max(1, usable_cores() - 1)


def workers_arg(text: str) -> int:
    """``--workers``: a number >= 0, or ``auto`` (:func:`auto_workers`)."""
    if str(text).strip().lower() == "auto":
        return auto_workers()
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--workers takes a number or 'auto', not {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError("--workers must be >= 0")
    return n


def parse_timespan(text: str) -> float:
    """'90', '90s', '2m', '1h30m', '1m30s' -> seconds."""
    text = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", text)
    if not parts or "".join(a + b for a, b in parts) != text:
        raise ConfigError(f"run time {text!r}: use e.g. 30s, 2m, 1h30m")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


def normalise_address(target: str) -> str:
    """The master agent address of the command line (any form
    :mod:`gridrpc.address` accepts) -> ``tcp://host:port``/``ipc://...``;
    several MAs, comma-separated, stay a comma-separated list (the users
    take them in turn)."""
    what = "target (a deployment file or a master agent address)"
    if "," in target:
        return ",".join(parse_addresses(target, what=what))
    return parse_address(target, what=what)


def locust_missing() -> str | None:
    """Why locust cannot run here (None: it can)."""
    import importlib.util
    try:
        if importlib.util.find_spec("locust") is None:
            return "No module named 'locust'"
    except (ImportError, ValueError) as exc:
        return str(exc)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(a: argparse.Namespace) -> int:
    try:
        _check(a)
    except ConfigError as exc:
        print(f"gridrpc loadtest: {exc}", file=sys.stderr)
        return 2
    why = locust_missing()
    if why:
        print(f"gridrpc loadtest: locust is not installed ({why}); install it with: {INSTALL_HINT}",
              file=sys.stderr)
        return 2
    path = Path(a.target)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        return _with_deployment(a, path)
    try:
        address = normalise_address(a.target)
    except ConfigError as exc:
        print(f"gridrpc loadtest: {exc}", file=sys.stderr)
        return 2
    return _run_locust(a, address)


def _check(a) -> None:
    parse_mix(a.mix)
    parse_args(a.call_args)
    a.run_seconds = parse_timespan(a.run_time)
    if a.run_seconds <= 0:
        raise ConfigError("--run-time must be > 0")
    if a.max_requests < 1:
        raise ConfigError("--max-requests must be >= 1 (load tests are bounded)")
    if a.users < 1:
        raise ConfigError("--users must be >= 1")
    if a.workers < 0:
        raise ConfigError("--workers must be >= 0")
    if not 0 <= a.reuse_discovery <= 60:
        raise ConfigError("--reuse-discovery must be between 0 and 60 s")
    if a.spawn_rate is None:
        a.spawn_rate = float(a.users)


def _with_deployment(a, path: Path) -> int:
    from ..deploy.runner import Deployment
    from ..deploy.spec import load
    try:
        spec = load(path)
        dep = Deployment(spec, state_dir=tempfile.mkdtemp(prefix="gridrpc-loadtest-"))
    except GridRPCError as exc:
        print(f"gridrpc loadtest: {exc}", file=sys.stderr)
        return 2
    try:
        try:
            info = dep.up()
        except GridRPCError as exc:
            print(f"gridrpc loadtest: deployment failed: {exc}", file=sys.stderr)
            return 2
        return _run_locust(a, info["ma"])
    finally:
        dep.down(quiet=True)
        dep.close()


def locust_env(a, address: str, summary: str, max_requests: int) -> dict:
    env = dict(os.environ)
    env.update({"GRIDRPC_MA": address, "GRIDRPC_MIX": format_mix(parse_mix(a.mix)),
                "GRIDRPC_ARGS": json.dumps(parse_args(a.call_args)), "GRIDRPC_K": str(a.k),
                "GRIDRPC_TIMEOUT": str(a.timeout), "GRIDRPC_WAIT": str(a.wait),
                "GRIDRPC_REUSE_DISCOVERY": str(a.reuse_discovery),
                "GRIDRPC_MAX_REQUESTS": str(max_requests), "GRIDRPC_SUMMARY": summary,
                "GRIDRPC_FAIL_RATIO": str(a.fail_ratio)})
    return env


def _run_locust(a, address: str) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="gridrpc-locust-"))
    summary_path = str(Path(a.json).resolve()) if a.json else str(tmp / "summary.json")
    if a.json and Path(summary_path).exists():
        Path(summary_path).unlink()
    base = [sys.executable, "-m", "locust", "-f", a.locustfile, "--headless", "-u", str(a.users),
            "-r", str(a.spawn_rate), "-t", f"{a.run_seconds:g}s", "--stop-timeout", "1",
            "--loglevel", "INFO" if a.verbose else "WARNING"]
    if a.csv:
        base += ["--csv", a.csv]
    if a.html:
        base += ["--html", a.html]
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        if a.workers:
            port = _free_port()
            master = base + ["--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port),
                             "--expect-workers", str(a.workers), "--expect-workers-max-wait", "30"]
            per_worker = math.ceil(a.max_requests / a.workers)
            procs.append(_spawn(master, locust_env(a, address, summary_path, a.max_requests), tmp, "master",
                                a.verbose, logs))
            for i in range(a.workers):
                w = [sys.executable, "-m", "locust", "-f", a.locustfile, "--worker", "--master-host", "127.0.0.1",
                     "--master-port", str(port), "--loglevel", "INFO" if a.verbose else "WARNING"]
                procs.append(_spawn(w, locust_env(a, address, str(tmp / f"w{i}.json"), per_worker), tmp,
                                    f"worker{i + 1}", a.verbose, logs))
            what = f"locust master + {a.workers} workers"
        else:
            procs.append(_spawn(base, locust_env(a, address, summary_path, a.max_requests), tmp, "locust",
                                a.verbose, logs))
            what = "locust"
        print(f"gridrpc loadtest: {what} -> {address}: {a.users} users, mix {format_mix(parse_mix(a.mix))}, "
              f"at most {a.run_seconds:g}s and {a.max_requests} requests", file=sys.stderr, flush=True)
        limit = a.run_seconds + 45 + (30 if a.workers else 0)
        t0 = time.monotonic()
        rc = _wait_reporting(procs[0], limit, None if a.verbose else logs[0])
        for p in procs[1:]:
            _wait(p, max(5.0, limit - (time.monotonic() - t0)))
    finally:
        for p in procs:
            _kill(p)
    if rc is None:
        print(f"gridrpc loadtest: locust did not stop by itself; killed after {limit:g}s", file=sys.stderr)
        _show_logs(logs)
        return 2
    try:
        s = json.loads(Path(summary_path).read_text())
    except (OSError, ValueError):
        print(f"gridrpc loadtest: locust exited with {rc} and wrote no summary", file=sys.stderr)
        _show_logs(logs)
        return 2
    print(format_summary(s))
    total = s["total"]
    if total["requests"] == 0:
        print("gridrpc loadtest: no request completed", file=sys.stderr)
        _show_logs(logs)
        return 1
    ratio = total["fail_ratio"]
    if ratio > a.fail_ratio:
        print(f"gridrpc loadtest: failure ratio {ratio:.3f} > {a.fail_ratio:g}", file=sys.stderr)
        return 1
    return 0


def _spawn(cmd, env, tmp: Path, name: str, verbose: bool, logs: list) -> subprocess.Popen:
    log = tmp / f"{name}.log"
    logs.append(log)
    fh = None if verbose else open(log, "wb")
    try:
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=fh,
                                stderr=subprocess.STDOUT if fh else None, start_new_session=True)
    finally:
        if fh:
            fh.close()


class _Progress:
    """Progress lines from locust's console table in its log (headless locust
    prints it every 2 s): requests, failures and the current rate."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.offset = 0
        self.tail = ""
        self.last = (0.0, 0)            # (elapsed, requests) at the previous line

    def line(self, elapsed: float) -> str | None:
        try:
            with open(self.log, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return None
        self.offset += len(data)
        text = self.tail + data.decode(errors="replace")
        cut = text.rfind("\n") + 1
        self.tail = text[cut:]
        rows = _AGGREGATED.findall(text[:cut])
        if not rows:
            return None
        reqs, fails, rps = int(rows[-1][0]), int(rows[-1][1]), float(rows[-1][2])
        if rps <= 0:              # locust's rate of the last seconds is 0 at first: ours since last line
            dt = elapsed - self.last[0]
            rps = (reqs - self.last[1]) / dt if dt > 0 else 0.0
        self.last = (elapsed, reqs)
        return f"gridrpc loadtest: {elapsed:4.0f}s: {reqs} requests, {fails} failures, {rps:.1f} req/s"


def _wait_reporting(p: subprocess.Popen, timeout: float, log: Path | None):
    """Wait for ``p`` like :func:`_wait`, printing progress every
    :data:`PROGRESS_EVERY` seconds from its log (if given)."""
    t0 = time.monotonic()
    progress = _Progress(log) if log is not None else None
    next_report = t0 + PROGRESS_EVERY
    while True:
        left = timeout - (time.monotonic() - t0)
        if left <= 0:
            return None
        rc = _wait(p, min(left, max(0.1, next_report - time.monotonic())))
        if rc is not None:
            return rc
        now = time.monotonic()
        if progress is not None and now >= next_report:
            text = progress.line(now - t0)
            if text:
                print(text, file=sys.stderr, flush=True)
            next_report = now + PROGRESS_EVERY


def _wait(p: subprocess.Popen, timeout: float):
    try:
        return p.wait(timeout=max(0.1, timeout))
    except subprocess.TimeoutExpired:
        return None


def _kill(p: subprocess.Popen) -> None:
    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGTERM)      # its own session: the group is locust and its children
        p.wait(5)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(5)


def _show_logs(logs: list[Path]) -> None:
    for log in logs:
        try:
            tail = log.read_text(errors="replace").splitlines()[-25:]
        except OSError:
            continue
        print(f"--- {log.name} (tail) ---\n" + "\n".join(tail), file=sys.stderr)


def _f(v, fmt="{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def format_summary(s: dict) -> str:
    """The run as a table: locust's statistics, then the client's own."""
    lines = [f"{'type':9s} {'name':14s} {'reqs':>7s} {'fails':>6s} {'req/s':>8s} {'median':>8s} "
             f"{'p95':>8s} {'p99':>8s} {'avg':>8s} {'client avg':>10s} {'client p99':>10s}   (ms)"]
    own = s.get("client", {})
    rows = list(s["locust"].values()) + [s["total"]]
    for e in rows:
        c = own.get(f"{e['type']} {e['name']}", {})
        lines.append(f"{e['type'] or '':9s} {e['name'][:14]:14s} {e['requests']:7d} {e['failures']:6d} "
                     f"{_f(e['rps'], '{:.1f}'):>8s} {_f(e['median_ms']):>8s} {_f(e['p95_ms']):>8s} "
                     f"{_f(e['p99_ms']):>8s} {_f(e['avg_ms']):>8s} {_f(c.get('avg_ms')):>10s} "
                     f"{_f(c.get('p99_ms')):>10s}")
    lines.append(f"failure ratio {s['total']['fail_ratio']:.4f}"
                 + (f"; workers {s['workers']}" if s.get("workers") else ""))
    for e in s.get("errors", [])[:10]:
        lines.append(f"  {e['occurrences']:6d} x {e['type']} {e['name']}: {e['error'][:150]}")
    return "\n".join(lines)
