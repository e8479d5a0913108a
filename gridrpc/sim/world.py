"""A simulated deployment: hosts, a tree of elements on them, clients, and
the measurements (discovery latency, throughput, messages per element,
freshness of the estimates, CPU per element).

Shapes are named as in the scalability study (``benchmarks/scalability``):
``flat`` (every SeD under the MA), ``L2-d`` (d LAs), ``L3-d`` (d LAs with d
LAs each), or given as agents per level (``agents=[1, 8, 64]``, the form of
``gridrpc deploy plan``). SeDs are replicas packed in SeD processes.
"""
from __future__ import annotations

import collections
import heapq
import math
import random
import statistics
from dataclasses import dataclass

from ..core.agent.roles import LocalRole, MasterRole
from ..loadtest.config import LoadConfig
from .elements import AgentNode, ClientNode, SedNode, User, size
from .engine import Host, Network, Sim
from .model import NOOP, Costs, ServiceModel


@dataclass(frozen=True)
class Element:
    kind: str                 # ma | la | sed
    name: str
    parent: str | None
    replicas: int = 1


def _split(n: int, parts: int) -> list[int]:
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def shape_agents(shape: str) -> tuple[int, int]:
    """``flat`` -> (1, 0); ``L2-4`` -> (2, 4)."""
    if shape == "flat":
        return 1, 0
    lv, d = shape.split("-")
    return int(lv.lstrip("Ll")), int(d)


def elements_for(shape: str | list[int], n: int, *, seds_per_proc: int | None = None,
                 flat_procs: int | None = None) -> list[Element]:
    """The tree of ``shape`` with ``n`` SeDs. Named shapes follow the study
    (flat: ``min(2, n)`` SeD processes unless ``flat_procs``; otherwise one
    SeD process per leaf agent unless ``seds_per_proc``); a list of agents
    per level (``[1, 8, 64]``) splits every level evenly."""
    if isinstance(shape, str):
        levels, d = shape_agents(shape)
        agents = [1] + [d ** i for i in range(1, levels)]
    else:
        agents = list(shape)
    out = [Element("ma", "MA", None)]
    prev = ["MA"]
    for lvl, count in enumerate(agents[1:], start=1):
        cur = []
        for j, parent in enumerate(_assign(count, prev)):
            name = f"LA{j + 1}" if lvl == 1 else f"{parent}.{sum(1 for c in cur if c[1] == parent) + 1}"
            cur.append((name, parent))
        out += [Element("la", nm, p) for nm, p in cur]
        prev = [nm for nm, _ in cur]
    leaves = prev
    if isinstance(shape, str) and shape == "flat" and seds_per_proc is None:
        procs = flat_procs or min(2, n)
        for i, k in enumerate(_split(n, procs)):
            out.append(Element("sed", f"s{i + 1}", "MA", k))
        return out
    per_leaf = _split(n, len(leaves))
    for leaf, k in zip(leaves, per_leaf):
        if not k:
            continue
        chunks = [k] if seds_per_proc is None else _split(k, math.ceil(k / seds_per_proc))
        for i, c in enumerate(chunks):
            out.append(Element("sed", f"s-{leaf}" if len(chunks) == 1 else f"s-{leaf}-{i + 1}", leaf, c))
    return out


def _assign(count: int, parents: list[str]) -> list[str]:
    """``count`` children spread evenly over ``parents`` (contiguous blocks)."""
    out = []
    for p, k in zip(parents, _split(count, len(parents))):
        out += [p] * k
    return out


class World:
    """Hosts, elements, network, measurements. ``placement``: ``"single"``
    (every process on one host of ``cores`` cores, as the measurements
    here) or ``"cluster"`` (every agent on a host of its own, every SeD
    process on a host of ``sed_cores`` cores, clients on hosts of their own)."""

    def __init__(self, *, costs: Costs | None = None, seed: int = 0, placement: str = "single",
                 cores: int = 2, agent_cores: int = 1, sed_cores: int | None = None,
                 hb_interval: float = 1.0, hb_timeout: float = 5.0, speed: float = 1.0,
                 views: bool = False, view_max_age: float | None = None) -> None:
        self.costs = costs or Costs.load(None)
        self.seed = seed
        self.sim = Sim(seed)
        self.rng = random.Random(seed + 1)
        self.net = Network(self.sim, local_latency=self.costs.local_latency, lan_latency=self.costs.lan_latency,
                           lan_bandwidth=self.costs.lan_bandwidth)
        self.placement, self.cores, self.agent_cores, self.sed_cores = placement, cores, agent_cores, sed_cores
        self.speed = speed
        self.hb_interval, self.hb_timeout = hb_interval, hb_timeout
        # pushed state (core/view.py): SeDs push snapshots, the MA answers from its view when fresh.
        # Off by default: the stored measurements (calibration, validation) predate it.
        self.views = views
        self.view_max_age = view_max_age if view_max_age is not None else (
            None if hb_interval == 1.0 else 1.5 * hb_interval)     # the default is 1.5 heartbeat periods
        self.sed_of: dict[str, SedNode] = {}
        self.hosts: dict[str, Host] = {}
        self.routes: dict[bytes, object] = {}
        self.agents: dict[str, AgentNode] = {}
        self.seds: dict[str, SedNode] = {}
        self.clients: list[ClientNode] = []
        self.n_seds = 0
        self.reset_stats()

    # -- building --------------------------------------------------------------------
    def host(self, name: str, cores: int) -> Host:
        h = self.hosts.get(name)
        if h is None:
            h = self.hosts[name] = Host(self.sim, name, cores, self.speed, self.costs.time_slice,
                                        self.costs.crowding)
        return h

    def _host_for(self, kind: str, name: str, replicas: int = 1) -> Host:
        if self.placement == "single":
            return self.host("host", self.cores)
        if kind in ("ma", "la"):
            return self.host(f"h-{name}", self.agent_cores)
        if kind == "sed":
            return self.host(f"h-{name}", self.sed_cores or max(1, replicas))
        return self.host(f"h-{name}", self.cores)

    def build(self, elements: list[Element], *, services: dict[str, ServiceModel] | None = None,
              policy: str = "fcfs", policy_options: dict | None = None, max_concurrent: int = 1,
              workers: int = 1, sed_heartbeats: bool = True) -> "World":
        services = services or {"noop": NOOP}
        seed = random.Random(self.seed)
        for e in elements:
            if e.kind in ("ma", "la"):
                role = MasterRole() if e.kind == "ma" else LocalRole()
                node = AgentNode(self, e.name, self._host_for(e.kind, e.name), role,
                                 e.parent.encode() if e.parent else None, seed=seed.randrange(2 ** 32),
                                 hb_interval=self.hb_interval, hb_timeout=self.hb_timeout,
                                 views=self.views, view_max_age=self.view_max_age)
                self.agents[e.name] = node
                self.routes[node.route] = node
            else:
                width = len(str(e.replicas))
                names = [e.name] if e.replicas == 1 else [f"{e.name}-{i:0{width}d}" for i in range(1, e.replicas + 1)]
                node = SedNode(self, e.name, self._host_for("sed", e.name, e.replicas), e.parent.encode(), names,
                               seed=seed.randrange(2 ** 32), services=services, policy=policy,
                               policy_options=policy_options, max_concurrent=max_concurrent, workers=workers,
                               hb_interval=self.hb_interval if sed_heartbeats else 0.0, views=self.views)
                self.seds[e.name] = node
                for rname in node.by_name:
                    self.sed_of[rname] = node
                for r in node.routes():
                    self.routes[r] = node
                self.n_seds += e.replicas
        # children start after their parents, as a deployment does (levels 10 ms apart)
        depth = {"MA": 0}
        for e in elements:
            if e.parent is not None:
                depth[e.name] = depth[e.parent] + 1
        for e in elements:
            node = self.agents.get(e.name) or self.seds[e.name]
            node.start(0.01 * depth[e.name])
        return self

    def client(self, name: str = "client", kind: str = "client", reuse: float = 0.0) -> ClientNode:
        """A client process; ``reuse``: its reuse window of view answers
        (s; 0: every call asks the MA; :class:`ClientNode`)."""
        host = self._host_for(kind, name)
        c = ClientNode(self, name, host, b"MA", kind, reuse=reuse)
        self.routes[c.route] = c
        self.clients.append(c)
        return c

    # -- the network -------------------------------------------------------------------
    def transmit(self, node, src: bytes, dst: bytes, h: dict) -> None:
        target = self.routes.get(dst)
        if target is None:
            return                              # a peer that does not exist: lost
        d = self.net.delay(node.proc.host, target.proc.host, size(h))
        self.sim.after(d, target.deliver, src, dst, h)

    def transmit_all(self, node, sends: list) -> None:
        """:meth:`transmit` of every ``(src, dst, header)`` of ``sends``, in
        order (one job's messages), with ``Network.delay`` and
        ``Sim.after`` inlined: the same times, counters and event order."""
        routes = self.routes
        net = self.net
        sim = self.sim
        heap = sim._heap
        now = sim.now
        seq = sim._seq                          # nothing else schedules in this loop: kept here, stored after
        n_msgs = n_bytes = 0
        host = node.proc.host
        links = net.links_from(host)
        for src, dst, h in sends:
            target = routes.get(dst)
            if target is None:
                continue                        # a peer that does not exist: lost
            thost = target.proc.host
            link = links.get(thost)
            if link is None:
                link = links[thost] = net.link(host, thost)
            n = size(h)
            busy = link.busy_until              # Network.delay
            link.busy_until = busy = (busy if busy > now else now) + n / link.bandwidth
            n_msgs += 1
            n_bytes += n
            t = now + (busy - now + link.latency)
            seq += 1                            # sim.after(d, ...)
            heapq.heappush(heap, (t if t > now else now, seq, target.deliver, (src, dst, h)))
        sim._seq = seq
        net.messages += n_msgs
        net.bytes += n_bytes

    # -- measurements --------------------------------------------------------------------
    def reset_stats(self) -> None:
        self.t0 = self.sim.now
        self.discoveries: list[float] = []
        self.discovery_failures = 0
        self.view_answers = 0               # discoveries answered from the MA's view (one hop)
        self.calls: list[float] = []
        self.call_only: list[float] = []
        self.call_failures = 0
        self.freshness: list[float] = []
        self.inbound: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self._busy0 = {n: p.busy_time for n, p in self._procs()}

    def _procs(self):
        for a in self.agents.values():
            yield a.name, a.proc
        for s in self.seds.values():
            yield s.name, s.proc
            for w in s.workers:
                yield w.name, w
        for c in self.clients:
            yield c.name, c.proc
        for n, p in list(self._main_procs()):
            if p.io is not None:
                yield n + "-io", p.io

    def _main_procs(self):
        for a in self.agents.values():
            yield a.name, a.proc
        for s in self.seds.values():
            yield s.name, s.proc
        for c in self.clients:
            yield c.name, c.proc

    def note_inbound(self, node, h: dict) -> None:
        self.inbound[node.name][h["type"]] += 1

    def record_discovery(self, user: User, latency: float, h: dict, ok: bool) -> None:
        if ok:
            self.discoveries.append(latency)
            first = h["servers"][0]["name"]
            s = self.sed_of.get(first)          # age of the chosen server's estimate (answered or pushed)
            t = s.answered_at.get(first) if s is not None else None
            if t is not None:
                self.freshness.append(self.sim.now - t)
            if h.get("view") is True:
                self.view_answers += 1
        else:
            self.discovery_failures += 1

    def record_call(self, user: User, total: float, call_only: float, ok: bool) -> None:
        if ok:
            self.calls.append(total)
            self.call_only.append(call_only)
        else:
            self.call_failures += 1

    def registered(self) -> bool:
        """Every SeD is known at the MA (directly or in a LA's subtree)."""
        ma = self.agents["MA"]
        count = 0
        for c in ma.state.registry.children.values():
            count += 1 if c.info.get("kind") == "sed" else sum(1 for e in c.elements if e.get("kind") == "sed")
        return count >= self.n_seds

    def wait_registered(self, limit: float = 30.0) -> float:
        step = 0.05
        while not self.registered():
            if self.sim.now > limit:
                raise RuntimeError(f"not every SeD registered after {limit} s of simulated time")
            self.sim.run(until=self.sim.now + step)
        return self.sim.now

    def summary(self) -> dict:
        dur = max(self.sim.now - self.t0, 1e-9)

        def q(xs, p):
            if not xs:
                return None
            s = sorted(xs)
            return s[min(len(s) - 1, int(p * len(s)))] * 1e3
        busy: dict[str, float] = {}
        for n, p in self._procs():          # an element's I/O thread counts as the element's CPU
            key = n[:-3] if n.endswith("-io") else n
            busy[key] = busy.get(key, 0.0) + (p.busy_time - self._busy0.get(n, 0.0)) / dur
        agents_in = {n: sum(self.inbound[n].values()) / dur for n in self.agents}
        ma_in = agents_in.get("MA", 0.0)
        las = [v for n, v in agents_in.items() if n != "MA"]
        kinds = collections.defaultdict(list)
        for n, b in busy.items():
            kinds[_kind_of(self, n)].append(b)
        return {
            "seconds": dur,
            "discoveries": len(self.discoveries), "discovery_failures": self.discovery_failures,
            "view_answers": self.view_answers, "views": self.views,
            "discovery_median_ms": q(self.discoveries, 0.5), "discovery_p99_ms": q(self.discoveries, 0.99),
            "calls": len(self.calls), "call_failures": self.call_failures,
            "throughput": len(self.calls) / dur if self.calls else len(self.discoveries) / dur,
            "call_median_ms": q(self.calls, 0.5), "call_p99_ms": q(self.calls, 0.99),
            "freshness_median_ms": q(self.freshness, 0.5),
            "ma_inbound_per_s": ma_in,
            "ma_inbound_by_type": {t: c / dur for t, c in self.inbound["MA"].items()},
            "la_inbound_per_s_max": max(las) if las else 0.0,
            "la_inbound_per_s_mean": statistics.fmean(las) if las else 0.0,
            "busy": busy,
            "busy_max_by_kind": {k: max(v) for k, v in kinds.items()},
            "ma_busy": busy.get("MA", 0.0),
            "events": self.sim.events,
        }


def _kind_of(world: World, name: str) -> str:
    if name in world.agents:
        return world.agents[name].kind
    if name in world.seds:
        return "sed"
    if name.endswith(tuple(f"-w{i}" for i in range(64))):
        return "worker"
    return "client"


# -- workloads ---------------------------------------------------------------------------
#: ``gridrpc loadtest``'s default ``--reuse-discovery`` (s): the window the measured load steps ran with
LOADTEST_REUSE = LoadConfig.reuse_discovery


def discovery_series(world: World, rounds: int = 300, warmup: int = 20, *, service: str = "noop", k: int = 3,
                     kind: str = "client", limit: float = 600.0) -> dict:
    """One client, ``rounds`` sequential discoveries after ``warmup`` (the
    scalability study's latency measurement)."""
    c = world.client("client", kind)
    box = {"n": 0}

    def done(user, _):
        box["n"] += 1
        if box["n"] == warmup:
            world.reset_stats()
    u = User(c, "u0", service=service, k=k, call=False, calls=rounds + warmup, think=None, user="u0", on_done=done)
    u.begin()
    end = world.sim.now + limit
    world.sim.run(until=end, stop=lambda: box["n"] >= rounds + warmup)
    return world.summary()


def closed_loop(world: World, users: int, *, seconds: float = 2.0, warmup: float = 0.3, service: str = "noop",
                k: int = 3, kind: str = "locust", clients: int = 1, think: float = 0.0, reuse: float = 0.0) -> dict:
    """``users`` users in ``clients`` client processes, each calling (discovery
    + call) back to back (``gridrpc loadtest``: closed loop, no wait).
    ``reuse``: the load generator's reuse window of view answers
    (``gridrpc loadtest --reuse-discovery``, :data:`LOADTEST_REUSE`); 0:
    every call asks the MA."""
    procs = [world.client(f"{kind}{i}" if clients > 1 else kind, kind, reuse) for i in range(clients)]
    tfn = (lambda rng: rng.expovariate(1.0 / think)) if think > 0 else None
    for i in range(users):
        c = procs[i % clients]
        u = User(c, f"u{i}", service=service, k=k, call=True, calls=None, think=tfn, user=f"user{i}")
        world.sim.after(world.rng.random() * 1e-3, u.begin)
    world.sim.run(until=world.sim.now + warmup)
    world.reset_stats()
    world.sim.run(until=world.sim.now + seconds)
    return world.summary()


def open_clients(world: World, n_clients: int, *, seconds: float, calls_per_client: float,
                 service: str = "noop", k: int = 3, client_procs: int = 100, call: bool = True,
                 warmup: float = 0.5) -> dict:
    """``n_clients`` clients, each calling ``calls_per_client`` times per
    ``seconds`` on average (exponential think times; first call at a random
    time), spread over ``client_procs`` client processes."""
    procs = [world.client(f"c{i}", "client") for i in range(min(client_procs, n_clients))]
    mean_think = seconds / max(calls_per_client, 1e-9)
    for i in range(n_clients):
        c = procs[i % len(procs)]
        u = User(c, f"u{i}", service=service, k=k, call=call, calls=None,
                 think=lambda rng: rng.expovariate(1.0 / mean_think), user=f"user{i}")
        world.sim.after(world.rng.random() * mean_think, u.begin)
    world.sim.run(until=world.sim.now + warmup)
    world.reset_stats()
    world.sim.run(until=world.sim.now + seconds)
    return world.summary()
