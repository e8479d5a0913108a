"""``gridrpc deploy plan``: a tree shape for N SeDs, from measured figures.

The model (see docs/deployment.md, "Planning a tree"): a discovery goes down
the tree and back; each agent forwards it to its children and aggregates
their answers, at a cost ``per_child`` per child; agents of one level work in
parallel on their own hosts, so only the largest fan-out of each level is on
the critical path; every extra agent level adds ``per_hop`` (an agent's own
receive/forward/aggregate/reply) plus one network round trip ``rtt``::

    latency = base + per_child * sum(max fan-out of level l) + (levels - 1) * (per_hop + rtt)

``base`` (client, MA and one SeD) does not depend on the shape. The figures
come from ``gridrpc deploy calibrate`` (:mod:`gridrpc.deploy.calibrate`);
:data:`DEFAULT_FIGURES` are built in; pass ``--figures FILE`` to use your own.
This module holds the model, the shapes and their placement on hosts.
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..cli.values import write_or_print
from ..errors import ConfigError

# From three runs of `gridrpc deploy calibrate --seds 50,100,200 --las 5,10 --rounds 60` on the
# development machine (2 vCPUs, Python 3.11, load average 14-18 from other jobs): CPU work of the
# in-process tree per discovery; see docs/deployment.md for the numbers.
DEFAULT_FIGURES = {
    "per_child": 90e-6,      # s per child of one agent (fits: 62, 87, 93 us; agent + child side)
    "per_hop": 50e-6,        # s per extra agent level, the LA's own work (fits: 0, 36, 185 us; noisy)
    "base": 0.2e-3,          # s: client + MA + one SeD (0.18-0.31 ms)
    "rtt": 200e-6,           # s per extra level: one LAN round trip (not measured: loopback)
    "source": "built-in: gridrpc deploy calibrate, 2 vCPU development machine",
}

PLAN_ONLY_HOST_KEYS = ("seds", "agents", "cores")


@dataclass
class Figures:
    per_child: float
    per_hop: float
    base: float = 0.0
    rtt: float = 0.0002
    source: str = ""
    samples: list = field(default_factory=list)

    @classmethod
    def load(cls, path: str | None) -> "Figures":
        if not path:
            return cls(**DEFAULT_FIGURES)
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read figures from {path}: {exc}") from None
        known = {k: data[k] for k in ("per_child", "per_hop", "base", "rtt", "source", "samples") if k in data}
        if "per_child" not in known or "per_hop" not in known:
            raise ConfigError(f"{path}: needs 'per_child' and 'per_hop' (seconds)")
        return cls(**known)


# -- the shape ----------------------------------------------------------------

@dataclass
class Shape:
    """Agents per level, top first (``[1]`` is a flat tree: the MA only)."""
    agents: list[int]
    seds: int

    @property
    def levels(self) -> int:
        return len(self.agents)

    def fanouts(self) -> list[int]:
        """The largest number of children of one agent, per level."""
        below = self.agents[1:] + [self.seds]
        return [math.ceil(b / a) for a, b in zip(self.agents, below)]

    def latency(self, f: Figures) -> float:
        return f.base + f.per_child * sum(self.fanouts()) + (self.levels - 1) * (f.per_hop + f.rtt)


def shape_for(n: int, levels: int) -> Shape:
    """Balanced shape with ``levels`` agent levels: fan-out ~ n ** (1/levels)."""
    fan = max(2, math.ceil(n ** (1.0 / levels) - 1e-9))
    agents, count = [], n
    for _ in range(levels - 1):
        count = math.ceil(count / fan)
        agents.append(count)
    agents.append(1)
    agents.reverse()
    # drop levels that collapsed to one agent under one agent
    out = [1] + [a for a in agents[1:] if a > 1]
    return Shape(agents=out, seds=n)


def best_shape(n: int, f: Figures, max_levels: int = 4, max_fanout: int | None = None,
               tolerance: float = 0.1, min_gain: float = 0.5e-3) -> tuple[Shape, list[tuple[Shape, float]]]:
    """The shape to use, and all candidates: among the shapes predicted within
    ``tolerance`` (relative) or ``min_gain`` (seconds) of the fastest, the one
    with the fewest agents (the figures are rough; fewer processes are
    cheaper to run and watch)."""
    if n < 1:
        raise ConfigError("--seds must be at least 1")
    cands, seen = [], set()
    for levels in range(1, max(1, max_levels) + 1):
        s = shape_for(n, levels)
        key = tuple(s.agents)
        if key in seen:
            continue
        seen.add(key)
        if max_fanout and max(s.fanouts()) > max_fanout:
            continue
        cands.append((s, s.latency(f)))
    if not cands:
        raise ConfigError(f"no shape with at most {max_levels} levels keeps the fan-out <= {max_fanout}")
    fastest = min(lat for _, lat in cands)
    near = [(s, lat) for s, lat in cands if lat <= fastest + max(fastest * tolerance, min_gain)]
    best = min(near, key=lambda sl: (sum(sl[0].agents), sl[1]))
    return best[0], cands


# -- placement ------------------------------------------------------------------

def _load_hosts(path: str) -> dict[str, dict]:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read hosts file {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    hosts = data.get("hosts") if isinstance(data, dict) and "hosts" in data else data
    if not isinstance(hosts, dict) or not hosts:
        raise ConfigError(f"{path}: expected a 'hosts:' mapping of host name -> settings")
    out = {}
    for name, h in hosts.items():
        h = dict(h or {})
        if "seds" in h and (not isinstance(h["seds"], int) or h["seds"] < 0):
            raise ConfigError(f"{path}: host {name}: 'seds' must be a number >= 0")
        names = expand_hosts(str(name), path)
        m = _RANGE.match(str(name))
        for one in names:
            if one in out:
                raise ConfigError(f"{path}: host {one} is named twice")
            if m:       # the same range in a string value (ssh: grid@node[1-3125]) takes this host's number
                num = one[len(m.group(1)):len(one) - len(m.group(4))]
                rng = f"[{m.group(2)}-{m.group(3)}]"
                out[one] = {k: v.replace(rng, num) if isinstance(v, str) else v for k, v in h.items()}
            else:
                out[one] = dict(h)
    return out


_RANGE = re.compile(r"^(.*)\[(\d+)-(\d+)\](.*)$")


def expand_hosts(name: str, path: str = "hosts file") -> list[str]:
    """``node[1-3125]`` -> ``node1`` ... ``node3125`` (Slurm's node-list
    syntax, one range; ``node[001-100]`` keeps the zeros): a planning file
    for thousands of alike hosts in one line (the same range in one of the
    host's string values becomes each host's number). Other names are
    themselves."""
    m = _RANGE.match(name)
    if not m:
        return [name]
    head, lo, hi, tail = m.groups()
    if int(lo) > int(hi):
        raise ConfigError(f"{path}: host range {name}: {lo} > {hi}")
    width = len(lo) if lo.startswith("0") else 0
    return [f"{head}{i:0{width}d}{tail}" for i in range(int(lo), int(hi) + 1)]


def _spread(n: int, hosts: dict[str, dict]) -> list[str]:
    """The host of each SeD, grouped by host. A host's ``seds`` is its share
    (e.g. its cores; default 1, 0 = no SeD there): SeDs are split in
    proportion, largest remainders first."""
    names = list(hosts)
    weights = {h: hosts[h].get("seds", 1) for h in names}
    total = sum(weights.values())
    if total <= 0:
        raise ConfigError("no host may run SeDs (every 'seds' is 0)")
    counts = {h: n * w // total for h, w in weights.items()}
    rest = n - sum(counts.values())
    for h in sorted(names, key=lambda h: -(n * weights[h] % total))[:rest]:
        counts[h] += 1
    return [h for h in names for _ in range(counts[h])]


def host_cores(name: str, settings: dict) -> int:
    """A host's cores: its ``cores`` key, else this machine's for ``localhost``, else 1."""
    c = settings.get("cores")
    if isinstance(c, int) and not isinstance(c, bool) and c >= 1:
        return c
    if name in ("localhost", "local", "127.0.0.1"):
        return os.cpu_count() or 1
    return 1


def _processes_per_group(groups: dict[tuple[str, str], int], hosts: dict[str, dict]) -> dict:
    """SeD processes for each (host, parent) group when packing: one process
    per core of the host (each element is one Python process: a node's cores
    are used by running several), shared between the host's groups in
    proportion to their SeDs, at least one each and never more than SeDs."""
    out = {}
    for h in {h for h, _ in groups}:
        mine = {k: n for k, n in groups.items() if k[0] == h}
        total = sum(mine.values())
        cores = min(host_cores(h, hosts.get(h, {})), total)
        for k, n in mine.items():
            out[k] = max(1, min(n, round(cores * n / total)))
    return out


def _split(n: int, k: int) -> list[int]:
    """``n`` SeDs in ``k`` processes of near-equal size."""
    q, r = divmod(n, k)
    return [q + (1 if j < r else 0) for j in range(k)]


def _blocks(items: list, k: int) -> list[list]:
    """Split into k contiguous blocks of near-equal size."""
    q, r = divmod(len(items), k)
    out, i = [], 0
    for j in range(k):
        size = q + (1 if j < r else 0)
        out.append(items[i:i + size])
        i += size
    return out


def plan(n: int, hosts: dict[str, dict], f: Figures, *, max_levels: int = 4, max_fanout: int | None = None,
         services: list[str] | None = None, name: str = "planned", ma_port: int = 5555,
         pack: bool = False, tolerance: float = 0.1, min_gain: float = 0.5e-3,
         model: str = "analytic", costs_file: str | None = None) -> tuple[dict, str]:
    """Return (deployment file data, explanation). ``model``: ``analytic``
    (the latency formula above) or ``sim`` (simulate every candidate with
    :mod:`gridrpc.sim` on these hosts, :func:`gridrpc.sim.plan.choose`)."""
    if model == "sim":
        from ..sim.plan import choose
        shape, sim_why = choose(n, hosts, max_levels=max_levels, max_fanout=max_fanout, tolerance=tolerance,
                                costs_file=costs_file, pack=pack)
        cands = []
    else:
        shape, cands = best_shape(n, f, max_levels, max_fanout, tolerance, min_gain)
        sim_why = None
    agent_hosts = [h for h, v in hosts.items() if v.get("agents", True)]
    if not agent_hosts:
        raise ConfigError("no host may run agents (every host has 'agents: false')")
    sed_hosts = _spread(n, hosts)

    # bottom-up: each agent of the last level gets a contiguous block of SeDs,
    # and lives on the host holding most of its block (when agents may run there)
    load = {h: 0 for h in agent_hosts}

    def place(children_hosts: list[str]) -> str:
        counts: dict[str, int] = {}
        for h in children_hosts:
            counts[h] = counts.get(h, 0) + 1
        for h, _ in sorted(counts.items(), key=lambda kv: -kv[1]):
            if h in load:
                load[h] += 1
                return h
        h = min(load, key=load.get)
        load[h] += 1
        return h

    # agents_by_level[l] = [(agent name, host, indexes of its children in level l+1)], 0 = the MA
    levels = shape.levels
    sed_idx = list(range(n))
    child_hosts = sed_hosts
    agents_by_level: list[list[tuple[str, str, list[int]]]] = [[] for _ in range(levels)]
    for lvl in range(levels - 1, -1, -1):
        level_agents = []
        for j, blk in enumerate(_blocks(list(range(len(child_hosts))), shape.agents[lvl])):
            host = agent_hosts[0] if lvl == 0 else place([child_hosts[i] for i in blk])
            aname = "MA" if lvl == 0 else f"LA{lvl}-{j + 1}" if levels > 2 else f"LA{j + 1}"
            level_agents.append((aname, host, blk))
        agents_by_level[lvl] = level_agents
        child_hosts = [h for _, h, _ in level_agents]

    # wire parents
    parent_of_sed: dict[int, str] = {}
    la_entries = []
    for lvl in range(levels):
        for aname, host, blk in agents_by_level[lvl]:
            if lvl == levels - 1:
                for i in blk:
                    parent_of_sed[i] = aname
            else:
                for ci in blk:
                    child = agents_by_level[lvl + 1][ci]
                    la_entries.append({"name": child[0], "parent": aname, "host": child[1]})
    ma_host = agents_by_level[0][0][1]

    svc = services or []

    def sed_common() -> dict:
        return {"services": list(svc)} if svc else {"examples": True}

    seds = []
    per_host_count: dict[str, int] = {}
    if pack:
        groups: dict[tuple[str, str], int] = {}
        for i in sed_idx:
            key = (sed_hosts[i], parent_of_sed[i])
            groups[key] = groups.get(key, 0) + 1
        procs = _processes_per_group(groups, hosts)
        for (h, p), cnt in groups.items():
            for part in _split(cnt, procs[(h, p)]):
                per_host_count[h] = per_host_count.get(h, 0) + 1
                seds.append({"name": f"sed-{h}-{per_host_count[h]}", "parent": p, "host": h, **sed_common(),
                             **({"replicas": part} if part > 1 else {})})
    else:
        for i in sed_idx:
            h = sed_hosts[i]
            per_host_count[h] = per_host_count.get(h, 0) + 1
            seds.append({"name": f"sed-{h}-{per_host_count[h]}", "parent": parent_of_sed[i], "host": h,
                         **sed_common()})

    out_hosts = {}
    for h, v in hosts.items():
        clean = {k: val for k, val in v.items() if k not in PLAN_ONLY_HOST_KEYS}
        if h in ("localhost", "local") and not clean:
            continue
        out_hosts[h] = clean
    data: dict = {"name": name}
    if out_hosts:
        data["hosts"] = out_hosts
    data["master_agent"] = {"name": "MA", "host": ma_host, "port": ma_port}
    if la_entries:
        data["local_agents"] = la_entries
    data["seds"] = seds

    def describe(s: Shape) -> str:
        return (f"{s.levels} agent level(s), agents per level {'+'.join(map(str, s.agents))}, "
                f"max fan-out per level {'/'.join(map(str, s.fanouts()))}")
    if sim_why is not None:
        return data, f"planned by 'gridrpc deploy plan --seds {n}' on {len(hosts)} host(s)\n" + sim_why
    lines = [f"planned by 'gridrpc deploy plan --seds {n}' on {len(hosts)} host(s)",
             "model: latency = base + per_child * sum(fan-out per level) + (levels-1) * (per_hop + rtt)",
             f"figures: per_child={f.per_child * 1e6:.0f}us per_hop={f.per_hop * 1e6:.0f}us "
             f"base={f.base * 1e3:.1f}ms rtt={f.rtt * 1e6:.0f}us ({f.source or 'figures file'})",
             f"choice: fewest agents among shapes within {tolerance:.0%} or {min_gain * 1e3:g} ms "
             "of the fastest prediction",
             "candidates:"]
    for s, lat in cands:
        mark = "  <- chosen" if s.agents == shape.agents else ""
        lines.append(f"  {describe(s)}: predicted discovery {lat * 1e3:.2f} ms{mark}")
    return data, "\n".join(lines)


_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-/@]*$")
_WORDS = {"yes", "no", "true", "false", "on", "off", "null", "y", "n"}   # read back as booleans/null, or quoted by yaml


def _flow_fast(v):
    """``v`` in YAML flow style as ``yaml.safe_dump`` writes it, for the
    values a planned file holds (names, numbers, booleans, lists and
    mappings of those); None for anything else (written by yaml then)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return v if _PLAIN.match(v) and v.lower() not in _WORDS else None
    if isinstance(v, list):
        parts = [_flow_fast(x) for x in v]
        return None if any(p is None for p in parts) else "[" + ", ".join(parts) + "]"
    if isinstance(v, dict):
        parts = []
        for k, x in v.items():
            fk, fx = _flow_fast(k) if isinstance(k, str) else None, _flow_fast(x)
            if fk is None or fx is None:
                return None
            parts.append(f"{fk}: {fx}")
        return "{" + ", ".join(parts) + "}"
    return None


def _flow(d) -> str:
    """One entry on one line; the fast path writes a 100,000-SeD plan in
    about a second, where yaml's emitter takes a minute."""
    fast = _flow_fast(d)
    if fast is not None:
        return fast
    return yaml.safe_dump(d, default_flow_style=True, width=10 ** 6, sort_keys=False).strip()


def dump_deployment(data: dict) -> str:
    """YAML in the style of deployments/*.yaml: one line per host and element."""
    out = [f"name: {data['name']}"]
    if data.get("heartbeat"):
        out.append(f"heartbeat: {_flow(data['heartbeat'])}")
    if data.get("hosts"):
        out.append("hosts:")
        out += [f"  {h}: {_flow(v)}" for h, v in data["hosts"].items()]
    out.append(f"master_agent: {_flow(data['master_agent'])}")
    for section in ("local_agents", "seds"):
        if data.get(section):
            out.append(f"{section}:")
            out += [f"  - {_flow(e)}" for e in data[section]]
    return "\n".join(out) + "\n"


def cmd_plan(a) -> int:
    from ..errors import GridRPCError
    try:
        f = Figures.load(a.figures)
        hosts = _load_hosts(a.hosts)
        services = None if a.services in ("examples", "", None) else [s.strip() for s in a.services.split(",") if s.strip()]
        name = a.name or (Path(a.output).stem if a.output else "planned")
        data, why = plan(a.seds, hosts, f, max_levels=a.max_levels, max_fanout=a.max_fanout,
                         services=services, name=name, ma_port=a.ma_port, pack=a.pack,
                         tolerance=a.tolerance, min_gain=a.min_gain / 1000.0,
                         model=getattr(a, "model", "analytic"), costs_file=getattr(a, "costs", None))
        from .spec import parse
        parse(json.loads(json.dumps(data)), name=name)   # what we write must load
    except GridRPCError as exc:
        print(f"gridrpc deploy plan: {exc}", file=sys.stderr)
        return 1
    text = "".join(f"# {line}\n" for line in why.splitlines()) + dump_deployment(data)
    if a.output:
        print(why, file=sys.stderr)     # also on stderr: the file holds it only as comments
    write_or_print(text, a.output)
    return 0
