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

``master_agent`` may also be a list of MA entries (unique names): they are
one redundant root, active-active (docs/reliability.md): an LA or SeD whose
``parent`` names any of them is attached to all of them (``--parent a,b``),
and clients are given every MA's address, comma-separated. An MA entry may
list ``peers`` (MAs of other trees, federation: ``gridrpc ma --peer``) with
``peer_keys`` (security on: one per peer, same order), ``peer_hops`` and
``peer_busy_wait``; ``view: false`` (every discovery by the fan-out) and
``view_max_age`` (``gridrpc ma --no-view`` / ``--view-max-age``). An LA entry
may say ``view: false`` (``gridrpc la --no-view``).

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

The whole file is validated before anything starts (:mod:`.schema`:
pydantic models plus the cross-entry rules); every problem is reported at
once, each with the file, the line and the field::

    local.yaml:7: seds[0].queue (SeD sed-1): unknown queue policy 'fcsf'; known: ethic, fcfs
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from . import schema

LOCAL_HOSTS = ("localhost", "local", "127.0.0.1")
DEFAULT_ORPHAN_TIMEOUT = 30.0
_UNSET = object()


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
    security: bool = False             # CurveZMQ on every link (default: on when a host is not loopback)
    keys_dir: str | None = None        # the key directory (None: the state directory's keys/)
    allow_insecure: bool = False       # security off on non-loopback hosts, explicitly
    deploy_user: str | None = None     # the user key the deploy command uses
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
        """The first master agent (the only one, usually)."""
        return self.elements[0]

    @property
    def mas(self) -> list[ElementSpec]:
        """Every master agent, in file order. Several are one redundant root
        (active-active): every child of one is attached to all of them."""
        return [e for e in self.elements if e.kind == "ma"]

    def parents_of(self, e: ElementSpec) -> list[str]:
        """The names of the agents ``e`` attaches to: all the master agents
        when its ``parent`` names one of them, else its parent."""
        if e.parent is None:
            return []
        mas = [m.name for m in self.mas]
        return mas if e.parent in mas else [e.parent]

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
    """Read and validate a deployment file; ConfigError names file, line and field."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"deployment file {p} not found")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read deployment file {p}: {exc}") from exc
    try:
        data, lines = schema.load_yaml(text, str(p))
    except yaml.YAMLError as exc:
        raise ConfigError(schema.yaml_error_text(exc, str(p))) from None
    return parse(data, name=p.stem, path=str(p.resolve()), lines=lines, source=str(p))


def _orphan(model, raw: Any):
    """An ``orphan_timeout`` as the dataclasses keep it: _UNSET when absent."""
    if not isinstance(raw, dict) or "orphan_timeout" not in raw:
        return _UNSET
    return model.orphan_timeout


def parse(data: Any, *, name: str = "deployment", path: str | None = None,
          lines: "schema.Lines | None" = None, source: str | None = None) -> DeploymentSpec:
    """Validate ``data`` (a deployment file's content) into a DeploymentSpec.
    ``lines``/``source`` (from :func:`load`) put file and line in the errors."""
    checked, problems = schema.check(data, lines)
    if problems:
        raise ConfigError(schema.format_problems(problems, data, lines, source))
    hosts = {"localhost": HostSpec(name="localhost")}
    for hname, h in checked.hosts.items():
        raw = data["hosts"][hname] if hname in data["hosts"] else data["hosts"].get(_key_of(data["hosts"], hname))
        launcher = h.launcher or ("ssh" if h.ssh else "slurm" if h.node else "local")
        address = h.address or (h.ssh.rsplit("@", 1)[-1] if h.ssh else h.node or "127.0.0.1")
        hosts[hname] = HostSpec(
            name=hname, launcher=launcher, address=str(address), ssh=h.ssh, port=h.port,
            key=h.key, known_hosts=h.known_hosts, python=h.python, venv=h.venv, workdir=h.workdir,
            env=dict(h.env), ssh_options=tuple(h.ssh_options), wrapper=tuple(h.wrapper), node=h.node,
            user=h.user, ssh_config=h.ssh_config, connect_timeout=h.connect_timeout,
            orphan_timeout=_orphan(h, raw), srun_args=tuple(h.srun_args), ssh_multiplex=h.ssh_multiplex)
    elements = []
    for ma in checked.master_agents:
        options = {"peers": list(ma.peers)} if ma.peers else {}
        if ma.peer_keys is not None:
            options["peer_keys"] = list(ma.peer_keys)
        if ma.peer_hops is not None:
            options["peer_hops"] = ma.peer_hops
        if ma.peer_busy_wait is not None:
            options["peer_busy_wait"] = ma.peer_busy_wait
        if ma.view is not None:
            options["view"] = ma.view
        if ma.view_max_age is not None:
            options["view_max_age"] = ma.view_max_age
        if ma.cpus is not None:
            options["cpus"] = ma.cpus
        elements.append(ElementSpec(name=ma.name, kind="ma", host=ma.host, port=ma.port, http_port=ma.http_port,
                                    options=options))
    for la, raw in zip(checked.local_agents, data.get("local_agents") or []):
        ot = _orphan(la, raw)
        options = {} if ot is _UNSET else {"orphan_timeout": ot}
        if la.view is not None:
            options["view"] = la.view
        if la.cpus is not None:
            options["cpus"] = la.cpus
        elements.append(ElementSpec(name=la.name, kind="la", host=la.host, parent=la.parent, port=la.port,
                                    options=options))
    for sed, raw in zip(checked.seds, data.get("seds") or []):
        options = {k: v for k, v in raw.items() if k not in ("name", "parent", "host", "port")}
        for key in ("services", "examples", "max_concurrent", "queue", "replicas", "workers", "prestart_workers",
                    "cpus", "isolation", "kill_grace", "gather", "kind", "args", "scheduler", "partition"):
            if key in raw:
                options[key] = getattr(sed, key)            # validated values (ints are ints, ...)
        if "orphan_timeout" in raw:
            options["orphan_timeout"] = sed.orphan_timeout
        elements.append(ElementSpec(name=sed.name, kind="sed", host=sed.host, parent=sed.parent, port=sed.port,
                                    options=options))
    hb = checked.heartbeat
    sec = checked.security
    remote = any(not _loopback_host(hosts, e.host) for e in elements)
    secure = remote if sec.enabled is None else sec.enabled
    if remote and not secure and not sec.allow_insecure:
        raise ConfigError(f"{path or name}: security: enabled: false on hosts that are not loopback needs "
                          "'allow_insecure: true' too (anyone reaching the ports could join the tree and "
                          "run calls); see docs/security.md")
    if secure:
        missing = [schema.Problem(loc + ("peers",), "with security on, each peer needs its public key: "
                                  "peer_keys: [...] (same order as peers; an element name in the key "
                                  "directory, a .key file, or the key itself)")
                   for (loc, _), ma in zip(schema.ma_entries(data), checked.master_agents)
                   if ma.peers and ma.peer_keys is None]
        if missing:
            raise ConfigError(schema.format_problems(missing, data, lines, source))
    spec = DeploymentSpec(name=str(checked.top.name or name), elements=tuple(elements), hosts=hosts,
                          security=secure, keys_dir=sec.keys, allow_insecure=sec.allow_insecure,
                          deploy_user=sec.user,
                          aggregator_plugins=tuple(checked.plugins.aggregators),
                          hb_interval=hb.interval, hb_timeout=hb.timeout,
                          path=path, orphan_timeout=_orphan(checked.top, data), raw=data)
    spec.ordered()
    return spec


def _key_of(mapping: dict, text: str):
    """The original key (maybe not a str in YAML) whose text is ``text``."""
    return next((k for k in mapping if str(k) == text), text)


def _loopback_host(hosts: dict, host: str) -> bool:
    from ..transport.security import is_loopback
    if host in LOCAL_HOSTS:
        return True
    h = hosts.get(host)
    return h is not None and is_loopback(h.address)      # what the sockets bind decides, not the launcher
