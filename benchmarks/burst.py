"""A burst of optional computations, as the scale experiment starts one
(issue #12, "Bursts"): ``U`` users of one client process arrive together,
each discovers the ``S`` SeDs of a real tree (ethic queue, 2 SeD processes)
and sends its ``n_min`` mandatory calls plus one optional call per server;
later every call still out is cancelled at once, as at the users' common
deadline.

Measured, from the moment the users start:

- ``discovered``: when the last user has its servers;
- ``received``: when the last call reached its SeD, by the SeDs' clock (the
  ``received`` time each CANCELLED carries back) — the realised arrival of
  the last user;
- ``dispatched``: when every call of every user is acknowledged by its SeD
  (queued or running), by the client: ``received`` plus the held ACCEPTED of
  a queued call (up to 0.25 s, docs/performance.md) and the trip back;
- ``cancelled``: from the moment every user cancels its calls until every
  cancellation is confirmed.

Run: ``python -m benchmarks.burst [--seds 138 --users 100 --n-min 3]
[--json out.json]``. The SeDs run ``sleep`` calls of ``--task`` seconds (long
enough that nothing finishes during the measure).
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import time

from gridrpc.client.aio import AsyncClient
from gridrpc.core.client_call.machine import Phase
from gridrpc.experiments.tree import ExperimentTree


class _GcClock:
    """Seconds this process spent in the cyclic GC (``gc.callbacks``), and collections per generation."""

    def __init__(self) -> None:
        self.seconds, self.by_gen, self._t = 0.0, [0, 0, 0], 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t
            self.by_gen[info["generation"]] += 1

    def take(self) -> dict:
        out = {"seconds": round(self.seconds, 3), "collections": list(self.by_gen)}
        self.seconds, self.by_gen = 0.0, [0, 0, 0]
        return out


def _cpu(tree: ExperimentTree) -> dict:
    c = tree.cpu()
    t = os.times()
    c["client"] = t.user + t.system
    return c


async def _users(tree: ExperimentTree, users: int, seds: int, n_min: int, task: float,
                 poll: float = 0.01, share: bool = True, freeze: bool = True, on_phase=None) -> dict:
    """``on_phase(name)``, if given, is called with "dispatched" and "cancelled" as each phase ends
    (a profiler's hook: stop sampling there)."""
    ma = tree.ma_address
    clients = [AsyncClient(ma, user=f"u{i}", discovery_timeout=60.0, ack_timeout=120.0, ping_timeout=60.0,
                           share_discovery=share)
               for i in range(users)]
    for c in clients:
        await c.start()
    gcs = _GcClock()
    try:
        if freeze:
            # as the experiment runner does before every run (gridrpc.experiments.ethic): what exists
            # before the users start is frozen out of the cyclic GC, whose full collections would walk
            # it again and again while the burst allocates (measured: 0.29 s of the client's 0.8 s)
            gc.collect()
            gc.freeze()
        gc.callbacks.append(gcs)
        c0 = _cpu(tree)
        t0, w0 = time.monotonic(), time.time()
        found: list[float] = []
        calls: list = []
        mine: dict = {c: [] for c in clients}

        async def one(c: AsyncClient) -> None:
            servers = await c.discover("sleep", max_servers=seds)
            found.append(time.monotonic() - t0)
            own = mine[c]
            for i in range(n_min):
                own.append(c.submit_nowait("sleep", task, server=servers[i % len(servers)]))
            for s in servers:
                own.append(c.submit_nowait("sleep", task, optional=True, server=s))
            calls.extend(own)

        await asyncio.gather(*(one(c) for c in clients))

        first = 0           # every call before it was seen acknowledged

        def waiting(c) -> bool:
            f = getattr(c, "_flight", None)
            return f is None or f.machine.phase in (Phase.NEW, Phase.WAITING)

        def unacknowledged() -> int:
            """0 once every call is acknowledged, else an upper bound. A poll must not tax the client it
            measures: rescanning the 14,100 calls every 10 ms took a third of the client's samples during
            the dispatch (py-spy). Only "all acknowledged" matters, so walk on from the first call not yet
            seen acknowledged and stop at the next one still waiting: O(calls) over the whole dispatch."""
            nonlocal first
            while first < len(calls) and not waiting(calls[first]):
                first += 1
            return len(calls) - first

        end = time.monotonic() + 120
        while unacknowledged() and time.monotonic() < end:
            await asyncio.sleep(poll)
        dispatched = time.monotonic() - t0
        gc_dispatch = gcs.take()
        if on_phase is not None:
            on_phase("dispatched")
        left = sum(1 for c in calls if waiting(c))
        c1 = _cpu(tree)
        t1 = time.monotonic()
        # each user cancels all its calls at once (AsyncClient.cancel_calls: one wait, not one per call)
        await asyncio.gather(*(c.cancel_calls(own) for c, own in mine.items()), return_exceptions=True)
        cancelled = time.monotonic() - t1
        if on_phase is not None:
            on_phase("cancelled")
        # the SeDs' own clock: every CANCELLED carries the call's "received" time (same host, same clock)
        got = [c.timing.get("received") for c in calls if isinstance(getattr(c, "timing", None), dict)]
        got = [g for g in got if isinstance(g, (int, float))]
        c2 = _cpu(tree)
        gc_cancel = gcs.take()
        cpu = {k: {"dispatch_s": round(c1[k] - c0[k], 3), "cancel_s": round(c2[k] - c1[k], 3)} for k in c0}
        return {"cpu": cpu, "users": users, "seds": seds, "calls": len(calls), "discovered_s": max(found),
                "dispatched_s": dispatched, "unacknowledged": left, "cancelled_s": cancelled,
                "received_s": (max(got) - w0) if got else None, "received_of": len(got),
                "client_gc": {"frozen": freeze, "dispatch": gc_dispatch, "cancel": gc_cancel}}
    finally:
        if gcs in gc.callbacks:
            gc.callbacks.remove(gcs)
        if freeze:
            gc.unfreeze()
        for c in clients:
            await c.aclose()


def measure(seds: int = 138, users: int = 100, n_min: int = 3, task: float = 60.0,
            sed_processes: int = 2, freeze: bool = True) -> dict:
    with ExperimentTree(n_seds=seds, queue="ethic", queue_options={"accounting": "cumulative"},
                        sed_processes=sed_processes) as tree:
        asyncio.run(_wait(tree.ma_address, seds))
        out = asyncio.run(_users(tree, users, seds, n_min, task, freeze=freeze))
    out["load"] = os.getloadavg()[0]
    return out


async def _wait(ma: str, seds: int, timeout: float = 60.0) -> None:
    async with AsyncClient(ma, user="setup") as c:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                if len(await c.discover("sleep", max_servers=seds)) >= seds:
                    return
            except Exception:  # noqa: BLE001 - not up yet
                pass
            await asyncio.sleep(0.2)
    raise TimeoutError(f"{seds} SeDs did not register")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.burst", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seds", type=int, default=138)
    ap.add_argument("--users", type=int, default=100)
    ap.add_argument("--n-min", type=int, default=3)
    ap.add_argument("--task", type=float, default=60.0, help="seconds each call would sleep")
    ap.add_argument("--sed-processes", type=int, default=2)
    ap.add_argument("--no-freeze", action="store_true",
                    help="leave the client's objects in the cyclic GC's walks (the experiment runner freezes them)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    r = measure(a.seds, a.users, a.n_min, a.task, a.sed_processes, freeze=not a.no_freeze)
    print(f"burst: {r['users']} users x {r['seds']} SeDs = {r['calls']} calls: "
          f"discovered {r['discovered_s']:.2f}s, all received by the SeDs "
          f"{r['received_s'] if r['received_s'] is None else round(r['received_s'], 2)}s "
          f"({r['received_of']} calls timed), all acknowledged {r['dispatched_s']:.2f}s "
          f"({r['unacknowledged']} not), all cancelled {r['cancelled_s']:.2f}s (load {r['load']:.1f})")
    print("CPU seconds (dispatch / cancel): " + ", ".join(f"{k} {v['dispatch_s']:.2f} / {v['cancel_s']:.2f}"
                                                      for k, v in r["cpu"].items()))
    g = r["client_gc"]
    print(f"client in the cyclic GC (dispatch / cancel): {g['dispatch']['seconds']:.2f} / {g['cancel']['seconds']:.2f} s"
          f" ({'start-up objects frozen' if g['frozen'] else 'nothing frozen'}; collections per generation "
          f"{g['dispatch']['collections']} / {g['cancel']['collections']})")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(r, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
