"""``gridrpc sim scale``: tree shapes compared at scale (cluster placement:
every agent on a host of its own, SeD processes of ``--replicas`` SeDs on
hosts of their own, clients in 100 client processes)."""
from __future__ import annotations

import contextlib
import gc
import json
import sys
import time

from .world import World, elements_for, open_clients, shape_agents


@contextlib.contextmanager
def few_collections(threshold: int = 1_000_000):
    """The cyclic garbage collector run less often: a world of 100,000 SeDs
    is millions of long-lived objects, and every full collection walked
    them all (~20 % of a run's CPU at 10,000 SeDs). Results are the same.
    The young generation is collected every ``threshold`` allocations and
    the middle one almost never: a fan-out keeps every SeD's answer alive
    a while (100,000 vectors in flight at 100,000 SeDs) and each
    collection walked those (~10 % of the CPU at 50,000 SeDs, collecting
    every 50,000 allocations and the middle generation every 50). A run
    makes few cyclic objects besides the world: at the end, one full
    collection frees what was built inside."""
    old = gc.get_threshold()
    gc.set_threshold(threshold, 1000, 1000)
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.collect()            # the worlds built inside (cyclic) go now, not at some later full collection


def run_shape(shape, n: int, clients: int, *, seconds: float, calls_per_client: float, replicas: int,
              views: bool = True, hb_interval: float = 1.0, warmup: float = 0.5) -> dict:
    with few_collections():
        return _run_shape(shape, n, clients, seconds=seconds, calls_per_client=calls_per_client,
                          replicas=replicas, views=views, hb_interval=hb_interval, warmup=warmup)


def _run_shape(shape, n: int, clients: int, *, seconds: float, calls_per_client: float, replicas: int,
               views: bool, hb_interval: float, warmup: float) -> dict:
    t = time.perf_counter()
    cpu = time.process_time()
    els = elements_for(shape, n, seds_per_proc=replicas, flat_procs=max(1, n // replicas))
    w = World(seed=1, placement="cluster", sed_cores=replicas, views=views, hb_interval=hb_interval,
              hb_timeout=5.0 * hb_interval).build(els)
    w.wait_registered(limit=30.0 + 5 * hb_interval)
    t_reg = time.perf_counter() - t
    sim_reg = w.sim.now
    r = open_clients(w, clients, seconds=seconds, calls_per_client=calls_per_client, client_procs=100,
                     warmup=warmup)
    ma = w.agents["MA"].state
    r = {k: v for k, v in r.items() if k != "busy"}
    r.update(views_at_ma=len(ma.view.seds), view_refused=ma.view.refused, hb_interval=hb_interval,
             sim_register_s=sim_reg)
    r.update(shape=shape if isinstance(shape, str) else "+".join(map(str, shape)), seds=n, clients=clients,
             agents=sum(1 for e in els if e.kind != "sed"), offered_per_s=clients * calls_per_client / seconds,
             wall_s=time.perf_counter() - t, wall_register_s=t_reg, cpu_s=time.process_time() - cpu)
    return r


def cmd_scale(a) -> int:
    out = []
    for text in a.shapes.split(";" if ";" in a.shapes else ","):
        try:
            shape = [int(x) for x in text.split("+")] if "+" in text else text
            if isinstance(shape, str):
                shape_agents(shape)
        except ValueError:
            print(f"gridrpc sim scale: bad shape {text!r}: flat, L2-D, L3-D, L4-D or agents per level "
                  "like 1+46+2128", file=sys.stderr)
            return 2
        try:
            r = run_shape(shape, a.seds, a.clients, seconds=a.seconds, calls_per_client=a.calls_per_client,
                          replicas=a.replicas, views=a.views, hb_interval=a.hb_interval, warmup=a.warmup)
        except RuntimeError as exc:         # the tree never registered: its agents cannot take the heartbeats
            print(f"{text:10s} {exc} (its agents cannot take their children's heartbeats?)", file=sys.stderr)
            continue
        out.append(r)
        print(f"{r['shape']:10s} agents {r['agents']:5d} views {'on ' if a.views else 'off'}: "
              f"{r['discoveries']} discoveries ({r['view_answers']} from the view), "
              f"discovery median {_f(r['discovery_median_ms'])} ms p99 {_f(r['discovery_p99_ms'])} ms, "
              f"{r['throughput']:.1f} calls/s of {r['offered_per_s']:.0f} offered, MA in {r['ma_inbound_per_s']:.0f}/s, "
              f"LA in max {r['la_inbound_per_s_max']:.0f}/s, freshness {_f(r['freshness_median_ms'])} ms, MA busy {r['ma_busy']:.0%}, "
              f"wall {r['wall_s']:.0f} s (CPU {r['cpu_s']:.0f} s)", file=sys.stderr, flush=True)
        if a.json:                      # after every shape: a long run keeps what it measured
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
    return 0


def _f(x) -> str:
    return "-" if x is None else f"{x:.2f}"
