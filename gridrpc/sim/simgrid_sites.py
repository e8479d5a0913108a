"""Several sites on one SimGrid platform (``gridrpc sim run --engine simgrid
--platform deployments/sim/two-sites.xml``): one tree per site, its master
agents federated (the real :mod:`gridrpc.core.agent.federation`), data kept
on SeDs and moved between them over the platform's WAN (the real
:class:`gridrpc.core.datastore.DataStore` keeps each SeD process's books).

- **Sites** (:func:`sites_of`): the zones (``<zone>`` or ``<cluster>``)
  directly under the platform's root zone, each with its hosts; a platform
  whose root zone holds the hosts itself is one site. In a site the agents
  and the clients run on its first host, the SeD processes on the others in
  turn (:func:`spread`); every SeD has a worker process of its own.
- **Tree and federation**: per site the tree of ``--shape`` with the site's
  name in front of every element's (``lyon-MA``, ``lyon-LA1``,
  ``lyon-s1``); every MA has the other sites' MAs as peers. Every SeD
  offers ``produce``; only the first site's offer ``solve`` (the solver
  lives there): a discovery of ``solve`` at another site is forwarded to
  the first site's MA, and its client calls the remote SeD directly.
- **Data** (:class:`DataSedNode`, :class:`DataUser`): each user loops
  ``produce`` keeping its result on the SeD (``keep_result``: a
  reference, ``--data-size`` bytes, held in the SeD's ``DataStore``), then
  ``solve`` on that reference; a SeD that does not hold a reference asks
  its holder (DATA_GET) and runs the call when the DATA message, carrying
  the bytes, has arrived. A user of the first site moves its data inside
  its site; a user of another site across the WAN.

The figures are ``gridrpc sim run``'s (per site where they differ) and what
moved: federated discoveries, transfers, bytes between sites, transfer times.

This module builds the federated trees (:class:`FedAgentNode`,
:class:`SitesWorld`) and measures them (:func:`measure_sites`); the
platform's sites are read by :mod:`gridrpc.sim.simgrid_site_platform`
(:func:`sites_of`, :func:`spread`) and the data workload is
:mod:`gridrpc.sim.simgrid_site_data` (:class:`DataSedNode`,
:class:`DataUser`, :data:`SITE_SERVICES`); their names are importable from
here as before.
"""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import replace as dc_replace

from ..core.agent.machine import AgentState, FromPeer
from ..core.agent.vocabulary import SendPeer
from ..core.agent.roles import LocalRole, MasterRole
from ..core.messages import MsgType
from .agent_node import AgentNode
from .client_node import ClientNode, User
from .model import Costs
from .node import Out
from .simgrid_engine import SgWorld
from .simgrid_site_data import SITE_SERVICES, DataSedNode, DataUser
from .simgrid_site_platform import sites_of, spread
from .world import elements_for

__all__ = ["DataSedNode", "DataUser", "FedAgentNode", "SitesWorld", "measure_sites", "sites_of", "spread",
           "SITE_SERVICES"]


# -- elements ---------------------------------------------------------------------------
class FedAgentNode(AgentNode):
    """An MA federated with ``peers`` (other sites' MAs, by element name): its
    forwarded discoveries (``SendPeer``) go to them, their answers come back
    as ``FromPeer`` events, as the daemon's federation runtime delivers them."""

    def __init__(self, world, name: str, host, role, parent, *, seed: int, peers: tuple[str, ...], **kw) -> None:
        super().__init__(world, name, host, role, parent, seed=seed, **kw)
        self.peers = tuple(peers)
        self.peer_routes = {p.encode(): p for p in self.peers}
        # rebuild_time 0: every simulated tree starts at once, so a service no SeD registered is not
        # offered (the daemon's window after a restart would answer "rebuilding" instead of asking the peers)
        self.state = AgentState(dc_replace(self.state.config, peers=self.peers, rebuild_time=0.0), role,
                                random.Random(seed), info=dict(self.state.info))

    def _handle(self, src, h, out: Out) -> None:
        peer = self.peer_routes.get(src)
        if peer is not None and h["type"] in ("servers", "error"):
            self._apply(self.state.handle(FromPeer(peer, MsgType(h["type"]), h), self.world.sim.now), out)
            return
        super()._handle(src, h, out)

    def _apply(self, actions: list, out: Out) -> None:
        rest = []
        for a in actions:
            if type(a) is SendPeer:
                out.send(self.route, a.peer.encode(), a.header)
            else:
                rest.append(a)
        super()._apply(rest, out)



# -- the world -------------------------------------------------------------------------------
class SitesWorld(SgWorld):
    """A SimGrid world of one federated tree per site of the platform
    (:func:`sites_of`), built by :meth:`build_sites`."""

    def __init__(self, platform: str, *, sites: dict[str, list[str]] | None = None, **kw) -> None:
        self.sites = sites or sites_of(platform)
        self.element_site: dict[str, str] = {}
        self._places = {site: spread(hosts) for site, hosts in self.sites.items()}
        super().__init__(platform, placement=self._place, **kw)
        self.site_seds: dict[str, int] = {}
        self.client_site: dict[str, str] = {}

    def _place(self, kind: str, name: str) -> str:
        site = self.element_site.get(name)
        if site is None:
            raise ValueError(f"{name!r} belongs to no site")
        return self._places[site](kind, name)

    def site_of_sed(self, replica: str) -> str:
        return self.element_site[self.sed_of[replica].name]

    def build_sites(self, shape, seds: int, *, services: dict | None = None,
                    solver_site: str | None = None) -> "SitesWorld":
        """Per site the tree of ``shape`` with ``seds`` SeDs; ``solve`` offered at
        ``solver_site`` only (default: the first site), the other services everywhere."""
        services = dict(services or SITE_SERVICES)
        solver_site = solver_site or next(iter(self.sites))
        others = {k: v for k, v in services.items() if k != "solve"}
        seed = random.Random(self.seed)
        mas = {site: f"{site}-MA" for site in self.sites}
        starts = []
        for site in self.sites:
            prefix = f"{site}-"
            depth = {}
            for e in elements_for([int(x) for x in shape.split(",")] if isinstance(shape, str) and "," in shape
                                  else shape, seds):
                name = prefix + e.name
                parent = prefix + e.parent if e.parent else None
                self.element_site[name] = site
                depth[name] = 0 if parent is None else depth[parent] + 1
                host = self._host_for(e.kind, name, e.replicas)
                if e.kind in ("ma", "la"):
                    common = dict(seed=seed.randrange(2 ** 32), hb_interval=self.hb_interval,
                                  hb_timeout=self.hb_timeout, views=self.views, view_max_age=self.view_max_age)
                    if e.kind == "ma":
                        peers = tuple(mas[o] for o in self.sites if o != site)
                        node = FedAgentNode(self, name, host, MasterRole(), None, peers=peers, **common)
                    else:
                        node = AgentNode(self, name, host, LocalRole(), parent.encode(), **common)
                    self.agents[name] = node
                    self.routes[node.route] = node
                else:
                    width = len(str(e.replicas))
                    names = [name] if e.replicas == 1 else [f"{name}-{i:0{width}d}" for i in range(1, e.replicas + 1)]
                    node = DataSedNode(self, name, host, parent.encode(), names, seed=seed.randrange(2 ** 32),
                                       services=services if site == solver_site else others,
                                       workers=e.replicas, hb_interval=self.hb_interval, views=self.views)
                    self.seds[name] = node
                    for rname in node.by_name:
                        self.sed_of[rname] = node
                    for r in node.routes():
                        self.routes[r] = node
                    self.n_seds += e.replicas
                    self.site_seds[site] = self.site_seds.get(site, 0) + e.replicas
                starts.append((node, depth[name]))
        for node, d in starts:
            node.start(0.01 * d)
        return self

    def site_client(self, site: str, name: str, kind: str = "client") -> ClientNode:
        full = f"{site}-{name}"
        self.element_site[full] = site
        c = ClientNode(self, full, self._host_for(kind, full), f"{site}-MA".encode(), kind)
        self.routes[c.route] = c
        self.clients.append(c)
        self.client_site[c.name] = site
        return c

    def registered(self) -> bool:
        for site, n in self.site_seds.items():
            ma = self.agents[f"{site}-MA"]
            count = 0
            for c in ma.state.registry.children.values():
                count += 1 if c.info.get("kind") == "sed" else sum(1 for e in c.elements if e.get("kind") == "sed")
            if count < n:
                return False
        return True

    # -- measurements ------------------------------------------------------------------
    def reset_stats(self) -> None:
        super().reset_stats()
        self.transfers: list[float] = []
        self.transfer_bytes = 0
        self.wan_transfers = 0
        self.wan_bytes = 0
        self.wan_times: list[float] = []
        self.by_site: dict[str, dict[str, list]] = {}
        self.by_service: dict[str, list] = {}
        self._forwarded0 = {n: a.state.counters.forwarded for n, a in self.agents.items()}

    def note_transfer(self, node: DataSedNode, h: dict, seconds: float) -> None:
        n = int(h.get("size") or 0)
        self.transfers.append(seconds)
        self.transfer_bytes += n
        if self.site_of_sed(h["holder"]) != self.element_site[node.name]:
            self.wan_transfers += 1
            self.wan_bytes += n
            self.wan_times.append(seconds)

    def _site(self, user) -> dict:
        site = self.client_site.get(user.client.name, "?")
        return self.by_site.setdefault(site, {"discoveries": [], "calls": []})

    def record_discovery(self, user, latency: float, h: dict, ok: bool) -> None:
        super().record_discovery(user, latency, h, ok)
        if ok:
            self._site(user)["discoveries"].append(latency)

    def record_call(self, user, total: float, call_only: float, ok: bool) -> None:
        super().record_call(user, total, call_only, ok)
        if ok:
            self._site(user)["calls"].append(total)
            self.by_service.setdefault(user.service, []).append(call_only)

    def summary(self) -> dict:
        out = super().summary()
        dur = out["seconds"]
        mas = [f"{s}-MA" for s in self.sites]
        out["ma_busy"] = max(out["busy"].get(n, 0.0) for n in mas)
        out["ma_inbound_per_s"] = max(sum(self.inbound[n].values()) / dur for n in mas)
        out["federated_discoveries"] = sum(a.state.counters.forwarded - self._forwarded0.get(n, 0)
                                           for n, a in self.agents.items())
        out["transfers"] = len(self.transfers)
        out["transfer_bytes"] = self.transfer_bytes
        out["wan_transfers"] = self.wan_transfers
        out["wan_bytes"] = self.wan_bytes
        out["transfer_median_ms"] = statistics.median(self.transfers) * 1e3 if self.transfers else None
        out["wan_transfer_median_ms"] = statistics.median(self.wan_times) * 1e3 if self.wan_times else None
        out["calls_by_service"] = {k: len(v) for k, v in self.by_service.items()}
        out["call_median_ms_by_service"] = {k: statistics.median(v) * 1e3 for k, v in self.by_service.items() if v}
        sites = {}
        for site in self.sites:
            d = self.by_site.get(site, {"discoveries": [], "calls": []})
            ma = f"{site}-MA"
            sites[site] = {"hosts": len(self.sites[site]), "seds": self.site_seds.get(site, 0),
                           "discoveries": len(d["discoveries"]),
                           "discovery_median_ms": (statistics.median(d["discoveries"]) * 1e3
                                                   if d["discoveries"] else None),
                           "calls": len(d["calls"]), "calls_per_s": len(d["calls"]) / dur,
                           "ma_busy": out["busy"].get(ma, 0.0),
                           "ma_inbound_per_s": sum(self.inbound[ma].values()) / dur,
                           "forwarded": self.agents[ma].state.counters.forwarded - self._forwarded0.get(ma, 0)}
        out["sites"] = sites
        return out


def _sites_series(platform: str, kw: dict, shape, seds: int, rounds: int, skip: int = 5) -> dict:
    """Every site's client discovers ``solve`` ``rounds`` times in a row, the
    sites at once; the first ``skip`` of each site are not counted."""
    w = SitesWorld(platform, **kw).build_sites(shape, seds)
    w.wait_registered()
    w.sim.run(until=w.sim.now + 0.05)
    w.reset_stats()
    users = []
    for site in w.sites:
        c = w.site_client(site, "client")
        users.append(User(c, f"{site}-u0", service="solve", k=3, call=False, calls=rounds + skip, think=None,
                          user="u0"))
    for u in users:
        u.begin()
    expected = len(users) * (rounds + skip)
    w.sim.run(until=w.sim.now + 600.0, stop=lambda: all(u.left == 0 for u in users) and
              sum(len(d["discoveries"]) for d in w.by_site.values()) + w.discovery_failures >= expected)
    out = w.summary()
    counted = []
    for site, d in w.by_site.items():
        lat = d["discoveries"][skip:]
        counted += lat
        out["sites"][site]["discoveries"] = len(lat)
        out["sites"][site]["discovery_median_ms"] = statistics.median(lat) * 1e3 if lat else None
    counted.sort()
    out["discovery_median_ms"] = statistics.median(counted) * 1e3 if counted else None
    out["discovery_p99_ms"] = counted[min(len(counted) - 1, int(0.99 * len(counted)))] * 1e3 if counted else None
    return out


def _sites_loop(platform: str, kw: dict, shape, seds: int, users: int, seconds: float, warmup: float,
                data_size: float) -> dict:
    w = SitesWorld(platform, **kw).build_sites(shape, seds)
    w.wait_registered()
    for site in w.sites:
        c = w.site_client(site, "locust", "locust")
        for i in range(users):
            u = DataUser(c, f"{site}-u{i}", data_size=int(data_size), user=f"{site}-user{i}")
            w.sim.after(w.rng.random() * 1e-3, u.begin)
    w.sim.run(until=w.sim.now + warmup)
    w.reset_stats()
    w.sim.run(until=w.sim.now + seconds)
    return w.summary()


def measure_sites(platform: str, shape, seds: int, *, users: int = 8, seed: int = 1, costs: Costs | None = None,
                  rounds: int = 200, seconds: float = 1.5, warmup: float = 0.3, data_size: float = 1e6,
                  network_model: str = "CM02", cpu_sharing: str = "slice") -> dict:
    """``gridrpc sim run``'s figures for a platform of several sites: the
    sequential discoveries of ``solve`` from every site (local at the solver's
    site, federated elsewhere), then ``users`` closed-loop users per site
    running ``produce`` + ``solve`` on the kept data for ``seconds``; each in
    a SimGrid run of its own (child processes)."""
    from .simgrid_isolate import run_isolated
    kw = dict(costs=costs or Costs.load(None), seed=seed, network_model=network_model, cpu=cpu_sharing)
    t = time.perf_counter()
    d = run_isolated(_sites_series, platform, kw, shape, seds, rounds)
    c = run_isolated(_sites_loop, platform, kw, shape, seds, users, seconds, warmup, data_size)
    sites = {s: {**c["sites"][s], "discovery_median_ms": d["sites"][s]["discovery_median_ms"],
                 "discoveries": d["sites"][s]["discoveries"]} for s in c["sites"]}
    return {"seds": seds, "shape": shape, "sites": sites,
            "discovery_median_ms": d["discovery_median_ms"], "discovery_p99_ms": d["discovery_p99_ms"],
            "calls_per_s": c["throughput"], "call_p99_ms": c["call_p99_ms"], "ma_busy": c["ma_busy"],
            "busiest": max(c["busy"], key=c["busy"].get), "ma_inbound_per_s": c["ma_inbound_per_s"],
            "federated_discoveries": d["federated_discoveries"] + c["federated_discoveries"],
            "calls_by_service": c["calls_by_service"], "call_median_ms_by_service": c["call_median_ms_by_service"],
            "call_failures": c["call_failures"],
            "discovery_failures": d["discovery_failures"] + c["discovery_failures"],
            "transfers": c["transfers"], "transfer_bytes": c["transfer_bytes"], "wan_transfers": c["wan_transfers"],
            "wan_bytes": c["wan_bytes"], "transfer_median_ms": c["transfer_median_ms"],
            "wan_transfer_median_ms": c["wan_transfer_median_ms"],
            "engine": "simgrid", "platform": platform, "network_model": network_model, "cpu_sharing": cpu_sharing,
            "wall_s": time.perf_counter() - t}
