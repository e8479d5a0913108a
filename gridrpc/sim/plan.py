"""Choosing a tree shape by simulating the candidates (``gridrpc deploy plan``).

Every candidate shape (``gridrpc.deploy.plan.shape_for`` at 1..max_levels
agent levels, within ``max_fanout``) is built in the simulator on the hosts
of the plan: one host -> every process on its cores (as the measurements
here); several -> agents and SeD processes on hosts of their own. Each is
measured twice: the median of sequential discoveries, and the calls/s of a
closed-loop load (8 users, discovery + call). The choice: the lowest
discovery median; among shapes within ``tolerance`` of it, the highest
throughput, then the fewest agents.
"""
from __future__ import annotations

import os

from .model import Costs
from .world import World, closed_loop, discovery_series, elements_for


def _cores(hosts: dict[str, dict]) -> int:
    h = next(iter(hosts.values()))
    c = h.get("cores")
    return int(c) if isinstance(c, int) and c > 0 else (os.cpu_count() or 1)


def simulate(agents: list[int], n: int, hosts: dict[str, dict], costs: Costs, *, pack: bool = True,
             rounds: int = 60, users: int = 8, seconds: float = 0.6) -> dict:
    single = len(hosts) == 1
    cores = _cores(hosts)
    kw = dict(placement="single" if single else "cluster", cores=cores, sed_cores=cores)
    per_proc = None if (single or pack) else 1
    els = elements_for(agents if len(agents) > 1 else "flat", n, seds_per_proc=per_proc,
                       flat_procs=min(cores, n) if single else max(1, len(hosts)))
    w = World(costs=costs, seed=1, **kw).build(els)
    w.wait_registered()
    d = discovery_series(w, rounds=rounds, warmup=5)
    w = World(costs=costs, seed=1, **kw).build(els)
    w.wait_registered()
    t = closed_loop(w, users, seconds=seconds)
    return {"median_ms": d["discovery_median_ms"], "p99_ms": d["discovery_p99_ms"], "rps": t["throughput"],
            "ma_busy": t["ma_busy"], "processes": len(els)}


def choose(n: int, hosts: dict[str, dict], *, max_levels: int = 4, max_fanout: int | None = None,
           tolerance: float = 0.1, costs_file: str | None = None, pack: bool = True):
    from ..deploy.plan import shape_for
    from ..errors import ConfigError
    costs = Costs.load(costs_file)
    cands, seen = [], set()
    for levels in range(1, max(1, max_levels) + 1):
        s = shape_for(n, levels)
        if tuple(s.agents) in seen or (max_fanout and max(s.fanouts()) > max_fanout):
            continue
        seen.add(tuple(s.agents))
        cands.append((s, simulate(s.agents, n, hosts, costs, pack=pack)))
    if not cands:
        raise ConfigError(f"no shape with at most {max_levels} levels keeps the fan-out <= {max_fanout}")
    fastest = min(r["median_ms"] for _, r in cands)
    near = [(s, r) for s, r in cands if r["median_ms"] <= fastest * (1 + tolerance)]
    best = max(near, key=lambda sr: (sr[1]["rps"], -sum(sr[0].agents)))[0]
    single = len(hosts) == 1
    lines = [f"model: simulation (gridrpc.sim) of every candidate on "
             + (f"one host of {_cores(hosts)} cores (every process shares them)" if single
                else f"{len(hosts)} hosts (agents and SeD processes on hosts of their own)"),
             f"costs: {costs.source}",
             f"choice: lowest simulated discovery median; within {tolerance:.0%} of it, most calls/s, "
             "then fewest agents",
             "candidates:"]
    for s, r in cands:
        mark = "  <- chosen" if s.agents == best.agents else ""
        lines.append(f"  agents per level {'+'.join(map(str, s.agents))} (fan-out {'/'.join(map(str, s.fanouts()))}): "
                     f"discovery median {r['median_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, {r['rps']:.0f} calls/s "
                     f"(8 users), MA busy {r['ma_busy']:.0%}{mark}")
    if single and len(best.agents) == 1:
        lines.append("why: on one host every agent takes CPU from the same cores and adds a hop; "
                     "a deeper tree only adds work (as measured in docs/scalability.md)")
    elif len(best.agents) > 1:
        lines.append("why: a flat MA would rank every SeD's answer and take every heartbeat itself; "
                     "agents on their own hosts share that work")
    return best, "\n".join(lines)
