"""``gridrpc sim run --engine simgrid --platform FILE.xml``: the run of
``gridrpc sim run`` on a SimGrid platform (:mod:`gridrpc.sim.simgrid_engine`).

A platform of one site (its hosts in one zone) runs the tree of ``--shape``
as the built-in engine does and reports the same figures; a platform of
several sites (zones under the root zone, :mod:`gridrpc.sim.simgrid_sites`)
runs one federated tree per site with data moved between them.
:func:`measure_tree` is the measurement of ``sim run`` for either engine
(the engines' comparison in tests/test_sim_simgrid.py uses it).
"""
from __future__ import annotations

import json
import sys
import time

from .model import Costs
from .world import World, closed_loop, discovery_series, elements_for

__all__ = ["ENGINES", "add_engine_arguments", "cmd_run_simgrid", "measure_tree", "sg_world", "shape_arg"]

ENGINES = ("builtin", "simgrid")


def add_engine_arguments(r) -> None:
    """The options of ``sim run`` that choose and set the engine."""
    r.add_argument("--engine", choices=ENGINES, default="builtin",
                   help="builtin: the heap of events (100,000 SeDs); simgrid: SimGrid actors on --platform")
    r.add_argument("--platform", help="SimGrid platform file (--engine simgrid), e.g. deployments/sim/one-host.xml")
    r.add_argument("--network-model", default="CM02",
                   help="SimGrid's network model (CM02: latency + size/bandwidth, as the built-in engine; LV08)")
    r.add_argument("--cpu-sharing", choices=("slice", "fair"), default="slice",
                   help="slice: a process keeps a core for its queued jobs up to the time slice (the built-in "
                        "engine's, the costs' calibration); fair: SimGrid's equal shares")
    r.add_argument("--rounds", type=int, default=200, help="sequential discoveries measured")
    r.add_argument("--seconds", type=float, default=1.5, help="simulated seconds of the closed loop measured")
    r.add_argument("--data-size", type=float, default=1e6,
                   help="several sites: bytes of the data each user's first call keeps on its SeD")


def shape_arg(text: str):
    return [int(x) for x in text.split(",")] if "," in text else text


def measure_tree(engine: str, shape, seds: int, *, users: int = 8, seed: int = 1, costs: Costs | None = None,
                 rounds: int = 200, seconds: float = 1.5, warmup: float = 0.3, platform: str | None = None,
                 cores: int = 2, placement: str = "single", network_model: str = "CM02",
                 cpu_sharing: str = "slice", speed: float = 1.0, views: bool = False, reuse: float = 0.0) -> dict:
    """``gridrpc sim run``'s figures of one tree: ``rounds`` sequential
    discoveries in one world, ``users`` closed-loop users for ``seconds``
    in another. ``engine`` ``simgrid``: each world is a SimGrid run of
    ``platform`` in a child process. Built-in engine: ``speed`` of the
    host (:mod:`gridrpc.sim.host`), pushed ``views``, the load generator's
    ``reuse`` window of view answers (:func:`gridrpc.sim.world.closed_loop`)."""
    costs = costs or Costs.load(None)
    els = elements_for(shape_arg(shape) if isinstance(shape, str) else shape, seds)
    t = time.perf_counter()
    if engine == "builtin":
        kw = dict(costs=costs, seed=seed, placement=placement, cores=cores, sed_cores=cores, speed=speed,
                  views=views)
        d = _series(World(**kw), els, rounds)
        c = _loop(World(**kw), els, users, seconds, warmup, reuse)
    elif engine == "simgrid":
        if not platform:
            raise ValueError("the SimGrid engine needs a platform file (--platform FILE.xml)")
        from .simgrid_isolate import run_isolated
        kw = dict(costs=costs, seed=seed, network_model=network_model, cpu=cpu_sharing)
        d = run_isolated(_sg_series, platform, kw, els, rounds)
        c = run_isolated(_sg_loop, platform, kw, els, users, seconds, warmup)
    else:
        raise ValueError(f"engine is one of {', '.join(ENGINES)}, not {engine!r}")
    out = {"seds": seds, "shape": shape, "discovery_median_ms": d["discovery_median_ms"],
           "discovery_p99_ms": d["discovery_p99_ms"], "calls_per_s": c["throughput"],
           "call_p99_ms": c["call_p99_ms"], "ma_busy": c["ma_busy"], "busiest": max(c["busy"], key=c["busy"].get),
           "ma_inbound_per_s": c["ma_inbound_per_s"], "engine": engine}
    if engine == "simgrid":
        out.update(platform=platform, network_model=network_model, cpu_sharing=cpu_sharing)
    out["wall_s"] = time.perf_counter() - t
    return out


def _series(w: World, els, rounds: int) -> dict:
    w.build(els)
    w.wait_registered()
    return discovery_series(w, rounds=rounds)


def _loop(w: World, els, users: int, seconds: float, warmup: float, reuse: float = 0.0) -> dict:
    w.build(els)
    w.wait_registered()
    return closed_loop(w, users, seconds=seconds, warmup=warmup, reuse=reuse)


def sg_world(platform: str, kw: dict):
    """A SimGrid world of ``platform``'s one site: on several hosts, the
    agents and clients on the first, the SeD processes on the others in turn."""
    from .simgrid_engine import SgWorld
    from .simgrid_sites import sites_of, spread
    hosts = [h for hs in sites_of(platform).values() for h in hs]
    return SgWorld(platform, placement=spread(hosts) if len(hosts) > 1 else None, **kw)


def _sg_series(platform: str, kw: dict, els, rounds: int) -> dict:
    return _series(sg_world(platform, kw), els, rounds)


def _sg_loop(platform: str, kw: dict, els, users: int, seconds: float, warmup: float) -> dict:
    return _loop(sg_world(platform, kw), els, users, seconds, warmup)


def cmd_run_simgrid(a) -> int:
    """``gridrpc sim run --engine simgrid``: one site as ``measure_tree``;
    several sites as :func:`gridrpc.sim.simgrid_sites.measure_sites`."""
    if not a.platform:
        print("gridrpc sim run --engine simgrid: --platform FILE.xml is required", file=sys.stderr)
        return 2
    from .simgrid_loader import SimGridMissing, load_simgrid
    from .simgrid_sites import measure_sites, sites_of
    try:
        load_simgrid()
    except SimGridMissing as exc:
        print(f"gridrpc sim run --engine simgrid: {exc}", file=sys.stderr)
        return 2
    sites = sites_of(a.platform)
    costs = Costs.load(a.costs)
    if len(sites) > 1:
        out = measure_sites(a.platform, a.shape, a.seds, users=a.users, seed=a.seed, costs=costs,
                            rounds=a.rounds, seconds=a.seconds, data_size=a.data_size,
                            network_model=a.network_model, cpu_sharing=a.cpu_sharing)
    else:
        out = measure_tree("simgrid", a.shape, a.seds, users=a.users, seed=a.seed, costs=costs,
                           rounds=a.rounds, seconds=a.seconds, platform=a.platform,
                           network_model=a.network_model, cpu_sharing=a.cpu_sharing)
    print(json.dumps(out, indent=1))
    return 0
