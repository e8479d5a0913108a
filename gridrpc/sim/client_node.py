"""Simulated clients (:mod:`gridrpc.sim.elements`): a client process holds
users; each user loops discover (+ call), and each call is a real
:class:`~gridrpc.core.call.CallMachine`."""
from __future__ import annotations

import random
from typing import Callable

from ..core import call as cm
from ..core import messages as m
from ..core.messages import MsgType
from .engine import FixedJob, Host
from .model import BACKGROUND_PERIOD
from .node import Node, Out

__all__ = ["ClientNode", "User"]


class _Target:
    __slots__ = ("name", "address", "estimation")

    def __init__(self, name: str, address: str, estimation: object = None) -> None:
        self.name, self.address, self.estimation = name, address, estimation


class User:
    """One client user: ``calls`` loops of discover (+ call), ``think`` seconds
    apart (a callable ``rng -> seconds``), starting at ``start``."""

    def __init__(self, client: "ClientNode", uid: str, *, service: str, k: int, call: bool, calls: int | None,
                 think: Callable[[random.Random], float] | None, user: str, aggregator=None,
                 budget_ms: float | None = None, optional: bool = False, on_done=None,
                 max_age: float | None = None) -> None:
        self.client, self.uid, self.service, self.k, self.call = client, uid, service, k, call
        self.left = calls
        self.think, self.user, self.aggregator, self.budget_ms = think, user, aggregator, budget_ms
        self.optional = optional
        self.on_done = on_done
        self.max_age = max_age          # as Client.discover(max_age=): 0 always fans out
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
        if self.max_age is not None:
            h["max_age_ms"] = max(0.0, float(self.max_age)) * 1000.0
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
        cands = [_Target(s["name"], s.get("address", ""), s.get("estimation")) for s in h["servers"]]
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
                                                            optional=self.optional,
                                                            ack_ms=self.machine.policy.ack_ms,
                                                            **({"start_now": True} if a.start_now else {})))
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
    """A client process (one DEALER): its users' discoveries and calls.
    With a ``background`` share for its kind (:class:`~gridrpc.sim.model.Costs`,
    the load generator's, measured by the calibration), it also spends that
    share of a core whatever the calls: a job every
    :data:`~gridrpc.sim.model.BACKGROUND_PERIOD`, from its creation; the
    wake-ups those jobs cause are counted apart (``bg_wakeups``), not as the
    process's (the calibration fits the background separately)."""
    kind = "client"

    def __init__(self, world, name: str, host: Host, ma: bytes, kind: str = "client",
                 policy: cm.CallPolicy | None = None) -> None:
        super().__init__(world, name, host, kind)
        self.route = name.encode()
        self.ma = ma
        self.pending: dict[str, User] = {}
        self.policy = policy or cm.CallPolicy()
        self._n = 0
        self.bg_wakeups = 0
        share = world.costs.bg(self.kind)
        if share > 0.0:
            self._bg_cost = share * BACKGROUND_PERIOD
            world.sim.after(BACKGROUND_PERIOD, self._background)

    def _background(self) -> None:
        p = self.proc
        before = p.wakeups
        p.submit(FixedJob, self._bg_cost)
        self.bg_wakeups += p.wakeups - before
        self.world.sim.after(BACKGROUND_PERIOD, self._background)

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
