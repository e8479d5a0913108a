"""A discrete-event simulation of an optional-computation scenario.

Drives the *same* pure objects as the real runtime — one
:class:`~gridrpc.core.queue.SedScheduler` per SeD, one
:class:`~gridrpc.core.dispatcher.OptionalDispatcher` (or
:class:`~gridrpc.core.dispatcher.LegacyDispatcher`) per user — on a virtual
clock with zero network latency, and writes the same event log as the real
runner. Seconds per run instead of minutes: used to compare policy options
(``accounting``, ``kill_grace``) before measuring them on a real tree, and
as a reference for what the real runs lose to overheads. The same with the
runtime's calibrated overheads: :mod:`.sim_runtime` (``gridrpc experiment
ethic --simulate``), which with zero overheads gives this module's event log.
"""
from __future__ import annotations

import heapq
import itertools
import random
from typing import Any

from ..core.dispatcher import Cancel, LegacyDispatcher, OptionalDispatcher, Submit, send_order
from ..core.metrics import metrics_from_events
from ..core.queue import Kill, Request, SedScheduler, Start, make_policy
from ..core.scenarios import ClientPlan

__all__ = ["simulate"]


def simulate(plans: list[ClientPlan], n_seds: int, *, queue: str = "ethic",
             queue_options: dict | None = None, n_submit: int | None = None,
             seed: int = 0, dispatcher_cls: type = OptionalDispatcher) -> tuple[list[dict], Any]:
    """Run ``plans`` on ``n_seds`` simulated SeDs. ``n_submit`` set: legacy
    clients (and normally ``queue="fifo"``, DIET's one arrival order). Returns ``(events, metrics)``."""
    rng = random.Random(seed)
    seds = [SedScheduler(policy=make_policy(queue, **(queue_options or {})), max_concurrent=1,
                         rng=random.Random(rng.random())) for _ in range(n_seds)]
    names = [f"sed-{i}" for i in range(n_seds)]
    sed_of = dict(zip(names, seds))
    heap: list = []
    seq = itertools.count()
    events: list[dict] = []
    disps: dict[str, Any] = {}
    plan_of = {p.user: p for p in plans}
    running_token: dict[str, int] = {}           # request id -> token of its finish event
    req_server: dict[str, str] = {}
    wakeups: dict[str, float] = {}
    start_of: dict[str, float] = {}

    def push(t, kind, *data):
        heapq.heappush(heap, (t, next(seq), kind, data))

    for p in plans:
        push(p.t0, "arrive", p.user)

    def sed_actions(sname: str, actions, now: float) -> None:
        for a in actions:
            rid = a.request_id
            user, key = rid.split("/", 1)
            if isinstance(a, Start):
                tok = next(seq)
                running_token[rid] = tok
                start_of[rid] = now
                events.append({"type": "call_start", "t": now, "call": rid, "user": user,
                               "optional": key.startswith("o"), "server": sname})
                push(now + plan_of[user].task_time, "finish", sname, rid, tok)
            elif isinstance(a, Kill):
                running_token.pop(rid, None)
                status = "killed" if a.reason == "preempted" else "cancelled"
                events.append({"type": "call_end", "t": now, "call": rid, "status": status})
                if a.reason == "preempted":
                    push(now, "done", user, key, False)

    def client_actions(user: str, actions, now: float) -> None:
        for a in send_order(actions):                            # as the runtime
            if isinstance(a, Submit):
                rid = f"{user}/{a.key}"
                req_server[rid] = a.server
                sed_actions(a.server, sed_of[a.server].submit(
                    Request(id=rid, user=user, service="sleep", optional=a.optional, submitted=now), now), now)
            elif isinstance(a, Cancel):
                rid = f"{user}/{a.key}"
                sname = req_server[rid]
                sed_actions(sname, sed_of[sname].cancel(rid, now), now)
        d = disps[user]
        if d.next_deadline is not None:
            push(d.next_deadline, "tick", user, d.next_deadline)

    while heap:
        now, _, kind, data = heapq.heappop(heap)
        if kind == "arrive":
            p = plan_of[data[0]]
            order = names[:]
            rng.shuffle(order)                   # discovery ranks servers in a random order
            mand = [p.task_time] * p.n_min
            opt = itertools.repeat(p.task_time, p.n_max - p.n_min)
            if n_submit is None:
                d = dispatcher_cls(mand, opt, p.deadline, order[:p.n_max])
            else:
                d = LegacyDispatcher(max(p.n_min, min(n_submit, p.n_max)), mand, opt, p.deadline,
                                     order[:p.n_max])
            disps[p.user] = d
            client_actions(p.user, d.start(now), now)
        elif kind == "finish":
            sname, rid, tok = data
            if running_token.get(rid) != tok:
                continue                          # killed or cancelled meanwhile
            del running_token[rid]
            user, key = rid.split("/", 1)
            events.append({"type": "call_end", "t": now, "call": rid, "status": "completed"})
            sed_actions(sname, sed_of[sname].finished(rid, now), now)
            client_actions(user, disps[user].on_done(key, True, now, started=start_of.pop(rid, None)), now)
        elif kind == "done":
            user, key, ok = data
            client_actions(user, disps[user].on_done(key, ok, now, retry=True), now)
        elif kind == "tick":
            user, when = data
            d = disps[user]
            if d.next_deadline == when:
                client_actions(user, d.on_tick(now), now)
        elif kind == "sedtick":
            sname = data[0]
            if wakeups.get(sname) == now:
                del wakeups[sname]
                sed_actions(sname, sed_of[sname].tick(now), now)
        # time-dependent policies (kill_grace): re-evaluate at their wake-up time
        for sname, s in sed_of.items():
            w = s.next_wakeup(now)
            if w is not None and w > now and wakeups.get(sname) != w:
                wakeups[sname] = w
                push(w, "sedtick", sname)
    for user, d in disps.items():
        events += d.events(user)
    return events, metrics_from_events(events, n_seds)
