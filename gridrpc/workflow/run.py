"""Run a workflow: HEFT placement, submission with server-to-server data, progress.

Every node is one call. Its arguments may be other nodes: the call then gets
the producer's result straight from the SeD that computed it (the producer
keeps its result, ``keep_result``); the consumer's SeD waits for it before
queueing the call, so the whole DAG is submitted at once and no SeD slot is
held waiting. A node that fails fails its descendants — each with an error
naming the failed ancestor — and leaves the rest running.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ConfigError, GridRPCError
from .heft import ServerEstimate, Task, heft, topological

__all__ = ["Node", "Workflow", "WorkflowResult", "NodeFailed", "load"]


class NodeFailed(GridRPCError):
    """A workflow node failed, or was not run because an ancestor failed
    (``.node``, ``.cause`` = the name of the node that failed first)."""

    def __init__(self, message: str, *, node: str, cause: str) -> None:
        super().__init__(message)
        self.node, self.cause = node, cause


@dataclass(eq=False)
class Node:
    name: str
    service: str
    args: tuple
    kwargs: dict
    server: str | None = None
    out_bytes: float = 0.0

    def deps(self) -> list[str]:
        out: list[str] = []
        _walk(self.args, out)
        _walk(self.kwargs, out)
        return list(dict.fromkeys(out))

    def __repr__(self) -> str:
        return f"<workflow node {self.name}: {self.service}>"


def _walk(v: Any, out: list) -> None:
    if isinstance(v, Node):
        out.append(v.name)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _walk(x, out)
    elif isinstance(v, dict):
        for x in v.values():
            _walk(x, out)


def _subst(v: Any, calls: dict) -> Any:
    if isinstance(v, Node):
        return calls[v.name]
    if isinstance(v, list):
        return [_subst(x, calls) for x in v]
    if isinstance(v, tuple):
        return tuple(_subst(x, calls) for x in v)
    if isinstance(v, dict):
        return {k: _subst(x, calls) for k, x in v.items()}
    return v


@dataclass
class WorkflowResult:
    results: dict = field(default_factory=dict)       # node -> value (exit nodes) or DataRef
    errors: dict = field(default_factory=dict)        # node -> NodeFailed
    placement: dict = field(default_factory=dict)     # node -> server it ran on
    elapsed: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.errors

    def __getitem__(self, node: str):
        if node in self.errors:
            raise self.errors[node]
        return self.results[node]


class Workflow:
    """``wf = Workflow(client)``; ``a = wf.add("produce", 10**6)``;
    ``b = wf.add("transform", a)``; ``wf.run()``. ``client``: a
    :class:`gridrpc.Client` or :class:`gridrpc.AsyncClient` (then ``await
    wf.arun()``). ``progress(line)`` is told of every node that ends
    (default: print)."""

    def __init__(self, client, *, bandwidth: float = 1e9, progress: Callable[[str], None] | None = print,
                 free_intermediate: bool = True) -> None:
        self.client = client
        self.bandwidth = bandwidth
        self.progress = progress or (lambda line: None)
        self.free_intermediate = free_intermediate
        self.nodes: dict[str, Node] = {}

    def add(self, service: str, *args, name: str | None = None, server: str | None = None,
            out_bytes: float = 0.0, **kwargs) -> Node:
        name = name or f"{service}-{len(self.nodes) + 1}"
        if name in self.nodes:
            raise ConfigError(f"workflow node {name!r} defined twice")
        node = Node(name, service, args, kwargs, server, out_bytes)
        for d in node.deps():
            if d not in self.nodes:
                raise ConfigError(f"node {name!r} uses {d!r}, which is not in this workflow")
        self.nodes[name] = node
        return node

    def run(self, timeout: float | None = None) -> WorkflowResult:
        return self.client.run_coroutine(self.arun(), timeout)

    async def arun(self) -> WorkflowResult:
        ac = getattr(self.client, "aclient", self.client)
        t0 = time.monotonic()
        tasks = {n: Task(name=n, service=x.service, deps=x.deps(), out_bytes=x.out_bytes)
                 for n, x in self.nodes.items()}
        topological(tasks)
        servers: dict[str, list[ServerEstimate]] = {}
        for svc in {x.service for x in self.nodes.values()}:
            try:
                found = await ac.discover(svc, 100)
            except GridRPCError:
                found = []
            now = time.time()
            servers[svc] = []
            for s in found:
                est = s.estimation
                tc = est.get("tcomp") if isinstance(est.get("tcomp"), (int, float)) else 0.0
                eft = est.get("eft") if isinstance(est.get("eft"), (int, float)) else now
                servers[svc].append(ServerEstimate(name=s.name, tcomp=float(tc), ready=max(0.0, eft - now - tc)))
        order, where = heft(tasks, servers, bandwidth=self.bandwidth)
        has_succ = {d for t in tasks.values() for d in t.deps}
        calls: dict[str, Any] = {}
        for n in order:
            node = self.nodes[n]
            server = node.server or where.get(n)
            calls[n] = ac.submit_nowait(node.service, *_subst(node.args, calls), server=server,
                                        keep_result="persistent" if n in has_succ else False,
                                        **_subst(node.kwargs, calls))
        res = WorkflowResult()
        total = len(order)
        waiting = {asyncio.ensure_future(c.aresult()): n for n, c in calls.items()}
        raw_errors: dict[str, BaseException] = {}
        while waiting:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for f in done:
                n = waiting.pop(f)
                c = calls[n]
                res.placement[n] = c.server
                if f.exception() is None:
                    res.results[n] = f.result()
                    status = "done"
                else:
                    raw_errors[n] = f.exception()
                    status = f"FAILED ({type(f.exception()).__name__})"
                k = len(res.results) + len(raw_errors)
                self.progress(f"[{k}/{total}] {n} ({self.nodes[n].service}) {status} on {c.server} "
                              f"after {time.monotonic() - t0:.2f}s")
        for n in order:                       # root causes first (dependency order)
            if n not in raw_errors:
                continue
            failed_deps = [d for d in tasks[n].deps if d in res.errors]
            if failed_deps:
                cause = res.errors[failed_deps[0]].cause
                res.errors[n] = NodeFailed(f"node {n!r} was not run: its ancestor {cause!r} failed: "
                                           f"{raw_errors[cause]}", node=n, cause=cause)
            else:
                res.errors[n] = NodeFailed(f"node {n!r} ({self.nodes[n].service} on {res.placement.get(n)}) "
                                           f"failed: {type(raw_errors[n]).__name__}: {raw_errors[n]}",
                                           node=n, cause=n)
        if self.free_intermediate:
            from ..client.data import DataRef
            for n in has_succ:
                v = res.results.pop(n, None) if n in res.results else None
                if isinstance(v, DataRef):
                    try:
                        await v.afree()
                    except GridRPCError:
                        pass
        res.elapsed = time.monotonic() - t0
        self.progress(f"workflow: {len(order) - len(res.errors)}/{total} nodes done, {len(res.errors)} failed, "
                      f"{res.elapsed:.2f}s")
        return res


def load(spec: dict | str, client, **kw) -> Workflow:
    """A workflow from YAML text or a parsed mapping::

        nodes:
          a: {service: produce, args: [1000000]}
          b: {service: transform, args: [$a], kwargs: {factor: 3}}
          c: {service: reduce_sum, args: [$b], server: sed-1}

    ``"$name"`` as an argument (or inside a list) is node ``name``'s result."""
    if isinstance(spec, str):
        import yaml
        try:
            spec = yaml.safe_load(spec)
        except yaml.YAMLError as exc:
            raise ConfigError(f"a workflow file must be valid YAML: {exc}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("nodes"), dict):
        raise ConfigError("a workflow file needs a 'nodes' mapping: name -> {service, args, kwargs, server}")
    raw = spec["nodes"]
    wf = Workflow(client, **kw)
    deps: dict[str, list[str]] = {}
    for name, n in raw.items():
        if not isinstance(n, dict) or not isinstance(n.get("service"), str):
            raise ConfigError(f"workflow node {name!r} needs a 'service'")
        found: list[str] = []
        _refs_in(n.get("args") or [], found)
        _refs_in(n.get("kwargs") or {}, found)
        for d in found:
            if d not in raw:
                raise ConfigError(f"workflow node {name!r} uses ${d}, which is not a node")
        deps[str(name)] = found
    order = topological({k: Task(name=k, service="", deps=v) for k, v in deps.items()})
    for name in order:
        n = raw[name]
        args = n.get("args") or []
        kwargs = n.get("kwargs") or {}
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise ConfigError(f"workflow node {name!r}: args must be a list and kwargs a mapping")
        wf.add(n["service"], *_resolve(args, wf.nodes), name=str(name), server=n.get("server"),
               out_bytes=float(n.get("out_bytes") or 0), **_resolve(kwargs, wf.nodes))
    return wf


def _refs_in(v: Any, out: list) -> None:
    if isinstance(v, str) and v.startswith("$") and len(v) > 1:
        out.append(v[1:])
    elif isinstance(v, list):
        for x in v:
            _refs_in(x, out)
    elif isinstance(v, dict):
        for x in v.values():
            _refs_in(x, out)


def _resolve(v: Any, nodes: dict) -> Any:
    if isinstance(v, str) and v.startswith("$") and len(v) > 1:
        return nodes[v[1:]]
    if isinstance(v, list):
        return [_resolve(x, nodes) for x in v]
    if isinstance(v, dict):
        return {k: _resolve(x, nodes) for k, x in v.items()}
    return v
