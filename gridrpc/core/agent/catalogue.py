"""What an agent shows of itself (:mod:`gridrpc.core.agent.machine`): the catalogue
(SERVICES requests), the flattened subtree sent to its parent and shown by
``/api/tree``, and its statistics.

:class:`Catalogue` holds those methods; :class:`~gridrpc.core.agent.machine.
AgentState` inherits them.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import messages as m
from .vocabulary import Send
from ..messages import MsgType

__all__ = ["AgentStatistics", "Catalogue"]


@dataclass(frozen=True, slots=True)
class AgentStatistics:
    name: str
    kind: str
    children: int
    pending_discoveries: int
    discoveries: int                # DISCOVER requests handled (from clients or the parent)
    discoveries_timed_out: int      # answered at the deadline, some children silent
    discoveries_refused: int        # over the per-connection or per-key limit of discoveries in flight
    bad_messages: int               # refused at the boundary
    answers_ignored: int            # late, duplicate or stranger SERVERS
    children_lost: int
    view_answers: int = 0           # discoveries answered from the pushed view (no fan-out)
    view_snapshots: int = 0         # SeD snapshots in the view
    view_updates: int = 0           # snapshots received
    views_ignored: int = 0          # VIEW messages dropped unread: views off (gridrpc ma|la --no-view)
    view_refused: int = 0           # snapshots of SeDs not (yet) registered under the child that sent them
    view_asked: int = 0             # snapshots asked of the children again (missing from the view)
    forwarded: int = 0              # discoveries forwarded to peer master agents (federation)
    forwarded_busy: int = 0         # of which: the local servers were all too busy

    def as_dict(self) -> dict:
        return {f: getattr(self, f) for f in self.__slots__}


@dataclass(slots=True)
class Counters:
    discoveries: int = 0
    discoveries_timed_out: int = 0
    discoveries_refused: int = 0
    bad_messages: int = 0
    answers_ignored: int = 0
    children_lost: int = 0
    view_answers: int = 0
    view_ranked: int = 0            # snapshots view answers ranked, the whole view each time
    view_moved: int = 0             # with the kept ranking (core/view_rank.py): changed snapshots moved,
    view_sorted: int = 0            # snapshots sorted anew,
    view_walked: int = 0            # first places looked at
    views_ignored: int = 0
    view_asked: int = 0
    forwarded: int = 0
    forwarded_busy: int = 0


class Catalogue:
    """The catalogue, tree and statistics output of :class:`~gridrpc.core.agent.machine.AgentState`."""

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
        # the view's counts go up with the load: the root's tree shows each agent's (gridrpc top)
        return {"load": {"children": len(self.registry.children), "view_snapshots": len(self.view.seds),
                         "view_refused": self.view.refused, "view_asked": self.counters.view_asked},
                "elements": self.elements(now, wall)}

    def statistics(self) -> AgentStatistics:
        c = self.counters
        return AgentStatistics(
            name=self.name, kind=self.role.kind, children=len(self.registry.children),
            pending_discoveries=len(self.discoveries.pending), discoveries=c.discoveries,
            discoveries_timed_out=c.discoveries_timed_out, discoveries_refused=c.discoveries_refused,
            bad_messages=c.bad_messages,
            answers_ignored=c.answers_ignored, children_lost=c.children_lost, view_answers=c.view_answers,
            view_snapshots=len(self.view.seds), view_updates=self.view.updates, views_ignored=c.views_ignored,
            view_refused=self.view.refused, view_asked=c.view_asked, forwarded=c.forwarded, forwarded_busy=c.forwarded_busy)
