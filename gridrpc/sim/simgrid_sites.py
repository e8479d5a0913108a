"""Several sites on one SimGrid platform (``gridrpc sim run --engine simgrid
--platform deployments/sim/two-sites.xml``): one tree per site, its master
agents federated (the real :mod:`gridrpc.core.agent_federation`), data kept
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
"""
from __future__ import annotations

import random
import statistics
import time
import xml.etree.ElementTree as ET
from dataclasses import replace as dc_replace

from ..core import call as cm
from ..core import messages as m
from ..core.agent import AgentState, FromPeer
from ..core.agent_events import SendPeer
from ..core.agent_roles import LocalRole, MasterRole
from ..core.datastore import DataError, DataStore, Mode
from ..core.messages import MsgType
from ..core.sed_calls import CallState
from .agent_node import AgentNode
from .client_node import ClientNode, User
from .model import NOOP, Costs, ServiceModel
from .node import Out
from .sed_node import SedNode
from .simgrid_engine import SgWorld
from .world import elements_for

__all__ = ["DataSedNode", "DataUser", "FedAgentNode", "SitesWorld", "measure_sites", "sites_of", "spread",
           "SITE_SERVICES"]

#: the services of the workflow: ``produce`` keeps its result, ``solve`` reads it (CPU-bound, seconds)
SITE_SERVICES = {"produce": ServiceModel(mean=0.02), "solve": ServiceModel(mean=0.05), "noop": NOOP}


# -- the platform's sites ----------------------------------------------------------------
def _radical(text: str) -> list[str]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            out += [str(i) for i in range(int(lo), int(hi) + 1)]
        elif part:
            out.append(part)
    return out


def _hosts_in(el) -> list[str]:
    out = []
    for child in el:
        tag = child.tag
        if tag == "host":
            out.append(child.get("id"))
        elif tag == "cluster":
            prefix, suffix = child.get("prefix", ""), child.get("suffix", "")
            out += [f"{prefix}{i}{suffix}" for i in _radical(child.get("radical", ""))]
        elif tag == "zone":
            out += _hosts_in(child)
    return out


def sites_of(platform: str) -> dict[str, list[str]]:
    """Site name -> its hosts, in the file's order: the zones and clusters
    directly under the root zone that hold hosts; the root zone itself when
    it holds hosts directly (one site)."""
    root = ET.parse(platform).getroot()
    top = [c for c in root if c.tag in ("zone", "AS", "cluster")]
    if len(top) != 1:
        raise ValueError(f"{platform}: one root zone expected, found {len(top)}")
    zone = top[0]
    if zone.tag == "cluster":
        return {zone.get("id"): _hosts_in(_wrap(zone))}
    direct = [c.get("id") for c in zone if c.tag == "host"]
    sites = {}
    for c in zone:
        if c.tag in ("zone", "AS", "cluster"):
            hosts = _hosts_in(_wrap(c)) if c.tag == "cluster" else _hosts_in(c)
            if hosts:
                sites[c.get("id")] = hosts
    if direct or not sites:
        return {zone.get("id"): direct + [h for hs in sites.values() for h in hs]}
    return sites


def _wrap(cluster):
    w = ET.Element("zone")
    w.append(cluster)
    return w


def spread(hosts: list[str]):
    """A placement over one site's hosts: agents and clients on the first,
    SeD processes on the others in turn (on the first too when it is alone)."""
    seds = hosts[1:] or hosts[:1]
    turn = {"n": 0}
    chosen: dict[str, str] = {}

    def place(kind: str, name: str) -> str:
        if kind != "sed":
            return hosts[0]
        h = chosen.get(name)
        if h is None:
            h = chosen[name] = seds[turn["n"] % len(seds)]
            turn["n"] += 1
        return h
    return place


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


class DataSedNode(SedNode):
    """A SeD process that keeps results by reference (its ``DataStore``) and
    fetches the references a call reads from their holders before running it."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.store = DataStore(memory_bytes=1 << 40)
        self.keep: dict[str, tuple[int, str]] = {}      # call id -> (bytes to keep, owner)
        self.reads: dict[str, list] = {}                # call id -> [(reference, holder)] it reads
        self.waiting: dict[str, list] = {}              # reference being fetched -> calls waiting for it
        self.asked_at: dict[str, float] = {}

    def handle(self, src, dst, h, out: Out) -> None:
        t = h["type"]
        if t == "data_get":
            self._on_get(src, dst, h, out)
            return
        if t == "data":
            self._on_data(h)
            return
        if t == "call" and h["id"] not in self.calls.live:
            if isinstance(h.get("keep"), (int, float)):
                self.keep[h["id"]] = (int(h["keep"]), h.get("user") or "anonymous")
            refs = [(r["ref"], r["holder"]) for r in h.get("refs") or ()
                    if isinstance(r, dict) and isinstance(r.get("ref"), str) and isinstance(r.get("holder"), str)]
            if refs:
                self.reads[h["id"]] = refs
        super().handle(src, dst, h, out)

    def _on_get(self, src, dst, h, out: Out) -> None:
        try:
            e = self.store.check(h["ref"], h.get("user"))
        except DataError as exc:
            out.send(dst, src, m.error_header(h["id"], "data_lost", str(exc)))
            return
        self.store.touch(h["ref"], self.world.sim.now)
        out.send(dst, src, m.make(MsgType.DATA, h["id"], ref=h["ref"], holder=dst.decode(), size=e.size,
                                  mode=e.mode.value, owner=e.owner))

    def _on_data(self, h: dict) -> None:
        ref, now = h["ref"], self.world.sim.now
        self.store.add(ref, h.get("owner") or "anonymous", Mode.VOLATILE, int(h.get("size") or 0), now)
        self.world.note_transfer(self, h, now - self.asked_at.pop(ref, now))
        for call in self.waiting.pop(ref, ()):
            call.missing.discard(ref)
            if not call.missing and call.state is CallState.RUNNING:
                SedNode._run(self, call, now)

    def _run(self, call, now: float) -> None:
        reads = self.reads.get(call.id, ())
        missing = {ref for ref, _ in reads if ref not in self.store}
        if not missing:
            super()._run(call, now)
            return
        call.missing = missing              # type: ignore[attr-defined]
        for ref, holder in reads:
            if ref not in missing:
                continue
            calls = self.waiting.setdefault(ref, [])
            if not calls:
                self.asked_at[ref] = now
                self.world.transmit(self, self.by_name[call.sed].route, holder.encode(), m.make(
                    MsgType.DATA_GET, f"{call.id}:{ref}", ref=ref, user=call.user, call=call.id))
            calls.append(call)

    def _finished(self, out: Out, call, gen: int, duration: float) -> None:
        n = len(out.sends)
        super()._finished(out, call, gen, duration)
        now = self.world.sim.now
        kept = self.keep.pop(call.id, None)
        for _, _, h in out.sends[n:]:
            if kept is not None and h["type"] == "result" and h["id"] == call.id:
                size, owner = kept
                self.store.add(call.id, owner, Mode.PERSISTENT, size, now)
                h["value"] = {"ref": call.id, "holder": call.sed, "size": size}
        for ref, _ in self.reads.pop(call.id, ()):
            self.store.used_once(ref, now)


class _CallFields:
    """An :class:`~gridrpc.sim.node.Out` that adds ``fields`` to the CALL messages sent through it."""
    __slots__ = ("out", "fields")

    def __init__(self, out: Out, fields: dict) -> None:
        self.out, self.fields = out, fields

    def send(self, src: bytes, dst: bytes, header: dict) -> None:
        if header.get("type") == "call":
            header.update(self.fields)
        self.out.send(src, dst, header)


class DataUser(User):
    """A user looping ``produce`` (its result kept on the SeD: ``keep`` bytes)
    then ``solve`` on that reference."""

    def __init__(self, client: ClientNode, uid: str, *, data_size: int, k: int = 3, user: str) -> None:
        super().__init__(client, uid, service="produce", k=k, call=True, calls=None, think=None, user=user)
        self.data_size = int(data_size)
        self.ref: dict | None = None

    def _do(self, actions: list, out: Out) -> None:
        for a in actions:
            if type(a) is cm.Done and self.service == "produce" and isinstance(a.value, dict):
                self.ref = a.value
        fields = {"keep": self.data_size} if self.service == "produce" else {"refs": [self.ref] if self.ref else []}
        super()._do(actions, _CallFields(out, fields))

    def next_round(self, out: Out) -> None:
        if self.service == "produce" and self.ref is not None:
            self.service = "solve"
        else:
            self.service, self.ref = "produce", None
        super().next_round(out)


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
    from .simgrid_engine import run_isolated
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
