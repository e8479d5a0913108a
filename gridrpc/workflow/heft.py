"""HEFT list scheduling of a workflow's calls (pure).

Topcuoglu, Hariri and Wu, "Performance-effective and low-complexity task
scheduling for heterogeneous computing" (IEEE TPDS 2002): rank every node by
its *upward rank* — its mean run time plus the most expensive path (data
transfer + upward rank) to an exit node — then, in decreasing rank order,
give each node to the server where it finishes earliest, counting the
server's queue (from ``eft``), the node's run time there (``tcomp``) and the
transfer of every input not produced on that server (``size / bandwidth``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Task", "ServerEstimate", "heft", "topological"]


@dataclass(slots=True, kw_only=True)
class Task:
    name: str
    service: str
    deps: list[str] = field(default_factory=list)
    out_bytes: float = 0.0               # size of its result (a hint; 0: unknown)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerEstimate:
    name: str
    tcomp: float                         # predicted run time of the service there, s
    ready: float = 0.0                   # when its queue frees up, s from now


def topological(tasks: dict[str, Task]) -> list[str]:
    """Names in dependency order; ValueError on a cycle or an unknown dependency."""
    order, state = [], {}

    def visit(n: str, path: tuple) -> None:
        s = state.get(n)
        if s == 2:
            return
        if s == 1:
            raise ValueError("workflow has a cycle: " + " -> ".join((*path, n)))
        state[n] = 1
        for d in tasks[n].deps:
            if d not in tasks:
                raise ValueError(f"node {n!r} depends on unknown node {d!r}")
            visit(d, (*path, n))
        state[n] = 2
        order.append(n)

    for n in tasks:
        visit(n, ())
    return order


def heft(tasks: dict[str, Task], servers: dict[str, list[ServerEstimate]], *,
         bandwidth: float = 1e9, default_tcomp: float = 1.0) -> tuple[list[str], dict[str, str]]:
    """``(submission order, node -> server)``. ``servers[service]``: the
    candidates of each service with their estimates."""
    order = topological(tasks)
    succ: dict[str, list[str]] = {n: [] for n in tasks}
    for n, t in tasks.items():
        for d in t.deps:
            succ[d].append(n)

    def w(t: Task, s: ServerEstimate) -> float:
        return s.tcomp if s.tcomp > 0 else default_tcomp

    def mean_w(t: Task) -> float:
        c = servers.get(t.service) or []
        return sum(w(t, s) for s in c) / len(c) if c else default_tcomp

    rank: dict[str, float] = {}
    for n in reversed(order):
        t = tasks[n]
        rank[n] = mean_w(t) + max((t.out_bytes / bandwidth + rank[s] for s in succ[n]), default=0.0)
    # decreasing rank is a topological order when run times are positive; ties: dependency order
    pos = {n: i for i, n in enumerate(order)}
    by_rank = sorted(order, key=lambda n: (-rank[n], pos[n]))
    done_at: dict[str, float] = {}
    where: dict[str, str] = {}
    avail: dict[str, float] = {}
    for n in by_rank:
        t = tasks[n]
        best = None
        for s in servers.get(t.service) or []:
            start = max(avail.get(s.name, s.ready),
                        max((done_at[d] + (0.0 if where[d] == s.name else tasks[d].out_bytes / bandwidth)
                             for d in t.deps if d in done_at), default=0.0))
            finish = start + w(t, s)
            if best is None or finish < best[0]:
                best = (finish, s.name)
        if best is None:
            continue                      # no server offers it: the call will say so
        done_at[n], where[n] = best
        avail[best[1]] = best[0]
    return [n for n in order], where
