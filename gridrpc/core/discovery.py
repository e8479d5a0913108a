"""Pending discoveries of one agent (pure).

A discovery fans out to the children offering the service; their answers are
collected until all answered or the deadline passed; then the aggregator ranks
the union and the best k go back. One slow or dead branch only costs the
deadline, never blocks the answer.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from .aggregators import Aggregator


@dataclass(slots=True)
class Pending:
    id: str
    reply_to: object                # opaque to the core (route + header id of the asker)
    waiting: set[str]
    k: int
    aggregator: Aggregator
    deadline: float
    servers: list[dict] = field(default_factory=list)
    answered: int = 0


@dataclass(frozen=True, slots=True)
class Done:
    id: str
    reply_to: object
    servers: list
    answered: int
    timed_out: list


class DiscoveryTable:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.pending: dict[str, Pending] = {}

    def start(self, id_: str, reply_to: object, children: list[str], k: int,
              aggregator: Aggregator, deadline: float) -> Done | None:
        p = Pending(id=id_, reply_to=reply_to, waiting=set(children), k=k,
                    aggregator=aggregator, deadline=deadline)
        if not p.waiting:
            return self._finish(p)
        self.pending[id_] = p
        return None

    def answer(self, id_: str, child: str, servers: list[dict]) -> Done | None:
        p = self.pending.get(id_)
        if p is None or child not in p.waiting:
            return None            # late or duplicate answer
        p.waiting.discard(child)
        p.answered += 1
        p.servers.extend(s for s in servers if isinstance(s, dict) and "name" in s)
        if not p.waiting:
            del self.pending[id_]
            return self._finish(p)
        return None

    def child_lost(self, child: str) -> list[Done]:
        out = []
        for id_ in [i for i, p in self.pending.items() if child in p.waiting]:
            p = self.pending[id_]
            p.waiting.discard(child)
            if not p.waiting:
                del self.pending[id_]
                out.append(self._finish(p))
        return out

    def expire(self, now: float) -> list[Done]:
        out = []
        for id_ in [i for i, p in self.pending.items() if p.deadline <= now]:
            out.append(self._finish(self.pending.pop(id_)))
        return out

    def next_deadline(self) -> float | None:
        return min((p.deadline for p in self.pending.values()), default=None)

    def _finish(self, p: Pending) -> Done:
        ranked = p.aggregator.rank(p.servers, self.rng)[: p.k] if p.servers else []
        return Done(id=p.id, reply_to=p.reply_to, servers=ranked, answered=p.answered,
                    timed_out=sorted(p.waiting))
