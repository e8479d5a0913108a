"""An optional-computation scenario on a virtual clock, with the overheads of
the real runtime.

The scheduling is the real core's: one :class:`~gridrpc.core.queue.SedScheduler`
per SeD (policy from :func:`~gridrpc.core.queue.make_policy`), one
:class:`~gridrpc.core.dispatcher.OptionalDispatcher` (or
:class:`~gridrpc.core.dispatcher.LegacyDispatcher`) per user. What this
module adds to the zero-latency simulation of :mod:`.sim` is *when* each of
their inputs happens, modelled on the processes of ``gridrpc experiment
ethic``:

* **processes** — the client process (all users; ``client_processes`` > 1
  spreads them round-robin), the MA, and ``sed_processes`` SeD processes
  holding the SeDs as replicas (contiguous blocks, as
  :class:`~gridrpc.experiments.tree.ExperimentTree`). Each runs one job at a
  time in arrival order (FIFO, like an asyncio loop or a daemon's message
  loop) and pays CPU per message (:class:`~.overheads.Overheads`), a SeD
  process also per request in the queue its scheduler re-sorts; decisions
  inside a job use the time the job has reached (its cursor);
* **a call** — the dispatcher's Submit costs the client one message (CALL);
  one hop later the SeD process pays one message to receive it, submits it
  to the replica's scheduler, and one message for ACCEPTED (the client pays
  one to read it). A started call runs ``T + worker`` on its worker; the SeD
  process then pays one message to send RESULT (after the scheduler starts
  the next call), the client one to read it and feeds its dispatcher, whose
  next Submit queues behind whatever the client process already has to do;
* **a kill** — ERROR to the client (one message each side), resubmission;
  **a cancel** — CANCEL (client one, SeD one), CANCELLED (SeD one, client one);
* **a user's start** — ``client_start`` on the client process, DISCOVER (client one), the MA fans it out to every
  SeD process (one message each way, plus ``sed_item`` per replica), ranks the
  answers (``ma_item`` per vector) and answers SERVERS; the client reads it,
  starts the dispatcher (its ``user_arrive`` time, as on the real tree) and
  sends the initial burst of calls;
* **today's runner and client** (``shared_discovery``, ``mandatory_first``,
  ``batches``; all three off: the runner before batches, one message per
  call) — the users' clients are up before the run (no ``client_start``) and
  a user arriving while a discovery of its client process is in flight joins
  it, its ranking rotated by its place (``core.discovery.joined_ranking``);
  a user's mandatory calls leave in a batch of their own and its optional ones
  in a later loop iteration (``core.dispatcher.mandatory_first``, as
  ``client.optional.drive``); a loop iteration's CALLs and CANCELs to a SeD
  process leave as one message, which the SeD process reads with its queues
  paused (:mod:`.sim_batches`);
* **pings** — every ``ping_interval``, each user pings each SeD process that
  holds calls of its (PING and PONG: one message each side).

``horizon``: stop the clock there (a run that would take hours to simulate
to its end): calls still running count as neither completed nor killed, and
users not started yet are listed by :attr:`ScenarioSim.not_started`.

With :meth:`Overheads.zero` and the per-call client it takes the same steps
in the same order as :func:`gridrpc.experiments.sim.simulate` and gives the
same event log.

Not modelled: CPU contention between processes (each has a core of its own;
the measured host had 2 cores shared with other work), lost messages,
failover, garbage collection.
"""
from __future__ import annotations

import collections
import heapq
import itertools
import random
from typing import Any

from ..core.dispatcher import Cancel, LegacyDispatcher, OptionalDispatcher, Submit, mandatory_first, send_order
from ..core.metrics import metrics_from_events
from ..core.queue import Kill, Request, SedScheduler, Start, make_policy
from ..core.scenarios import ClientPlan
from ..core.discovery import joined_ranking
from .overheads import Overheads
from .sim_batches import BatchesMixin
from .sim_procs import ProcessClock, Proc, split

__all__ = ["ScenarioSim", "simulate_with_overheads"]


class ScenarioSim(BatchesMixin, ProcessClock):
    """``plans`` on ``n_seds`` SeDs; ``n_submit`` set: legacy clients.
    :meth:`run` returns ``(events, metrics)``; afterwards :meth:`cpu` gives
    each kind of process's CPU and message counts, :attr:`disps` the users'
    dispatchers and :attr:`sed_of` the SeDs' schedulers."""

    def __init__(self, plans: list[ClientPlan], n_seds: int, *, queue: str = "ethic",
                 queue_options: dict | None = None, n_submit: int | None = None, seed: int = 0,
                 dispatcher_cls: type = OptionalDispatcher, overheads: Overheads | None = None,
                 sed_processes: int = 1, client_processes: int = 1, horizon: float | None = None,
                 mandatory_first: bool = True, batches: bool = True, shared_discovery: bool = True) -> None:
        if n_seds < 1:
            raise ValueError("need n_seds >= 1")
        if horizon is not None and not horizon >= 0:
            raise ValueError("horizon must be >= 0 (s of the run's clock)")
        self.horizon = horizon
        self.mandatory_first, self.batches, self.shared = mandatory_first, batches, shared_discovery
        self._init_batches()
        if sed_processes < 1 or client_processes < 1:
            raise ValueError("need sed_processes >= 1 and client_processes >= 1")
        self.o = o = overheads if overheads is not None else Overheads.zero()
        self.zero = o.is_zero()
        self.plans = plans
        self.n_submit, self.dispatcher_cls = n_submit, dispatcher_cls
        self.rng = rng = random.Random(seed)
        self.names = [f"sed-{i}" for i in range(n_seds)]
        self.sed_of = {n: SedScheduler(policy=make_policy(queue, **(queue_options or {})), max_concurrent=1,
                                       rng=random.Random(rng.random())) for n in self.names}
        self.index = {n: i for i, n in enumerate(self.names)}
        self.plan_of = {p.user: p for p in plans}
        k = max(1, min(sed_processes, n_seds))
        self.sed_procs = [Proc(f"sed{i}", "sed") for i in range(k)]
        self.sp_of: dict[str, Proc] = {}
        self.replicas: dict[Proc, int] = {}
        it = iter(self.names)
        self.names_of: dict[Proc, list[str]] = {}
        for sp, size in zip(self.sed_procs, split(n_seds, k)):
            self.replicas[sp] = size
            self.names_of[sp] = [next(it) for _ in range(size)]
            for n in self.names_of[sp]:
                self.sp_of[n] = sp
        self.client_procs = [Proc(f"client{i}", "client") for i in range(client_processes)]
        self.client_of = {p.user: self.client_procs[i % client_processes] for i, p in enumerate(plans)}
        self.ma = Proc("MA", "ma")
        ProcessClock.__init__(self, o.latency)
        self.events: list[dict] = []
        self.disps: dict[str, Any] = {}
        self.running_token: dict[str, int] = {}
        self.req_server: dict[str, str] = {}
        self.start_of: dict[str, float] = {}
        self.wakeups: dict[str, float] = {}
        self.touched: set[str] = set()
        self.grace = any(getattr(s.policy, "kill_grace", 0.0) > 0.0 or getattr(s.policy, "gather", 0.0) > 0.0
                         for s in self.sed_of.values())
        pol = next(iter(self.sed_of.values())).policy
        # the scheduler's own CPU per queued request and event (FCFS's arrival-order path is O(1))
        self.sched = 0.0 if getattr(pol, "arrival_order", False) else (
            o.sched_item_virtual if getattr(pol, "accounting", "") == "virtual" else o.sched_item)
        self.answers: dict[str, int] = {}
        self.sharing: dict[tuple[Proc, int], list[str]] = {}  # discoveries in flight: the asker, then joiners
        self.order_of: dict[str, list[str]] = {}             # the asker's ranking, for the joiners
        self.out_at: dict[str, collections.Counter] = {}     # user -> SeD process -> calls outstanding
        self.left = len(plans)                               # users not finished yet
        self._gone: set[str] = set()

    # -- users: discovery -------------------------------------------------------
    def _arrive(self, user: str) -> None:
        p = self.plan_of[user]
        c = self.client_of[user]
        group = self.sharing.get((c, p.n_max)) if self.shared else None
        if group is not None:
            # a discovery of this client process is in flight: this user joins it and gets its
            # answer rotated by its place among the joiners, as the runtime's share_discovery
            order = joined_ranking(self.order_of[group[0]], len(group))
            group.append(user)
        else:
            order = self.names[:]
            self.rng.shuffle(order)               # discovery ranks servers in a random order
            if self.shared:
                self.sharing[(c, p.n_max)] = [user]
                self.order_of[user] = order
        mand = [p.task_time] * p.n_min
        opt = itertools.repeat(p.task_time, p.n_max - p.n_min)
        if self.n_submit is None:
            d = self.dispatcher_cls(mand, opt, p.deadline, order[:p.n_max])
        else:
            d = LegacyDispatcher(max(p.n_min, min(self.n_submit, p.n_max)), mand, opt, p.deadline,
                                 order[:p.n_max])
        self.disps[user] = d
        self.out_at[user] = collections.Counter()
        if group is None:
            self._job(c, self._c_discover, user)

    def _c_discover(self, user: str) -> None:
        c = self.client_of[user]
        start = 0.0 if self.shared else self.o.client_start      # shared: the clients are up beforehand
        self._charge(c, start + self.o.client_msg, 1)            # start the user; DISCOVER out
        self._send(c, self.ma, self._ma_discover, user)

    def _ma_discover(self, user: str) -> None:
        o, ma = self.o, self.ma
        self._charge(ma, o.ma_msg)                               # DISCOVER in
        self.answers[user] = 0
        for sp in self.sed_procs:
            self._charge(ma, o.ma_msg)                           # forwarded to every SeD process
            self._send(ma, sp, self._sp_discover, user, sp)

    def _sp_discover(self, user: str, sp: Proc) -> None:
        n = self.replicas[sp]
        self._charge(sp, 2 * self.o.sed_msg + n * self.o.sed_item, 2)
        self._send(sp, self.ma, self._ma_answer, user, n)

    def _ma_answer(self, user: str, n: int) -> None:
        o, ma = self.o, self.ma
        self._charge(ma, o.ma_msg + n * o.ma_item)
        self.answers[user] += 1
        if self.answers[user] == len(self.sed_procs):
            del self.answers[user]
            k = len(self.disps[user].servers)
            self._charge(ma, o.ma_msg + k * o.ma_item)           # SERVERS out
            self._send(ma, self.client_of[user], self._c_servers, user)

    def _c_servers(self, user: str) -> None:
        c = self.client_of[user]
        self._charge(c, self.o.client_msg)                       # SERVERS in
        if self.shared:
            self.order_of.pop(user, None)
            group = self.sharing.pop((c, self.plan_of[user].n_max))
            for u in group:                                      # every user waiting for this answer
                self._c_start(u)
            return
        self._c_start(user)

    def _c_start(self, user: str) -> None:
        c = self.client_of[user]
        first = self.disps[user].start(c.busy_until)
        if self.mandatory_first:
            mand, first = mandatory_first(first)
            if mand:
                # the mandatory calls go out now; the rest once what reached the client process
                # by the end of this job had its turn (the runtime's loop steps before the
                # optional calls: other users' answers read, their mandatory calls sent)
                self._c_apply(user, mand)
                self._push(c.busy_until, "job", c, self._c_apply, (user, first))
                return
        self._c_apply(user, first)

    # -- users: dispatching -------------------------------------------------------
    def _c_apply(self, user: str, actions) -> None:
        c = self.client_of[user]
        o = self.o
        for a in send_order(actions):                            # as the runtime
            if isinstance(a, Submit):
                rid = f"{user}/{a.key}"
                self.req_server[rid] = a.server
                sp = self.sp_of[a.server]
                self.out_at[user][sp] += 1
                item: tuple = ("call", a.server, rid, user, a.optional)
            elif isinstance(a, Cancel):
                rid = f"{user}/{a.key}"
                sname = self.req_server[rid]
                sp = self.sp_of[sname]
                item = ("cancel", sname, rid)
            else:
                continue
            if self.batches:
                self._c_out(c, user, sp, item)                   # leaves at the end of the loop iteration
            else:
                self._charge(c, o.client_msg)                    # CALL or CANCEL out
                self._c_send(c, sp, item)
        d = self.disps[user]
        if d.finished and user not in self._gone:
            self._gone.add(user)
            self.left -= 1
        if d.next_deadline is not None:
            self._push(d.next_deadline, "tick", user, d.next_deadline)

    def _c_reply(self, user: str, key: str, ok: bool, started: float | None, sp: Proc) -> None:
        """RESULT (``ok``) or ERROR preempted, read by the client."""
        c = self.client_of[user]
        self._charge(c, self.o.client_msg)
        self.out_at[user][sp] -= 1
        d = self.disps[user]
        if ok:
            self._c_apply(user, d.on_done(key, True, c.busy_until, started=started))
        else:
            self._c_apply(user, d.on_done(key, False, c.busy_until, retry=True))

    def _c_read(self, user: str, sp: Proc | None) -> None:
        """ACCEPTED or CANCELLED read by the client (no decision)."""
        self._charge(self.client_of[user], self.o.client_msg)
        if sp is not None:
            self.out_at[user][sp] -= 1

    def _c_tick(self, user: str, when: float) -> None:
        d = self.disps[user]
        if d.next_deadline == when:
            self._c_apply(user, d.on_tick(self.client_of[user].busy_until))

    # -- SeD processes ------------------------------------------------------------
    def _sp_call(self, sname: str, rid: str, user: str, optional: bool) -> None:
        sp = self.sp_of[sname]
        o = self.o
        sch = self.sed_of[sname]
        self._charge(sp, o.sed_msg + self.sched * (len(sch.requests) + 1), 1)   # CALL in, re-sort the queue
        t = sp.busy_until
        self._sed(sname, sch.submit(Request(id=rid, user=user, service="sleep", optional=optional, submitted=t), t))
        if self.zero:
            return
        task = self.plan_of[user].task_time + o.worker
        if rid in self.running_token and task < o.ack_delay:
            return                                               # the quick RESULT stands for ACCEPTED
        self._charge(sp, o.sed_msg)                              # ACCEPTED out
        self._send(sp, self.client_of[user], self._c_read, user, None)

    def _sp_cancel(self, sname: str, rid: str) -> None:
        sp = self.sp_of[sname]
        sch = self.sed_of[sname]
        known = rid in sch.requests
        self._charge(sp, self.o.sed_msg + (self.sched * len(sch.requests) if known else 0.0), 1)   # CANCEL in
        self._sed(sname, sch.cancel(rid, sp.busy_until))
        if self.zero:
            return
        self._charge(sp, self.o.sed_msg)                         # CANCELLED (or the result) out
        user = rid.split("/", 1)[0]
        self._send(sp, self.client_of[user], self._c_read, user, sp if known else None)

    def _sp_finished(self, sname: str, rid: str, tok: int) -> None:
        if self.running_token.get(rid) != tok:
            return                                               # killed or cancelled meanwhile
        del self.running_token[rid]
        sp = self.sp_of[sname]
        t = sp.busy_until
        user, key = rid.split("/", 1)
        self.events.append({"type": "call_end", "t": t, "call": rid, "status": "completed"})
        sch = self.sed_of[sname]
        self._charge(sp, self.o.sed_msg + self.sched * len(sch.requests), 1)     # the worker's result in
        self._sed(sname, sch.finished(rid, sp.busy_until))
        self._charge(sp, self.o.sed_msg)                         # RESULT out
        self._send(sp, self.client_of[user], self._c_reply, user, key, True, self.start_of.pop(rid, None), sp)

    def _sp_tick(self, sname: str) -> None:
        sp, sch = self.sp_of[sname], self.sed_of[sname]
        self._charge(sp, self.sched * len(sch.requests), 0)
        self._sed(sname, sch.tick(sp.busy_until))

    def _sed(self, sname: str, actions) -> None:
        """Apply a scheduler's actions, at the cursor of its SeD process."""
        sp = self.sp_of[sname]
        self.touched.add(sname)
        for a in actions:
            t = sp.busy_until
            rid = a.request_id
            user, key = rid.split("/", 1)
            if isinstance(a, Start):
                tok = next(self.seq)
                self.running_token[rid] = tok
                self.start_of[rid] = t
                self.events.append({"type": "call_start", "t": t, "call": rid, "user": user,
                                    "optional": key.startswith("o"), "server": sname})
                self._push(t + (self.plan_of[user].task_time + self.o.worker), "finish", sname, rid, tok)
            elif isinstance(a, Kill):
                self.running_token.pop(rid, None)
                status = "killed" if a.reason == "preempted" else "cancelled"
                self.events.append({"type": "call_end", "t": t, "call": rid, "status": status})
                if a.reason == "preempted":
                    if self.zero:
                        self._push(self.now, "done", user, key, sp)
                    else:
                        self._charge(sp, self.o.sed_msg)         # ERROR preempted out
                        self._push(sp.busy_until + self.o.latency, "job", self.client_of[user],
                                   self._c_reply, (user, key, False, None, sp))

    # -- pings --------------------------------------------------------------------
    def _ping(self) -> None:
        o = self.o
        per_sp: collections.Counter = collections.Counter()
        per_client: collections.Counter = collections.Counter()
        for user, out in self.out_at.items():
            if self.disps[user].finished:
                continue
            n = 0
            for sp, k in out.items():
                if k > 0:
                    n += 1
                    per_sp[sp] += 1
            if n:
                per_client[self.client_of[user]] += n
        for c, n in per_client.items():
            self._job(c, self._charge, c, 2 * n * o.client_msg, 2 * n)
        for sp, n in per_sp.items():
            self._job(sp, self._charge, sp, 2 * n * o.sed_msg, 2 * n)
        if self.left > 0:
            self._push(self.now + o.ping_interval, "ping")

    # -- the loop -----------------------------------------------------------------
    def run(self) -> tuple[list[dict], Any]:
        for p in self.plans:
            self._push(p.t0, "arrive", p.user)
        if not self.zero and self.o.ping_interval > 0 and self.plans:
            self._push(self.o.ping_interval, "ping")
        heap, pop = self.heap, heapq.heappop
        horizon = self.horizon
        while heap:
            if horizon is not None and heap[0][0] > horizon:
                break                                    # stop the clock: what is open stays open
            now, _, kind, data = pop(heap)
            self.now = now
            if kind == "job":
                self._job(data[0], data[1], *data[2])
            elif kind == "wake":
                self._wake(data[0])
            elif kind == "finish":
                sname, rid, tok = data
                self._job(self.sp_of[sname], self._sp_finished, sname, rid, tok)
            elif kind == "arrive":
                self._arrive(data[0])
            elif kind == "tick":
                self._job(self.client_of[data[0]], self._c_tick, data[0], data[1])
            elif kind == "done":                         # zero overheads: a kill reaches the client
                user, key, sp = data
                self._job(self.client_of[user], self._c_reply, user, key, False, None, sp)
            elif kind == "sedtick":
                sname = data[0]
                if self.wakeups.get(sname) == now:
                    del self.wakeups[sname]
                    self._job(self.sp_of[sname], self._sp_tick, sname)
            elif kind == "ping":
                self._ping()
            if self.grace and self.touched:
                # time-dependent policies (kill_grace): re-evaluate at their wake-up time (every
                # SeD with zero overheads, as .sim does: equal times are common on its clock)
                for sname in (self.names if self.zero else sorted(self.touched, key=self.index.__getitem__)):
                    w = self.sed_of[sname].next_wakeup(now)
                    if w is not None and w > now and self.wakeups.get(sname) != w:
                        self.wakeups[sname] = w
                        self._push(w, "sedtick", sname)
            self.touched.clear()
        for user, d in self.disps.items():
            self.events += d.events(user)
        return self.events, metrics_from_events(self.events, len(self.names))

    # -- results ------------------------------------------------------------------
    @property
    def not_started(self) -> list[str]:
        """Users whose dispatcher had not started when the clock stopped
        (only with a ``horizon``): no ``user_arrive`` in the log, so the
        metrics do not see them; they did not get their mandatory work."""
        return [p.user for p in self.plans if p.user not in self.disps or self.disps[p.user].started_at is None]

    def cpu(self) -> dict[str, Any]:
        """CPU seconds and messages per kind of process."""
        out: dict[str, Any] = {}
        for kind, procs in (("ma", [self.ma]), ("sed_processes", self.sed_procs), ("clients", self.client_procs)):
            out[kind] = {"cpu_s": sum(p.busy for p in procs), "messages": sum(p.msgs for p in procs),
                         "max_cpu_s": max(p.busy for p in procs)}
        return out


def simulate_with_overheads(plans: list[ClientPlan], n_seds: int, **kw) -> tuple[list[dict], Any]:
    """``ScenarioSim(plans, n_seds, **kw).run()``: ``(events, metrics)``."""
    return ScenarioSim(plans, n_seds, **kw).run()
