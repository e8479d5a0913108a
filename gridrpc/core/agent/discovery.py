"""Discovery and the pushed view of the agent state machine
(:mod:`gridrpc.core.agent.machine`).

A DISCOVER fans out to the children offering the service (SeD replicas of one
process get one message naming them all) with a share of the asker's budget;
the answers are aggregated in the :class:`~gridrpc.core.discovery.
DiscoveryTable` and the best ``k`` go back. The root answers from the pushed
view of its subtree (:mod:`gridrpc.core.view`) when it is fresh enough, and
fans out otherwise.

:class:`Discovering` holds those transitions; :class:`~gridrpc.core.agent.machine.
AgentState` inherits them and owns the state they use (``registry``,
``discoveries``, ``view``, ``latency``, ``counters``, ``_inflight``,
``_offers``, ``_seq``, ``_rebuild_until``).
"""
from __future__ import annotations

import logging
import random

from .. import messages as m
from .vocabulary import FromParent, Send, SendParent
from .federation import PEER_PREFIX
from .roles import MIN_BUDGET_S, child_budget_ms, discovery_budget
from ..aggregators import make_aggregator
from ..discovery import Done
from ..fields import MAX_K, MAX_VIEW_MISSING
from ..messages import MsgType
from ..tree import ChildRegistry
from ..tally import tally
from ..view import MAX_RANKINGS, ViewRanking, candidates, power_of_two

__all__ = ["VIEW_ASK_FIRST", "VIEW_ASK_MAX", "VIEW_ASK_MAX_S", "Discovering", "group_by_process"]

#: s after the view is first seen missing snapshots before the children are asked for them
#: (a SeD just registered has its first push on the way), doubling while some stay missing
VIEW_ASK_FIRST = 1.0
VIEW_ASK_MAX_S = 60.0
#: names asked of one child in one HEARTBEAT_ACK (what a child accepts, core.fields)
VIEW_ASK_MAX = MAX_VIEW_MISSING

log = logging.getLogger("gridrpc.core.agent.machine")     # the agent's one logger


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


class _Asking:
    """Snapshots missing from the view (:meth:`Discovering._view_missing`)."""
    __slots__ = ("next_scan", "interval", "ask", "missing")

    def __init__(self, next_scan: float) -> None:
        self.next_scan = next_scan              # when the registry is scanned next
        self.interval = VIEW_ASK_FIRST          # doubling up to VIEW_ASK_MAX_S
        self.ask: dict[str, list[str]] = {}     # child -> names to ask of it (given once per scan)
        self.missing: set[str] = set()          # missing at the last scan


class Discovering:
    """The discovery and pushed-view transitions of :class:`~gridrpc.core.agent.machine.AgentState`."""

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

    def _view_missing(self, child: str, now: float) -> list[str]:
        """SeDs registered under ``child`` whose snapshot this agent lacks,
        asked of it in its HEARTBEAT_ACK (``view_missing``). An idle SeD
        pushes only on change, so a snapshot lost on the way (refused because
        it came before the registration that names its SeD, a VIEW dropped
        or ignored) left the view incomplete for good, and every discovery
        of that SeD's services fanned out (the 2,000-SeD benchmark row, once
        in about ten runs). Cheap when nothing is missing (as many snapshots
        as registered SeDs). Otherwise the registry is scanned
        ``VIEW_ASK_FIRST`` s after the gap was first seen, then at doubling
        intervals (up to ``VIEW_ASK_MAX_S``) while a gap stays; a SeD is asked
        for when two scans in a row found it missing (not one that registered
        a moment ago, its first push on the way: 500-2,700 needless asks per
        agent while 2,000 SeDs registered), each child's names given once per
        scan, at most ``VIEW_ASK_MAX``; a SeD whose services are not pushed is
        asked at ever longer intervals."""
        if not self.config.view:
            return []
        owner = self.offers()[1]
        seds = self.view.seds
        if len(owner) == len(seds):
            self._asking = None
            return []
        a = self._asking
        if a is None:
            self._asking = _Asking(now + VIEW_ASK_FIRST)
            return []
        if now >= a.next_scan:
            missing, ask = set(), {}
            for name, via in owner.items():
                s = seds.get(name)
                if s is None or s.via != via:
                    missing.add(name)
                    if name in a.missing:               # missing at the scan before too
                        names = ask.setdefault(via, [])
                        if len(names) < VIEW_ASK_MAX:
                            names.append(name)
            a.ask, a.missing = ask, missing
            a.interval = min(a.interval * 2, VIEW_ASK_MAX_S)
            a.next_scan = now + a.interval
            self.counters.view_asked += sum(len(v) for v in ask.values())
        return a.ask.pop(child, [])

    def _on_view(self, peer: bytes, h: dict, now: float, user: str | None = None) -> list:
        if not self.config.view:                       # views off: nothing kept, nothing pushed up
            self.counters.views_ignored += 1
            return []
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
        silent_after = max(max_age, self.config.view_max_age)
        ranking = self._ranking(service, agg, len(expected)) if max_age >= self.config.view_max_age else None
        servers = None if ranking is None else ranking.answer(self.view.seds, expected, now, silent_after, k)
        if servers is not None:                   # the first places of the kept ranking
            c = self.counters
            c.view_moved += ranking.moved
            c.view_sorted += ranking.sorted
            c.view_walked += ranking.walked
            answered = len(ranking.matched)        # SeDs known to the ranking (silent ones too)
        else:                                     # rank every SeD of the view
            skip = self.latency.silent(now - self.config.silent_probe) if self.latency.missed else frozenset()
            servers = candidates(self.view, expected, service, now, max_age, skip, silent_after=silent_after)
            if servers:
                self.counters.view_ranked += len(servers)
                answered = len(servers)
                servers = agg.rank(self.discoveries.with_recent_since(servers, now), self.discoveries.rng)
        if not servers:
            return None
        ranked = power_of_two(servers, k, self.discoveries.rng)
        if ranked:
            self.discoveries.remember_choice(ranked[0]["name"], now)
            self.discoveries.sweep(now)         # servers chosen once, never walked again, are forgotten too
        keys = self.public_keys()
        if keys:                                  # under CURVE clients pin the SeD's key from the answer
            ranked = [dict(s, public_key=keys[s["name"]]) if s["name"] in keys else s for s in ranked]
        self.counters.view_answers += 1
        return m.make(MsgType.SERVERS, h["id"], name=self.name, servers=ranked, answered=answered,
                      timed_out=[], view=True)

    def _ranking(self, service: str, agg, n: int) -> ViewRanking | None:
        """The kept ranking of ``service``'s SeDs for ``agg`` (created on first
        use, told of every change by the view), or None: too few SeDs
        (``view_index_min``) or an aggregator without a ``view_id`` and
        ``view_key`` (see :class:`~gridrpc.core.aggregators.DefaultAggregator`)."""
        vid = getattr(agg, "view_id", None)
        if n < self.config.view_index_min or vid is None:
            return None
        key = (service, vid)
        r = self._rankings.pop(key, None)
        if r is None:
            if len(self._rankings) >= MAX_RANKINGS:         # the least recently used goes
                old = self._rankings.pop(next(iter(self._rankings)))
                self.view.rankings.remove(old)
                self.discoveries.watchers.remove(old)
            r = ViewRanking(service, agg.view_key, random.Random(self.discoveries.rng.random()), self.discoveries)
            r.dirty.update(self.view.seds)
            self.view.rankings.append(r)                # told of every changed snapshot
            self.discoveries.watchers.append(r)         # and of every choice
        self._rankings[key] = r                         # most recently used last
        return r

    # -- discovery -------------------------------------------------------------------
    def _on_discover(self, peer: bytes, h: dict, now: float, user: str | None = None) -> list:
        c = self.config
        for counts, key, limit, who, name in ((self._inflight, peer, c.max_discoveries_per_peer, "this connection",
                                               "max_discoveries_per_peer"),
                                              (self._inflight_user, user, c.max_discoveries_per_user, user,
                                               "max_discoveries_per_user")):
            n = counts.get(key, 0)
            if key is not None and n >= limit:
                self.counters.discoveries_refused += 1
                return [Send(peer, m.error_header(
                    h["id"], "refused", f"agent {self.name}: {n} discoveries already in flight from {who} "
                    f"(limit {name}={limit})"))]
        return self._discover(h, ("peer", peer, user), now, user)

    def _from_parent(self, ev: FromParent, now: float) -> list:
        if ev.type is MsgType.DISCOVER:
            return self._discover(ev.header, ("parent",), now)
        if ev.type is MsgType.PING:
            return [SendParent(m.make(MsgType.PONG, ev.header["id"], name=self.name))]
        return []

    def _discover(self, h: dict, reply_to: tuple, now: float, user: str | None = None) -> list:
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
        budget = discovery_budget(h.get("budget_ms"), self.config.discovery_budget)
        if not children:
            if self.role.root and self.rebuilding(now):
                return [self._to(reply_to, m.error_header(
                    rid, "rebuilding", f"master agent {self.name} started recently and is rebuilding its "
                    f"tree: {service!r} may be offered once its children are back (retry)"))]
            federated = self._federate(h, reply_to, service, k, agg, budget, now, user)
            if federated is not None:
                return federated
            err = self.role.no_offer(rid, service)
            if err is not None:
                return [self._to(reply_to, err)]
        if self.role.root and self.config.view and children:
            header = self._view_answer(h, service, k, agg, now)
            if header is not None:
                busy = self._federate_busy(h, reply_to, service, k, agg, header["servers"], budget, now, user)
                return busy if busy is not None else [self._to(reply_to, header)]
        budget = max(MIN_BUDGET_S, self.latency.deadline(children, budget))   # a silent child costs ms
        self._seq += 1
        fid = f"{self.name}:{self._seq}"
        fwd = dict(h, id=fid, budget_ms=child_budget_ms(budget), k=k)
        if spec is not None:
            fwd["aggregator"] = spec
        fwd.pop("names", None)      # ours to set, per process
        out: list = []
        registry_children = self.registry.children
        for group in self._process_groups(service, children):
            msg = dict(fwd, names=list(group)) if len(group) > 1 else fwd
            out.append(Send(registry_children[group[0]].route, msg, tuple(group)))
        self._in_flight_from(reply_to)
        done = self.discoveries.start(fid, (reply_to, rid, service, k), children, k, agg, now + budget, now)
        if done is not None:
            out.extend(self._finish(done, now))
        return out

    def _process_groups(self, service: str, children: list[str]) -> list[tuple[str, ...]]:
        """:func:`group_by_process` of the children offering ``service``, kept
        until the registry changes (a large tree's LA asks the same groups at
        every fan-out)."""
        version, groups = self._groups
        if version != self.registry.version:
            groups = {}
            self._groups = (self.registry.version, groups)
        cached = groups.get(service)
        if cached is None:
            cached = groups[service] = [tuple(g) for g in group_by_process(self.registry, children)]
        return cached

    def _on_servers(self, peer: bytes, h: dict, now: float, user: str | None = None) -> list:
        name = h.get("name") or ""
        child = self.registry.children.get(name)
        if child is None or child.route != peer:        # only the asked child answers for itself
            self.counters.answers_ignored += 1
            return []
        p = self.discoveries.pending.get(h["id"])
        if p is not None:
            names = h.get("names")
            waiting = p.waiting
            self.latency.observe_all([n for n in (names if names else (name,)) if n in waiting], now - p.started)
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

    def _in_flight_from(self, reply_to: tuple) -> None:
        """One more discovery pending for the asking connection and its key (released in _finish)."""
        if reply_to[0] == "peer":
            self._count_in_flight(reply_to, 1)

    def _count_in_flight(self, reply_to: tuple, step: int) -> None:
        tally(self._inflight, reply_to[1], step)
        if reply_to[2] is not None:         # the asking key, under CURVE
            tally(self._inflight_user, reply_to[2], step)

    def _finish(self, done: Done, now: float | None = None) -> list:
        reply_to, rid, service, k = done.reply_to
        if reply_to[0] == "peer":
            self._count_in_flight(reply_to, -1)
        if done.timed_out:
            self.counters.discoveries_timed_out += 1
            if now is not None:
                for n in done.timed_out:
                    if not n.startswith(PEER_PREFIX):
                        self.latency.miss(n, now)
            log.info("%s: discovery %s for %s: no answer in time from %s", self.name, rid, service,
                     ", ".join(done.timed_out))
        header = self._federated_answer(done, rid, service) if done.id in self._forwarded else None
        if header is None:
            heard = {}
            for n in done.timed_out:
                c = self.registry.children.get(n)
                if c is not None and now is not None:
                    heard[n] = (max(0.0, now - c.last_seen), now - c.last_seen <= self._lost_after)
            header = self.role.finished(rid, service, k, done, heard)
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
