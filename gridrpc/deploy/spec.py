"""Deployment files (YAML): parsed once into frozen dataclasses.

::

    master_agent: {name: MA, host: localhost, port: 5555, http_port: 8080}
    local_agents:
      - {name: LA1, parent: MA, host: localhost}
    seds:
      - {name: sed-1, parent: LA1, host: localhost, max_concurrent: 1, queue: fcfs,
         services: [gridrpc.examples.services:add]}
    hosts:
      node2: {ssh: root@node2, python: /opt/venv/bin/python, address: 10.0.0.2}

``host`` is ``localhost`` (this machine) or a key of ``hosts``. Each host may
give ``address`` (the IP elements bind and advertise; default 127.0.0.1 for
localhost, else the ssh host name or the Slurm node name), ``ssh`` (``host``
or ``user@host``), ``user``, ``port``, ``key``, ``known_hosts``,
``ssh_config``, ``connect_timeout``, ``python`` or ``venv``, ``workdir``,
``env``, ``ssh_options``, ``wrapper``, ``orphan_timeout``, or
``launcher: slurm`` with ``node``.

``orphan_timeout`` (seconds, or ``null`` for never) says how long an agent or
SeD keeps running once its parent is gone for good and nothing runs on it.
It is taken from the element, else its host, else the top-level
``orphan_timeout``, else :data:`DEFAULT_ORPHAN_TIMEOUT` for ssh and slurm
hosts (nothing for local ones). See docs/deployment.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError

LOCAL_HOSTS = ("localhost", "local", "127.0.0.1")
DEFAULT_ORPHAN_TIMEOUT = 30.0
_UNSET = object()
_HOST_KEYS = {"launcher", "address", "ssh", "user", "port", "key", "known_hosts", "ssh_config",
              "connect_timeout", "python", "venv", "workdir", "env", "ssh_options", "wrapper", "node",
              "orphan_timeout", "srun_args", "ssh_multiplex", "seds", "agents"}
_TOP_KEYS = {"master_agent", "local_agents", "seds", "hosts", "name", "heartbeat", "orphan_timeout",
             "plugins"}
_SED_KEYS = {"name", "parent", "host", "port", "services", "examples", "max_concurrent", "queue",
             "replicas", "workers", "isolation", "kill_grace", "kind", "orphan_timeout", "args",
             "scheduler", "partition", "options"}


@dataclass(frozen=True, kw_only=True)
class HostSpec:
    name: str
    launcher: str = "local"           # local | ssh | slurm
    address: str = "127.0.0.1"
    ssh: str | None = None
    port: int = 22
    key: str | None = None
    known_hosts: str | None = None
    python: str | None = None
    venv: str | None = None
    workdir: str | None = None
    env: dict = field(default_factory=dict)
    ssh_options: tuple = ()
    wrapper: tuple = ()
    node: str | None = None
    user: str | None = None
    ssh_config: str | None = None
    connect_timeout: float = 10.0
    orphan_timeout: object = _UNSET      # float | None | _UNSET (not given)
    srun_args: tuple = ()
    ssh_multiplex: bool = True

    @property
    def target(self) -> str | None:
        """The ssh destination, ``user@host`` when a user is given."""
        if not self.ssh:
            return None
        return self.ssh if "@" in self.ssh or not self.user else f"{self.user}@{self.ssh}"


@dataclass(frozen=True, kw_only=True)
class ElementSpec:
    name: str
    kind: str                          # ma | la | sed
    host: str = "localhost"
    parent: str | None = None
    port: int = 0
    http_port: int | None = None
    options: dict = field(default_factory=dict)   # kind-specific (services, queue, ...)


@dataclass(frozen=True, kw_only=True)
class DeploymentSpec:
    name: str
    elements: tuple[ElementSpec, ...]
    hosts: dict[str, HostSpec]
    hb_interval: float = 1.0
    hb_timeout: float = 3.0
    path: str | None = None
    orphan_timeout: object = _UNSET
    aggregator_plugins: tuple = ()     # 'pkg.mod:Class' registered on every agent at start
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    def host(self, name: str) -> HostSpec:
        return self.hosts["localhost" if name in LOCAL_HOSTS else name]

    def orphan_timeout_for(self, e: ElementSpec) -> float | None:
        """Element's ``orphan_timeout``, else its host's, else the deployment's,
        else 30 s on ssh/slurm hosts and none on local ones (MA: always none)."""
        if e.kind == "ma":
            return None
        for value in (e.options.get("orphan_timeout", _UNSET), self.host(e.host).orphan_timeout,
                      self.orphan_timeout):
            if value is not _UNSET:
                return None if value is None else float(value)
        return DEFAULT_ORPHAN_TIMEOUT if self.host(e.host).launcher in ("ssh", "slurm") else None

    @property
    def ma(self) -> ElementSpec:
        return self.elements[0]

    def element(self, name: str) -> ElementSpec:
        for e in self.elements:
            if e.name == name:
                return e
        raise ConfigError(f"no element named {name!r} in deployment {self.name!r}")

    def ordered(self) -> list[list[ElementSpec]]:
        """Levels, parents first: [[MA], [its children], ...]."""
        levels, placed = [], set()
        remaining = list(self.elements)
        while remaining:
            level = [e for e in remaining if e.parent is None or e.parent in placed]
            if not level:
                raise ConfigError("parent cycle among: " + ", ".join(e.name for e in remaining))
            levels.append(level)
            placed.update(e.name for e in level)
            remaining = [e for e in remaining if e.name not in placed]
        return levels


def load(path: str | Path) -> DeploymentSpec:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"deployment file {p} not found")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from exc
    return parse(data, name=p.stem, path=str(p.resolve()))


def _req(d: Any, what: str) -> dict:
    if not isinstance(d, dict):
        raise ConfigError(f"{what} must be a mapping, got {type(d).__name__}")
    return d


def _timeout(d: dict, what: str):
    """``orphan_timeout`` of a mapping: _UNSET when absent, None for null/never, else > 0."""
    if "orphan_timeout" not in d:
        return _UNSET
    v = d["orphan_timeout"]
    if v is None or v in ("never", "none", False):
        return None
    try:
        v = float(v)
    except (TypeError, ValueError):
        raise ConfigError(f"{what}: orphan_timeout must be a number of seconds or null") from None
    if v <= 0:
        raise ConfigError(f"{what}: orphan_timeout must be > 0 (or null for never)")
    return v


def parse(data: Any, *, name: str = "deployment", path: str | None = None) -> DeploymentSpec:
    data = _req(data, "the deployment file")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise ConfigError(f"unknown top-level keys: {', '.join(sorted(unknown))}")
    hosts = {"localhost": HostSpec(name="localhost")}
    for hname, h in (_req(data.get("hosts") or {}, "hosts")).items():
        h = _req(h, f"host {hname}")
        bad = set(h) - _HOST_KEYS
        if bad:
            raise ConfigError(f"host {hname}: unknown keys {', '.join(sorted(bad))}")
        launcher = h.get("launcher") or ("ssh" if h.get("ssh") else "slurm" if h.get("node") else "local")
        if launcher not in ("local", "ssh", "slurm"):
            raise ConfigError(f"host {hname}: launcher must be local, ssh or slurm")
        if launcher == "ssh" and not h.get("ssh"):
            raise ConfigError(f"host {hname}: 'ssh: user@host' is required for ssh hosts")
        address = h.get("address") or (str(h["ssh"]).rsplit("@", 1)[-1] if h.get("ssh") else
                                        h.get("node") or "127.0.0.1")
        hosts[hname] = HostSpec(
            name=hname, launcher=launcher, address=str(address), ssh=h.get("ssh"), port=int(h.get("port", 22)),
            key=h.get("key"), known_hosts=h.get("known_hosts"), python=h.get("python"), venv=h.get("venv"),
            workdir=h.get("workdir"), env={str(k): str(v) for k, v in (h.get("env") or {}).items()},
            ssh_options=tuple(str(o) for o in h.get("ssh_options") or ()),
            wrapper=tuple(str(w) for w in h.get("wrapper") or ()),
            node=h.get("node"), user=h.get("user"), ssh_config=h.get("ssh_config"),
            connect_timeout=float(h.get("connect_timeout", 10.0)),
            orphan_timeout=_timeout(h, f"host {hname}"),
            srun_args=tuple(str(a) for a in h.get("srun_args") or ()),
            ssh_multiplex=bool(h.get("ssh_multiplex", True)))
    hb = _req(data.get("heartbeat") or {}, "heartbeat")
    if not data.get("master_agent"):
        raise ConfigError("the deployment file needs a 'master_agent: {name: MA, host: ..., port: ...}' entry")
    ma = _req(data.get("master_agent"), "master_agent")
    bad = set(ma) - {"name", "host", "port", "http_port"}
    if bad:
        raise ConfigError(f"master_agent: unknown keys {', '.join(sorted(bad))}")
    elements = [ElementSpec(name=str(ma.get("name", "MA")), kind="ma", host=str(ma.get("host", "localhost")),
                            port=int(ma.get("port", 5555)), http_port=ma.get("http_port"))]
    for la in data.get("local_agents") or []:
        la = _req(la, "a local agent")
        if "name" not in la or "parent" not in la:
            raise ConfigError(f"local agent {la}: 'name' and 'parent' are required")
        bad = set(la) - {"name", "parent", "host", "port", "orphan_timeout"}
        if bad:
            raise ConfigError(f"local agent {la['name']}: unknown keys {', '.join(sorted(bad))}")
        la_ot = _timeout(la, f"local agent {la['name']}")
        elements.append(ElementSpec(name=str(la["name"]), kind="la", host=str(la.get("host", "localhost")),
                                    parent=str(la["parent"]), port=int(la.get("port", 0)),
                                    options={} if la_ot is _UNSET else {"orphan_timeout": la_ot}))
    for sed in data.get("seds") or []:
        sed = _req(sed, "a SeD")
        if "name" not in sed or "parent" not in sed:
            raise ConfigError(f"SeD {sed}: 'name' and 'parent' are required")
        bad = set(sed) - _SED_KEYS
        if sed.get("kind") == "cloud":        # keys and values checked by the cloud SeD's parser
            from ..sed.cloud.config import CLOUD_KEYS, parse_cloud_config
            bad -= CLOUD_KEYS
            parse_cloud_config({k: v for k, v in sed.items() if k in CLOUD_KEYS or k not in _SED_KEYS},
                               what=f"SeD {sed['name']}")
        if sed.get("kind") == "batch":        # batch SeD settings (docs/batch.md), checked here
            from ..sed.batch.config import BATCH_KEYS, batch_settings, parse_batch_config
            bad -= BATCH_KEYS
            if not bad:
                parse_batch_config(batch_settings(sed), what=f"SeD {sed['name']}")
        if bad:
            raise ConfigError(f"SeD {sed['name']}: unknown keys {', '.join(sorted(bad))}")
        sed_ot = _timeout(sed, f"SeD {sed['name']}")
        if not sed.get("services") and not sed.get("examples"):
            raise ConfigError(f"SeD {sed['name']}: give 'services: [module:function, ...]' (or 'examples: true')")
        elements.append(ElementSpec(name=str(sed["name"]), kind="sed", host=str(sed.get("host", "localhost")),
                                    parent=str(sed["parent"]), port=int(sed.get("port", 0)),
                                    options={k: (sed_ot if k == "orphan_timeout" else v) for k, v in sed.items()
                                             if k not in ("name", "parent", "host", "port")}))
    names = [e.name for e in elements]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ConfigError(f"element names must be unique: {', '.join(sorted(dup))}")
    agents = {e.name for e in elements if e.kind in ("ma", "la")}
    for e in elements:
        if e.parent is not None and e.parent not in agents:
            raise ConfigError(f"{e.name}: parent {e.parent!r} is not an agent of this deployment")
        if e.host not in hosts and e.host not in LOCAL_HOSTS:
            raise ConfigError(f"{e.name}: host {e.host!r} is not 'localhost' nor listed under hosts:")
    plugins = _req(data.get("plugins") or {}, "plugins")
    if set(plugins) - {"aggregators"}:
        raise ConfigError(f"plugins: unknown keys {', '.join(sorted(set(plugins) - {'aggregators'}))} "
                          "(known: aggregators)")
    aggs = plugins.get("aggregators") or []
    if not isinstance(aggs, list) or not all(isinstance(t, str) and ":" in t for t in aggs):
        raise ConfigError("plugins.aggregators must be a list of 'package.module:Class'")
    spec = DeploymentSpec(name=str(data.get("name") or name), elements=tuple(elements), hosts=hosts,
                          aggregator_plugins=tuple(aggs),
                          hb_interval=float(hb.get("interval", 1.0)), hb_timeout=float(hb.get("timeout", 3.0)),
                          path=path, orphan_timeout=_timeout(data, "the deployment"), raw=data)
    spec.ordered()
    return spec
