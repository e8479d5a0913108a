"""Simulated clients (:mod:`gridrpc.sim.elements`): a client process holds
users; each user loops discover (+ call), and each call is a real
:class:`~gridrpc.core.client_call.machine.CallMachine`. Replies become machine events
through :func:`gridrpc.core.client_call.replies.reply_event`, as in the real
drivers (:mod:`gridrpc.client.driver`).

A client process with a reuse window (``ClientNode(reuse=S)``, the load
generator's ``gridrpc loadtest --reuse-discovery``, 0.01 s by default)
works as the gevent client (:mod:`gridrpc.loadtest.green`): each call's
machine asks for candidates (``Discover``), answered from the real
:class:`~gridrpc.client.reuse.ReusedAnswers` (a view answer of the last
``S`` seconds, ranked again for the call), by joining a DISCOVER of the same
key already out, or by a DISCOVER of its own; the answer is settled on every
call that waited for it by ``ReusedAnswers.settle``."""
from __future__ import annotations

import random
from typing import Callable

from ..client.reuse import ReusedAnswers, answer_key, ask_again, ask_for, server_failed
from ..core.client_call import machine as cm
from ..core import messages as m
from ..core.client_call.replies import pong_events, reply_event
from ..core.messages import MsgType
from .engine import FixedJob, Host
from .model import BACKGROUND_PERIOD
from .node import Node, Out

__all__ = ["ClientNode", "User"]

_T = {t.value: t for t in MsgType}


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
        self.chosen: str | None = None  # the server its call is counted on in the client's reuse window
        self.t_discover = self.t_call = 0.0
        self._tick_at: float | None = None

    def begin(self, out: Out | None = None) -> None:
        if self.left is not None:
            if self.left <= 0:
                return
            self.left -= 1
        c = self.client
        if self.call and c.reuse is not None:
            self.t_discover = self.t_call = c.world.sim.now
            self.machine = cm.CallMachine(self.service, (), policy=c.policy, new_id=c.new_id, discover=True)
            if out is None:
                c.local(lambda o: self._do(self.machine.handle(cm.Start(), c.world.sim.now), o))
            else:
                self._do(self.machine.handle(cm.Start(), c.world.sim.now), out)
            return
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
        while actions:
            follow = None
            for a in actions:
                ta = type(a)
                if ta is cm.Discover:
                    follow = c.discover_for(self, a, out)
                elif self._act(a, ta, out):
                    return
            actions = self.machine.handle(follow, c.world.sim.now) if follow is not None else None
        self._arm()

    def _act(self, a, ta, out: Out) -> bool:
        """Carry out one action of the machine; True when the call ended."""
        c = self.client
        if ta is cm.SendCall:
            if self.chosen is not None and self.chosen != a.server:     # passed on: counted where it is
                c.reuse.moved(self.chosen, a.server)
                self.chosen = a.server
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
            if self.chosen is not None:
                c.reuse.ended(self.chosen, failed=server_failed(self.machine, a), now=now)
                self.chosen = None
            self.machine = None
            if self.on_done:
                self.on_done(self, a)
            self.next_round(out)
            return True
        return False

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
                 policy: cm.CallPolicy | None = None, reuse: float = 0.0) -> None:
        super().__init__(world, name, host, kind)
        self.route = name.encode()
        self.ma = ma
        self.pending: dict[str, User] = {}
        self.policy = policy or cm.CallPolicy()
        #: the load generator's reuse window (gridrpc loadtest --reuse-discovery): None, every call asks the MA
        self.reuse: ReusedAnswers | None = ReusedAnswers(reuse) if reuse > 0 else None
        self._joining: dict[tuple, list] = {}       # reuse key -> [(user, Discover)] waiting for the same ask
        self._asks: dict[str, tuple] = {}           # DISCOVER id -> (user that asked, its Discover, reuse key)
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

    # -- the reuse window (as gridrpc.loadtest.green.GreenClient) ---------------------
    def discover_for(self, user: User, a: cm.Discover, out: Out):
        """A call's machine asks for candidates: a kept view answer at once
        (``Discovered``), else it joins a DISCOVER of the same key already
        out, else it sends one (None: the answer comes later)."""
        reuse = self.reuse
        key = answer_key(user.service, False, user.k, user.aggregator)
        now = self.world.sim.now
        servers = reuse.take(key, now)
        if servers is not None:
            return self._seat(user, servers, now)
        joined = self._joining.get(key)
        if joined is not None:
            joined.append((user, a))
            return None
        self._joining[key] = []
        self._ask(user, a, key, out)
        return None

    def _ask(self, user: User, a: cm.Discover, key: tuple, out: Out) -> None:
        rid = self.new_id()
        asked = ask_for(user.k, 1 + len(self._joining.get(key, ())), len(self.reuse.in_flight))
        self._asks[rid] = (user, a, key)
        user.t_discover = self.world.sim.now
        h = m.make(MsgType.DISCOVER, rid, service=user.service, k=asked, user=user.user)
        if user.aggregator is not None:
            h["aggregator"] = user.aggregator
        out.send(self.route, self.ma, h)

    def _seat(self, user: User, ranked: list, now: float) -> cm.Discovered:
        free = self.reuse.free(ranked, now)
        user.chosen = self.reuse.begin(ranked)
        user.t_call = now
        return cm.Discovered(ranked[:user.k], free)

    def _settle(self, rid: str, h: dict, out: Out) -> None:
        """The MA's answer to an ask: recorded as a discovery, then settled
        on the call that asked and those that joined it (the real
        ``ReusedAnswers.settle``); the joiners it cannot seat ask again."""
        user, own, key = self._asks.pop(rid)
        now = self.world.sim.now
        ok = h["type"] == "servers" and bool(h.get("servers"))
        self.world.record_discovery(user, now - user.t_discover, h, ok)
        calls = [(user, own)] + self._joining.pop(key, [])
        if not ok:
            event = cm.DiscoveryFailed(h.get("error", {}).get("kind", "no_server") if h["type"] == "error"
                                       else "no_server", "no server")
            for u, _own in calls:
                if u.machine is not None and not u.machine.finished:
                    u.event(event, out)
            return
        servers = [_Target(x["name"], x.get("address", ""), x.get("estimation")) for x in h["servers"]]
        again = self.reuse.settle(key, servers, h.get("view") is True, now, calls, user,
                                  lambda u, ranked: u.event(self._seat(u, ranked, now), out))
        first = ask_again(self._joining, key, again)
        if first is not None:
            u, a = first
            self._ask(u, a, key, out)

    # -- messages ----------------------------------------------------------------------
    def handle(self, src, dst, h, out: Out) -> None:
        t = h["type"]
        if t == "pong":
            for pong in pong_events(h):
                u = self.pending.get(pong.id)
                if u is not None and u.machine is not None:
                    u.event(pong, out)
            return
        rid = h.get("id", "")
        if src == self.ma and rid in self._asks:
            self._settle(rid, h, out)
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
        if t in ("result", "error"):
            self.pending.pop(rid, None)
        u.event(reply_event(_T[t], h, h.get("value")), out)
