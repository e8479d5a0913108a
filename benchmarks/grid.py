"""gridrpc measurements on real processes (``gridrpc ma|la|sed`` subprocesses).

Tree A (``tree`` items): MA -> 2 LAs -> 4 SeDs (``--examples``, default
options: max_concurrent 1, FCFS, calls in worker processes). The client runs
in the benchmark process: an :class:`gridrpc.AsyncClient` on this process's
event loop (the ``*_sync`` items use the blocking :class:`gridrpc.Client`).

Tree B (``discovery_100``): MA -> 10 LAs -> 10 ``gridrpc sed --replicas 10``
processes = 100 SeDs. Memory: a lone ``gridrpc sed --examples`` attached to
an MA, then one with ``--replicas 100``.
"""
from __future__ import annotations

import asyncio
import time

import numpy as np

import gridrpc

from .procs import Procs, wait_registered
from .stats import latency, rates

MB8 = 8 * 1024 * 1024
TREE_ITEMS = ("call_discovery", "call_bound", "call_discovery_sync", "call_bound_sync",
              "throughput_bound", "throughput_discovery", "array_8mb")


async def _seq(fn, warmup: int, n: int) -> dict:
    out = []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        await fn()
        if i >= warmup:
            out.append(time.perf_counter() - t0)
    return latency(out)


def _seq_sync(fn, warmup: int, n: int) -> dict:
    out = []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            out.append(time.perf_counter() - t0)
    return latency(out)


async def _throughput(fn, n: int, window: int, repeat: int) -> dict:
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
    return {"calls_per_s": rates([await one_run(n) for _ in range(repeat)]), "n": n, "window": window}


async def _tree_async(ma: str, bound_to: str, items: set[str], quick: bool) -> dict:
    res: dict = {}
    seq_n = 300 if quick else 3000
    tp_n = 500 if quick else 5000
    rep = 1 if quick else 3
    async with gridrpc.AsyncClient(ma) as c:
        bound = c.handle("add", server=await c.resolve(bound_to))
        if "call_discovery" in items:
            res["call_discovery"] = await _seq(lambda: c.call("add", 1, 2), 50, seq_n)
        if "call_bound" in items:
            res["call_bound"] = await _seq(lambda: bound(1, 2), 50, seq_n)
        if "throughput_bound" in items:
            res["throughput_bound"] = await _throughput(lambda: bound(1, 2), tp_n, 256, rep)
        if "throughput_discovery" in items:
            res["throughput_discovery"] = await _throughput(lambda: c.call("add", 1, 2), tp_n, 256, rep)
        if "array_8mb" in items:
            arr = np.random.default_rng(0).random(MB8 // 8)
            echo = c.handle("echo", server=await c.resolve(bound_to))

            async def rt():
                back = await echo(arr)
                assert back.shape == arr.shape
            lat = await _seq(rt, 3, 5 if quick else 30)
            lat["gb_per_s"] = 2 * MB8 / (lat["median_ms"] / 1e3) / 1e9
            res["array_8mb"] = lat
    return res


def run_tree(procs: Procs, items: set[str], quick: bool) -> dict:
    t0 = time.monotonic()
    tree = procs.tree(las=2, seds_per_la=2)
    setup = time.monotonic() - t0
    ma = tree["ma"].address
    bound_to = tree["sed_names"][0]
    res = asyncio.run(_tree_async(ma, bound_to, items, quick))
    seq_n = 300 if quick else 3000
    if {"call_discovery_sync", "call_bound_sync"} & items:
        with gridrpc.Client(ma) as c:
            if "call_discovery_sync" in items:
                res["call_discovery_sync"] = _seq_sync(lambda: c.call("add", 1, 2), 50, seq_n)
            if "call_bound_sync" in items:
                h = c.handle("add", server=bound_to)
                res["call_bound_sync"] = _seq_sync(lambda: h(1, 2), 50, seq_n)
    for v in res.values():
        v["tree"] = "MA -> 2 LAs -> 4 SeDs (separate processes)"
        v["bound_to"] = bound_to
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
            lat = await _seq(lambda: c.discover("add", 10), 20, 100 if quick else 1000)
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
