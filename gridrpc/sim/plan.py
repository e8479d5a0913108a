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
of 100,000 SeDs) is reported, not simulated. Over ``SPLIT`` SeDs on
several hosts a candidate is measured on pieces of at most ``WHOLE`` SeDs
(:func:`split_shape`, :func:`compose`): a level and one subtree at a time,
so that 100,000 SeDs are planned in under a minute. The choice: the lowest
discovery median; among shapes within ``tolerance`` of it, the highest
throughput, then the fewest agents.
"""
from __future__ import annotations

import gc
import math
import os
import time

from .model import Costs
from .scale import few_collections
from .world import World, closed_loop, discovery_series, elements_for

LARGE = 20_000          # SeDs from which each candidate is measured briefly (fewer discoveries, shorter load)
SPLIT = 20_000          # SeDs from which a candidate on several hosts is measured on its pieces (compose)
WHOLE = 2_500           # the most SeDs of the last piece, simulated as one tree


def _cores(hosts: dict[str, dict]) -> int:
    h = next(iter(hosts.values()))
    c = h.get("cores")
    return int(c) if isinstance(c, int) and c > 0 else (os.cpu_count() or 1)


def heartbeat_shares(agents: list[int], n: int, costs: Costs, hb_interval: float = 1.0) -> list[float]:
    """The CPU share (cores) that heartbeats alone take on one agent of
    each level of a shape, by the simulator's costs: every second each
    child's heartbeat in (an LA's carries its whole subtree) and the ack
    out, and the agent's own heartbeat up."""
    levels = len(agents)
    below = [n] * levels                 # SeDs under one agent of each level
    size = [0.0] * levels                # elements in the subtree of one agent of each level
    for i in range(levels - 1, -1, -1):
        below[i] = n / agents[i]
        size[i] = below[i] + (sum(agents[i + 1:]) / agents[i])
    out = []
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
        out.append(cpu / hb_interval)
    return out


def heartbeat_share(agents: list[int], n: int, costs: Costs, hb_interval: float = 1.0) -> tuple[str, float]:
    """The busiest agent of a shape and the CPU share (cores) its heartbeats
    alone take (:func:`heartbeat_shares`). A shape whose agent needs a core
    or more for that can never register its SeDs (the flat MA of 100,000
    SeDs: 13 cores), so it is not simulated."""
    worst = ("MA", 0.0)
    for i, share in enumerate(heartbeat_shares(agents, n, costs, hb_interval)):
        if share > worst[1]:
            worst = ("MA" if i == 0 else f"an LA of level {i + 1}", share)
    return worst


def simulate(agents: list[int], n: int, hosts: dict[str, dict], costs: Costs, *, pack: bool = True,
             rounds: int = 60, users: int = 8, seconds: float = 0.6, leaf: bool = False) -> dict:
    """One candidate's figures. ``leaf``: a flat tree laid out as the SeDs
    under one leaf agent of a larger tree (one SeD process with ``--pack``),
    not spread over every host as a flat deployment's."""
    single = len(hosts) == 1
    cores = _cores(hosts)
    kw = dict(placement="single" if single else "cluster", cores=cores, sed_cores=cores)
    per_proc = None if (single or pack) else 1
    els = elements_for(agents if len(agents) > 1 or leaf else "flat", n, seds_per_proc=per_proc,
                       flat_procs=min(cores, n) if single else max(1, len(hosts)))
    w = World(costs=costs, seed=1, **kw).build(els)
    w.wait_registered()
    d = discovery_series(w, rounds=rounds, warmup=5)
    del w
    gc.collect()                # a world is cyclic: free it before building the next (100,000 SeDs: ~1 GB)
    w = World(costs=costs, seed=1, **kw).build(els)
    w.wait_registered()
    t = closed_loop(w, users, seconds=seconds)
    busy = {k: v for k, v in t["busy"].items() if k in w.agents or k in w.seds}
    top = max(busy, key=busy.get)
    return {"median_ms": d["discovery_median_ms"], "p99_ms": d["discovery_p99_ms"], "rps": t["throughput"],
            "ma_busy": t["ma_busy"], "processes": len(els), "busiest": (top, busy[top])}


def split_shape(agents: list[int], n: int, whole: int) -> list[tuple[list[int], int]]:
    """The pieces a shape is measured on when it is too large to simulate
    whole: while the tree holds more than ``whole`` SeDs, its top level is
    cut off as a piece of its own (the root and its children, each child an
    agent with one SeD) and the cut goes on in the busiest subtree below one
    of those children (the largest: every level's fan-out rounded up); the
    last piece, at most ``whole`` SeDs (or a flat subtree), is simulated
    whole. Agents of one level run on hosts of their own, in parallel, and
    the subtrees below them are alike, so a discovery's path through the
    tree is the path through one root and one subtree of each level."""
    out = []
    while n > whole and len(agents) > 1:
        f1 = agents[1]
        out.append(([1, f1], f1))
        agents = [1] + [math.ceil(a / f1) for a in agents[2:]]
        n = math.ceil(n / f1)
    out.append((agents, n))
    return out


def compose(agents: list[int], n: int, hosts: dict[str, dict], costs: Costs, *, whole: int, pack: bool = True,
            rounds: int = 20, seconds: float = 0.2, users: int = 8, cache: dict | None = None) -> dict:
    """A large shape's figures from its pieces (:func:`split_shape`), each
    simulated whole. A piece's discovery = client -> its root -> the root's
    children -> back; the tree's = the sum over its pieces less, per cut,
    one discovery of a tree of one SeD (the client's hops and the SeD's
    answer, counted in both pieces of a cut). The closed loop's time per
    call (users / calls/s) composes the same way. The busiest element:
    each piece's busiest at the tree's calls/s (its work per call times the
    tree's rate), the root of a cut piece with the heartbeats of the whole
    subtrees below it (:func:`heartbeat_shares`) instead of its one-SeD
    children's."""
    cache = {} if cache is None else cache

    def measure(a: list[int], k: int) -> dict:
        key = (tuple(a), k)
        if key not in cache:
            with few_collections():
                cache[key] = simulate(a, k, hosts, costs, pack=pack, rounds=rounds, users=users, seconds=seconds,
                                      leaf=True)
        return cache[key]

    parts = split_shape(agents, n, whole)
    one = measure([1], 1)
    res = [measure(a, k) for a, k in parts]
    cuts = len(parts) - 1
    median = sum(r["median_ms"] for r in res) - cuts * one["median_ms"]
    p99 = sum(r["p99_ms"] for r in res) - cuts * one["p99_ms"]
    cycle = sum(users / r["rps"] for r in res) - cuts * users / one["rps"]
    rps = users / cycle
    real_hb = heartbeat_shares(agents, n, costs)
    elements: list[tuple[str, float]] = []
    for depth, ((a, k), r) in enumerate(zip(parts, res)):
        scale = rps / r["rps"]          # the piece's work per call, at the tree's calls/s
        root = r["ma_busy"]
        if depth < cuts:                # a cut piece's root: heartbeats of the real subtrees below it
            root = max(0.0, root - heartbeat_shares(a, k, costs)[0]) * scale + real_hb[depth]
        else:
            root *= scale
        elements.append(("MA" if depth == 0 else f"an LA of level {depth + 1}", root))
        name, share = r["busiest"]
        if depth == cuts and name != "MA":
            label = _label(name)
            if name.startswith("LA"):       # its level in the whole tree: below the cut pieces' roots
                label = f"an LA of level {depth + name.count('.') + 2}"
            elements.append((label, share * scale))
    busiest = max(elements, key=lambda e: e[1])
    ma_busy = elements[0][1]
    return {"median_ms": median, "p99_ms": p99, "rps": rps, "ma_busy": min(ma_busy, 1.0),
            "busiest": (busiest[0], min(busiest[1], 1.0)), "processes": sum(r["processes"] for r in res),
            "pieces": [("+".join(map(str, a)), k) for a, k in parts]}


def choose(n: int, hosts: dict[str, dict], *, max_levels: int = 4, max_fanout: int | None = None,
           tolerance: float = 0.1, costs_file: str | None = None, pack: bool = True,
           whole: int | None = None, split_above: int | None = None):
    """The shape to deploy and the lines saying why. Over ``split_above``
    SeDs (default :data:`SPLIT`) on several hosts, every candidate is
    measured on its pieces (:func:`compose`), the last one of at most
    ``whole`` SeDs (default :data:`WHOLE`)."""
    from ..deploy.plan import shape_for
    from ..errors import ConfigError
    t_start = time.perf_counter()
    costs = Costs.load(costs_file)
    whole = WHOLE if whole is None else whole
    cands, seen, skipped = [], set(), []
    single = len(hosts) == 1
    brief = {} if n <= LARGE else {"rounds": 20, "seconds": 0.2}   # every fan-out builds n estimates
    pieces_cache: dict = {}
    split = not single and n > (SPLIT if split_above is None else split_above)
    for levels in range(1, max(1, max_levels) + 1):
        s = shape_for(n, levels)
        if tuple(s.agents) in seen or (max_fanout and max(s.fanouts()) > max_fanout):
            continue
        seen.add(tuple(s.agents))
        who, share = heartbeat_share(s.agents, n, costs)
        if not single and share >= 1.0:       # on one host the processes share its cores: simulated anyway
            skipped.append((s, f"not simulated: {who} would need {share:.1f} cores for heartbeats alone"))
            continue
        if split and len(s.agents) == 1:
            skipped.append((s, f"not simulated: a flat tree of {n:,} SeDs cannot be cut into pieces of at most "
                               f"{whole:,} SeDs ({who} would need {share:.2f} cores for heartbeats alone)"))
            continue
        try:
            if split:
                cands.append((s, compose(s.agents, n, hosts, costs, whole=whole, pack=pack, cache=pieces_cache,
                                         **(brief or {"rounds": 20, "seconds": 0.2}))))
            else:
                with few_collections():
                    r = simulate(s.agents, n, hosts, costs, pack=pack, **brief)
                r["busiest"] = (_label(r["busiest"][0]), r["busiest"][1])
                cands.append((s, r))
        except RuntimeError as exc:           # the tree never registered (saturated by its heartbeats)
            skipped.append((s, f"not simulated to the end: {exc}"))
    if not cands:
        why = "; ".join(f"{'+'.join(map(str, s.agents))}: {w}" for s, w in skipped)
        raise ConfigError(f"no shape with at most {max_levels} levels keeps the fan-out <= {max_fanout}"
                          if not skipped else f"no shape could be simulated ({why})")
    fastest = min(r["median_ms"] for _, r in cands)
    near = [(s, r) for s, r in cands if r["median_ms"] <= fastest * (1 + tolerance)]
    best = max(near, key=lambda sr: (sr[1]["rps"], -sum(sr[0].agents)))[0]
    if split:
        measured = (f"each candidate on its pieces (a tree over {whole:,} SeDs is cut level by level: "
                    "the root with its children, then one subtree below; discovery times and time per call "
                    "of the pieces add up), each piece with 20 sequential discoveries and 0.2 s of load")
    elif brief:
        measured = (f"{brief['rounds']} sequential discoveries and {brief['seconds']} s of load "
                    f"(over {LARGE:,} SeDs: shorter)")
    else:
        measured = "60 sequential discoveries and 0.6 s of load"
    lines = [f"model: simulation (gridrpc.sim) of every candidate on "
             + (f"one host of {_cores(hosts)} cores (every process shares them)" if single
                else f"{len(hosts)} hosts (agents and SeD processes on hosts of their own)"),
             f"costs: {costs.source}",
             "measured per candidate: " + measured,
             f"choice: lowest simulated discovery median; within {tolerance:.0%} of it, most calls/s, "
             "then fewest agents",
             "candidates:"]
    for s, r in cands:
        mark = "  <- chosen" if s.agents == best.agents else ""
        who, share = r["busiest"]
        pieces = (" [pieces " + ", ".join(f"{a} ({k:,} SeDs)" for a, k in r["pieces"]) + "]") if "pieces" in r else ""
        lines.append(f"  agents per level {'+'.join(map(str, s.agents))} (fan-out {'/'.join(map(str, s.fanouts()))}): "
                     f"discovery median {r['median_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, {r['rps']:.0f} calls/s "
                     f"(8 users), MA busy {r['ma_busy']:.0%}, busiest {who} {share:.0%} of a core{pieces}{mark}")
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
            if res["median_ms"] <= fastest:
                head = f"the lowest median under no load ({res['median_ms']:.1f} ms"
            else:
                head = (f"within {tolerance:.0%} of the lowest median ({res['median_ms']:.1f} ms against "
                        f"{fastest:.1f}) with the most calls/s ({res['rps']:.0f}")
            text = (f"why {_name(best)}: {head}, {max(best.fanouts())} children per agent at most; "
                    f"next {_name(sh2)}: {r2['median_ms']:.1f} ms, {r2['rps']:.0f} calls/s, "
                    f"{max(sh2.fanouts())} children)")
            full = [f"{_name(sh)}'s MA is saturated ({r['ma_busy']:.0%} busy under 8 users)" for sh, r in others
                    if r["ma_busy"] >= 0.95]
            lines.append(text + ("; " + "; ".join(full) if full else ""))
    lines.append(f"planning took {time.perf_counter() - t_start:.0f} s of wall time")
    return best, "\n".join(lines)


def _label(name: str) -> str:
    """A simulated element's name as the plan says it: the MA, an LA of
    its level (``LA3`` is level 2, ``LA3.1`` level 3), a SeD process."""
    if name == "MA":
        return "MA"
    if name.startswith("LA"):
        return f"an LA of level {name.count('.') + 2}"
    return "a SeD process"


def _name(shape) -> str:
    return "+".join(map(str, shape.agents)) if len(shape.agents) > 1 else "flat"
