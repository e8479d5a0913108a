"""An agent's view of its children (pure).

Children are SeDs or agents. Each registers with its element info, its
services and, for agents, the elements of its own subtree; each heartbeats.
The registry answers: which children offer a service, the catalogue of the
subtree, the flattened element list (for the status API and for propagation
to the parent), and which children missed their heartbeats.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from .aggregators import AGGREGATORS, check_spec


def _known_aggregator(spec: Any) -> bool:
    """A child may suggest a default aggregator for its service, but only one
    registered on this agent counts (a name is never code)."""
    try:
        return check_spec(spec)[0] in AGGREGATORS
    except ValueError:
        return False


@dataclass(slots=True)
class Child:
    name: str
    route: bytes                 # zmq routing id of the child's DEALER
    info: dict                   # element info: kind, address, host, pid, ...
    services: dict[str, dict]    # name -> {"doc", "params"} offered by the child's subtree
    elements: list[dict]         # descendants (agents only)
    last_seen: float
    load: dict = field(default_factory=dict)
    identity: str | None = None  # authenticated key of its connection (CURVE), None without security


class ChildRegistry:
    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.children: dict[str, Child] = {}
        self.version = 0              # bumped on every change of the subtree's shape or services
        self._by_service: dict[str, tuple[str, ...]] | None = None
        self._services: Mapping[str, Mapping] | None = None
        self._owners: dict[str, str] | None = None

    # -- names are unique in a tree -------------------------------------------
    def owner_of(self, name: str) -> str | None:
        """The child whose subtree holds element ``name`` (itself or a descendant)."""
        if self._owners is None:
            owners: dict[str, str] = {}
            for n, c in self.children.items():
                owners[n] = n
                for e in c.elements:
                    en = e.get("name")
                    if isinstance(en, str):
                        owners.setdefault(en, n)
            self._owners = owners
        return self._owners.get(name)

    def name_conflict(self, route: bytes, header: dict, identity: str | None, now: float,
                      live_for: float) -> str | None:
        """Why registering ``header`` would take names of live elements of
        other connections, or None. A child keeps its place while it is seen
        within ``live_for`` seconds; its own connection (or, under security,
        its own key) may register again."""
        names = [header["name"]] + [e["name"] for e in header.get("elements") or ()
                                    if isinstance(e, dict) and isinstance(e.get("name"), str)]
        for n in names:
            if n == self.owner:
                return f"{n!r} is the name of this agent"
            holder = self.owner_of(n)
            if holder is None:
                continue
            c = self.children[holder]
            same = c.route == route or (identity is not None and c.identity == identity)
            if holder == header["name"] and same:
                continue                          # the child itself, registering again
            if now - c.last_seen <= live_for:
                where = "" if holder == n else f" (in the subtree of {holder})"
                return f"an element named {n!r} is already registered{where}"
        return None

    # -- inputs -----------------------------------------------------------
    def register(self, route: bytes, header: dict, now: float, identity: str | None = None) -> None:
        name = header["name"]
        services = {}
        for s in header.get("services") or ():
            if isinstance(s, dict) and isinstance(s.get("name"), str):
                services[s["name"]] = {"doc": s.get("doc") or "", "params": s.get("params") or []}
                if s.get("aggregator") is not None and _known_aggregator(s["aggregator"]):
                    services[s["name"]]["aggregator"] = s["aggregator"]
                if s.get("idempotent") is False:         # shown in the catalogue (retry semantics)
                    services[s["name"]]["idempotent"] = False
            elif isinstance(s, str):
                services[s] = {"doc": "", "params": []}
        info = {k: header.get(k) for k in ("kind", "address", "host", "pid", "started")}
        if isinstance(header.get("public_key"), str):      # CURVE: clients pin it from the MA's answers
            info["public_key"] = header["public_key"]
        elements = [e for e in header.get("elements") or () if isinstance(e, dict)]
        old = self.children.get(name)
        self.children[name] = Child(name=name, route=route, info=info, services=services,
                                    elements=elements, last_seen=now,
                                    load=header.get("load") or {}, identity=identity)
        if old is None or old.services != services or old.info != info or \
                _shape(old.elements) != _shape(elements):
            self._changed(name, None if old is None else old.elements, elements)

    def heartbeat(self, route: bytes, header: dict, now: float, identity: str | None = None) -> bool:
        """Returns False when the child is unknown (it must register again).
        A heartbeat from another connection counts only under the child's own
        key (security on); otherwise the sender must register (and is refused
        while the child lives)."""
        child = self.children.get(header["name"])
        if child is None:
            return False
        if child.route != route:
            if identity is None or identity != child.identity:
                return False
            child.route = route
        child.last_seen = now
        if isinstance(header.get("load"), dict):
            child.load = header["load"]
        if isinstance(header.get("elements"), list):
            # as in register, and a heartbeat cannot take names it did not register with: elements
            # named like this agent or held by another child's subtree are left out (names are unique
            # in a tree; only REGISTER is checked for conflicts, and answered when it has one)
            elements = [e for e in header["elements"] if isinstance(e, dict) and self._may_name(child.name, e)]
            if _shape(child.elements) != _shape(elements):
                self._changed(child.name, child.elements, elements)
            child.elements = elements
        return True

    def _may_name(self, child: str, element: dict) -> bool:
        """Whether ``child``'s subtree may hold an element of this name."""
        n = element.get("name")
        if not isinstance(n, str) or n == self.owner:
            return False
        holder = self.owner_of(n)
        return holder is None or holder == child

    def remove(self, name: str) -> bool:
        if self.children.pop(name, None) is not None:
            self._changed()
            return True
        return False

    def expire(self, now: float, timeout: float) -> list[str]:
        """Drop children silent for longer than ``timeout``; returns their names."""
        dead = [n for n, c in self.children.items() if now - c.last_seen > timeout]
        for n in dead:
            self.remove(n)
        return dead

    # -- queries ----------------------------------------------------------
    def offering(self, service: str) -> list[str]:
        """The children offering ``service``, in registration order (a new list)."""
        if self._by_service is None:
            idx: dict[str, list[str]] = {}
            for n, c in self.children.items():
                for s in c.services:
                    idx.setdefault(s, []).append(n)
            self._by_service = {s: tuple(ns) for s, ns in idx.items()}
        return list(self._by_service.get(service, ()))

    def services(self) -> Mapping[str, Mapping]:
        """Union of the children's services: ``name -> {doc, params[, aggregator]}``,
        the first registered child's metadata first. Read-only (the result is
        cached until the subtree changes and shared by every caller)."""
        if self._services is None:
            out: dict[str, dict] = {}
            for c in self.children.values():
                for s, meta in c.services.items():
                    entry = out.setdefault(s, dict(meta))
                    if "aggregator" in meta and "aggregator" not in entry:   # any declaring child wins
                        entry["aggregator"] = meta["aggregator"]
            self._services = MappingProxyType({s: MappingProxyType(e) for s, e in out.items()})
        return self._services

    def catalogue(self) -> dict[str, dict]:
        """service -> {doc, params, servers: [SeD names]} over the whole subtree."""
        cat: dict[str, dict] = {}
        for e in self.elements(now=None):
            if e.get("kind") not in ("sed",):
                continue
            for s in e.get("services", []):
                entry = cat.setdefault(s, {"doc": "", "params": [], "servers": []})
                entry["servers"].append(e["name"])
        for s, meta in self.services().items():
            cat.setdefault(s, {"doc": "", "params": [], "servers": []}).update(meta)
        return cat

    def elements(self, now: float | None, lost_after: float | None = None) -> list[dict]:
        """Flattened subtree: each child then its descendants. A child silent
        for more than ``lost_after`` is shown ``lost`` until it is dropped."""
        out = []
        for c in self.children.values():
            lost = now is not None and lost_after is not None and now - c.last_seen > lost_after
            out.append({"name": c.name, "parent": self.owner, **c.info,
                        "services": sorted(c.services) if c.info.get("kind") == "sed" else [],
                        "state": "lost" if lost else "alive", "last_seen": c.last_seen, "load": c.load})
            out.extend(c.elements)
        return out

    def _changed(self, name: str | None = None, old: list | None = None, new: list | None = None) -> None:
        """The subtree changed; ``name``: the child that (re)registered, with
        its ``old`` (None: a new child) and ``new`` elements."""
        self.version += 1
        self._by_service = None
        self._services = None
        if name is None or self._owners is None or not self._owners_follow(name, old, new or []):
            self._owners = None

    def _owners_follow(self, name: str, old: list | None, new: list) -> bool:
        """Keep :meth:`owner_of`'s map through one child's registration
        without rebuilding it (at a leaf agent every SeD's registration
        rebuilt it: quadratic in the SeDs). Only when the answer is sure:
        a new child (last in order) or new names no one held; False (rebuild
        it) when a name held by another child or a name of this one goes."""
        owners = self._owners
        names = [e.get("name") for e in new if isinstance(e.get("name"), str)]
        if old is None:
            owners[name] = name
            for en in names:
                owners.setdefault(en, name)
            return True
        before = {e.get("name") for e in old if isinstance(e.get("name"), str)}
        if any(owners.get(en) == name for en in before.difference(names) if en != name):
            return False
        for en in names:
            if en not in before:
                holder = owners.get(en)
                if holder is None:
                    owners[en] = name
                elif holder != name:
                    return False
        return True


def _shape(elements: list[dict]) -> Any:
    return sorted((str(e.get("name")), str(e.get("parent")),
                   tuple(map(str, e["services"])) if isinstance(e.get("services"), list) else ())
                  for e in elements)
