"""``gridrpc experiment ethic``: one optional-computation scenario on a real
local tree (see ``docs/experiments/optional-computations.md``).

Per invocation: start the tree (:class:`~gridrpc.experiments.tree.ExperimentTree`,
queue ``ethic`` or, with ``legacy``, ``fifo``: DIET's one arrival order), warm the SeDs' workers up,
then for each run generate the scenario's clients
(:func:`gridrpc.core.scenarios.generate`, times multiplied by
``time_scale``), start each at its arrival time as an
:class:`~gridrpc.AsyncClient` of its own (user ``r<run>-u<i>``; all clients
share this process's event loop), let it discover up to ``n_max`` servers
and drive its dispatcher (:func:`gridrpc.client.optional.drive`) with real
calls of ``sleep(T)``. The event log joins the dispatchers' user events with
``call_start``/``call_end`` taken from the SeDs' timing of each call; the
metrics come from it (:mod:`gridrpc.core.metrics`). Medians over runs.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import logging
import random
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import psutil

from ..client.aio import AsyncClient
from ..client.optional import DeadlineAwareDispatcher, call_events, drive
from ..core.dispatcher import LegacyDispatcher, OptionalDispatcher
from ..core.metrics import metrics_from_events
from ..errors import NoServerAvailable
from ..core.scenarios import SCENARIOS, ClientPlan, generate
from .tree import ExperimentTree

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class EthicConfig:
    scenario: str = "night-simultaneous"
    seds: int = 10
    clients: int = 10
    deadline: float = 100.0            # paper units (scaled by time_scale)
    task_time: float = 1.0             # paper units
    n_min: int = 3
    n_max: int = 1000
    arrival_interval: float | None = None
    runs: int = 1
    seed: int = 0
    legacy: bool = False
    n_submit: int | None = None
    time_scale: float = 1.0
    kill_grace: float = 0.0            # paper units (scaled)
    gather: float = 0.0                # seconds (not scaled): an idle SeD ranks a burst whole
    accounting: str = "cumulative"
    sed_processes: int = 1
    service: str = "sleep"
    skip_late: bool = False            # ethic clients: DeadlineAwareDispatcher

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {self.scenario!r}; known: {', '.join(SCENARIOS)}")
        if self.legacy and self.n_submit is None:
            raise ValueError("--legacy needs --n-submit")
        if not self.legacy and self.n_submit is not None:
            raise ValueError("--n-submit only makes sense with --legacy")
        if self.seds < 1 or self.runs < 1 or self.time_scale <= 0:
            raise ValueError("need seds >= 1, runs >= 1, time_scale > 0")
        if self.gather and self.legacy:
            raise ValueError("--gather applies to the ethic queue, not to --legacy")
        from ..core.queue import make_policy
        make_policy(self.queue, **self.queue_options)       # every queue option checked here, with its message

    @property
    def queue(self) -> str:
        return "fifo" if self.legacy else "ethic"

    @property
    def queue_options(self) -> dict:
        if self.legacy:
            return {}
        opts: dict[str, Any] = {"accounting": self.accounting}
        if self.kill_grace:
            opts["kill_grace"] = self.kill_grace * self.time_scale
        if self.gather:
            opts["gather"] = self.gather
        return opts

    def plans(self, seed: int) -> list[ClientPlan]:
        return generate(self.scenario, random.Random(seed), n_users=self.clients,
                        task_time=self.task_time, relative_deadline=self.deadline, n_min=self.n_min,
                        n_max=self.n_max, time_scale=self.time_scale,
                        arrival_interval=self.arrival_interval)


def _client(ma: str, name: str) -> AsyncClient:
    # a patient client: at scale a SeD process receives thousands of calls
    # at once and may take seconds to acknowledge them all
    # users arriving together share one discovery (share_discovery); 100 users keep ~14,000
    # calls queued for the whole run: a liveness ping per call every 5 s, not every second
    # (at 1 s the one client process spent most of its time on ping timers and reached
    # the deadline seconds late)
    return AsyncClient(ma, user=name, discovery_timeout=30.0, ack_timeout=60.0,
                       ping_interval=5.0, ping_timeout=30.0, share_discovery=True)


async def _user(plan: ClientPlan, cfg: EthicConfig, client: AsyncClient, origin: float, name: str,
                out: dict[str, Any]) -> None:
    # the user's client is up before it arrives, as a user's own process would be: 100 users of
    # one process starting their sockets one after the other at the arrival spread the arrivals
    # over 0.3-3 s, the late ones missing the shared discovery (docs/experiments)
    await asyncio.sleep(max(0.0, origin + plan.t0 - time.time()))
    async with contextlib.aclosing(client):      # started by run_once; closed here
        for attempt in range(3):     # a swamped SeD process may miss the discovery budget
            try:
                servers = await client.discover(cfg.service, max_servers=plan.n_max)
                break
            except NoServerAvailable:
                if attempt == 2:
                    raise
                log.warning("user %s: discovery found no server; retrying", name)
        mand = [plan.task_time] * plan.n_min
        opt = itertools.repeat(plan.task_time, plan.n_max - plan.n_min)
        deadline = origin + plan.deadline
        names = [s.name for s in servers]
        if cfg.legacy:
            n_submit = max(plan.n_min, min(cfg.n_submit, plan.n_max))
            disp = LegacyDispatcher(n_submit, mand, opt, deadline, names)
        else:
            cls = DeadlineAwareDispatcher if cfg.skip_late else OptionalDispatcher
            disp = cls(mand, opt, deadline, names)
        calls = await drive(client, cfg.service, disp, servers)
    events = disp.events(name) + call_events(calls, disp.records, name)
    for e in events:
        e["t"] -= origin
        if e["type"] == "user_arrive":
            e["deadline"] -= origin
            e["task_time"] = plan.task_time
            e["planned_t0"] = plan.t0
    out[name] = {"events": events, "servers": len(servers), "statistics": disp.statistics()}


async def _warm_up(ma: str, cfg: EthicConfig) -> None:
    """One tiny call per SeD so its worker process exists before the run."""
    async with AsyncClient(ma, user="warm-up", discovery_timeout=10.0) as client:
        servers = await client.discover(cfg.service, max_servers=cfg.seds)
        await asyncio.gather(*(client.call(cfg.service, 0.0, server=s) for s in servers))


async def _wait_registered(ma: str, cfg: EthicConfig, timeout: float = 60.0) -> None:
    async with AsyncClient(ma, user="setup") as client:
        end = time.monotonic() + timeout
        while True:
            try:
                if len(await client.discover(cfg.service, max_servers=cfg.seds)) >= cfg.seds:
                    return
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if time.monotonic() > end:
                raise TimeoutError(f"{cfg.seds} SeDs did not register within {timeout}s")
            await asyncio.sleep(0.2)


def user_details(events: list[dict], m) -> list[dict]:
    arrive = {e["user"]: e for e in events if e["type"] == "user_arrive"}
    done = {e["user"]: e["t"] for e in events if e["type"] == "mandatory_done"}
    starts = {e["call"]: e for e in events if e["type"] == "call_start"}
    comp: dict[str, int] = {}
    killed: dict[str, int] = {}
    for e in events:
        if e["type"] == "call_end" and e["call"] in starts:
            u = starts[e["call"]]["user"]
            if e["status"] == "completed":
                comp[u] = comp.get(u, 0) + 1
            elif e["status"] in ("killed", "cancelled"):
                killed[u] = killed.get(u, 0) + 1
    out = []
    for u, a in sorted(arrive.items(), key=lambda kv: kv[1]["t"]):
        out.append({"user": u, "t0": a["t"], "deadline": a["deadline"], "task_time": a.get("task_time"),
                    "n_min": a["n_min"], "mandatory_done": done.get(u),
                    "unhappy": u in m.unhappy, "completed": comp.get(u, 0), "killed": killed.get(u, 0),
                    "allocated": m.allocated.get(u), "deserved": m.deserved.get(u),
                    "satisfaction": m.satisfaction.get(u)})
    return out


def durations(events: list[dict], task_times: dict[str, float]) -> dict[str, float]:
    """SeD-side duration of completed calls relative to the task time: how
    much the runtime adds to each request (1.0 = no overhead)."""
    starts = {e["call"]: e for e in events if e["type"] == "call_start"}
    ratios = sorted((e["t"] - starts[e["call"]]["t"]) / task_times[starts[e["call"]]["user"]]
                    for e in events if e["type"] == "call_end" and e.get("status") == "completed"
                    and e["call"] in starts and task_times.get(starts[e["call"]]["user"]))
    if not ratios:
        return {}
    return {"median": ratios[len(ratios) // 2], "p95": ratios[int(len(ratios) * 0.95)], "n": len(ratios)}


def by_deadline(events: list[dict]) -> int:
    """Requests completed by their user's deadline (the paper's count: work
    that finished after it is not counted)."""
    deadline = {e["user"]: e["deadline"] for e in events if e["type"] == "user_arrive"}
    user_of = {e["call"]: e["user"] for e in events if e["type"] == "call_start"}
    return sum(1 for e in events if e["type"] == "call_end" and e.get("status") == "completed"
               and e["call"] in user_of and e["t"] <= deadline.get(user_of[e["call"]], float("inf")))


def gaps(events: list[dict]) -> dict[str, float]:
    """Idle time between consecutive calls on each server (s): the dispatch
    overhead the clients and SeDs add."""
    by_server: dict[str, list[tuple[float, float]]] = {}
    starts = {e["call"]: e for e in events if e["type"] == "call_start"}
    for e in events:
        if e["type"] == "call_end" and e["call"] in starts:
            s = starts[e["call"]]
            by_server.setdefault(s.get("server") or "?", []).append((s["t"], e["t"]))
    gaps = []
    for ivs in by_server.values():
        ivs.sort()
        gaps += [b[0] - a[1] for a, b in zip(ivs, ivs[1:]) if b[0] >= a[1]]
    gaps.sort()
    if not gaps:
        return {}
    return {"median": gaps[len(gaps) // 2], "p95": gaps[int(len(gaps) * 0.95)]}


async def run_once(cfg: EthicConfig, ma: str, run: int, seed: int) -> dict[str, Any]:
    plans = cfg.plans(seed)
    out: dict[str, Any] = {}
    names = {p.user: f"r{run}-{p.user}" for p in plans}
    clients = {p.user: _client(ma, names[p.user]) for p in plans}
    try:
        for c in clients.values():
            await c.start()
    except BaseException:
        for c in clients.values():
            await c.aclose()
        raise
    origin = time.time() + 0.2
    # users with the same arrival time start in one step of the loop: one timer per arrival time, not
    # one per user (timers microseconds apart fired in separate loop iterations, and a user woken
    # after the shared discovery had been answered made its own, arriving up to 1.5 s late)
    by_t0: dict[float, list[ClientPlan]] = {}
    for p in plans:
        by_t0.setdefault(p.t0, []).append(p)
    users: list[asyncio.Task] = []
    try:
        for t0 in sorted(by_t0):
            await asyncio.sleep(max(0.0, origin + t0 - time.time()))
            users += [asyncio.ensure_future(_user(p, cfg, clients[p.user], origin, names[p.user], out))
                      for p in by_t0[t0]]
        await asyncio.gather(*users)
    finally:
        for t in users:
            t.cancel()
        await asyncio.gather(*(c.aclose() for c in clients.values()), return_exceptions=True)
    events = [e for o in out.values() for e in o["events"]]
    m = metrics_from_events(events, cfg.seds)
    task_times = {names[p.user]: p.task_time for p in plans}
    return {"run": run, "seed": seed, "users": len(plans), "unhappy_users": m.unhappy_users,
            "unfairness": m.unfairness, "completed": m.completed,
            "completed_by_deadline": by_deadline(events),
            "completed_mandatory": m.completed_mandatory, "completed_optional": m.completed_optional,
            "killed": m.killed, "killed_seconds": m.killed_seconds,
            "duration": max((e["t"] for e in events), default=0.0),
            "sed_duration_over_T": durations(events, task_times), "idle_gap": gaps(events),
            "user_details": user_details(events, m), "events": events}


def run_experiment(cfg: EthicConfig, *, progress=print) -> dict[str, Any]:
    """Start a tree, run ``cfg.runs`` runs, stop the tree. Returns the result
    dict (events of each run under ``runs[i]["events"]``)."""
    me = psutil.Process()
    with ExperimentTree(n_seds=cfg.seds, queue=cfg.queue, queue_options=cfg.queue_options,
                        sed_processes=cfg.sed_processes) as tree:
        asyncio.run(_wait_registered(tree.ma_address, cfg))
        asyncio.run(_warm_up(tree.ma_address, cfg))
        runs = []
        for i in range(cfg.runs):
            # the earlier runs' results (~90,000 event dicts) stay in this process: frozen, the
            # cyclic GC does not walk them again. Unfrozen, a full collection set off by the next
            # burst of allocations stalled the users' arrival by ~0.9 s in every run after the first
            gc.collect()
            gc.freeze()
            c0, t0 = tree.cpu(), time.monotonic()
            me0 = sum(me.cpu_times()[:2])
            try:
                r = asyncio.run(run_once(cfg, tree.ma_address, i, cfg.seed + i))
            finally:
                gc.unfreeze()
            wall = time.monotonic() - t0
            c1 = tree.cpu()
            client_cpu = sum(me.cpu_times()[:2]) - me0
            r["wall"] = wall
            r["cpu_percent"] = {
                "ma": 100 * (c1["ma"] - c0["ma"]) / wall,
                "sed_processes": 100 * (c1["seds"] - c0["seds"]) / wall,
                "per_sed": 100 * (c1["seds"] - c0["seds"]) / wall / cfg.seds,
                "clients": 100 * client_cpu / wall,
                "per_client": 100 * client_cpu / wall / max(1, r["users"])}
            runs.append(r)
            ts = [d["t0"] for d in r["user_details"]]
            progress(f"run {i}: unhappy={r['unhappy_users']} unfairness={r['unfairness']:.3f} "
                     f"completed={r['completed']} (by the deadlines {r['completed_by_deadline']}) "
                     f"killed={r['killed']} arrivals {min(ts, default=0):.1f}-{max(ts, default=0):.1f}s "
                     f"({wall:.1f}s)")
    med = lambda k: statistics.median(r[k] for r in runs)  # noqa: E731
    return {"config": asdict(cfg), "unhappy_users": med("unhappy_users"), "unfairness": med("unfairness"),
            "completed": med("completed"), "completed_by_deadline": med("completed_by_deadline"),
            "killed": med("killed"), "killed_seconds": med("killed_seconds"),
            "completed_optional": med("completed_optional"),
            "cpu_percent": {k: statistics.median(r["cpu_percent"][k] for r in runs)
                            for k in runs[0]["cpu_percent"]},
            "runs": runs}


def write_outputs(result: dict[str, Any], json_path: str, events_path: str | None) -> None:
    """JSON without the events; the event log as JSON lines (``run`` added)."""
    slim = {**result, "runs": [{k: v for k, v in r.items() if k != "events"} for r in result["runs"]]}
    if events_path:
        slim["events_log"] = events_path
        with open(events_path, "w") as fh:
            for r in result["runs"]:
                for e in sorted(r["events"], key=lambda e: e["t"]):
                    fh.write(json.dumps({"run": r["run"], **e}) + "\n")
    with open(json_path, "w") as fh:
        json.dump(slim, fh, indent=1)
