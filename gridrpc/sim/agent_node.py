"""A simulated agent (:mod:`gridrpc.sim.elements`): drives the real
:class:`gridrpc.core.agent.machine.AgentState` (with the real roles, registry,
discovery table and aggregators), as ``gridrpc/runtime/agent.py`` does with
sockets: registration and heartbeats to the parent, the state's actions as
messages, its ticks as timers. The parent's acknowledgements are decided by
:func:`gridrpc.core.parent_ack.parent_ack`, as the daemons' ``ParentLink``."""
from __future__ import annotations

import math
import random

from ..core import messages as m
from ..core.agent.machine import AgentConfig, AgentState, FromParent, Received, Tick
from ..core.agent.vocabulary import ChildrenUpdated, Send, SendParent
from ..core.messages import MsgType
from ..core.parent_ack import parent_ack
from .engine import Host
from .node import Node, Out

__all__ = ["AgentNode"]

_T = {t.value: t for t in MsgType}

#: MA CPU of a view answer per snapshot handled, by what was done with it (the agent's counters), measured
#: with benchmarks/view_core.py (CPU time, gc on, this shared 2-core host, 100,000 SeDs unless said):
#: the whole view ranked, per SeD: 5.2-6.4 us (10,000-100,000 SeDs; 2.1 us at 500); the kept ranking
#: (core/view_rank.py): created (keyed, sorted and counted: 2 per SeD) 0.61-0.70 s, i.e. ~3.3 us per unit;
#: a changed snapshot moved 8-14 us; a first place walked ~3.5 us (0.3-0.4 ms for ~105). Before: the
#: calibrated per-item cost of the MA (1.7 us per SeD ranked), fitted on messages, not on ranking.
VIEW_CPU = {"view_ranked": 5e-6, "view_sorted": 3.3e-6, "view_moved": 10e-6, "view_walked": 3.5e-6}
#: a small view ranked whole costs less per SeD (it stays in the CPU's caches): 2.19 us at 100 SeDs, 1.74 at
#: 250 (`python -m benchmarks.view_core 100 250`, 2026-11-28, load average ~15), 2.1 at 500; 2 us per SeD up
#: to SMALL_VIEW SeDs, VIEW_CPU["view_ranked"] from LARGE_VIEW, log-interpolated between
SMALL_VIEW, SMALL_VIEW_RANKED = 1000, 2e-6
LARGE_VIEW = 10000


def ranked_cpu(n: int) -> float:
    """MA CPU of one answer that ranked a whole view of ``n`` SeDs."""
    if n <= SMALL_VIEW:
        return n * SMALL_VIEW_RANKED
    large = VIEW_CPU["view_ranked"]
    if n >= LARGE_VIEW:
        return n * large
    f = math.log(n / SMALL_VIEW) / math.log(LARGE_VIEW / SMALL_VIEW)
    return n * (SMALL_VIEW_RANKED + f * (large - SMALL_VIEW_RANKED))


def view_cpu(counters, before: list) -> float:
    """The MA CPU of what a view answer did since ``before`` (the counters of
    :data:`VIEW_CPU`; the whole view ranked: :func:`ranked_cpu`)."""
    total = 0.0
    for (k, cost), b in zip(VIEW_CPU.items(), before):
        d = getattr(counters, k) - b
        if d:
            total += ranked_cpu(d) if k == "view_ranked" else cost * d
    return total


class AgentNode(Node):
    kind = "agent"

    def __init__(self, world, name: str, host: Host, role, parent: bytes | None, *, seed: int,
                 hb_interval: float = 1.0, hb_timeout: float = 5.0, views: bool = False,
                 view_max_age: float | None = None) -> None:
        super().__init__(world, name, host, role.kind)
        self.route = name.encode()
        self.parent = parent
        self.hb_interval = hb_interval
        self.state = AgentState(
            AgentConfig(name=name, parent=parent.decode() if parent else None, hb_interval=hb_interval,
                        hb_timeout=hb_timeout, view=views,
                        **({} if view_max_age is None else {"view_max_age": view_max_age})),
            role, random.Random(seed),
            info={"address": f"sim://{name}", "host": host.name, "pid": id(self) & 0xffffff, "started": 0.0})
        self._tick_at: float | None = None
        self.attached = False       # the parent acknowledged us (core.parent_ack, as ParentLink)
        self._rereg = False
        self._held: list = []       # VIEW batches waiting for the debounced REGISTER
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
        for h in self._held:
            out.send(self.route, self.parent, h)
        self._held.clear()

    def _heartbeat_timer(self) -> None:
        self.local(self._heartbeat)
        self.world.sim.after(self.hb_interval, self._heartbeat_timer)

    def _heartbeat(self, out: Out) -> None:
        now = self.world.sim.now
        out.send(self.route, self.parent, m.make(MsgType.HEARTBEAT, self._id(), name=self.name,
                                                 **self.state.heartbeat_info(now, now)))

    def handle(self, src, dst, h, out: Out) -> None:
        if not self.state.role.root:
            self._handle(src, h, out)
            return
        c = self.state.counters
        before = [getattr(c, k) for k in VIEW_CPU]
        self._handle(src, h, out)
        out.cost += view_cpu(c, before)                 # a view answer's ranking (or a try at one)

    def _handle(self, src, h, out: Out) -> None:
        now = self.world.sim.now
        t = _T[h["type"]]
        if src == self.parent and self.parent is not None:
            if t is MsgType.HEARTBEAT_ACK or t is MsgType.REGISTERED:
                ack = parent_ack(t, h, self.attached)      # as ParentLink
                if ack.register:
                    self.attached = False
                    self._register(out)
                    return
                if ack.view_missing and self.state.view.resend(ack.view_missing, now):
                    self._arm()                         # AgentRuntime._on_view_missing
                if ack.attached_now:                    # AgentRuntime._on_attached
                    self.state.view.resend_all(now)
                    self._arm()
                self.attached = True
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
                if self.parent is None:
                    continue
                if self._rereg and a.header.get("type") == "view":
                    # the runtime registers again at once, so the parent knows the new SeDs before
                    # their snapshots arrive; here the REGISTER is debounced: the VIEW waits for it
                    self._held.append(a.header)
                else:
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
