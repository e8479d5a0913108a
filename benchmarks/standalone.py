"""Bound calls against one standalone SeD: calls/s and CPU per call of the SeD
(with its workers) and of the client, without a tree.

    python -m benchmarks.standalone [--isolation process|inline] [--n 10000] [--window 256] [--repeat 3]

Starts ``gridrpc sed --examples`` with no parent, warms up, then runs
``--repeat`` rounds of ``--n`` bound ``add`` calls with at most ``--window``
in flight, and 300 sequential ones. Prints the median round (calls/s, SeD
CPU µs per call from /proc, client CPU µs per call) and every round's rate;
the rounds of one run differ by up to ±20 % on this 2-vCPU machine, so
compare medians of several runs. The process is the SeD's and its children's
(workers); nothing else of the machine is counted.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

import psutil

import gridrpc

from .procs import Procs, cpu_seconds


async def _run(address: str, ps: psutil.Process, n: int, window: int, repeat: int) -> dict:
    async with gridrpc.AsyncClient(None) as c:
        h = c.handle("add", server=address)
        sem = asyncio.Semaphore(window)

        async def one():
            async with sem:
                assert await h(1, 2) == 3
        await asyncio.gather(*(one() for _ in range(500)))
        seq = []
        for _ in range(300):
            t0 = time.perf_counter()
            await h(1, 2)
            seq.append(time.perf_counter() - t0)
        seq.sort()
        rounds = []
        for _ in range(repeat):
            c0, m0, t0 = cpu_seconds(ps), time.process_time(), time.perf_counter()
            await asyncio.gather(*(one() for _ in range(n)))
            dt = time.perf_counter() - t0
            rounds.append({"calls_per_s": n / dt, "sed_us": (cpu_seconds(ps) - c0) / n * 1e6,
                           "client_us": (time.process_time() - m0) / n * 1e6})
        rounds.sort(key=lambda r: r["calls_per_s"])
        return {**rounds[len(rounds) // 2], "rounds": [round(r["calls_per_s"]) for r in rounds],
                "sequential_median_ms": seq[len(seq) // 2] * 1e3}


def measure(isolation: str = "process", n: int = 10000, window: int = 256, repeat: int = 3) -> dict:
    with Procs() as procs:
        p = procs.daemon("sed", "s1", "--examples", "--isolation", isolation).wait_ready()
        out = asyncio.run(_run(f"{p.address}#s1", psutil.Process(p.pid), n, window, repeat))
    out.update(isolation=isolation, n=n, window=window, load=os.getloadavg()[0], sed_pid=p.pid)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.standalone", description=__doc__.split("\n\n")[0])
    ap.add_argument("--isolation", choices=("process", "inline"), default="process")
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    r = measure(a.isolation, a.n, a.window, a.repeat)
    print(f"{r['isolation']}: {r['calls_per_s']:,.0f} calls/s ({a.window} in flight; rounds {r['rounds']}), "
          f"SeD {r['sed_us']:.0f} µs/call, client {r['client_us']:.0f} µs/call; "
          f"sequential median {r['sequential_median_ms']:.3f} ms (load {r['load']:.1f})")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(r, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
