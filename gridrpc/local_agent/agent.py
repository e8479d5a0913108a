"""Agent runtime shared by the Master Agent and the Local Agents.

Binds a ROUTER for children (SeDs, LAs) and clients; optionally links to a
parent. Wires the pure core (child registry, discovery table, aggregators) to
sockets and timers.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
import socket
import time

from ..core import messages as m
from ..core.aggregators import make_aggregator
from ..core.discovery import DiscoveryTable, Done
from ..core.messages import MsgType
from ..core.tree import ChildRegistry
from ..errors import ProtocolError
from ..transport.channel import Channel, bind_router, host_of
from ..transport.parent_link import ParentLink

log = logging.getLogger(__name__)


class Agent:
    kind = "la"

    def __init__(self, *, name: str, address: str = "tcp://127.0.0.1:0", parent: str | None = None,
                 hb_interval: float = 1.0, hb_timeout: float = 3.0, discovery_budget: float = 2.0,
                 orphan_timeout: float | None = None, seed: int | None = None) -> None:
        self.name = name
        self.bind_address = address
        self.parent = parent
        self.hb_interval = hb_interval
        self.hb_timeout = hb_timeout
        self.discovery_budget = discovery_budget
        self.orphan_timeout = orphan_timeout
        self.registry = ChildRegistry(name)
        self.discoveries = DiscoveryTable(random.Random(seed), remember=self.kind == "ma")
        self.address: str | None = None
        self.router: Channel | None = None
        self.link: ParentLink | None = None
        self._ids = itertools.count(1)
        self._tasks: list[asyncio.Task] = []
        self._timer: asyncio.TimerHandle | None = None
        self._reported_version = -1
        self.started = time.time()
        self.stats = {"discoveries": 0, "discoveries_timed_out": 0, "bad_messages": 0}
        self.closed = asyncio.Event()

    # -- lifecycle --------------------------------------------------------
    async def start(self) -> "Agent":
        sock, self.address = bind_router(self.bind_address)
        self.router = Channel(sock, self._on_router, name=f"{self.name}.router")
        if self.parent:
            self.link = ParentLink(name=self.name, parent=self.parent, register_info=self._register_info,
                                   heartbeat_info=self._heartbeat_info, on_message=self._on_parent,
                                   hb_interval=self.hb_interval, hb_timeout=self.hb_timeout,
                                   orphan_timeout=self.orphan_timeout, on_orphaned=self._orphaned)
            self.link.start()
        self._tasks.append(asyncio.get_running_loop().create_task(self._housekeeping()))
        log.info("%s (%s) listening on %s%s", self.name, self.kind, self.address,
                 f", parent {self.parent}" if self.parent else "")
        return self

    async def __aenter__(self):
        return await self.start()

    async def __aexit__(self, *exc):
        await self.aclose()

    async def aclose(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        if self._timer:
            self._timer.cancel()
        if self.link:
            await self.link.aclose()
        if self.router:
            self.router.close()
        self.closed.set()

    def _orphaned(self) -> None:
        if getattr(self, "_orphan_exit", False):  # called every heartbeat while orphaned: act once
            return
        self._orphan_exit = True
        log.warning("%s: parent gone for more than %gs: exiting", self.name, self.orphan_timeout)
        asyncio.get_running_loop().create_task(self.aclose())

    # -- element info -----------------------------------------------------
    def element_info(self) -> dict:
        return {"kind": self.kind, "address": self.address, "host": host_of(self.address or "") or socket.gethostname(),
                "pid": os.getpid(), "started": self.started}

    def _register_info(self) -> dict:
        return {**self.element_info(), "services": self._service_list(),
                "elements": self._elements()}

    def _heartbeat_info(self) -> dict:
        return {"load": {"children": len(self.registry.children)}, "elements": self._elements()}

    def _elements(self) -> list[dict]:
        now_m, now_u = time.monotonic(), time.time()
        out = []
        for e in self.registry.elements(now_m, lost_after=self.hb_interval * 2.5):
            e = dict(e)
            if "last_seen" in e:
                e["last_heartbeat"] = now_u - (now_m - e.pop("last_seen"))
            out.append(e)
        return out

    def _service_list(self) -> list[dict]:
        return [{"name": s, **meta} for s, meta in self.registry.services().items()]

    # -- messages ---------------------------------------------------------
    def _reply(self, route: list, header: dict, buffers: list = ()) -> None:
        try:
            self.router.send([*route, m.dumps(header), *buffers])
        except Exception as exc:
            log.debug("%s: reply failed: %s", self.name, exc)

    def _on_router(self, frames: list) -> None:
        try:
            route, mt, h, _ = m.parse_routed(frames)
        except ProtocolError as exc:
            route = frames[:1]
            self.stats["bad_messages"] += 1
            log.warning("%s: rejected message: %s", self.name, exc)
            self._reply(route, m.error_header("", "protocol", str(exc)))
            return
        now = time.monotonic()
        if mt is MsgType.REGISTER:
            self.registry.register(route[0].bytes, h, now)
            self._reply(route, m.make(MsgType.REGISTERED, h["id"]))
            self._subtree_changed()
        elif mt is MsgType.HEARTBEAT:
            known = self.registry.heartbeat(route[0].bytes, h, now)
            self._reply(route, m.make(MsgType.HEARTBEAT_ACK, h["id"], known=known))
            if known:
                self._subtree_changed()
        elif mt is MsgType.UNREGISTER:
            if self.registry.remove(h["name"]):
                log.info("%s: child %s left", self.name, h["name"])
                self._child_lost(h["name"])
        elif mt is MsgType.SERVERS:
            names = h.get("names") if isinstance(h.get("names"), list) else None
            self._finish(self.discoveries.answer(h["id"], h.get("name", ""), h["servers"], now, names))
        elif mt is MsgType.DISCOVER:
            self._discover(h, ("router", route))
        elif mt is MsgType.SERVICES:
            self._reply(route, self._catalogue_reply(h))
        elif mt is MsgType.PING:
            self._reply(route, m.make(MsgType.PONG, h["id"], name=self.name))
        else:
            self._reply(route, m.error_header(h["id"], "protocol", f"{self.name} does not handle {mt.value}"))

    def _on_parent(self, mt: MsgType, h: dict, frames: list) -> None:
        if mt is MsgType.DISCOVER:
            self._discover(h, ("parent", None))
        elif mt is MsgType.PING:
            self.link.send(m.make(MsgType.PONG, h["id"], name=self.name))

    def _catalogue_reply(self, h: dict) -> dict:
        cat = self.registry.catalogue()
        elements = self._elements()
        addresses = {e["name"]: e.get("address") for e in elements if e.get("kind") == "sed"}
        extra = {"elements": self.tree()} if h.get("tree") else {}
        return m.make(MsgType.CATALOGUE, h["id"], services=cat, servers=addresses, **extra)

    def tree(self) -> list[dict]:
        """This agent and its whole subtree, as /api/tree shows it."""
        me = {"name": self.name, "parent": self.parent if self.kind != "ma" else None,
              **self.element_info(), "services": [], "state": "alive",
              "last_heartbeat": time.time(), "load": self.statistics()}
        return [me] + [dict(e, state=e.get("state", "alive")) for e in self._elements()]

    def _subtree_changed(self) -> None:
        if self.link and self.registry.version != self._reported_version:
            self._reported_version = self.registry.version
            self.link.update()

    def _child_lost(self, name: str) -> None:
        for done in self.discoveries.child_lost(name, time.monotonic()):
            self._finish(done)
        self._subtree_changed()

    # -- discovery --------------------------------------------------------
    def _discover(self, h: dict, reply_to: tuple) -> None:
        self.stats["discoveries"] += 1
        service = h["service"]
        k = max(0, min(int(h["k"]), 100000))
        if h.get("aggregator") is None:       # the service's own default, else DIET's default
            meta = self.registry.services().get(service)
            if meta and meta.get("aggregator") is not None:
                h = dict(h, aggregator=meta["aggregator"])
        try:
            agg = make_aggregator(h.get("aggregator"))
        except ValueError as exc:
            self._answer(reply_to, m.error_header(h["id"], "invalid_argument", str(exc)))
            return
        children = self.registry.offering(service)
        if not children and self.kind == "ma":
            self._answer(reply_to, m.error_header(
                h["id"], "service_not_found", f"no server in the tree offers {service!r}"))
            return
        budget = float(h.get("budget_ms") or self.discovery_budget * 1000) / 1000.0
        budget = min(max(budget, 0.01), 60.0)
        # children get a little less time, so our own answer leaves before our asker's deadline
        child_budget_ms = max(5.0, budget * 1000 * 0.8 - 2.0)
        fid = f"{self.name}:{next(self._ids)}"
        fwd = dict(h, id=fid, budget_ms=child_budget_ms, k=k)
        sent = []
        for group in self._by_process(children):
            child = self.registry.children.get(group[0])
            msg = dict(fwd, names=group) if len(group) > 1 else fwd
            try:
                self.router.send([child.route, m.dumps(msg)])
                sent.extend(group)
            except Exception as exc:
                log.debug("%s: discovery to %s failed: %s", self.name, group[0], exc)
        now = time.monotonic()
        done = self.discoveries.start(fid, (reply_to, h["id"], service, k), sent, k, agg,
                                      now + budget, now)
        if done:
            self._finish(done)
        else:
            self._arm_timer()

    def _by_process(self, names: list[str]) -> list[list[str]]:
        """SeD replicas of one process (same address and pid) get one
        discovery message naming them all and answer it with one message."""
        groups: dict[tuple, list[str]] = {}
        for n in names:
            info = self.registry.children[n].info
            key = (info.get("address"), info.get("pid")) if info.get("kind") == "sed" else (n,)
            groups.setdefault(key, []).append(n)
        return list(groups.values())

    def _arm_timer(self) -> None:
        nd = self.discoveries.next_deadline()
        if nd is None:
            return
        if self._timer is not None and self._timer.when() <= nd:
            return
        if self._timer:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_at(loop.time() + max(0.0, nd - time.monotonic()), self._expire)

    def _expire(self) -> None:
        self._timer = None
        for done in self.discoveries.expire(time.monotonic()):
            self._finish(done)
        self._arm_timer()

    def _finish(self, done: Done | None) -> None:
        if done is None:
            return
        (reply_to, orig_id, service, k) = done.reply_to
        if done.timed_out:
            self.stats["discoveries_timed_out"] += 1
            log.info("%s: discovery %s for %s: no answer in time from %s", self.name, orig_id,
                     service, ", ".join(done.timed_out))
        header = m.make(MsgType.SERVERS, orig_id, name=self.name, servers=done.servers,
                        answered=done.answered, timed_out=done.timed_out)
        if not done.servers and self.kind == "ma" and k > 0:
            header = m.error_header(orig_id, "no_server",
                                    f"no server answered for {service!r} in time"
                                    + (f" (silent: {', '.join(done.timed_out)})" if done.timed_out else ""))
        self._answer(reply_to, header)

    def _answer(self, reply_to: tuple, header: dict) -> None:
        where, route = reply_to
        if where == "router":
            self._reply(route, header)
        elif self.link:
            header.setdefault("name", self.name)
            self.link.send(header)

    # -- timers -----------------------------------------------------------
    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(self.hb_interval / 2)
            for name in self.registry.expire(time.monotonic(), self.hb_timeout):
                log.warning("%s: child %s missed its heartbeats: dropped", self.name, name)
                self._child_lost(name)

    def statistics(self) -> dict:
        return {"name": self.name, "kind": self.kind, "children": len(self.registry.children),
                "pending_discoveries": len(self.discoveries.pending), **self.stats}


class LocalAgent(Agent):
    kind = "la"

    def __init__(self, *, name: str, parent: str, **kw) -> None:
        super().__init__(name=name, parent=parent, **kw)
