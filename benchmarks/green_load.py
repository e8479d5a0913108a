"""Many independent load-test clients against one tree: bound calls and calls
with discovery, phase by phase in the same run (the ``load`` items of
``python -m benchmarks``).

``C`` clients (each a :class:`gridrpc.loadtest.GreenClient` of its own, so
each with its own reuse window, as every locust user has) run in ``P`` load
processes (gevent, no locust: what is measured is the tree and the client, not
locust's bookkeeping), each client a closed loop of ``add(1, 2)``. The phases
alternate in the same processes — bound (each client bound to one SeD, the
clients spread evenly over the SeDs), then with discovery (``client.call``:
the MA's answer, or the client's kept view answer) — ``repeats`` times; a
phase counts the calls that ended inside its window and, separately, the
failures by error type. Each load process reports its own CPU (user +
system, its zmq I/O thread included), so the client's CPU per call and a
saturated load process are visible.

    python -m benchmarks.green_load --ma tcp://127.0.0.1:5555 --clients 64 --procs 2
    python -m benchmarks.green_load --clients 32 --procs 1     # the client's CPU per call, one process
    python -m benchmarks.green_load --locust --users 16        # one locust process's CPU per request
    python -m benchmarks --only load

A load process is ``python -m benchmarks.green_load worker ...``: it reads a
phase per line on stdin (JSON) and answers one JSON line on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODES = ("bound", "call")
#: the suite's items (``python -m benchmarks --only load``): the two modes of one run
ITEMS = ("load_bound", "load_discovery")
CLIENTS = 64


# -- the load process ----------------------------------------------------------------------
def _worker(a: argparse.Namespace) -> int:
    import gevent
    from gridrpc.client.futures import ServerInfo
    from gridrpc.errors import GridRPCError
    from gridrpc.loadtest.green import GreenClient

    servers = [ServerInfo(name=n, address=addr) for n, addr in json.loads(a.servers)]
    clients = [GreenClient(a.ma, timeout=a.timeout, user=f"load{a.index}-{i}") for i in range(a.clients)]
    bound = [servers[(a.first + i) % len(servers)] for i in range(a.clients)]
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("quit"):
            break
        mode, seconds = cmd["mode"], float(cmd["seconds"])
        state = {"stop": False, "calls": 0, "fail": {}, "errors": [], "lat": []}
        end_cpu: list = []

        def loop(c, server):
            call, lat, fail = c.call, state["lat"], state["fail"]
            while not state["stop"]:
                t0 = time.perf_counter()
                try:
                    call("add", 1, 2, server=server)
                except GridRPCError as exc:      # counted also when it ends after the window
                    k = type(exc).__name__
                    fail[k] = fail.get(k, 0) + 1
                    if len(state["errors"]) < 3:
                        state["errors"].append(f"{k}: {str(exc)[:200]}")
                    continue
                if not state["stop"]:
                    state["calls"] += 1
                    if len(lat) < 20000:
                        lat.append(time.perf_counter() - t0)

        def stop():
            t = os.times()
            end_cpu.append((time.perf_counter(), t.user + t.system))
            state["stop"] = True

        counted0 = [dict(getattr(c, "counters", {})) for c in clients]
        t = os.times()
        t0, cpu0 = time.perf_counter(), t.user + t.system
        gs = [gevent.spawn(loop, c, s if mode == "bound" else None) for c, s in zip(clients, bound)]
        gevent.spawn_later(seconds, stop)
        gevent.joinall(gs, timeout=seconds + a.timeout + 5)
        t1, cpu1 = end_cpu[0]
        lat = sorted(state["lat"])
        counted = {}
        for c, c0 in zip(clients, counted0):
            for k, v in getattr(c, "counters", {}).items():
                counted[k] = counted.get(k, 0) + v - c0.get(k, 0)
        print(json.dumps({"mode": mode, "calls": state["calls"], "failures": state["fail"], "counters": counted,
                          "errors": state["errors"], "wall_s": t1 - t0, "cpu_s": cpu1 - cpu0,
                          "median_ms": lat[len(lat) // 2] * 1e3 if lat else None,
                          "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3 if lat else None}),
              flush=True)
    for c in clients:
        c.close()
    return 0


# -- the driver ----------------------------------------------------------------------------
class LoadProcs:
    """``procs`` load processes holding ``clients`` clients in all."""

    def __init__(self, ma: str, servers: list[tuple[str, str]], clients: int, procs: int, timeout: float = 10.0,
                 env: dict | None = None) -> None:
        from .procs import REPO, child_env
        procs = max(1, min(procs, clients))
        share = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
        self.procs: list[subprocess.Popen] = []
        first = 0
        for i, n in enumerate(share):
            cmd = [sys.executable, "-m", "benchmarks.green_load", "worker", "--ma", ma, "--clients", str(n),
                   "--servers", json.dumps(servers), "--first", str(first), "--index", str(i),
                   "--timeout", str(timeout)]
            first += n
            self.procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                               env=env or child_env(), cwd=str(REPO), start_new_session=True))
        for p in self.procs:
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"load process {p.pid} did not start (exit {p.poll()})")
        self.clients, self.share = clients, share

    def phase(self, mode: str, seconds: float) -> dict:
        for p in self.procs:
            p.stdin.write(json.dumps({"mode": mode, "seconds": seconds}) + "\n")
            p.stdin.flush()
        parts = []
        for p in self.procs:
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"load process {p.pid} died (exit {p.poll()})")
            parts.append(json.loads(line))
        calls = sum(x["calls"] for x in parts)
        fails: dict[str, int] = {}
        for x in parts:
            for k, v in x["failures"].items():
                fails[k] = fails.get(k, 0) + v
        counted: dict[str, int] = {}
        for x in parts:
            for k, v in (x.get("counters") or {}).items():
                counted[k] = counted.get(k, 0) + v
        return {"mode": mode, "calls": calls, "calls_per_s": sum(x["calls"] / x["wall_s"] for x in parts),
                "counters": counted,
                "failures": fails, "errors": [e for x in parts for e in x["errors"]][:3],
                "load_process_cpu_pct": [round(100 * x["cpu_s"] / x["wall_s"], 1) for x in parts],
                "median_ms": statistics.median([x["median_ms"] for x in parts if x["median_ms"] is not None] or [0]),
                "p99_ms": max([x["p99_ms"] for x in parts if x["p99_ms"] is not None] or [0])}

    def close(self) -> None:
        for p in self.procs:
            try:
                p.stdin.write(json.dumps({"quit": True}) + "\n")
                p.stdin.close()
            except (BrokenPipeError, OSError):
                pass
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)

    def __enter__(self) -> "LoadProcs":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _per_call(rs: list[dict]) -> dict:
    """Messages per call of the clients, over the phases: CALLs (1 + busy
    probes passed on + failovers) and DISCOVERs (0 for a bound call; below 1
    when kept view answers served calls). Empty for a client without counters."""
    total: dict[str, int] = {}
    for x in rs:
        for k, v in (x.get("counters") or {}).items():
            total[k] = total.get(k, 0) + v
    calls = total.get("calls")
    if not calls:
        return {}
    return {"call_messages_per_call": round(total.get("call_messages", 0) / calls, 3),
            "discover_messages_per_call": round(total.get("discover_messages", 0) / calls, 3)}


def default_procs(clients: int) -> int:
    """Load processes for ``clients`` clients: one per core, at most one per 8 clients."""
    return max(1, min(os.cpu_count() or 1, clients // 8))


def measure(ma: str, servers: list[tuple[str, str]], *, clients: int = 64, procs: int | None = None,
            seconds: float = 1.5, repeats: int = 3, warmup: float = 0.5, roles: dict[str, list[int]] | None = None,
            idle_s: float = 1.0, env: dict | None = None, log=None) -> dict:
    """Bound and with-discovery phases, alternated (bound first, then the
    other way round, ...), ``repeats`` times each; per mode the median rate,
    every rate, the calls and failures (summed over the phases), and CPU per
    call: the load processes' (``client``) and, with ``roles`` (role -> PIDs of
    the tree's processes: ma, la, sed), the tree's by role, idle rate
    (heartbeats) subtracted (:class:`benchmarks.grid.CpuProbe`)."""
    from .grid import CpuProbe
    procs = default_procs(clients) if procs is None else procs
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    with LoadProcs(ma, servers, clients, procs, env=env) as lp:
        probe = CpuProbe(roles or {}, idle_s, client=[p.pid for p in lp.procs])
        for mode in MODES:
            lp.phase(mode, warmup)
        for r in range(repeats):
            for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                before = probe.snapshot()
                res = lp.phase(mode, seconds)
                if res["calls"]:
                    res["cpu_us_per_call"] = probe.per_call(before, probe.snapshot(), res["calls"])
                runs[mode].append(res)
                if log:
                    cpu = res.get("cpu_us_per_call") or {}
                    per = _per_call([res])
                    log(f"  {mode:5s} {res['calls_per_s']:8.0f} calls/s, failures {res['failures'] or 0}, "
                        f"CALLs/call {per.get('call_messages_per_call', '-')}, "
                        f"DISCOVERs/call {per.get('discover_messages_per_call', '-')}, "
                        f"CPU µs/call {', '.join(f'{k} {v:.0f}' for k, v in cpu.items())}; "
                        f"load processes at {res['load_process_cpu_pct']} % of a core")
        nprocs = len(lp.procs)
    out = {}
    for mode, rs in runs.items():
        fails: dict[str, int] = {}
        for x in rs:
            for k, v in x["failures"].items():
                fails[k] = fails.get(k, 0) + v
        cpus = [x["cpu_us_per_call"] for x in rs if x.get("cpu_us_per_call")]
        out[mode] = {"calls_per_s": {"median": statistics.median([x["calls_per_s"] for x in rs]),
                                     "all": [round(x["calls_per_s"], 1) for x in rs]},
                     "n": sum(x["calls"] for x in rs), "failed": sum(fails.values()), "failures": fails,
                     "errors": [e for x in rs for e in x["errors"]][:3],
                     "cpu_us_per_call": {k: statistics.median([c.get(k, 0.0) for c in cpus]) for k in cpus[0]}
                     if cpus else {},
                     "load_process_cpu_pct_max": max((max(x["load_process_cpu_pct"]) for x in rs), default=0.0),
                     **_per_call(rs),
                     "median_ms": statistics.median([x["median_ms"] for x in rs]),
                     "p99_ms": max(x["p99_ms"] for x in rs),
                     "clients": clients, "load_processes": nprocs, "phase_s": seconds, "repeats": repeats}
    return out


def servers_of(ma: str) -> list[tuple[str, str]]:
    """Every SeD offering ``add``: (name, address), by name."""
    import gridrpc
    with gridrpc.Client(ma) as c:
        names = sorted(s.name for s in c.discover("add", 1000))
        return [(n, c.resolve(n).address) for n in names]


def run_tree(procs, *, clients: int = 64, load_procs: int | None = None, seconds: float = 1.5,
             repeats: int = 3, log=None) -> dict:
    """Tree A (MA -> 2 LAs -> 4 SeDs, as the ``tree`` items) started in
    ``procs`` (:class:`benchmarks.procs.Procs`), then :func:`measure`."""
    t0 = time.monotonic()
    tree = procs.tree(las=2, seds_per_la=2)
    setup = time.monotonic() - t0
    ma = tree["ma"].address
    roles = {"ma": [tree["ma"].pid], "la": [p.pid for p in tree["las"]], "sed": [p.pid for p in tree["seds"]]}
    res = measure(ma, servers_of(ma), clients=clients, procs=load_procs, seconds=seconds, repeats=repeats,
                  roles=roles, idle_s=0.5 if seconds < 1 else 1.0, log=log)
    for v in res.values():
        v["tree"] = "MA -> 2 LAs -> 4 SeDs (separate processes)"
    res["_setup_s"] = {"tree_load": setup}
    return res


def run_items(procs, quick: bool) -> dict:
    """The suite's ``load`` items: :func:`run_tree` with 64 clients; phases of
    1.5 s, 3 of each (``--quick``: 0.5 s, 1 of each)."""
    res = run_tree(procs, clients=CLIENTS, seconds=0.5 if quick else 1.5, repeats=1 if quick else 3)
    return {"load_bound": res["bound"], "load_discovery": res["call"], "_setup_s": res["_setup_s"]}


def locust_cost(procs, users: int = 16, seconds: float = 8.0, log=print) -> dict:
    """CPU of a locust process per request (``gridrpc loadtest``, one locust
    process, ``users`` users) on tree A: mix ``add`` (with discovery) then
    ``add/bound``; CPU sampled in the middle of each run
    (:func:`benchmarks.scalability.measure.load_step`)."""
    import tempfile
    from pathlib import Path
    from .scalability.measure import CpuMeter, load_step
    tree = procs.tree(las=2, seds_per_la=2)
    pids = {"MA": tree["ma"].pid, **{p.name: p.pid for p in tree["las"] + tree["seds"]}}
    out = {}
    for mode, mix in (("call", "add"), ("bound", "add/bound")):
        st = load_step(tree["ma"].address, users, seconds, 1_000_000, mix, Path(tempfile.mkdtemp()), CpuMeter(pids))
        pct = st["cpu"].get("locust", 0.0)
        out[mode] = {"rps": st.get("rps"), "failures": st.get("failures"), "locust_cpu_pct": pct,
                     "locust_us_per_request": pct / 100 / st["rps"] * 1e6 if st.get("rps") else None}
        log(f"locust, {users} users, {mix}: {st.get('rps', 0):,.0f} requests/s, {st.get('failures')} failed, "
            f"locust at {pct:.0f} % of a core: {out[mode]['locust_us_per_request'] or 0:.0f} µs per request")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.green_load", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    w = sub.add_parser("worker")
    w.add_argument("--ma", required=True)
    w.add_argument("--clients", type=int, required=True)
    w.add_argument("--servers", required=True)
    w.add_argument("--first", type=int, default=0)
    w.add_argument("--index", type=int, default=0)
    w.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--ma", help="a running tree's MA (else a tree MA -> 2 LAs -> 4 SeDs is started)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--procs", type=int, default=None, help="load processes (default: one per core, "
                                                            "at most one per 8 clients)")
    ap.add_argument("--seconds", type=float, default=1.5, help="one phase (default 1.5)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the result here")
    ap.add_argument("--locust", action="store_true",
                    help="instead: CPU of one locust process per request (gridrpc loadtest, --users users)")
    ap.add_argument("--users", type=int, default=16, help="--locust: locust users (default 16)")
    a = ap.parse_args(argv)
    if a.cmd == "worker":
        return _worker(a)
    from .procs import Procs
    if a.locust:
        with Procs() as procs:
            res = locust_cost(procs, a.users, max(4.0, a.seconds * 4))
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(res, fh, indent=1)
        return 0

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    if a.ma:
        res = measure(a.ma, servers_of(a.ma), clients=a.clients, procs=a.procs, seconds=a.seconds,
                      repeats=a.repeats, log=log)
    else:
        with Procs() as procs:
            res = run_tree(procs, clients=a.clients, load_procs=a.procs, seconds=a.seconds, repeats=a.repeats,
                           log=log)
    b, c = res["bound"], res["call"]
    print(f"{a.clients} clients in {b['load_processes']} load processes: bound {b['calls_per_s']['median']:,.0f} "
          f"calls/s ({b['failed']} failed), with discovery {c['calls_per_s']['median']:,.0f} calls/s "
          f"({c['failed']} failed): {c['calls_per_s']['median'] / b['calls_per_s']['median']:.2f}x bound; "
          f"client CPU {b['cpu_us_per_call'].get('client', 0):.0f} / {c['cpu_us_per_call'].get('client', 0):.0f} "
          "µs per call")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
