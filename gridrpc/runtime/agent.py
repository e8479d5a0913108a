"""The agent runtime: the pure :class:`~gridrpc.core.agent.machine.AgentState` on
real sockets and timers.

It binds an :class:`~gridrpc.transport.endpoint.Endpoint` for children and
clients (messages are parsed and validated there; bad ones answered there),
attaches to a parent through a
:class:`~gridrpc.transport.parent_link.ParentLink` when it has one, feeds
every message and the passing of time to the state machine, and carries out
the actions it returns. One timer: the state says when it next needs a
:class:`~gridrpc.core.agent.machine.Tick` (a discovery deadline, the next sweep of
silent children).

What kind of agent it is comes from the role (:class:`MasterRole`,
:class:`LocalRole`); :mod:`gridrpc.master_agent` and
:mod:`gridrpc.local_agent` are thin programs over this class. Subclasses may
override the hooks :meth:`on_children_updated` and :meth:`on_child_lost`.
"""
from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import socket
import time
from typing import Mapping

from ..core.agent.machine import (AgentConfig, AgentState, ChildLost, ChildrenUpdated, FromParent, LocalRole,
                          Received, Rejected, Role, Send, SendFailed, SendParent, SendPeer, Tick,
                          group_by_process)
from ..core.events import EventOutbox
from ..core.messages import MsgType
from ..transport.events_up import EventsUplink
from ..transport.channel import host_of
from ..transport.endpoint import DEFAULT_MAX_MESSAGE, Endpoint, Incoming
from ..transport.parent_link import ParentLink, parent_link
from ..transport.security import Security
from .federation import PeerLinks
from .lifecycle import Daemon

log = logging.getLogger(__name__)


class AgentRuntime(Daemon):
    def __init__(self, *, name: str, address: str = "tcp://127.0.0.1:0", parent: str | None = None,
                 role: Role | None = None, hb_interval: float = 1.0, hb_timeout: float = 3.0,
                 discovery_budget: float = 2.0, orphan_timeout: float | None = None,
                 seed: int | None = None, socket_options: Mapping[int, object] | None = None,
                 security: Security | None = None, parent_key: bytes | list | None = None,
                 max_message_size: int = DEFAULT_MAX_MESSAGE,
                 rebuild_time: float | None = None, peers: list[str] | tuple[str, ...] = (),
                 peer_keys: Mapping[str, bytes] | None = None, peer_hops: int = 2,
                 peer_busy_wait: float | None = None, view: bool = True,
                 view_max_age: float | None = None) -> None:
        if view_max_age is not None and not (math.isfinite(view_max_age) and view_max_age >= 0):
            raise ValueError(f"view_max_age: a finite number of seconds >= 0, not {view_max_age!r}")
        super().__init__(name=name, address=address, parent=parent, orphan_timeout=orphan_timeout)
        self.security = security
        self.parent_key = parent_key
        self.hb_interval = hb_interval
        self.hb_timeout = hb_timeout
        self.discovery_budget = discovery_budget
        self.state = AgentState(
            AgentConfig(name=name, parent=parent, hb_interval=hb_interval, hb_timeout=hb_timeout,
                        discovery_budget=discovery_budget, rebuild_time=rebuild_time,
                        peers=tuple(peers) if (role is not None and role.root) else (), peer_hops=peer_hops,
                        peer_busy_wait=peer_busy_wait, view=view,
                        **({} if view_max_age is None else {"view_max_age": view_max_age})),
            role or LocalRole(), random.Random(seed))
        handle = self._on_message
        self.endpoint = Endpoint(name, address, {mt: handle for mt in AgentState.HANDLED},
                                 what=f"agent {name}", socket_options=socket_options,
                                 on_rejected=self._on_rejected, security=security,
                                 max_message_size=max_message_size)
        self.endpoint.handlers[MsgType.EVENTS] = self._on_events
        self._watch_answers = False          # the MA: on_answer() sees every answer it sends
        self.outbox = EventOutbox()          # events from the subtree, relayed to the parent
        self.uplink: EventsUplink | None = None
        self.link: ParentLink | None = None
        self.peers = list(peers)            # federated MAs of other trees (gridrpc.runtime.federation)
        self.federation: PeerLinks | None = None
        if self.state.config.peers:
            self.federation = PeerLinks(name, self.peers, self._feed, security=security, peer_keys=peer_keys,
                                        max_message_size=max_message_size)
        self.started = time.time()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._view_resend: asyncio.TimerHandle | None = None     # _view_lost

    # -- what the dashboard, the tests and the tools read ----------------------------
    @property
    def kind(self) -> str:
        return self.state.role.kind

    @property
    def registry(self):
        return self.state.registry

    @property
    def discoveries(self):
        return self.state.discoveries

    def statistics(self) -> dict:
        """A snapshot: counters of the state machine and of the endpoint."""
        return self.state.statistics().as_dict()

    @property
    def stats(self) -> dict:
        return self.statistics()

    def tree(self) -> list[dict]:
        """This agent and its whole subtree, as /api/tree shows it."""
        return self.state.tree(time.monotonic(), time.time(), load=self.statistics())

    def _by_process(self, names: list[str]) -> list[list[str]]:
        """SeD replicas of one process, grouped as one discovery message asks them."""
        return group_by_process(self.state.registry, names)

    # -- lifecycle (gridrpc.runtime.lifecycle) ---------------------------------------------
    @property
    def label(self) -> str:
        return "Master Agent" if self.kind == "ma" else "Local Agent"

    @property
    def root(self) -> bool:
        return self.state.role.root

    async def setup(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.on_cleanup(self.endpoint.close)
        self.endpoint.start()
        self.address = self.endpoint.address
        self.state.info.update(kind=self.kind, address=self.address,
                               host=host_of(self.address or "") or socket.gethostname(),
                               pid=os.getpid(), started=self.started)
        if self.parent and not self.state.role.root:
            self.link = parent_link(name=self.name, parent=self.parent, register_info=self._register_info,
                                   heartbeat_info=self._heartbeat_info, on_message=self._on_parent,
                                   hb_interval=self.hb_interval, hb_timeout=self.hb_timeout,
                                   orphan_timeout=self.orphan_timeout, on_orphaned=self.orphaned,
                                   security=self.security, parent_key=self.parent_key,
                                   on_attached=self._on_attached, on_view_missing=self._on_view_missing)
            self.on_cleanup(self.link.aclose)
            self.link.start()
            self.uplink = EventsUplink(self.name, self.outbox, self.link.send)
            self.on_cleanup(self.uplink.aclose)
            self.uplink.start()
        if self.federation is not None:
            self.on_cleanup(self.federation.close)
            self.federation.start()
        self.on_cleanup(self._stop_timers)
        self._tick()
        log.info("%s (%s) listening on %s%s", self.name, self.kind, self.address,
                 f", parent {self.parent}" if self.parent else "")

    def _stop_timers(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._view_resend is not None:
            self._view_resend.cancel()
            self._view_resend = None

    # -- the parent link's callbacks -------------------------------------------------------
    def _register_info(self) -> dict:
        return self.state.register_info(time.monotonic(), time.time())

    def _heartbeat_info(self) -> dict:
        return self.state.heartbeat_info(time.monotonic(), time.time())

    def _on_attached(self) -> None:
        """A parent registered us (first time, after a loss, or it restarted):
        it has none of our subtree's snapshots; push them all (the next VIEW
        batch), or its view would miss the idle SeDs until their load changes."""
        self.state.view.resend_all(time.monotonic())
        self._rearm()

    def _on_view_missing(self, names: list) -> None:
        """The parent lacks these snapshots (``view_missing`` in its
        HEARTBEAT_ACK): those this view holds go up with the next batch; the
        others are missing here too, and this agent asks its own children."""
        if self.state.view.resend(names, time.monotonic()):
            self._rearm()

    #: s after a VIEW that could not be sent before every snapshot is pushed again
    VIEW_RESEND_S = 1.0

    def _view_lost(self) -> None:
        """A VIEW to the parent was dropped (its queue full, or it is gone):
        the idle SeDs of this subtree push only on change, so the parent's
        view would lack them for good. Every snapshot goes up again in
        ``VIEW_RESEND_S`` (not at once: a parent that is down would get the
        whole subtree every few ms; a parent that comes back gets them all
        anyway, ``_on_attached``)."""
        if self._view_resend is not None or self._loop is None or self.closing:
            return
        log.info("%s: a VIEW to the parent was not sent: every snapshot goes up again in %.1fs",
                 self.name, self.VIEW_RESEND_S)

        def again():
            self._view_resend = None
            if not self.closing:
                self.state.view.resend_all(time.monotonic())
                self._rearm()
        self._view_resend = self._loop.call_later(self.VIEW_RESEND_S, again)

    def _feed(self, event: object) -> None:
        """An event from the peer links (federation)."""
        self._run(self.state.handle(event, time.monotonic()))

    def _on_parent(self, mt: MsgType, h: dict, frames: list) -> None:
        self._run(self.state.handle(FromParent(mt, h), time.monotonic()))

    # -- the endpoint's --------------------------------------------------------------------
    def _on_message(self, msg: Incoming) -> None:
        self._run(self.state.handle(Received(msg.peer, msg.type, msg.header, msg.user), msg.received))

    def _on_events(self, msg: Incoming) -> None:
        """A child's events: only from its own connection; relayed up as they
        came (the MA validates them, see :meth:`accept_events`)."""
        h = msg.header
        child = self.state.registry.children.get(h["name"])
        if child is None or not (child.route == msg.peer or (msg.user is not None and child.identity == msg.user)):
            return
        self.accept_events(h["events"], h.get("dropped") or 0, h["name"])

    def on_answer(self, header: dict) -> None:
        """An answer sent to a peer (only when ``_watch_answers``)."""

    def accept_events(self, events: list, dropped: int, origin: str) -> None:
        self.outbox.relay(events, dropped)

    def _on_rejected(self, exc) -> None:
        self.state.handle(Rejected(), time.monotonic())

    # -- carrying out actions ----------------------------------------------------------------
    def _run(self, actions: list) -> None:
        i = 0
        while i < len(actions):
            a = actions[i]
            i += 1
            t = type(a)
            if t is Send:
                if not self.endpoint.send([a.to], a.header) and a.children:
                    actions.extend(self.state.handle(SendFailed(a), time.monotonic()))
                elif self._watch_answers and not a.children:
                    self.on_answer(a.header)
            elif t is SendParent:
                if self.link is not None and not self.link.send(a.header) and a.header.get("type") == "view":
                    self._view_lost()
            elif t is SendPeer:
                if self.federation is not None:
                    self.federation.send(a.peer, a.header)
            elif t is ChildrenUpdated:
                self.on_children_updated(a.reregister)
            elif t is ChildLost:
                self.on_child_lost(a.name, a.reason)
        self._rearm()

    def _rearm(self) -> None:
        when = self.state.next_wakeup()
        if (when is None or self._loop is None or self.closing
                or (self._timer is not None and self._timer_at <= when)):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = self._loop.call_at(self._loop.time() + max(0.0, when - time.monotonic()), self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._run(self.state.handle(Tick(wall=time.time()), time.monotonic()))

    # -- hooks ------------------------------------------------------------------------------
    def on_children_updated(self, reregister: bool) -> None:
        """A child registered, heartbeated or left; ``reregister``: the
        subtree changed since the parent last heard it."""
        if reregister and self.link is not None:
            self.link.update()

    def on_child_lost(self, name: str, reason: str) -> None:
        """A child left or was dropped for silence (its discoveries were answered)."""
