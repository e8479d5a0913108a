"""The simulated elements: thin drivers of the *real* core objects.

- :class:`AgentNode` drives :class:`gridrpc.core.agent.AgentState` (with the
  real :class:`~gridrpc.core.agent_roles.MasterRole` / ``LocalRole``, the
  registry, the discovery table and the aggregators): what the asyncio
  driver ``gridrpc/runtime/agent.py`` does with sockets, it does with
  simulated messages.
- :class:`SedNode` is a SeD process holding replicas: each replica a real
  :class:`~gridrpc.core.queue.SedScheduler` (FCFS, ethic, ...) and
  :class:`~gridrpc.core.estimation.RunTimePredictor`, the process's calls in
  one real :class:`~gridrpc.core.sed_calls.SedCalls`; estimation vectors from
  :func:`~gridrpc.core.estimation.scheduler_tags`, as the SeD runtime.
- :class:`ClientNode` holds users; each call is a real
  :class:`~gridrpc.core.call.CallMachine`.

Headers are the real wire headers (``gridrpc.core.messages.make``), passed
as dicts (no JSON). Every message received is a job on the receiving
process: its CPU cost is ``msg[kind] * (1 + messages sent) + item[kind] *
(items received and sent)`` (items: estimation vectors, replica names,
subtree elements), from the calibration (:mod:`gridrpc.sim.model`).
"""
from __future__ import annotations

import collections
import random
from typing import Callable

from ..core import call as cm
from ..core import messages as m
from ..core.agent import AgentConfig, AgentState, FromParent, Received, Tick
from ..core.agent_events import ChildrenUpdated, Send, SendParent
from ..core.estimation import RunTimePredictor, scheduler_tags
from ..core.messages import MsgType
from ..core.queue import SedScheduler, make_policy
from ..core.sed_calls import CallRecord, CallState, Drop, Reacknowledge, Resend, Run, SedCalls, Stop
from .engine import Host, Proc

_T = {t.value: t for t in MsgType}


def items(h: dict) -> int:
    n = 0
    for key in ("servers", "names", "elements"):
        v = h.get(key)
        if v:
            n += len(v)
    return n


def size(h: dict) -> int:
    """Bytes on the wire, roughly (measured orjson sizes of typical headers)."""
    n = 140
    v = h.get("servers")
    if v:
        n += 330 * len(v)
    v = h.get("names")
    if v:
        n += 12 * len(v)
    v = h.get("elements")
    if v:
        n += 260 * len(v)
    return n


class Out:
    """What one job does when its CPU time is spent: send messages."""
    __slots__ = ("node", "sends", "cost", "after")

    def __init__(self, node: "Node") -> None:
        self.node = node
        self.sends: list = []
        self.cost = 0.0
        self.after: list = []

    def send(self, src: bytes, dst: bytes, header: dict) -> None:
        self.sends.append((src, dst, header))

    def complete(self) -> None:
        world = self.node.world
        for src, dst, h in self.sends:
            world.transmit(self.node, src, dst, h)
        for fn in self.after:
            fn()


class Node:
    kind = "?"

    def __init__(self, world, name: str, host: Host, kind: str | None = None) -> None:
        self.world = world
        self.name = name
        self.kind = kind or self.kind
        self.proc = Proc(host, name, self.kind)
        share = world.costs.io_share
        if share > 0.0 and self.kind != "worker":
            self.proc.io = Proc(host, name + "-io", "io")
            self.proc.io_share = share
        self.inbound: collections.Counter = collections.Counter()
        self.n_msgs = 0             # messages received and sent (what the calibration fits against)
        self.n_items = 0

    def deliver(self, src: bytes, dst: bytes, h: dict) -> None:
        self.inbound[h["type"]] += 1
        self.world.note_inbound(self, h)
        self.proc.submit(self._job, src, dst, h)

    def _job(self, src, dst, h) -> Out:
        out = Out(self)
        self.handle(src, dst, h, out)
        self.charge(out, items(h))
        return out

    def charge(self, out: Out, n_items: int) -> None:
        c = self.world.costs
        k = self.kind
        nm = (1 if n_items >= 0 else 0) + len(out.sends)
        ni = max(n_items, 0) + sum(items(s[2]) for s in out.sends)
        self.n_msgs += nm
        self.n_items += ni
        out.cost += c.msg(k) * nm + c.item(k) * ni

    def handle(self, src, dst, h, out: Out) -> None:    # pragma: no cover - overridden
        raise NotImplementedError

    def local(self, fn: Callable, *args) -> None:
        """Run ``fn(out, *args)`` as a job of this process (a timer, a tick)."""
        def job():
            out = Out(self)
            fn(out, *args)
            self.charge(out, -1)        # a timer: no message received
            return out
        self.proc.submit(job)


# -- agents -----------------------------------------------------------------------
class AgentNode(Node):
    kind = "agent"

    def __init__(self, world, name: str, host: Host, role, parent: bytes | None, *, seed: int,
                 hb_interval: float = 1.0, hb_timeout: float = 5.0) -> None:
        super().__init__(world, name, host, role.kind)
        self.route = name.encode()
        self.parent = parent
        self.hb_interval = hb_interval
        self.state = AgentState(
            AgentConfig(name=name, parent=parent.decode() if parent else None, hb_interval=hb_interval,
                        hb_timeout=hb_timeout),
            role, random.Random(seed),
            info={"address": f"sim://{name}", "host": host.name, "pid": id(self) & 0xffffff, "started": 0.0})
        self._tick_at: float | None = None
        self._rereg = False
        self._n = 0

    def start(self, at: float) -> None:
        if self.parent is not None:
            self.world.sim.at(at, self.local, self._register)
            self.world.sim.at(at + self.hb_interval * (0.5 + self.world.sim.rng.random()), self._heartbeat_timer)

    def _id(self) -> str:
        self._n += 1
        return f"{self.name}.{self._n}"

    def _register(self, out: Out) -> None:
        self._rereg = False
        now = self.world.sim.now
        out.send(self.route, self.parent, m.make(MsgType.REGISTER, self._id(), name=self.name,
                                                 **self.state.register_info(now, now)))

    def _heartbeat_timer(self) -> None:
        self.local(self._heartbeat)
        self.world.sim.after(self.hb_interval, self._heartbeat_timer)

    def _heartbeat(self, out: Out) -> None:
        now = self.world.sim.now
        out.send(self.route, self.parent, m.make(MsgType.HEARTBEAT, self._id(), name=self.name,
                                                 **self.state.heartbeat_info(now, now)))

    def handle(self, src, dst, h, out: Out) -> None:
        now = self.world.sim.now
        t = _T[h["type"]]
        if src == self.parent and self.parent is not None:
            if t is MsgType.HEARTBEAT_ACK:
                if h.get("known") is False:
                    self._register(out)
                return
            if t is MsgType.REGISTERED:
                return
            actions = self.state.handle(FromParent(t, h), now)
        else:
            actions = self.state.handle(Received(src, t, h), now)
        self._apply(actions, out)

    def _apply(self, actions: list, out: Out) -> None:
        for a in actions:
            ta = type(a)
            if ta is Send:
                out.send(self.route, a.to, a.header)
            elif ta is SendParent:
                if self.parent is not None:
                    out.send(self.route, self.parent, a.header)
            elif ta is ChildrenUpdated:
                if a.reregister and not self._rereg and self.parent is not None:
                    self._rereg = True      # the runtime's ParentLink.update(): one REGISTER for a burst
                    self.world.sim.after(0.05, self.local, self._register)
        self._arm()

    def _arm(self) -> None:
        w = self.state.next_wakeup()
        if w is not None and (self._tick_at is None or w < self._tick_at):
            self._tick_at = w
            self.world.sim.at(w, self._tick_due, w)

    def _tick_due(self, w: float) -> None:
        if self._tick_at != w:
            return
        self._tick_at = None
        self.local(self._tick)

    def _tick(self, out: Out) -> None:
        self._apply(self.state.handle(Tick(), self.world.sim.now), out)


# -- SeD processes ------------------------------------------------------------------
class Replica:
    __slots__ = ("name", "route", "scheduler", "predictor", "last_solve", "completed")

    def __init__(self, name: str, scheduler: SedScheduler, predictor: RunTimePredictor) -> None:
        self.name, self.route = name, name.encode()
        self.scheduler, self.predictor = scheduler, predictor
        self.last_solve: float | None = None
        self.completed = 0


class SedNode(Node):
    """A SeD process: ``replicas`` tree elements sharing one process, one
    address and ``workers`` worker processes (``gridrpc sed --replicas K``)."""
    kind = "sed"
    ack_delay = 0.02            # ProcessBackend.ack_delay: a quick call's RESULT stands for ACCEPTED

    def __init__(self, world, name: str, host: Host, parent: bytes, names: list[str], *, seed: int,
                 services: dict, policy: str = "fcfs", policy_options: dict | None = None,
                 max_concurrent: int = 1, workers: int = 1, hb_interval: float = 1.0,
                 host_tags: dict | None = None) -> None:
        super().__init__(world, name, host)
        self.parent = parent
        self.address = f"sim://{name}"
        self.services = services            # name -> ServiceModel (gridrpc.sim.model)
        self.hb_interval = hb_interval
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

    def start(self, at: float) -> None:
        sim = self.world.sim
        svc = [{"name": s, "doc": "", "params": []} for s in self.services]
        info = {"kind": "sed", "address": self.address, "host": self.proc.host.name, "pid": id(self) & 0xffffff,
                "started": 0.0}
        for r in self.replicas.values():
            h = m.make(MsgType.REGISTER, self._id(), name=r.name, **info, services=svc, elements=[], load={})
            sim.at(at, self.world.transmit, self, r.route, self.parent, h)
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
        vec = dict(self.host_tags)
        vec["server_type"] = "serial"
        vec.update(scheduler_tags(scheduler=r.scheduler, service=service, predictor=r.predictor, now=now,
                                  last_solve=r.last_solve))
        return vec

    # -- messages ---------------------------------------------------------------
    def handle(self, src, dst, h, out: Out) -> None:
        now = self.world.sim.now
        t = h["type"]
        r = self.replicas[dst]
        if t == "discover":
            names = h.get("names") if isinstance(h.get("names"), list) else [r.name]
            mine = [self.by_name[n] for n in names if n in self.by_name] or [r]
            service = h["service"]
            servers = [] if service not in self.services else [
                {"name": rep.name, "address": self.address, "estimation": self.estimate(rep, service, now)}
                for rep in mine]
            self.estimates += len(servers)
            for rep in mine:
                self.answered_at[rep.name] = now
            reply = m.make(MsgType.SERVERS, h["id"], name=r.name, servers=servers)
            if len(mine) > 1:
                reply["names"] = [rep.name for rep in mine]
            out.send(r.route, self.parent, reply)
        elif t == "call":
            self._on_call(src, r, h, now, out)
        elif t == "cancel":
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
                out.send(r.route, src, m.make(MsgType.PONG, h["id"], name=r.name,
                                              calls={i: self.calls.state(i) for i in ids}))
        elif t == "heartbeat_ack" and h.get("known") is False:
            svc = [{"name": s, "doc": "", "params": []} for s in self.services]
            out.send(r.route, self.parent, m.make(
                MsgType.REGISTER, self._id(), name=r.name, kind="sed", address=self.address,
                host=self.proc.host.name, pid=id(self) & 0xffffff, started=0.0, services=svc, elements=[],
                load={}))

    def _on_call(self, src: bytes, r: Replica, h: dict, now: float, out: Out) -> None:
        dup = self.calls.duplicate(h["id"])
        if isinstance(dup, Reacknowledge):
            out.send(r.route, src, m.make(MsgType.ACCEPTED, h["id"], server=dup.call.sed))
            return
        if isinstance(dup, Resend):
            out.send(r.route, src, m.make(MsgType.RESULT, h["id"], value=None, server=h.get("sed")))
            return
        if dup is not None:
            out.send(r.route, src, m.error_header(h["id"], "result_gone", "result dropped"))
            return
        sed = h.get("sed") if h.get("sed") in self.by_name else r.name
        call = CallRecord(id=h["id"], sed=sed, service=h["service"], user=h.get("user") or "anonymous",
                          optional=bool(h.get("optional")), received=now)
        call.route = src            # type: ignore[attr-defined]
        call.gen = 0                # type: ignore[attr-defined]
        actions = self.calls.submit(call, now)
        self._apply(sed, actions, now, out)
        if call.state is CallState.QUEUED:
            out.send(self.by_name[sed].route, src, m.make(MsgType.ACCEPTED, call.id, server=sed))
        else:
            self.world.sim.after(self.ack_delay, self._maybe_ack, call)

    def _maybe_ack(self, call) -> None:
        if call.state is CallState.RUNNING and self.calls.live.get(call.id) is call:
            self.world.transmit(self, self.by_name[call.sed].route, call.route,
                                m.make(MsgType.ACCEPTED, call.id, server=call.sed))

    def _apply(self, sed: str, actions: list, now: float, out: Out) -> None:
        for a in actions:
            if isinstance(a, Run):
                self._run(a.call, now)
            elif isinstance(a, Stop):
                a.call.gen += 1
                kind = "preempted" if a.reason == "preempted" else "cancelled"
                out.send(self.by_name[a.call.sed].route, a.call.route, m.error_header(
                    a.call.id, kind, f"call {a.reason}", server=a.call.sed))
                self._complete(a.call, ok=False, now=now, out=out)
            elif isinstance(a, Drop):
                out.send(self.by_name[a.call.sed].route, a.call.route, m.error_header(
                    a.call.id, "cancelled", "call cancelled while queued", server=a.call.sed))
                self._complete(a.call, ok=False, now=now, out=out)
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


# -- clients --------------------------------------------------------------------------
class _Target:
    __slots__ = ("name", "address")

    def __init__(self, name: str, address: str) -> None:
        self.name, self.address = name, address


class User:
    """One client user: ``calls`` loops of discover (+ call), ``think`` seconds
    apart (a callable ``rng -> seconds``), starting at ``start``."""

    def __init__(self, client: "ClientNode", uid: str, *, service: str, k: int, call: bool, calls: int | None,
                 think: Callable[[random.Random], float] | None, user: str, aggregator=None,
                 budget_ms: float | None = None, optional: bool = False, on_done=None) -> None:
        self.client, self.uid, self.service, self.k, self.call = client, uid, service, k, call
        self.left = calls
        self.think, self.user, self.aggregator, self.budget_ms = think, user, aggregator, budget_ms
        self.optional = optional
        self.on_done = on_done
        self.machine: cm.CallMachine | None = None
        self.t_discover = self.t_call = 0.0
        self._tick_at: float | None = None

    def begin(self, out: Out | None = None) -> None:
        if self.left is not None:
            if self.left <= 0:
                return
            self.left -= 1
        c = self.client
        rid = c.new_id()
        c.pending[rid] = self
        self.t_discover = c.world.sim.now
        h = m.make(MsgType.DISCOVER, rid, service=self.service, k=self.k, user=self.user)
        if self.aggregator is not None:
            h["aggregator"] = self.aggregator
        if self.budget_ms is not None:
            h["budget_ms"] = self.budget_ms
        if out is None:
            c.local(lambda o: o.send(c.route, c.ma, h))
        else:
            out.send(c.route, c.ma, h)

    def next_round(self, out: Out) -> None:
        w = self.think(self.client.world.rng) if self.think else 0.0
        if w > 0:
            self.client.world.sim.after(w, self.begin)
        else:
            self.begin(out)

    # discovery answer
    def servers(self, h: dict, out: Out) -> None:
        c = self.client
        now = c.world.sim.now
        ok = h["type"] == "servers" and bool(h.get("servers"))
        c.world.record_discovery(self, now - self.t_discover, h, ok)
        if not self.call or not ok:
            if self.on_done:
                self.on_done(self, None)
            self.next_round(out)
            return
        cands = [_Target(s["name"], s.get("address", "")) for s in h["servers"]]
        self.machine = cm.CallMachine(self.service, cands, policy=c.policy, new_id=c.new_id)
        self.t_call = now
        self._do(self.machine.handle(cm.Start(), now), out)

    def event(self, ev, out: Out) -> None:
        self._do(self.machine.handle(ev, self.client.world.sim.now), out)

    def _do(self, actions: list, out: Out) -> None:
        c = self.client
        for a in actions:
            ta = type(a)
            if ta is cm.SendCall:
                c.pending[a.id] = self
                out.send(c.route, a.server.encode(), m.make(MsgType.CALL, a.id, sed=a.server, service=self.service,
                                                            args=[], kwargs={}, user=self.user,
                                                            optional=self.optional))
                self.machine.handle(cm.CallSent(), c.world.sim.now)
            elif ta is cm.SendPing:
                out.send(c.route, a.server.encode(), m.make(MsgType.PING, c.new_id(), ids=[a.id]))
            elif ta is cm.SendCancel:
                out.send(c.route, a.server.encode(), m.make(MsgType.CANCEL, a.id, sed=a.server))
            elif ta is cm.Done or ta is cm.Fail:
                now = c.world.sim.now
                c.world.record_call(self, now - self.t_discover, now - self.t_call, ta is cm.Done)
                self.machine = None
                if self.on_done:
                    self.on_done(self, a)
                self.next_round(out)
                return
        self._arm()

    def _arm(self) -> None:
        if self.machine is None:
            return
        w = self.machine.next_wakeup()
        if w is not None and (self._tick_at is None or w < self._tick_at):
            self._tick_at = w
            self.client.world.sim.at(w, self._tick_due, w)

    def _tick_due(self, w: float) -> None:
        if self._tick_at != w:
            return
        self._tick_at = None
        if self.machine is not None:
            self.client.local(lambda out: self.machine is not None and self.event(cm.Tick(), out))


class ClientNode(Node):
    """A client process (one DEALER): its users' discoveries and calls."""
    kind = "client"

    def __init__(self, world, name: str, host: Host, ma: bytes, kind: str = "client",
                 policy: cm.CallPolicy | None = None) -> None:
        super().__init__(world, name, host, kind)
        self.route = name.encode()
        self.ma = ma
        self.pending: dict[str, User] = {}
        self.policy = policy or cm.CallPolicy()
        self._n = 0

    def new_id(self) -> str:
        self._n += 1
        return f"{self.name}.{self._n}"

    def handle(self, src, dst, h, out: Out) -> None:
        t = h["type"]
        rid = h.get("id", "")
        if t == "pong" and isinstance(h.get("calls"), dict):
            for cid, state in h["calls"].items():
                u = self.pending.get(cid)
                if u is not None and u.machine is not None:
                    u.event(cm.Pong(cid, state), out)
            return
        u = self.pending.get(rid)
        if u is None:
            return
        if src == self.ma:
            del self.pending[rid]
            u.servers(h, out)
            return
        if u.machine is None:
            return
        if t == "accepted":
            u.event(cm.Accepted(rid, h.get("patience")), out)
        elif t == "result":
            self.pending.pop(rid, None)
            u.event(cm.Result(rid, h.get("value"), h.get("timing"), h.get("server")), out)
        elif t == "error":
            self.pending.pop(rid, None)
            u.event(cm.Error(rid, h["error"], h.get("timing"), h.get("server")), out)
        elif t == "cancelled":
            u.event(cm.CancelAck(rid, h.get("state")), out)
