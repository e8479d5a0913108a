"""``gridrpc experiment ethic --simulate``: the experiment of
:mod:`.ethic`, simulated with the runtime's overheads
(:mod:`.sim_runtime`), written in the same JSON shape.

Per run: the scenario's plans for seed ``cfg.seed + i`` (users renamed
``r<i>-u<k>`` as on the real tree), the same seed for the simulator's random
draws (server order of each discovery, the SeDs' tie-breaks), the metrics
from the event log, and the fields the real runner measures on the tree
(``sed_duration_over_T``, ``idle_gap``, ``user_details``, ``cpu_percent``).
``wall`` is the *simulated* length of the run; ``sim_wall`` and
``sim_cpu`` the real seconds (wall, CPU) the simulation took. With a ``horizon`` the clock stops there and
``unhappy_users`` also counts the users not started by then
(``not_started``). ``unhappy_by_client`` counts the users whose client
had not *read* their mandatory results by their deadline (the metric falls
back on the SeD-side end of the calls when the client never read them, e.g.
at a horizon).
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any

from ..client.optional import DeadlineAwareDispatcher
from ..core.dispatcher import OptionalDispatcher
from .ethic import EthicConfig, by_deadline, durations, gaps, user_details
from .overheads import Overheads
from .sim_runtime import ScenarioSim

__all__ = ["run_simulated", "simulate_once"]


def simulate_once(cfg: EthicConfig, run: int, seed: int, overheads: Overheads, *,
                  client_processes: int = 1, horizon: float | None = None, mandatory_first: bool = True,
                  batches: bool = True, shared_discovery: bool = True) -> dict[str, Any]:
    plans = [dataclasses.replace(p, user=f"r{run}-{p.user}") for p in cfg.plans(seed)]
    cls = DeadlineAwareDispatcher if cfg.skip_late else OptionalDispatcher
    t0, c0 = time.perf_counter(), time.process_time()
    sim = ScenarioSim(plans, cfg.seds, queue=cfg.queue, queue_options=cfg.queue_options,
                      n_submit=cfg.n_submit if cfg.legacy else None, seed=seed, dispatcher_cls=cls,
                      overheads=overheads, sed_processes=cfg.sed_processes,
                      client_processes=client_processes, horizon=horizon, mandatory_first=mandatory_first,
                      batches=batches, shared_discovery=shared_discovery)
    events, m = sim.run()
    not_started = sim.not_started
    sim_wall, sim_cpu = time.perf_counter() - t0, time.process_time() - c0
    plan_of = {p.user: p for p in plans}
    for e in events:
        if e["type"] == "user_arrive":
            e["task_time"] = plan_of[e["user"]].task_time
            e["planned_t0"] = plan_of[e["user"]].t0
    # unhappy as the client sees it: its dispatcher had not read the mandatory results by the
    # deadline (the metric falls back on the SeD-side end of the calls when it never read them)
    late = sum(1 for p in plans if (d := sim.disps.get(p.user)) is None or d.mandatory_done_at is None
               or d.mandatory_done_at > p.deadline)
    duration = max((e["t"] for e in events), default=0.0)
    task_times = {p.user: p.task_time for p in plans}
    cpu = sim.cpu()
    span = duration or 1.0
    return {"run": run, "seed": seed, "users": len(plans), "unhappy_users": m.unhappy_users + len(not_started),
            "not_started": len(not_started), "horizon": horizon, "unhappy_by_client": late,
            "unfairness": m.unfairness, "completed": m.completed,
            "completed_by_deadline": by_deadline(events),
            "completed_mandatory": m.completed_mandatory, "completed_optional": m.completed_optional,
            "killed": m.killed, "killed_seconds": m.killed_seconds, "duration": duration,
            "sed_duration_over_T": durations(events, task_times), "idle_gap": gaps(events),
            "user_details": user_details(events, m), "events": events,
            "wall": duration, "sim_wall": sim_wall, "sim_cpu": sim_cpu,
            "cpu_percent": {"ma": 100 * cpu["ma"]["cpu_s"] / span,
                            "sed_processes": 100 * cpu["sed_processes"]["cpu_s"] / span,
                            "per_sed": 100 * cpu["sed_processes"]["cpu_s"] / span / cfg.seds,
                            "clients": 100 * cpu["clients"]["cpu_s"] / span,
                            "per_client": 100 * cpu["clients"]["cpu_s"] / span / max(1, len(plans)),
                            "busiest_client": 100 * cpu["clients"]["max_cpu_s"] / span},
            "messages": {k: v["messages"] for k, v in cpu.items()}}


def run_simulated(cfg: EthicConfig, *, overheads: Overheads | None = None, client_processes: int = 1,
                  horizon: float | None = None, per_call_client: bool = False, progress=print) -> dict[str, Any]:
    """``cfg.runs`` simulated runs; the result dict of
    :func:`gridrpc.experiments.ethic.run_experiment` plus ``simulated``,
    ``overheads`` and ``client_processes``. ``per_call_client``: the
    runner's client before batches (each user's client started at its
    arrival with a discovery of its own, one message per CALL and CANCEL, a
    user's first calls as one burst) instead of today's."""
    if client_processes < 1:
        raise ValueError("client_processes must be >= 1")
    o = overheads if overheads is not None else Overheads.from_costs()
    runs = []
    for i in range(cfg.runs):
        r = simulate_once(cfg, i, cfg.seed + i, o, client_processes=client_processes, horizon=horizon,
                          mandatory_first=not per_call_client, batches=not per_call_client,
                          shared_discovery=not per_call_client)
        runs.append(r)
        progress(f"run {i}: unhappy={r['unhappy_users']} unfairness={r['unfairness']:.3f} "
                 f"completed={r['completed']} killed={r['killed']} "
                 + (f"not started={r['not_started']} " if horizon is not None else "")
                 + f"(simulated {r['wall']:.1f}s in {r['sim_wall']:.1f}s)")
    med = lambda k: statistics.median(r[k] for r in runs)  # noqa: E731
    return {"config": {**dataclasses.asdict(cfg), "client_processes": client_processes, "horizon": horizon,
                       "per_call_client": per_call_client},
            "simulated": True, "overheads": o.to_dict(),
            "unhappy_users": med("unhappy_users"), "unfairness": med("unfairness"),
            "completed": med("completed"), "completed_by_deadline": med("completed_by_deadline"),
            "killed": med("killed"), "killed_seconds": med("killed_seconds"),
            "completed_optional": med("completed_optional"),
            "cpu_percent": {k: statistics.median(r["cpu_percent"][k] for r in runs)
                            for k in runs[0]["cpu_percent"]},
            "sim_wall": sum(r["sim_wall"] for r in runs),
            "runs": runs}
