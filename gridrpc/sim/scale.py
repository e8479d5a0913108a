"""``gridrpc sim scale``: tree shapes compared at scale (cluster placement:
every agent on a host of its own, SeD processes of ``--replicas`` SeDs on
hosts of their own, clients in 100 client processes)."""
from __future__ import annotations

import json
import sys
import time

from .world import World, elements_for, open_clients


def run_shape(shape, n: int, clients: int, *, seconds: float, calls_per_client: float, replicas: int) -> dict:
    t = time.perf_counter()
    els = elements_for(shape, n, seds_per_proc=replicas, flat_procs=max(1, n // replicas))
    w = World(seed=1, placement="cluster", sed_cores=replicas).build(els)
    w.wait_registered()
    t_reg = time.perf_counter() - t
    r = open_clients(w, clients, seconds=seconds, calls_per_client=calls_per_client, client_procs=100)
    r = {k: v for k, v in r.items() if k != "busy"}
    r.update(shape=shape if isinstance(shape, str) else "+".join(map(str, shape)), seds=n, clients=clients,
             agents=sum(1 for e in els if e.kind != "sed"), offered_per_s=clients * calls_per_client / seconds,
             wall_s=time.perf_counter() - t, wall_register_s=t_reg)
    return r


def cmd_scale(a) -> int:
    out = []
    for text in a.shapes.split(";" if ";" in a.shapes else ","):
        shape = [int(x) for x in text.split("+")] if "+" in text else text
        r = run_shape(shape, a.seds, a.clients, seconds=a.seconds, calls_per_client=a.calls_per_client,
                      replicas=a.replicas)
        out.append(r)
        print(f"{r['shape']:10s} agents {r['agents']:5d}: discovery median {r['discovery_median_ms']} ms, "
              f"{r['throughput']:.1f} calls/s of {r['offered_per_s']:.0f} offered, MA in {r['ma_inbound_per_s']:.0f}/s, "
              f"LA in max {r['la_inbound_per_s_max']:.0f}/s, freshness {r['freshness_median_ms']} ms, "
              f"wall {r['wall_s']:.0f} s", file=sys.stderr, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0
