"""A simulated SeD process (:mod:`gridrpc.sim.elements`) holding replicas:
each replica a real :class:`~gridrpc.core.queue.SedScheduler` and
:class:`~gridrpc.core.estimation.RunTimePredictor`, the process's calls in one
real :class:`~gridrpc.core.sed_calls.SedCalls`; estimation vectors from
:func:`~gridrpc.core.estimation.scheduler_tags`, as the SeD runtime. Calls
run on simulated worker processes for a duration drawn from the service's
model (:mod:`gridrpc.sim.model`).

Pushed state (``views``): every replica pushes its snapshot (a VIEW message)
as the SeD runtime does (``SeD._view_changed`` / ``_push_view``): after its
registration, then when its load changes, coalesced by the real
:class:`~gridrpc.core.view.PushRule` (2 ms for a busy<->free change, 50 ms
otherwise); its heartbeats confirm the snapshot at the parent.

Every answer (SERVERS, ACCEPTED, the owner check's refusal, busy, the
errors of a stopped, dropped or forgotten call) comes from
:mod:`gridrpc.core.sed_protocol` and the parent's acknowledgements are
decided by :func:`gridrpc.core.parent_ack.parent_ack`, the functions the
SeD runtime uses. Not simulated: the runtime's pause of the queues for the
length of one socket read (``RunsMixin._read_begin``) and its send-ahead of
the next queued call to a hot worker (``RunsMixin._send_ahead``); both
matter for queued calls, which ``noop`` load on 1 slot per replica rarely
has."""
from __future__ import annotations

import random

from ..core import messages as m
from ..core.estimation import RunTimePredictor, estimation_vector
from ..core.messages import MsgType
from ..core.queue import SedScheduler, make_policy
from ..core.parent_ack import parent_ack
from ..core.sed_protocol import (accepted_header, busy_error, call_replica, discover_replicas, discover_reply,
                                 drop_error, gone_error, not_owner_error, stop_error)
from ..core.view import PushRule, load_key, sed_entry
from ..core.sed_calls import CallRecord, CallState, Drop, Reacknowledge, Resend, Run, SedCalls, Stop, ack_delay
from .engine import Host, Proc
from .node import Node, Out

__all__ = ["Replica", "SedNode"]


class Replica:
    __slots__ = ("name", "route", "scheduler", "predictor", "last_solve", "completed", "push", "push_gen",
                 "attached")

    def __init__(self, name: str, scheduler: SedScheduler, predictor: RunTimePredictor) -> None:
        self.name, self.route = name, name.encode()
        self.scheduler, self.predictor = scheduler, predictor
        self.last_solve: float | None = None
        self.completed = 0
        self.push = PushRule()          # when its snapshot goes to the parent (as the SeD runtime)
        self.push_gen = 0               # the pending push timer (a newer one cancels it)
        self.attached = False           # the parent acknowledged it (core.parent_ack, as ParentLink)


class SedNode(Node):
    """A SeD process: ``replicas`` tree elements sharing one process, one
    address and ``workers`` worker processes (``gridrpc sed --replicas K``)."""
    kind = "sed"
    ack_delay = 0.02            # ProcessBackend.ack_delay: a quick call's RESULT stands for ACCEPTED

    def __init__(self, world, name: str, host: Host, parent: bytes, names: list[str], *, seed: int,
                 services: dict, policy: str = "fcfs", policy_options: dict | None = None,
                 max_concurrent: int = 1, workers: int = 1, hb_interval: float = 1.0,
                 host_tags: dict | None = None, views: bool = False) -> None:
        super().__init__(world, name, host)
        self.parent = parent
        self.address = f"sim://{name}"
        self.services = services            # name -> ServiceModel (gridrpc.sim.model)
        self.hb_interval = hb_interval
        self.views = views
        self.pushes = 0
        rng = random.Random(seed)
        self.replicas: dict[bytes, Replica] = {}
        for n in names:
            sch = SedScheduler(make_policy(policy, **(policy_options or {})), max_concurrent=max_concurrent,
                               rng=random.Random(rng.random()))
            self.replicas[n.encode()] = Replica(n, sch, RunTimePredictor())
        self.by_name = {r.name: r for r in self.replicas.values()}
        self.calls = SedCalls({r.name: r.scheduler for r in self.replicas.values()})
        self.rng = rng
        self.workers = [Proc(host, f"{name}-w{i}", "worker") for i in range(workers)]
        self._w = 0
        self.host_tags = {"nb_cpu": host.cores, "free_cpu": 1.0, "total_mem": 16e9, "free_mem": 8e9,
                          **(host_tags or {})}
        self._n = 0
        self._wake: dict[str, float] = {}
        self.answered_at: dict[str, float] = {}
        self.estimates = 0

    def routes(self) -> list[bytes]:
        return list(self.replicas)

    def _register_header(self, r: Replica) -> dict:
        svc = [{"name": s, "doc": "", "params": []} for s in self.services]
        return m.make(MsgType.REGISTER, self._id(), name=r.name, kind="sed", address=self.address,
                      host=self.proc.host.name, pid=id(self) & 0xffffff, started=0.0, services=svc, elements=[],
                      load={})

    def start(self, at: float) -> None:
        sim = self.world.sim
        for r in self.replicas.values():
            sim.at(at, self.world.transmit, self, r.route, self.parent, self._register_header(r))
            if self.views:          # SeD._register_info: the snapshot follows the REGISTER
                sim.at(at, self.local, self._push_view, r, True, None)
        if self.hb_interval:
            sim.at(at + self.hb_interval * (0.5 + self.rng.random()), self._heartbeat_timer)

    def _id(self) -> str:
        self._n += 1
        return f"{self.name}.{self._n}"

    def _heartbeat_timer(self) -> None:
        self.local(self._heartbeats)
        self.world.sim.after(self.hb_interval, self._heartbeat_timer)

    def _heartbeats(self, out: Out) -> None:
        for r in self.replicas.values():
            sch = r.scheduler
            load = {"policy": sch.policy.name, "num_running": len(sch.running),
                    "num_waiting": len(sch.requests) - len(sch.running), "completed": r.completed}
            out.send(r.route, self.parent, m.make(MsgType.HEARTBEAT, self._id(), name=r.name, load=load))

    def estimate(self, r: Replica, service: str, now: float) -> dict:
        return estimation_vector(self.host_tags, "serial", scheduler=r.scheduler, service=service,
                                 predictor=r.predictor, now=now, last_solve=r.last_solve)

    # -- pushed state (SeD._view_changed / SeD._push_view) ---------------------------
    def _view_changed(self, r: Replica, now: float) -> None:
        key = load_key(r.scheduler)
        at = r.push.changed(key, key[0], now)
        if at is not None:
            r.push_gen += 1             # the runtime cancels its pending timer
            self.world.sim.at(at, self.local, self._push_view, r, False, r.push_gen)

    def _push_view(self, out: Out, r: Replica, force: bool, gen: int | None) -> None:
        if gen is not None and gen != r.push_gen:
            return                      # a cancelled timer
        if not r.push.take(load_key(r.scheduler), force):
            return
        now = self.world.sim.now
        entry = sed_entry(r.name, {s: self.estimate(r, s, now) for s in self.services})
        if entry is None:
            return
        self.pushes += 1
        self.answered_at[r.name] = now          # the age of the estimate the agents hold
        out.send(r.route, self.parent, m.make(MsgType.VIEW, f"{r.name}:v{r.completed}", name=r.name,
                                              entries=[entry]))

    # -- messages ---------------------------------------------------------------
    def handle(self, src, dst, h, out: Out) -> None:
        now = self.world.sim.now
        t = h["type"]
        r = self.replicas[dst]
        if t == "discover":
            mine = discover_replicas(h, r, self.by_name)
            service = h["service"]
            tags = self.host_tags
            estimations = [estimation_vector(                   # self.estimate(rep, service, now) of each
                tags, "serial", scheduler=rep.scheduler, service=service, predictor=rep.predictor, now=now,
                last_solve=rep.last_solve) for rep in mine] if service in self.services else None
            reply = discover_reply(h, r.name, [rep.name for rep in mine], estimations, address=self.address)
            self.estimates += len(reply["servers"])
            answered_at = self.answered_at
            for rep in mine:
                answered_at[rep.name] = now
            out.send(r.route, self.parent, reply)
        elif t == "call":
            self._on_call(src, r, h, now, out)
        elif t == "cancel":
            if not self.calls.owned_by(h["id"], src):          # CallsMixin._on_cancel
                out.send(r.route, src, m.error_header(h["id"], "refused", f"call {h['id']} belongs to another "
                                                      "client: only its owner may cancel it"))
                return
            call = self.calls.live.get(h["id"])
            state, actions = self.calls.cancel(h["id"], now)
            out.send(r.route, src, m.make(MsgType.CANCELLED, h["id"], state=state))
            if call is not None:
                self._apply(call.sed, actions, now, out)
        elif t == "ping":
            if src == self.parent:
                out.send(r.route, src, m.make(MsgType.PONG, h["id"], name=r.name))
            else:
                ids = h.get("ids") or []
                out.send(r.route, src, m.make(MsgType.PONG, h["id"], name=r.name, calls={
                    i: self.calls.state(i) if self.calls.owned_by(i, src) else "unknown" for i in ids}))
        elif t == "heartbeat_ack" or t == "registered":
            ack = parent_ack(MsgType(t), h, r.attached)       # as ParentLink
            if ack.register:
                r.attached = False
                out.send(r.route, self.parent, self._register_header(r))
                if self.views:                  # SeD._register_info: the snapshot follows the REGISTER
                    self._push_view(out, r, True, None)
                return
            if self.views and r.name in ack.view_missing:       # SeD._view_asked
                r.push_gen += 1                 # the runtime cancels its pending timer
                self._push_view(out, r, True, None)
            r.attached = True

    def _on_call(self, src: bytes, r: Replica, h: dict, now: float, out: Out) -> None:
        """``CallsMixin._on_call`` without what a simulated call has not
        (decoding, data, size and access limits); every answer from
        :mod:`gridrpc.core.sed_protocol`, as the runtime's."""
        cid = h["id"]
        if not self.calls.owned_by(cid, src):
            out.send(r.route, src, not_owner_error(cid, self.name))
            return
        dup = self.calls.duplicate(cid)
        if isinstance(dup, Reacknowledge):
            dup.call.route = src
            out.send(r.route, src, accepted_header(cid, dup.call.sed, running=dup.call.state is CallState.RUNNING,
                                                   duplicate=True))
            return
        if isinstance(dup, Resend):             # the same answer again (a simulated RESULT carries no value)
            out.send(r.route, src, m.make(MsgType.RESULT, cid, value=None, server=h.get("sed")))
            return
        if dup is not None:
            out.send(r.route, src, gone_error(cid, self.name, self.calls.cache.max_bytes))
            return
        rep = call_replica(h, self.by_name)
        if rep is None:
            out.send(r.route, src, m.error_header(cid, "no_server", f"no SeD named {h.get('sed')!r} here"))
            return
        sed = rep.name
        if h.get("start_now") is True and not rep.scheduler.has_free_slot():
            out.send(r.route, src, busy_error(cid, sed, h["service"],
                                              self.estimate(rep, h["service"], now).get("est_wait", 0.0)))
            return
        call = CallRecord(id=cid, sed=sed, service=h["service"], user=h.get("user") or "anonymous",
                          optional=bool(h.get("optional")), received=now, owner=src)
        call.route = src            # type: ignore[attr-defined]
        call.gen = 0                # type: ignore[attr-defined]
        actions = self.calls.submit(call, now)
        self._apply(sed, actions, now, out)
        delay = ack_delay(self.ack_delay, call.state is CallState.RUNNING, True, h.get("ack_ms"))
        if delay <= 0:
            out.send(rep.route, src, self._accepted(call))
        else:                                   # the runtime's rule (core.sed_calls.ack_delay)
            self.world.sim.after(delay, self._maybe_ack, call)

    @staticmethod
    def _accepted(call) -> dict:
        return accepted_header(call.id, call.sed, running=call.state is CallState.RUNNING)

    def _maybe_ack(self, call) -> None:
        if self.calls.live.get(call.id) is call:
            self.world.transmit(self, self.by_name[call.sed].route, call.route, self._accepted(call))

    def _timing(self, call, now: float) -> dict:
        """``RunsMixin.timing``: the answer's server and timing."""
        return {"server": call.sed, "timing": {"received": call.received, "started": call.started, "ended": now}}

    def _apply(self, sed: str, actions: list, now: float, out: Out) -> None:
        for a in actions:
            if isinstance(a, Run):
                self._run(a.call, now)
            elif isinstance(a, Stop):
                a.call.gen += 1
                out.send(self.by_name[a.call.sed].route, a.call.route,
                         stop_error(a.call.id, a.reason, a.call.sed, **self._timing(a.call, now)))
                self._complete(a.call, ok=False, now=now, out=out)
            elif isinstance(a, Drop):
                out.send(self.by_name[a.call.sed].route, a.call.route,
                         drop_error(a.call.id, **self._timing(a.call, now)))
                self._complete(a.call, ok=False, now=now, out=out)
        if self.views:
            self._view_changed(self.by_name[sed], now)
        wake = self.calls.next_wakeup(sed, now)
        if wake is not None and self._wake.get(sed) != wake:
            self._wake[sed] = wake
            self.world.sim.at(wake + 0.001, self.local, self._tick, sed, wake)

    def _tick(self, out: Out, sed: str, wake: float) -> None:
        if self._wake.get(sed) != wake:
            return
        del self._wake[sed]
        now = self.world.sim.now
        self._apply(sed, self.calls.tick(sed, now), now, out)

    def _complete(self, call, *, ok: bool, now: float, out: Out) -> None:
        self._apply(call.sed, self.calls.complete(call.id, None, ok=ok, now=now), now, out)

    def _run(self, call, now: float) -> None:
        svc = self.services.get(call.service)
        duration = svc.sample(self.rng) if svc is not None else 0.0
        cpu = svc is not None and svc.cpu_bound
        w = self.workers[self._w % len(self.workers)]
        self._w += 1
        gen = call.gen
        costs = self.world.costs

        class _Exec:
            __slots__ = ("cost",)

            def __init__(s):
                s.cost = costs.exec_cpu + (duration if cpu else 0.0)

            def complete(s):
                if cpu:
                    self.local(self._finished, call, gen, duration)
                else:
                    self.world.sim.after(duration, self.local, self._finished, call, gen, duration)
        w.submit(_Exec)

    def _finished(self, out: Out, call, gen: int, duration: float) -> None:
        if call.gen != gen or call.state is not CallState.RUNNING:
            return                  # stopped meanwhile: answered by Stop
        now = self.world.sim.now
        r = self.by_name[call.sed]
        r.predictor.observe(call.service, duration)
        r.last_solve = now
        r.completed += 1
        out.cost += self.world.costs.call_cpu
        out.send(r.route, call.route, m.make(MsgType.RESULT, call.id, value=None, server=call.sed,
                                             timing={"received": call.received, "started": call.started,
                                                     "ended": now}))
        self._complete(call, ok=True, now=now, out=out)
