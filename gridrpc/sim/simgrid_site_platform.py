"""The sites of a SimGrid platform file (:mod:`gridrpc.sim.simgrid_sites`):
:func:`sites_of` reads the zones (``<zone>`` or ``<cluster>``) directly
under the platform's root zone, each with its hosts (a platform whose root
zone holds the hosts itself is one site); :func:`spread` places a site's
processes on its hosts (agents and clients on the first, SeD processes on
the others in turn).
"""
from __future__ import annotations

import xml.etree.ElementTree as ET

__all__ = ["sites_of", "spread"]


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
