"""8 MB numpy echo to a bound SeD, plain and under CURVE, calls interleaved.

``python -m benchmarks --only array_8mb_curve`` measures the plain tree,
then the secure one: on a machine shared with other work the load moves
between the two phases and the ratio with it. Here a plain tree and a secure
tree (MA -> sed-1 each, real processes) run together and the two clients
alternate calls one by one, so both see the same load; the CPU each side
spends per call (client, SeD with its workers) comes with it. Each round then
does the same for data references: ``client.put`` of the array to the SeD and
``client.get`` of it back (one put+get per step, the two trees alternating).

    python -m benchmarks.curve_bulk [--calls 40] [--rounds 3] [--mb 8]
"""
from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np
import psutil

import gridrpc

from .procs import Procs, cpu_seconds, wait_registered


def _tree(procs: Procs, secure: bool) -> tuple[str, dict, psutil.Process]:
    keys = procs.keys(["MA", "sed-1"]) if secure else None
    ma = procs.daemon("ma", "MA", keys=keys).wait_ready(30)
    sed = procs.daemon("sed", "sed-1", "--examples", parent=ma.address, keys=keys, parent_key="MA").wait_ready(30)
    kw = {"keys": str(keys), "user": "bench"} if keys else {}
    wait_registered(ma.address, 1, 30, **kw)
    return ma.address, kw, psutil.Process(sed.pid)


async def _round(plain, secure, calls: int, nbytes: int) -> dict:
    (pa, pkw, psed), (sa, skw, ssed) = plain, secure
    async with gridrpc.AsyncClient(pa, **pkw) as pc, gridrpc.AsyncClient(sa, **skw) as sc:
        handles = {"plain": pc.handle("echo", server=await pc.resolve("sed-1")),
                   "curve": sc.handle("echo", server=await sc.resolve("sed-1"))}
        seds = {"plain": psed, "curve": ssed}
        a = np.random.default_rng(0).random(nbytes // 8)
        for _ in range(3):
            for h in handles.values():
                await h(a)
        times: dict = {k: [] for k in handles}
        cpu = {k: [0.0, 0.0] for k in handles}
        me = psutil.Process()
        for _ in range(calls):
            for k, h in handles.items():
                c0, s0, t0 = me.cpu_times(), cpu_seconds(seds[k]), time.perf_counter()
                back = await h(a)
                times[k].append(time.perf_counter() - t0)
                c1, s1 = me.cpu_times(), cpu_seconds(seds[k])
                cpu[k][0] += c1.user + c1.system - c0.user - c0.system
                cpu[k][1] += s1 - s0
                assert back.shape == a.shape and back[-1] == a[-1]
    return _summary(times, cpu, calls, nbytes)


async def _put_get_round(plain, secure, calls: int, nbytes: int) -> dict:
    """One put and one get of the array per step and tree, the trees alternating."""
    (pa, pkw, psed), (sa, skw, ssed) = plain, secure
    async with gridrpc.AsyncClient(pa, **pkw) as pc, gridrpc.AsyncClient(sa, **skw) as sc:
        clients = {"plain": (pc, await pc.resolve("sed-1")), "curve": (sc, await sc.resolve("sed-1"))}
        seds = {"plain": psed, "curve": ssed}
        a = np.random.default_rng(1).random(nbytes // 8)

        async def put_get(c, srv):
            ref = await c.put(a, server=srv)
            back = await c.get(ref)
            return ref, back
        for _ in range(3):              # the secure client's first large put opens its bulk session
            for c, srv in clients.values():
                ref, _ = await put_get(c, srv)
                await c.free(ref)
        times: dict = {k: [] for k in clients}
        cpu = {k: [0.0, 0.0] for k in clients}
        me = psutil.Process()
        for _ in range(calls):
            for k, (c, srv) in clients.items():
                c0, s0, t0 = me.cpu_times(), cpu_seconds(seds[k]), time.perf_counter()
                ref, back = await put_get(c, srv)
                times[k].append(time.perf_counter() - t0)
                c1, s1 = me.cpu_times(), cpu_seconds(seds[k])
                cpu[k][0] += c1.user + c1.system - c0.user - c0.system
                cpu[k][1] += s1 - s0
                assert back.shape == a.shape and back[-1] == a[-1]
                await c.free(ref)
        stats = sc.data.bulk.stats
        out = _summary(times, cpu, calls, nbytes)
        out["sealed_mb"] = (stats["sent_bytes"] + stats["received_bytes"]) / 2 ** 20
        return out


def _summary(times: dict, cpu: dict, calls: int, nbytes: int) -> dict:
    out: dict = {}
    for k, ts in times.items():
        ts.sort()
        med = ts[len(ts) // 2]
        out[k] = {"median_ms": med * 1e3, "min_ms": ts[0] * 1e3, "gb_per_s": 2 * nbytes / med / 1e9,
                  "client_cpu_ms": cpu[k][0] / calls * 1e3, "sed_cpu_ms": cpu[k][1] / calls * 1e3}
    out["ratio_median"] = out["curve"]["median_ms"] / out["plain"]["median_ms"]
    out["ratio_min"] = out["curve"]["min_ms"] / out["plain"]["min_ms"]
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=40, help="steps per round (echo calls, then put+get pairs)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--mb", type=int, default=8)
    a = p.parse_args(argv)
    with Procs() as p1, Procs() as p2:
        plain, secure = _tree(p1, False), _tree(p2, True)
        for r in range(a.rounds):
            res = asyncio.run(_round(plain, secure, a.calls, a.mb << 20))
            pl, cu = res["plain"], res["curve"]
            print(f"round {r + 1}: plain {pl['median_ms']:.1f} ms/rt ({pl['gb_per_s']:.2f} GB/s, min "
                  f"{pl['min_ms']:.1f}), CURVE {cu['median_ms']:.1f} ms/rt ({cu['gb_per_s']:.2f} GB/s, min "
                  f"{cu['min_ms']:.1f}): {res['ratio_median']:.2f}x (min {res['ratio_min']:.2f}x); CPU ms per "
                  f"call client {pl['client_cpu_ms']:.1f} -> {cu['client_cpu_ms']:.1f}, SeD+workers "
                  f"{pl['sed_cpu_ms']:.1f} -> {cu['sed_cpu_ms']:.1f}", flush=True)
            res = asyncio.run(_put_get_round(plain, secure, a.calls, a.mb << 20))
            pl, cu = res["plain"], res["curve"]
            print(f"round {r + 1} put+get: plain {pl['median_ms']:.1f} ms ({pl['gb_per_s']:.2f} GB/s, min "
                  f"{pl['min_ms']:.1f}), CURVE {cu['median_ms']:.1f} ms ({cu['gb_per_s']:.2f} GB/s, min "
                  f"{cu['min_ms']:.1f}): {res['ratio_median']:.2f}x (min {res['ratio_min']:.2f}x); CPU ms per "
                  f"put+get client {pl['client_cpu_ms']:.1f} -> {cu['client_cpu_ms']:.1f}, SeD+workers "
                  f"{pl['sed_cpu_ms']:.1f} -> {cu['sed_cpu_ms']:.1f}; {res['sealed_mb']:.0f} MB sealed through "
                  "the data session", flush=True)


if __name__ == "__main__":
    main()
