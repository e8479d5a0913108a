"""The agent state machine (pure): what a Master or Local Agent does.

An agent keeps its children (:class:`~gridrpc.core.tree.ChildRegistry`), the
catalogue of its subtree and its pending discoveries
(:class:`~gridrpc.core.discovery.DiscoveryTable`). It changes in one way::

    actions = state.handle(event, now)

``event`` is a validated message from a peer (:class:`Received`), from the
parent (:class:`FromParent`), a failed send (:class:`SendFailed`), a
rejected message (:class:`Rejected`) or the passing of time (:class:`Tick`);
``now`` is the caller's clock in seconds (monotonic, or a simulator's). The
actions say what to send and what happened: :class:`Send`,
:class:`SendParent`, :class:`ChildrenUpdated`, :class:`ChildLost`. There is
no socket, timer or clock here; :meth:`AgentState.next_wakeup` says when the
caller should deliver the next :class:`Tick`. A runtime
(:mod:`gridrpc.runtime.agent`) or the simulator drives it.

What differs between the Master Agent and a Local Agent is a *role*
(:class:`MasterRole`, :class:`LocalRole`), passed in: the MA remembers its
recent choices, says ``service_not_found`` when nothing in the tree offers
a service and ``no_server`` when nobody answered.

Discovery: the request fans out to the children offering the service; SeD
replicas of one process (same address and pid) get one message naming them
all (``names``) and answer it once. Children get 80 % of the asker's budget
minus 2 ms (at least 5 ms), so the agent's own answer leaves before its
asker's deadline; a budget is clamped to 10 ms .. 60 s. When every child
answered, or at the deadline, or when the last silent child is lost, the
aggregator ranks the union and the best ``k`` go back.

The state and its children's registry are here; the discovery and pushed
view transitions in :mod:`gridrpc.core.agent.discovery`, the catalogue, tree
and statistics output in :mod:`gridrpc.core.agent.catalogue`; the
vocabulary, roles and budget rules the runtimes use are importable from
here too.
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass

from .. import messages as m
from .catalogue import AgentStatistics, Catalogue, Counters
from .discovery import Discovering, group_by_process
from .vocabulary import (ChildLost, ChildrenUpdated, FromParent, FromPeer, PeerUnreachable, Received, Rejected,
                           Send, SendFailed, SendParent, SendPeer, Tick)
from .federation import Federating
from .roles import (CHILD_MARGIN_MS, CHILD_SHARE, MAX_BUDGET_S, MIN_BUDGET_S, MIN_CHILD_BUDGET_MS,
                          LocalRole, MasterRole, Role, child_budget_ms, discovery_budget)
from ..discovery import DiscoveryTable, Done
from ..messages import MsgType
from ..tree import ChildRegistry
from ..view import (DEADLINE_FACTOR, DEADLINE_FLOOR, DEFAULT_MAX_AGE, PUSH_INTERVAL, VIEW_INDEX_MIN, ChildLatency,
                   SubtreeView)

log = logging.getLogger(__name__)


def _may_register(identity: str, name: str) -> bool:
    """Under security only an element's own key registers it: ``element:X``
    registers ``X`` and its replicas ``X-1``, ``X-02``..."""
    if not identity.startswith("element:"):
        return False
    key = identity[8:]
    return name == key or (name.startswith(key + "-") and name[len(key) + 1:].isdigit())


# -- the state ----------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class AgentConfig:
    name: str
    parent: str | None = None       # the parent's address (None: the root, or a detached agent)
    hb_interval: float = 1.0        # children's heartbeat period: shown "lost" after 2.5 of them
    hb_timeout: float = 3.0         # a child silent this long is dropped
    discovery_budget: float = 2.0   # seconds, when a request gives none
    max_discoveries_per_peer: int = 512   # in flight from one connection; more are refused at once
    max_discoveries_per_user: int = 2048  # in flight from one authenticated key, all its connections together
    view: bool = True               # the root answers from pushed state when it is fresh (core/view.py);
                                    # False: every discovery is a fan-out, and the agent keeps no view (drops
                                    # its children's VIEW messages: an LA pushes none up)
    view_max_age: float = DEFAULT_MAX_AGE   # seconds a pushed snapshot counts as fresh
    view_index_min: int = VIEW_INDEX_MIN    # root: from this many SeDs for a service, a view answer walks a
                                            # kept ranking (core/view_rank.py) instead of ranking them all
    push_interval: float = PUSH_INTERVAL    # an LA pushes its children's snapshots up at most this often
    deadline_floor: float = DEADLINE_FLOOR  # a fan-out waits for a child min(budget, max(floor, factor*p95))
    deadline_factor: float = DEADLINE_FACTOR
    silent_probe: float = 1.0       # a child that missed its deadline is left out of view answers this long
    rebuild_time: float | None = None   # root: "rebuilding" instead of service_not_found this long after
                                        # start (None: hb_timeout + hb_interval, every child is back by then)
    peers: tuple[str, ...] = ()     # root: peer master agents of other trees (core/agent/federation.py)
    peer_hops: int = 2              # how far a discovery may travel from peer to peer
    peer_busy_wait: float | None = None   # root: also ask the peers when every local server's est_wait is over this


class AgentState(Discovering, Federating, Catalogue):
    """One agent's state. ``info``: its own element info (kind, address,
    host, pid, started), shown in the tree and sent to the parent; the
    runtime fills it once bound."""

    def __init__(self, config: AgentConfig, role: Role, rng: random.Random,
                 info: dict | None = None) -> None:
        self.config = config
        self.role = role
        self.name = config.name
        self.registry = ChildRegistry(config.name)
        self.discoveries = DiscoveryTable(rng, remember=role.remember_choices)
        self.info: dict = {"kind": role.kind, **(info or {})}
        self.counters = Counters()
        self.wall_offset = 0.0          # wall clock minus ``now`` (display only)
        self._seq = 0
        self._reported_version = -1     # registry version the parent last heard
        self._next_sweep = 0.0
        self._inflight: dict[bytes, int] = {}   # discoveries in flight per asking connection
        self._inflight_user: dict[str, int] = {}   # ... and per authenticated key (CURVE)
        self._sweep_interval = config.hb_interval / 2
        self._lost_after = config.hb_interval * 2.5
        self.view = SubtreeView(config.push_interval)
        self._rankings: dict = {}                   # (service, aggregator's view_id) -> ViewRanking (root)
        self._groups: tuple = (-1, {})              # (registry version, {service: children by process})
        self.latency = ChildLatency(config.deadline_floor, config.deadline_factor)
        self._offers: tuple[int, dict, dict] | None = None     # (registry version, by service, owner of)
        self._asking = None                          # snapshots missing from the view (agent.discovery._Asking)
        self._rebuild_until: float | None = None     # set at the first event: start + rebuild time
        self._forwarded: dict = {}                   # federated discovery id -> what its answer needs
        self._on_peer = {
            MsgType.VIEW: self._on_view,
            MsgType.DISCOVER: self._on_discover, MsgType.SERVERS: self._on_servers,
            MsgType.HEARTBEAT: self._on_heartbeat, MsgType.REGISTER: self._on_register,
            MsgType.UNREGISTER: self._on_unregister, MsgType.SERVICES: self._on_services,
            MsgType.PING: self._on_ping, MsgType.ERROR: self._on_error,
        }

    #: message types the agent handles on its endpoint (others get an error reply)
    HANDLED = (MsgType.DISCOVER, MsgType.SERVERS, MsgType.HEARTBEAT, MsgType.REGISTER,
               MsgType.UNREGISTER, MsgType.SERVICES, MsgType.PING, MsgType.ERROR, MsgType.VIEW)

    # -- the one way in ------------------------------------------------------
    def handle(self, event: object, now: float) -> list:
        if self._rebuild_until is None:
            c = self.config
            self._rebuild_until = now + (c.rebuild_time if c.rebuild_time is not None
                                         else c.hb_timeout + c.hb_interval)
        t = type(event)
        if t is Received:
            handler = self._on_peer.get(event.type)
            if handler is None:
                h = event.header
                return [Send(event.peer, m.error_header(
                    h.get("id", ""), "protocol", f"agent {self.name} does not handle {event.type.value!r}"))]
            if event.user is not None:
                return handler(event.peer, event.header, now, event.user)
            return handler(event.peer, event.header, now)
        if t is Tick:
            return self._tick(event, now)
        if t is FromParent:
            return self._from_parent(event, now)
        if t is SendFailed:
            return self._send_failed(event.send, now)
        if t is FromPeer:
            return self._from_peer(event, now)
        if t is PeerUnreachable:
            return self._peer_unreachable(event.peer, event.id, now)
        if t is Rejected:
            self.counters.bad_messages += 1
            return []
        raise TypeError(f"not an agent event: {event!r}")

    def next_wakeup(self) -> float | None:
        """When the next :class:`Tick` is due (None: nothing to wait for)."""
        d = self.discoveries.next_deadline()
        if self.registry.children and (d is None or self._next_sweep < d):
            d = self._next_sweep
        f = self.view.flush_at
        if f is not None and self._pushes_up() and (d is None or f < d):
            d = f
        return d

    # -- children --------------------------------------------------------------
    def _on_register(self, peer: bytes, h: dict, now: float, user: str | None = None) -> list:
        if user is not None and not _may_register(user, h["name"]):
            log.warning("%s: %s tried to register as %r: refused", self.name, user, h["name"])
            return [Send(peer, m.error_header(
                h["id"], "refused", f"only the key of element {h['name']!r} may register it "
                f"(this connection is {user})"))]
        why = self.registry.name_conflict(peer, h, user, now, self.config.hb_timeout)
        if why is not None:
            log.warning("%s: registration of %r refused: %s", self.name, h["name"], why)
            return [Send(peer, m.error_header(h["id"], "refused", f"names are unique in a tree: {why}; "
                                              "choose another name (or wait until it is dropped)"))]
        self.registry.register(peer, h, now, user)
        if self._next_sweep <= now:
            self._next_sweep = now + self._sweep_interval
        return [Send(peer, m.make(MsgType.REGISTERED, h["id"])), self._updated()]

    def _on_heartbeat(self, peer: bytes, h: dict, now: float, user: str | None = None) -> list:
        known = self.registry.heartbeat(peer, h, now, user)
        ack = m.make(MsgType.HEARTBEAT_ACK, h["id"], known=known)
        if known:
            missing = self._view_missing(h["name"], now)
            if missing:                                 # snapshots lost on the way: pushed again
                ack["view_missing"] = missing
        out = [Send(peer, ack)]
        if known and h["name"] in self.view.seds:
            self.view.refresh(h["name"], (h["name"],), now)     # a SeD pushes every change: unchanged
        if known:
            out.append(self._updated())
        return out

    def _on_unregister(self, peer: bytes, h: dict, now: float, user: str | None = None) -> list:
        child = self.registry.children.get(h["name"])
        if child is None or not (child.route == peer or (user is not None and child.identity == user)):
            return []                                   # a child unregisters only itself
            return []
        self.registry.remove(h["name"])
        return self._lost(h["name"], "left", now)

    def _updated(self) -> ChildrenUpdated:
        v = self.registry.version
        if v == self._reported_version or self.role.root or self.config.parent is None:
            return ChildrenUpdated(reregister=False)
        self._reported_version = v
        return ChildrenUpdated(reregister=True)

    def _lost(self, name: str, reason: str, now: float) -> list:
        self.counters.children_lost += 1
        if reason == "silent":
            log.warning("%s: child %s missed its heartbeats: dropped", self.name, name)
        else:
            log.info("%s: child %s left", self.name, name)
        out: list = [ChildLost(name, reason)]
        self.view.drop_via(name, now)
        self.latency.forget(name)
        for done in self.discoveries.child_lost(name, now):
            out.extend(self._finish(done, now))
        out.append(self._updated())
        return out

    # -- time ----------------------------------------------------------------------
    def _tick(self, ev: Tick, now: float) -> list:
        if ev.wall is not None:
            self.wall_offset = ev.wall - now
        out: list = []
        for done in self.discoveries.expire(now):
            out.extend(self._finish(done, now))
        if now >= self._next_sweep:
            self._next_sweep = now + self._sweep_interval
            for name in self.registry.expire(now, self.config.hb_timeout):
                out.extend(self._lost(name, "silent", now))
            self.view.expire(now, self.config.hb_timeout)
        f = self.view.flush_at
        if f is not None and now >= f:
            if self._pushes_up():
                out.append(SendParent(m.make(MsgType.VIEW, f"{self.name}:v{self._next_seq()}", name=self.name,
                                             **self.view.take(now))))
            else:
                self.view.take(now)             # the root keeps no delta
        return out

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _pushes_up(self) -> bool:
        return not self.role.root and self.config.parent is not None


__all__ = ["CHILD_MARGIN_MS", "CHILD_SHARE", "MAX_BUDGET_S", "MIN_BUDGET_S", "MIN_CHILD_BUDGET_MS", "Done",
           "AgentConfig", "AgentState", "AgentStatistics", "ChildLost", "ChildrenUpdated", "FromParent", "FromPeer",
           "PeerUnreachable", "SendPeer",
           "LocalRole", "MasterRole", "Received", "Rejected", "Role", "Send", "SendFailed", "SendParent",
           "Tick", "child_budget_ms", "discovery_budget", "group_by_process"]
