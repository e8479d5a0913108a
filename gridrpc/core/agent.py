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
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass

from . import messages as m
from .agent_events import (ChildLost, ChildrenUpdated, FromParent, Received, Rejected, Send, SendFailed,
                           SendParent, Tick)
from .agent_roles import (CHILD_MARGIN_MS, CHILD_SHARE, MAX_BUDGET_S, MIN_BUDGET_S, MIN_CHILD_BUDGET_MS,
                          LocalRole, MasterRole, Role, child_budget_ms, discovery_budget)
from .aggregators import make_aggregator
from .discovery import DiscoveryTable, Done
from .fields import MAX_K
from .messages import MsgType
from .tree import ChildRegistry
from .view import (DEADLINE_FACTOR, DEADLINE_FLOOR, DEFAULT_MAX_AGE, PUSH_INTERVAL, ChildLatency, SubtreeView,
                   candidates, power_of_two)

log = logging.getLogger(__name__)


def group_by_process(registry: ChildRegistry, names: list[str]) -> list[list[str]]:
    """SeD replicas of one process (same address and pid) form one group:
    one discovery message naming them all, one answer."""
    groups: dict[tuple, list[str]] = {}
    children = registry.children
    for n in names:
        info = children[n].info
        key = (info.get("address"), info.get("pid")) if info.get("kind") == "sed" else (n,)
        groups.setdefault(key, []).append(n)
    return list(groups.values())


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
    view: bool = True               # the root answers from pushed state when it is fresh (core/view.py)
    view_max_age: float = DEFAULT_MAX_AGE   # seconds a pushed snapshot counts as fresh
    push_interval: float = PUSH_INTERVAL    # an LA pushes its children's snapshots up at most this often
    deadline_floor: float = DEADLINE_FLOOR  # a fan-out waits for a child min(budget, max(floor, factor*p95))
    deadline_factor: float = DEADLINE_FACTOR
    silent_probe: float = 1.0       # a child that missed its deadline is left out of view answers this long
    rebuild_time: float | None = None   # root: "rebuilding" instead of service_not_found this long after
                                        # start (None: hb_timeout + hb_interval, every child is back by then)


@dataclass(frozen=True, slots=True)
class AgentStatistics:
    name: str
    kind: str
    children: int
    pending_discoveries: int
    discoveries: int                # DISCOVER requests handled (from clients or the parent)
    discoveries_timed_out: int      # answered at the deadline, some children silent
    discoveries_refused: int        # over the per-connection limit of discoveries in flight
    bad_messages: int               # refused at the boundary
    answers_ignored: int            # late, duplicate or stranger SERVERS
    children_lost: int
    view_answers: int = 0           # discoveries answered from the pushed view (no fan-out)
    view_snapshots: int = 0         # SeD snapshots in the view
    view_updates: int = 0           # snapshots received

    def as_dict(self) -> dict:
        return {f: getattr(self, f) for f in self.__slots__}


@dataclass(slots=True)
class _Counters:
    discoveries: int = 0
    discoveries_timed_out: int = 0
    discoveries_refused: int = 0
    bad_messages: int = 0
    answers_ignored: int = 0
    children_lost: int = 0
    view_answers: int = 0


class AgentState:
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
        self.counters = _Counters()
        self.wall_offset = 0.0          # wall clock minus ``now`` (display only)
        self._seq = 0
        self._reported_version = -1     # registry version the parent last heard
        self._next_sweep = 0.0
        self._inflight: dict[bytes, int] = {}   # discoveries in flight per asking connection
        self._sweep_interval = config.hb_interval / 2
        self._lost_after = config.hb_interval * 2.5
        self.view = SubtreeView(config.push_interval)
        self.latency = ChildLatency(config.deadline_floor, config.deadline_factor)
        self._offers: tuple[int, dict, dict] | None = None     # (registry version, by service, owner of)
        self._rebuild_until: float | None = None     # set at the first event: start + rebuild time
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
        out = [Send(peer, m.make(MsgType.HEARTBEAT_ACK, h["id"], known=known))]
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

    # -- pushed state ----------------------------------------------------------------
    def offers(self) -> tuple[dict, dict]:
        """From the registry (never from a push): service -> {SeD name:
        (address, child it is under)}, and SeD name -> that child."""
        reg = self.registry
        if self._offers is None or self._offers[0] != reg.version:
            by_service: dict[str, dict] = {}
            owner: dict[str, str] = {}
            keys: dict[str, str] = {}
            for c in reg.children.values():
                if c.info.get("kind") == "sed":
                    owner[c.name] = c.name
                    if c.info.get("public_key"):
                        keys[c.name] = c.info["public_key"]
                    for svc in c.services:
                        by_service.setdefault(svc, {})[c.name] = (c.info.get("address"), c.name)
                for e in c.elements:
                    if e.get("kind") == "sed" and isinstance(e.get("name"), str):
                        owner[e["name"]] = c.name
                        if isinstance(e.get("public_key"), str):
                            keys[e["name"]] = e["public_key"]
                        for svc in e.get("services") or ():
                            by_service.setdefault(svc, {})[e["name"]] = (e.get("address"), c.name)
            self._offers = (reg.version, by_service, owner, keys)
        return self._offers[1], self._offers[2]

    def public_keys(self) -> dict[str, str]:
        """SeD name -> its CURVE public key (from the registry), for answers."""
        self.offers()
        return self._offers[3]

    def _on_view(self, peer: bytes, h: dict, now: float, user: str | None = None) -> list:
        name = h["name"]
        child = self.registry.children.get(name)
        if child is None or child.route != peer:       # only a registered child, for its own subtree
            self.counters.answers_ignored += 1
            return []
        self.view.update(name, h.get("entries") or (), h.get("gone") or (), now, self.offers()[1])
        if h.get("fresh"):
            self.view.refresh(name, h["fresh"], now)
        return []

    def _view_answer(self, h: dict, service: str, k: int, agg, now: float) -> dict | None:
        max_age = h.get("max_age_ms")
        max_age = self.config.view_max_age if max_age is None else max_age / 1000.0
        if max_age <= 0 or k <= 0:
            return None
        if any(isinstance(a, dict) and a.get("type") == "ref" for a in h.get("args") or ()):
            return None          # data references: each server's fetch_bytes depends on the request
        expected = self.offers()[0].get(service)
        if not expected:
            return None
        skip = self.latency.silent(now - self.config.silent_probe) if self.latency.missed else frozenset()
        servers = candidates(self.view, expected, service, now, max_age, skip)
        if not servers:
            return None
        servers = self.discoveries.with_recent_since(servers, now)
        ranked = power_of_two(agg.rank(servers, self.discoveries.rng), k, self.discoveries.rng)
        if ranked:
            self.discoveries.remember_choice(ranked[0]["name"], now)
        keys = self.public_keys()
        if keys:                                  # under CURVE clients pin the SeD's key from the answer
            ranked = [dict(s, public_key=keys[s["name"]]) if s["name"] in keys else s for s in ranked]
        self.counters.view_answers += 1
        return m.make(MsgType.SERVERS, h["id"], name=self.name, servers=ranked, answered=len(servers),
                      timed_out=[], view=True)

    # -- discovery -------------------------------------------------------------------
    def _on_discover(self, peer: bytes, h: dict, now: float, user: str | None = None) -> list:
        n = self._inflight.get(peer, 0)
        if n >= self.config.max_discoveries_per_peer:
            self.counters.discoveries_refused += 1
            return [Send(peer, m.error_header(
                h["id"], "refused", f"agent {self.name}: {n} discoveries already in flight from this "
                f"connection (limit max_discoveries_per_peer={self.config.max_discoveries_per_peer})"))]
        return self._discover(h, ("peer", peer), now)

    def _from_parent(self, ev: FromParent, now: float) -> list:
        if ev.type is MsgType.DISCOVER:
            return self._discover(ev.header, ("parent",), now)
        if ev.type is MsgType.PING:
            return [SendParent(m.make(MsgType.PONG, ev.header["id"], name=self.name))]
        return []

    def _discover(self, h: dict, reply_to: tuple, now: float) -> list:
        self.counters.discoveries += 1
        rid, service = h["id"], h["service"]
        k = max(0, min(h["k"], MAX_K))
        spec = h.get("aggregator")
        if spec is None:            # the service's own default, else DIET's default
            meta = self.registry.services().get(service)
            if meta is not None:
                spec = meta.get("aggregator")
        try:
            agg = make_aggregator(spec)
        except ValueError as exc:
            return [self._to(reply_to, m.error_header(rid, "invalid_argument", str(exc)))]
        children = self.registry.offering(service)
        if not children:
            if self.role.root and self.rebuilding(now):
                return [self._to(reply_to, m.error_header(
                    rid, "rebuilding", f"master agent {self.name} started recently and is rebuilding its "
                    f"tree: {service!r} may be offered once its children are back (retry)"))]
            err = self.role.no_offer(rid, service)
            if err is not None:
                return [self._to(reply_to, err)]
        if self.role.root and self.config.view and children:
            header = self._view_answer(h, service, k, agg, now)
            if header is not None:
                return [self._to(reply_to, header)]
        budget = discovery_budget(h.get("budget_ms"), self.config.discovery_budget)
        budget = max(MIN_BUDGET_S, self.latency.deadline(children, budget))   # a silent child costs ms
        self._seq += 1
        fid = f"{self.name}:{self._seq}"
        fwd = dict(h, id=fid, budget_ms=child_budget_ms(budget), k=k)
        if spec is not None:
            fwd["aggregator"] = spec
        fwd.pop("names", None)      # ours to set, per process
        out: list = []
        registry_children = self.registry.children
        for group in group_by_process(self.registry, children):
            msg = dict(fwd, names=group) if len(group) > 1 else fwd
            out.append(Send(registry_children[group[0]].route, msg, tuple(group)))
        if reply_to[0] == "peer":
            self._inflight[reply_to[1]] = self._inflight.get(reply_to[1], 0) + 1
        done = self.discoveries.start(fid, (reply_to, rid, service, k), children, k, agg, now + budget, now)
        if done is not None:
            out.extend(self._finish(done, now))
        return out

    def _on_servers(self, peer: bytes, h: dict, now: float, user: str | None = None) -> list:
        name = h.get("name") or ""
        child = self.registry.children.get(name)
        if child is None or child.route != peer:        # only the asked child answers for itself
            self.counters.answers_ignored += 1
            return []
        p = self.discoveries.pending.get(h["id"])
        if p is not None:
            names = h.get("names")
            for n in (names if names else (name,)):
                if n in p.waiting:
                    self.latency.observe(n, now - p.started)
        done = self.discoveries.answer(h["id"], name, h["servers"], now, h.get("names"))
        if done is None:
            if h["id"] not in self.discoveries.pending:
                self.counters.answers_ignored += 1
            return []
        return self._finish(done, now)

    def _on_error(self, peer: bytes, h: dict, now: float, user: str | None = None) -> list:
        """A child could not answer a discovery (e.g. an aggregator it does
        not have): an empty answer, so the discovery need not wait for it."""
        name = h.get("name") or ""
        child = self.registry.children.get(name)
        if child is None or child.route != peer or h["id"] not in self.discoveries.pending:
            return []                                   # never answer an error with an error
        log.info("%s: child %s could not answer discovery %s: %s", self.name, name, h["id"],
                 h["error"].get("message", ""))
        done = self.discoveries.answer(h["id"], name, [], now)
        return self._finish(done, now) if done is not None else []

    def _send_failed(self, send: Send, now: float) -> list:
        if not send.children:
            return []
        done = self.discoveries.drop(send.header.get("id", ""), list(send.children), now)
        return self._finish(done, now) if done is not None else []

    def _finish(self, done: Done, now: float | None = None) -> list:
        reply_to, rid, service, k = done.reply_to
        if reply_to[0] == "peer":
            left = self._inflight.get(reply_to[1], 0) - 1
            if left > 0:
                self._inflight[reply_to[1]] = left
            else:
                self._inflight.pop(reply_to[1], None)
        if done.timed_out:
            self.counters.discoveries_timed_out += 1
            if now is not None:
                for n in done.timed_out:
                    self.latency.miss(n, now)
            log.info("%s: discovery %s for %s: no answer in time from %s", self.name, rid, service,
                     ", ".join(done.timed_out))
        header = self.role.finished(rid, service, k, done)
        if header is None:
            header = m.make(MsgType.SERVERS, rid, name=self.name, servers=done.servers,
                            answered=done.answered, timed_out=done.timed_out)
        return [self._to(reply_to, header)]

    def _to(self, reply_to: tuple, header: dict):
        if reply_to[0] == "peer":
            return Send(reply_to[1], header)
        header.setdefault("name", self.name)
        return SendParent(header)

    def rebuilding(self, now: float) -> bool:
        """Whether the tree may still be incomplete: a restarted root waits a
        few heartbeat intervals for its children to register again."""
        return self._rebuild_until is not None and now < self._rebuild_until

    # -- catalogue, tree, statistics ----------------------------------------------------
    def _on_services(self, peer: bytes, h: dict, now: float, user: str | None = None) -> list:
        elements = self.elements(now)
        servers = {e["name"]: e.get("address") for e in elements if e.get("kind") == "sed"}
        extra = {"elements": self.tree(now)} if h.get("tree") else {}
        keys = {e["name"]: e["public_key"] for e in elements if e.get("kind") == "sed" and e.get("public_key")}
        if keys:
            extra["keys"] = keys
        if self.role.root and self.rebuilding(now):
            extra["rebuilding"] = True
        return [Send(peer, m.make(MsgType.CATALOGUE, h["id"], services=self.registry.catalogue(),
                                  servers=servers, **extra))]

    def _on_ping(self, peer: bytes, h: dict, now: float, user: str | None = None) -> list:
        return [Send(peer, m.make(MsgType.PONG, h["id"], name=self.name))]

    def service_list(self) -> list[dict]:
        """The services of the subtree, as sent to the parent."""
        return [{"name": s, **meta} for s, meta in self.registry.services().items()]

    def elements(self, now: float, wall: float | None = None) -> list[dict]:
        """The subtree, flattened (children, then their descendants), each
        with ``last_heartbeat`` in wall-clock time; a child silent for 2.5
        heartbeat periods shows ``lost`` until it is dropped."""
        offset = self.wall_offset if wall is None else wall - now
        out = []
        for e in self.registry.elements(now, lost_after=self._lost_after):
            if "last_seen" in e:
                e = dict(e)
                e["last_heartbeat"] = e.pop("last_seen") + offset
            out.append(e)
        return out

    def tree(self, now: float, wall: float | None = None, load: dict | None = None) -> list[dict]:
        """This agent and its whole subtree, as ``/api/tree`` shows it."""
        offset = self.wall_offset if wall is None else wall - now
        me = {"name": self.name, "parent": None if self.role.root else self.config.parent,
              **self.info, "services": [], "state": "alive", "last_heartbeat": now + offset,
              "load": load if load is not None else self.statistics().as_dict()}
        return [me] + [dict(e, state=e.get("state", "alive")) for e in self.elements(now, wall)]

    def register_info(self, now: float, wall: float | None = None) -> dict:
        """What the parent link sends in REGISTER."""
        return {**self.info, "services": self.service_list(), "elements": self.elements(now, wall)}

    def heartbeat_info(self, now: float, wall: float | None = None) -> dict:
        return {"load": {"children": len(self.registry.children)}, "elements": self.elements(now, wall)}

    def statistics(self) -> AgentStatistics:
        c = self.counters
        return AgentStatistics(
            name=self.name, kind=self.role.kind, children=len(self.registry.children),
            pending_discoveries=len(self.discoveries.pending), discoveries=c.discoveries,
            discoveries_timed_out=c.discoveries_timed_out, discoveries_refused=c.discoveries_refused,
            bad_messages=c.bad_messages,
            answers_ignored=c.answers_ignored, children_lost=c.children_lost, view_answers=c.view_answers,
            view_snapshots=len(self.view.seds), view_updates=self.view.updates)


__all__ = ["CHILD_MARGIN_MS", "CHILD_SHARE", "MAX_BUDGET_S", "MIN_BUDGET_S", "MIN_CHILD_BUDGET_MS", "Done",
           "AgentConfig", "AgentState", "AgentStatistics", "ChildLost", "ChildrenUpdated", "FromParent",
           "LocalRole", "MasterRole", "Received", "Rejected", "Role", "Send", "SendFailed", "SendParent",
           "Tick", "child_budget_ms", "discovery_budget", "group_by_process"]
