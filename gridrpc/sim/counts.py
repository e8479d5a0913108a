"""What each element of a simulated tree handles: wake-ups, messages and
items, per sequential discovery or per call under a closed-loop load -- the
columns of the calibration's fit (:mod:`gridrpc.sim.calibrate`).

Messages and items do not depend on the costs (the real core decides who
sends what); wake-ups do: a process that is still busy when the next message
arrives drains it without waking up again, so the counts are taken with the
costs being fitted (the calibration iterates)."""
from __future__ import annotations

from .model import Costs
from .world import World, elements_for

__all__ = ["count_discovery", "count_load"]


def _snapshot(w: World) -> dict[str, tuple]:
    nodes = {**w.agents, **w.seds, **{c.name: c for c in w.clients}}
    # the wake-ups of a client's background jobs are not the process's (the calibration fits the background apart)
    return {name: (node.kind, node.proc.wakeups - getattr(node, "bg_wakeups", 0), node.n_msgs, node.n_items,
                   sum(p.jobs_done for p in getattr(node, "workers", ())),
                   node.proc.host.elements / node.proc.host.cores) for name, node in nodes.items()}


def _diff(before: dict, after: dict, per: int) -> dict[str, dict]:
    out = {}
    for name, (kind, wk, nm, ni, ex, crowd) in after.items():
        _, wk0, nm0, ni0, ex0, _ = before.get(name, (kind, 0, 0, 0, 0, 0))
        out[name] = {"kind": kind, "wakeups": (wk - wk0) / per, "msgs": (nm - nm0) / per,
                     "items": (ni - ni0) / per, "execs": (ex - ex0) / per, "crowd": crowd}
    return out


def count_discovery(shape: str, n: int, costs: Costs, rounds: int = 20, *, views: bool = False,
                    cores: int = 2) -> dict[str, dict]:
    """Wake-ups, messages, items (and worker runs: ``execs``; ``crowd``: element
    processes per core of its host) per sequential discovery (one blocking
    client, k = 3, no heartbeats) of each element of the tree; ``views``:
    the agents answer from pushed views (the daemons' default); ``cores``:
    of the one host every process runs on."""
    from .client_node import User
    w = World(costs=costs, seed=0, hb_interval=1000.0, views=views, cores=cores,
              sed_cores=cores).build(elements_for(shape, n))
    w.wait_registered()
    w.sim.run(until=w.sim.now + 0.05)           # registration traffic drained
    c = w.client("client", "client")
    before = _snapshot(w)
    u = User(c, "u", service="noop", k=3, call=False, calls=rounds, think=None, user="u")
    u.begin()
    w.sim.run(until=w.sim.now + 100.0)
    got = len(w.discoveries)
    if got != rounds:
        raise RuntimeError(f"{shape} with {n} SeDs: {got} of {rounds} discoveries answered")
    return _diff(before, _snapshot(w), got)


def count_load(shape: str, n: int, users: int, costs: Costs, *, seconds: float = 0.5,
               warmup: float = 0.3, min_calls_per_user: int = 3, limit: float = 4.0,
               views: bool = False, cores: int = 2) -> tuple[dict[str, dict], float]:
    """Wake-ups, messages, items and worker runs per call of each element
    (the load generator ``locust`` included) with ``users`` closed-loop users
    calling ``noop`` (discovery + call), no heartbeats; and the simulated
    calls/s. Counted over at least ``seconds`` after ``warmup``, and until
    every user made ``min_calls_per_user`` calls on average (a deep tree
    under load answers slowly: a short window would count work of calls
    not finished in it), at most ``limit`` simulated seconds. ``views``:
    pushed views, and the load generator's reuse window of view answers
    (``gridrpc loadtest``'s default), as the daemons and ``gridrpc loadtest``
    run by default."""
    from .client_node import User
    from .world import LOADTEST_REUSE
    w = World(costs=costs, seed=1, hb_interval=1000.0, views=views, cores=cores,
              sed_cores=cores).build(elements_for(shape, n))
    w.wait_registered()
    c = w.client("locust", "locust", LOADTEST_REUSE if views else 0.0)
    for i in range(users):
        u = User(c, f"u{i}", service="noop", k=3, call=True, calls=None, think=None, user=f"user{i}")
        w.sim.after(w.rng.random() * 1e-3, u.begin)
    w.sim.run(until=w.sim.now + warmup)
    w.reset_stats()
    before = _snapshot(w)
    t0 = w.sim.now
    while True:
        w.sim.run(until=w.sim.now + 0.1)
        dur = w.sim.now - t0
        if dur >= limit or (dur >= seconds and len(w.calls) >= min_calls_per_user * users):
            break
    calls = len(w.calls)
    if not calls:
        raise RuntimeError(f"{shape} with {n} SeDs, {users} users: no call completed in {dur:.1f} s")
    return _diff(before, _snapshot(w), calls), calls / dur
