"""Choosing a tree shape by simulating the candidates (``gridrpc deploy plan``).

Every candidate shape (``gridrpc.deploy.plan.shape_for`` at 1..max_levels
agent levels, within ``max_fanout``) is built in the simulator on the hosts
of the plan: one host -> every process on its cores (as the measurements
here); several -> agents and SeD processes on hosts of their own. Each is
measured twice: the median of sequential discoveries, and the calls/s of a
closed-loop load (8 users, discovery + call); over ``LARGE`` SeDs with 20
discoveries and 0.2 s of load instead of 60 and 0.6 s (every fan-out
builds one estimate per SeD). A shape whose busiest agent would need a core
for its children's heartbeats alone (:func:`heartbeat_share`: the flat MA
of 100,000 SeDs) is reported, not simulated. The choice: the lowest
discovery median; among shapes within ``tolerance`` of it, the highest
throughput, then the fewest agents.
"""
from __future__ import annotations

import gc
import os

from .model import Costs
from .scale import few_collections
from .world import World, closed_loop, discovery_series, elements_for

LARGE = 20_000          # SeDs from which each candidate is measured briefly (fewer discoveries, shorter load)


def _cores(hosts: dict[str, dict]) -> int:
    h = next(iter(hosts.values()))
    c = h.get("cores")
    return int(c) if isinstance(c, int) and c > 0 else (os.cpu_count() or 1)


def heartbeat_share(agents: list[int], n: int, costs: Costs, hb_interval: float = 1.0) -> tuple[str, float]:
    """The busiest agent of a shape and the CPU share (cores) its heartbeats
    alone take, by the simulator's costs: every second each child's
    heartbeat in (an LA's carries its whole subtree) and the ack out, and
    the agent's own heartbeat up. A shape whose agent needs a core or more
    for that can never register its SeDs (the flat MA of 100,000 SeDs: 13
    cores), so it is not simulated."""
    levels = len(agents)
    below = [n] * levels                 # SeDs under one agent of each level
    size = [0.0] * levels                # elements in the subtree of one agent of each level
    for i in range(levels - 1, -1, -1):
        below[i] = n / agents[i]
        size[i] = below[i] + (sum(agents[i + 1:]) / agents[i])
    worst = ("MA", 0.0)
    for i in range(levels):
        kind = "ma" if i == 0 else "la"
        msg, item = costs.msg(kind), costs.item(kind)
        if i == levels - 1:              # SeD children: no elements
            cpu = below[i] * 2 * msg
        else:
            fan = agents[i + 1] / agents[i]
            cpu = fan * (2 * msg + size[i + 1] * item)
        if i > 0:
            cpu += 2 * msg + size[i] * item
        share = cpu / hb_interval
        if share > worst[1]:
            worst = ("MA" if i == 0 else f"an LA of level {i + 1}", share)
    return worst


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
    del w
    gc.collect()                # a world is cyclic: free it before building the next (100,000 SeDs: ~1 GB)
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
    cands, seen, skipped = [], set(), []
    single = len(hosts) == 1
    brief = {} if n <= LARGE else {"rounds": 20, "seconds": 0.2}   # every fan-out builds n estimates
    for levels in range(1, max(1, max_levels) + 1):
        s = shape_for(n, levels)
        if tuple(s.agents) in seen or (max_fanout and max(s.fanouts()) > max_fanout):
            continue
        seen.add(tuple(s.agents))
        who, share = heartbeat_share(s.agents, n, costs)
        if not single and share >= 1.0:       # on one host the processes share its cores: simulated anyway
            skipped.append((s, f"not simulated: {who} would need {share:.1f} cores for heartbeats alone"))
            continue
        try:
            with few_collections():
                cands.append((s, simulate(s.agents, n, hosts, costs, pack=pack, **brief)))
        except RuntimeError as exc:           # the tree never registered (saturated by its heartbeats)
            skipped.append((s, f"not simulated to the end: {exc}"))
    if not cands:
        why = "; ".join(f"{'+'.join(map(str, s.agents))}: {w}" for s, w in skipped)
        raise ConfigError(f"no shape with at most {max_levels} levels keeps the fan-out <= {max_fanout}"
                          if not skipped else f"no shape could be simulated ({why})")
    fastest = min(r["median_ms"] for _, r in cands)
    near = [(s, r) for s, r in cands if r["median_ms"] <= fastest * (1 + tolerance)]
    best = max(near, key=lambda sr: (sr[1]["rps"], -sum(sr[0].agents)))[0]
    lines = [f"model: simulation (gridrpc.sim) of every candidate on "
             + (f"one host of {_cores(hosts)} cores (every process shares them)" if single
                else f"{len(hosts)} hosts (agents and SeD processes on hosts of their own)"),
             f"costs: {costs.source}",
             "measured per candidate: " + (f"{brief['rounds']} sequential discoveries and {brief['seconds']} s "
                                           f"of load (over {LARGE:,} SeDs: shorter)" if brief else
                                           "60 sequential discoveries and 0.6 s of load"),
             f"choice: lowest simulated discovery median; within {tolerance:.0%} of it, most calls/s, "
             "then fewest agents",
             "candidates:"]
    for s, r in cands:
        mark = "  <- chosen" if s.agents == best.agents else ""
        lines.append(f"  agents per level {'+'.join(map(str, s.agents))} (fan-out {'/'.join(map(str, s.fanouts()))}): "
                     f"discovery median {r['median_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, {r['rps']:.0f} calls/s "
                     f"(8 users), MA busy {r['ma_busy']:.0%}{mark}")
    for s, why in skipped:
        lines.append(f"  agents per level {'+'.join(map(str, s.agents))} (fan-out {'/'.join(map(str, s.fanouts()))}): "
                     + why)
    if single and len(best.agents) == 1:
        lines.append("why: on one host every agent takes CPU from the same cores and adds a hop; "
                     "a deeper tree only adds work (as measured in docs/scalability.md)")
    elif len(best.agents) > 1:
        lines.append("why: a flat MA would rank every SeD's answer and take every heartbeat itself; "
                     "agents on their own hosts share that work")
        res = dict((tuple(sh.agents), r) for sh, r in cands)[tuple(best.agents)]
        others = sorted(((sh, r) for sh, r in cands if sh.agents != best.agents), key=lambda sr: sr[1]["median_ms"])
        if others:
            sh2, r2 = others[0]
            text = (f"why {_name(best)}: the lowest median under no load ({res['median_ms']:.1f} ms, "
                    f"{max(best.fanouts())} children per agent at most; next {_name(sh2)}: {r2['median_ms']:.1f} ms, "
                    f"{max(sh2.fanouts())} children)")
            full = [f"{_name(sh)}'s MA is saturated ({r['ma_busy']:.0%} busy under 8 users)" for sh, r in others
                    if r["ma_busy"] >= 0.95]
            lines.append(text + ("; " + "; ".join(full) if full else ""))
    return best, "\n".join(lines)


def _name(shape) -> str:
    return "+".join(map(str, shape.agents)) if len(shape.agents) > 1 else "flat"
