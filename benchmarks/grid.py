"""gridrpc measurements on real processes (``gridrpc ma|la|sed`` subprocesses).

Tree A (``tree`` items): MA -> 2 LAs -> 4 SeDs (``--examples``, default
options: max_concurrent 1, FCFS, calls in worker processes). The client runs
in the benchmark process: an :class:`gridrpc.AsyncClient` on this process's
event loop (the ``*_sync`` items use the blocking :class:`gridrpc.Client`).

Tree A with CURVE (``curve`` items, ``*_curve``): the same tree started
with ``--secure --keys DIR`` (a key pair per element and a user key
``bench``, in the run's temp dir), the client with ``keys=DIR, user="bench"``;
its rows are compared with the plain items of the same run (``PLAIN_OF``).

Tree B (``discovery_100``): MA -> 10 LAs -> 10 ``gridrpc sed --replicas 10``
processes = 100 SeDs. Memory: a lone ``gridrpc sed --examples`` attached to
an MA, then one with ``--replicas 100``.
"""
from __future__ import annotations

import asyncio
import os
import time

import numpy as np

import gridrpc

from .procs import Procs, wait_registered
from .stats import latency, rates

MB8 = 8 * 1024 * 1024
TREE_ITEMS = ("call_discovery", "call_bound", "call_discovery_sync", "call_bound_sync",
              "throughput_bound", "throughput_discovery", "array_8mb")
# diagnostics (no target): where the time of the items above goes
DIAG_ITEMS = ("discover_4", "discover_4_fanout", "call_bound_inline", "throughput_bound_inline", "array_8mb_inline",
              "call_discovery_ask", "throughput_discovery_ask", "call_bound_pinned", "throughput_bound_pinned")
PINNED_ITEMS = ("call_bound_pinned", "throughput_bound_pinned")
# the same tree with CURVE on every link; each compared with its plain item of the same run
CURVE_ITEMS = ("call_discovery_curve", "call_bound_curve", "throughput_bound_curve", "array_8mb_curve")
PLAIN_OF = {i: i.removesuffix("_curve") for i in CURVE_ITEMS}
# the blocking Client's items, each compared with its AsyncClient item of the same run
ASYNC_OF = {"call_discovery_sync": "call_discovery", "call_bound_sync": "call_bound"}


class CpuProbe:
    """CPU seconds (user + system) used so far by each role's processes:
    ``client`` (this process), ``ma``, ``la`` (all LAs), ``sed`` (SeD
    processes), ``workers`` (their worker processes). Differences over a run,
    minus the idle rate measured at start (heartbeats ...), divided by the
    number of calls, say where the work goes even on a busy machine, where
    wall-clock times are noisy. Resolution: the 10 ms clock tick / calls."""

    def __init__(self, roles: dict[str, list[int]], idle_s: float = 2.0, client: list[int] | None = None) -> None:
        import psutil
        self.procs = {r: [psutil.Process(p) for p in pids] for r, pids in roles.items()}
        # the client's processes: this one, or the load processes that make the calls (benchmarks.green_load)
        self.procs["client"] = [psutil.Process(p) for p in client] if client else [psutil.Process()]
        # idle rate (heartbeats, housekeeping) per role, subtracted from every run
        self.idle: dict[str, float] = {}
        if idle_s:
            a = self.snapshot()
            time.sleep(idle_s)
            b = self.snapshot()
            self.idle = {r: max(0.0, (b[r] - a.get(r, 0.0)) / (b["_t"] - a["_t"])) for r in b if r != "_t"}

    def snapshot(self) -> dict[str, float]:
        import psutil
        out = {}
        for role, ps in self.procs.items():
            total = 0.0
            for p in ps:
                try:
                    t = p.cpu_times()
                    total += t.user + t.system
                    if role == "sed":
                        for k in p.children(recursive=True):
                            kt = k.cpu_times()
                            out["workers"] = out.get("workers", 0.0) + kt.user + kt.system
                except psutil.Error:
                    pass
            out[role] = total
        out["_t"] = time.monotonic()
        return out

    def per_call(self, before: dict, after: dict, calls: int) -> dict:
        """CPU microseconds per call and role, idle rate subtracted."""
        dt = after["_t"] - before["_t"]
        return {r: round(max(0.0, after[r] - before.get(r, 0.0) - self.idle.get(r, 0.0) * dt) / calls * 1e6, 1)
                for r in after if r != "_t"}


async def _seq(fn, warmup: int, n: int, probe: CpuProbe | None = None) -> dict:
    out = []
    before = None
    for i in range(warmup + n):
        if i == warmup and probe:
            before = probe.snapshot()
        t0 = time.perf_counter()
        await fn()
        if i >= warmup:
            out.append(time.perf_counter() - t0)
    res = latency(out)
    if probe:
        res["cpu_us_per_call"] = probe.per_call(before, probe.snapshot(), n)
    return res


def _seq_sync(fn, warmup: int, n: int) -> dict:
    out = []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            out.append(time.perf_counter() - t0)
    return latency(out)


async def _throughput(fn, n: int, window: int, repeat: int, probe: CpuProbe | None = None) -> dict:
    """``n`` calls, at most ``window`` in flight; calls/s, median of ``repeat`` runs."""
    async def one_run(count):
        sem = asyncio.Semaphore(window)

        async def one(i):
            async with sem:
                r = await fn()
                assert r == 3, r
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(count)))
        return count / (time.perf_counter() - t0)
    await one_run(min(n, 300))      # warm-up
    before = probe.snapshot() if probe else None
    res = {"calls_per_s": rates([await one_run(n) for _ in range(repeat)]), "n": n, "window": window}
    if probe:
        res["cpu_us_per_call"] = probe.per_call(before, probe.snapshot(), n * repeat)
    return res


async def _bw(handle, quick: bool) -> dict:
    arr = np.random.default_rng(0).random(MB8 // 8)

    async def rt():
        back = await handle(arr)
        assert back.shape == arr.shape and back[-1] == arr[-1]
    lat = await _seq(rt, 3, 5 if quick else 30)
    lat["gb_per_s"] = 2 * MB8 / (lat["median_ms"] / 1e3) / 1e9
    return lat


async def _tree_async(ma: str, bound_to: str, inline: str | None, items: set[str], quick: bool,
                      probe: CpuProbe | None = None, client_kw: dict | None = None,
                      pinned: tuple[str, list, list] | None = None) -> dict:
    res: dict = {}
    seq_n = 200 if quick else 3000
    tp_n = 400 if quick else 5000
    rep = 1 if quick else 3
    async with gridrpc.AsyncClient(ma, **(client_kw or {})) as c:
        bound = c.handle("add", server=await c.resolve(bound_to))
        if "call_discovery" in items:
            res["call_discovery"] = await _seq(lambda: c.call("add", 1, 2), 50, seq_n, probe)
        if "call_bound" in items:
            res["call_bound"] = await _seq(lambda: bound(1, 2), 50, seq_n, probe)
        if "throughput_bound" in items:
            res["throughput_bound"] = await _throughput(lambda: bound(1, 2), tp_n, 256, rep, probe)
        if "throughput_discovery" in items:
            res["throughput_discovery"] = await _throughput(lambda: c.call("add", 1, 2), tp_n, 256, rep, probe)
        if "array_8mb" in items:
            res["array_8mb"] = await _bw(c.handle("echo", server=await c.resolve(bound_to)), quick)
        if "discover_4" in items:
            res["discover_4"] = await _seq(lambda: c.discover("add", 3), 50, seq_n, probe)
        if "discover_4_fanout" in items:       # max_age=0: never from the MA's pushed view
            res["discover_4_fanout"] = await _seq(lambda: c.discover("add", 3, max_age=0), 50, seq_n, probe)
        if {"call_discovery_ask", "throughput_discovery_ask"} & items:
            # reuse_discovery=0: every call asks the MA (the default reuses a view answer for 10 ms)
            async with gridrpc.AsyncClient(ma, **{**(client_kw or {}), "reuse_discovery": 0}) as ask:
                if "call_discovery_ask" in items:
                    res["call_discovery_ask"] = await _seq(lambda: ask.call("add", 1, 2), 50, seq_n, probe)
                if "throughput_discovery_ask" in items:
                    res["throughput_discovery_ask"] = await _throughput(lambda: ask.call("add", 1, 2), tp_n, 256,
                                                                        rep, probe)
        if pinned:
            # a SeD started with --cpus (its process, zmq thread and worker on one CPU), this client bound
            # to the other CPUs for these rows only (docs/performance.md, "CPU binding")
            from gridrpc.affinity import bind_cpus
            where, _sed_cpus, client_cpus = pinned
            ph = c.handle("add", server=await c.resolve(where))
            before = sorted(os.sched_getaffinity(0))
            bind_cpus(client_cpus)
            try:
                if "call_bound_pinned" in items:
                    res["call_bound_pinned"] = await _seq(lambda: ph(1, 2), 50, seq_n, probe)
                if "throughput_bound_pinned" in items:
                    res["throughput_bound_pinned"] = await _throughput(lambda: ph(1, 2), tp_n, 256, rep, probe)
            finally:
                bind_cpus(before, check=False)
        if inline:
            srv = await c.resolve(inline)
            ib = c.handle("add", server=srv)
            if "call_bound_inline" in items:
                res["call_bound_inline"] = await _seq(lambda: ib(1, 2), 50, seq_n, probe)
            if "throughput_bound_inline" in items:
                res["throughput_bound_inline"] = await _throughput(lambda: ib(1, 2), tp_n, 256, rep, probe)
            if "array_8mb_inline" in items:
                res["array_8mb_inline"] = await _bw(c.handle("echo", server=srv), quick)
    return res


def run_tree(procs: Procs, items: set[str], quick: bool, secure: bool = False) -> dict:
    """Tree A items; ``secure``: the ``*_curve`` items, i.e. their plain
    items measured on tree A started with CURVE keys."""
    if secure:
        items = {PLAIN_OF[i] for i in items if i in PLAIN_OF}
    t0 = time.monotonic()
    tree = procs.tree(las=2, seds_per_la=2, secure=secure)
    setup = time.monotonic() - t0
    ma, kw = tree["ma"].address, tree["client_kw"]
    bound_to = tree["sed_names"][0]
    inline = None
    if {"call_bound_inline", "throughput_bound_inline", "array_8mb_inline"} & items:
        # outside the tree (no parent): a SeD running calls in its own process
        p = procs.daemon("sed", "sed-inline", "--examples", "--isolation", "inline").wait_ready()
        inline = f"{p.address}#sed-inline"
    roles = {"ma": [tree["ma"].pid], "la": [p.pid for p in tree["las"]], "sed": [p.pid for p in tree["seds"]]}
    if inline:
        roles["sed"].append(p.pid)
    pinned = None
    cpus = sorted(os.sched_getaffinity(0))
    if set(PINNED_ITEMS) & items and len(cpus) >= 2:
        pp = procs.daemon("sed", "sed-pinned", "--examples", "--cpus", str(cpus[-1])).wait_ready()
        pinned = (f"{pp.address}#sed-pinned", cpus[-1:], cpus[:-1])
        roles["sed"].append(pp.pid)
    res = asyncio.run(_tree_async(ma, bound_to, inline, items, quick, CpuProbe(roles, 0.5 if quick else 2.0), kw,
                                  pinned))
    seq_n = 200 if quick else 3000
    if {"call_discovery_sync", "call_bound_sync"} & items:
        with gridrpc.Client(ma, **kw) as c:
            if "call_discovery_sync" in items:
                res["call_discovery_sync"] = _seq_sync(lambda: c.call("add", 1, 2), 50, seq_n)
            if "call_bound_sync" in items:
                h = c.handle("add", server=bound_to)
                res["call_bound_sync"] = _seq_sync(lambda: h(1, 2), 50, seq_n)
    for k, v in res.items():
        v["tree"] = "MA -> 2 LAs -> 4 SeDs (separate processes)" + (", CURVE on every link" if secure else "")
        v["bound_to"] = ("sed-inline (--isolation inline, no parent)" if k.endswith("_inline") else
                         f"sed-pinned (--cpus {pinned[1][0]}, no parent; client on CPUs {pinned[2]})"
                         if k.endswith("_pinned") and pinned else bound_to)
    if secure:
        return {**{k + "_curve": v for k, v in res.items()}, "_setup_s": {"tree_a_curve": setup}}
    res["_setup_s"] = {"tree_a": setup}
    return res


def run_discovery_100(procs: Procs, quick: bool) -> dict:
    t0 = time.monotonic()
    tree = procs.tree(las=10, seds_per_la=1, replicas=10, timeout=120)
    setup = time.monotonic() - t0
    ma = tree["ma"].address

    async def go():
        async with gridrpc.AsyncClient(ma) as c:
            found = await c.discover("add", 10)
            assert len(found) == 10, found
            probe = CpuProbe({"ma": [tree["ma"].pid], "la": [p.pid for p in tree["las"]],
                              "sed": [p.pid for p in tree["seds"]]}, 0.5 if quick else 2.0)
            lat = await _seq(lambda: c.discover("add", 10), 10 if quick else 20, 60 if quick else 1000, probe)
            lat["answered_seds"] = len(tree["sed_names"])
            return lat
    res = asyncio.run(go())
    res["tree"] = "MA -> 10 LAs -> 10 processes x --replicas 10 = 100 SeDs"
    res["setup_s"] = setup
    return {"discovery_100": res}


def _mem(pid: int) -> dict:
    import psutil
    p = psutil.Process(pid)
    mi = p.memory_full_info()
    kids = p.children(recursive=True)
    kid_rss = sum(k.memory_info().rss for k in kids)
    kid_uss = sum(k.memory_full_info().uss for k in kids)
    return {"rss_mb": mi.rss / 2**20, "uss_mb": mi.uss / 2**20, "pss_mb": getattr(mi, "pss", 0) / 2**20,
            "workers": len(kids), "workers_rss_mb": kid_rss / 2**20, "workers_uss_mb": kid_uss / 2**20}


def run_memory(procs: Procs, items: set[str], quick: bool) -> dict:
    ma = procs.daemon("ma", "MA").wait_ready()
    res = {}
    one = procs.daemon("sed", "mem-1", "--examples", parent=ma.address).wait_ready()
    wait_registered(ma.address, 1, 30)
    time.sleep(1.5)         # a heartbeat or two, host metrics refreshed
    m1 = _mem(one.pid)
    res["memory_sed"] = {**m1, "what": "idle `gridrpc sed --examples`, registered under an MA; "
                                       "rss_mb is the SeD process (workers listed apart)"}
    if "memory_replicas" in items:
        reps = 100
        many = procs.daemon("sed", "mem-100", "--examples", "--replicas", str(reps),
                            parent=ma.address).wait_ready()
        wait_registered(ma.address, 1 + reps, 60)
        time.sleep(1.5)
        m100 = _mem(many.pid)
        res["memory_replicas"] = {**m100, "replicas": reps,
                                  "per_replica_kb": (m100["rss_mb"] - m1["rss_mb"]) * 1024 / (reps - 1),
                                  "what": f"`gridrpc sed --examples --replicas {reps}`: "
                                          "(RSS(100) - RSS(1)) / 99"}
    return res
