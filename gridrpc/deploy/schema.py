"""The schema of deployment files, checked whole before anything starts.

:func:`load_yaml` reads the YAML and remembers the line of every key and
value (PyYAML's node marks); :func:`check` validates every section with
pydantic models plus the rules pydantic cannot express (parents, unique
names, hosts, the settings of each kind of SeD by its own parser: see
:mod:`gridrpc.sed.backends.registry`), and
collects *every* problem; :func:`format_problems` turns them into one
message, one line per problem, each naming the file, the line and the field::

    deployments/x.yaml:7: seds[0].queue (SeD sed-1): unknown queue policy 'fcsf'; known: ethic, fcfs

The accepted format is the one of :mod:`gridrpc.deploy.spec` (its docstring
and ``docs/deployment.md``). The models of the sections and their value types
are in :mod:`gridrpc.deploy.schema_models`, the YAML reader in
:mod:`gridrpc.deploy.yaml_lines`; this module holds the check itself: unknown
keys, the models, the rules across entries, and the problems' text.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from ..errors import ConfigError
from .schema_models import (HeartbeatModel, HostModel, LocalAgentModel, MasterAgentModel, PluginsModel,
                            SecurityModel, SedModel, TopModel)
from .schema_models import (ArgList, Name, NonNegFloat, NonNegInt, OptionList, Orphan, Plugin,  # noqa: F401
                            PosFloat, PosInt, Port, Queue, Service, SshPort, Text)
from .yaml_lines import Lines, Loc
from .yaml_lines import load_yaml, yaml_error_text  # noqa: F401 - part of this module's interface

LOCAL_HOSTS = ("localhost", "local", "127.0.0.1")
TOP_KEYS = frozenset({"master_agent", "local_agents", "seds", "hosts", "name", "heartbeat", "orphan_timeout",
                      "plugins", "security"})
MA_KEYS = frozenset({"name", "host", "port", "http_port", "peers", "peer_keys", "peer_hops", "peer_busy_wait",
                     "view", "view_max_age", "cpus"})
LA_KEYS = frozenset({"name", "parent", "host", "port", "orphan_timeout", "view", "cpus"})
SED_KEYS = frozenset({"name", "parent", "host", "port", "services", "examples", "max_concurrent", "queue",
                      "replicas", "workers", "prestart_workers", "cpus", "isolation", "kill_grace", "gather", "kind", "orphan_timeout", "args",
                      "scheduler", "partition", "options", "result_cache_bytes", "max_message_size",
                      "allow", "groups", "max_calls_per_user", "data_memory_bytes", "data_disk_bytes",
                      "data_policy", "data_dir", "data_bytes_per_user"})
HOST_KEYS = frozenset({"launcher", "address", "ssh", "user", "port", "key", "known_hosts", "ssh_config",
                       "connect_timeout", "python", "venv", "workdir", "env", "ssh_options", "wrapper", "node",
                       "orphan_timeout", "srun_args", "ssh_multiplex", "seds", "agents"})
HEARTBEAT_KEYS = frozenset({"interval", "timeout"})
PLUGINS_KEYS = frozenset({"aggregators"})
SECURITY_KEYS = frozenset({"enabled", "keys", "allow_insecure", "user"})


# -- problems ------------------------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    loc: Loc
    message: str
    line: int | None = None          # when the path's own line is not the one (a duplicate key)


_TYPE_TEXT = {
    "int_parsing": "must be a whole number", "int_type": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number", "float_type": "must be a number",
    "bool_parsing": "must be a boolean (true or false)", "bool_type": "must be a boolean (true or false)",
    "string_type": "must be a string", "list_type": "must be a list", "dict_type": "must be a mapping",
    "model_type": "must be a mapping", "model_attributes_type": "must be a mapping",
    "missing": "is required",
}


def _message(err: dict) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "literal_error":
        text = f"must be {ctx.get('expected')}"
    elif kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[kind]
        bound = next(iter(ctx.values()), "?")
        text = f"must be {op} {bound}"
    elif kind == "value_error":
        text = str(ctx.get("error") or err["msg"]).removeprefix("Value error, ")
    else:
        text = _TYPE_TEXT.get(kind, err["msg"])
    if kind not in ("missing", "value_error") and "input" in err and not isinstance(err["input"], (dict, list)):
        text += f" (got {err['input']!r})"
    return text


def _validate(model: type[BaseModel], data: Any, loc: Loc, problems: list[Problem]):
    """``model`` from ``data``, or None with the problems appended (each with its full loc)."""
    if not isinstance(data, dict):
        problems.append(Problem(loc, "must be a mapping (key: value, ...)"))
        return None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            problems.append(Problem(loc + tuple(err["loc"]), _message(err)))
        return None


def _unknown(data: Any, known: frozenset, loc: Loc, problems: list[Problem]) -> None:
    """Unknown keys of one mapping: one problem, at the first one's line."""
    if not isinstance(data, dict):
        return
    bad = [k for k in data if k not in known]
    if not bad:
        return
    hints = []
    for k in bad:
        close = difflib.get_close_matches(str(k), sorted(known), n=1, cutoff=0.75)
        if close:
            hints.append(close[0] if len(bad) == 1 else f"{k} -> {close[0]}")
    text = f"unknown keys {', '.join(str(k) for k in bad)}"
    text += f" (did you mean {'; '.join(hints)}?)" if hints else f"; known: {', '.join(sorted(known))}"
    problems.append(Problem(loc + (bad[0],), text))


def _list(data: Any, key: str, problems: list[Problem]) -> list:
    v = data.get(key)
    if v is None:
        return []
    if not isinstance(v, list):
        problems.append(Problem((key,), "must be a list of entries (- {name: ..., parent: ...})"))
        return []
    return v


def ma_entries(data: dict) -> list[tuple[Loc, Any]]:
    """The master agents' entries and their locations: ``master_agent:`` is
    one mapping (``("master_agent",)``) or a list of them (``("master_agent", i)``)."""
    raw = data.get("master_agent")
    if isinstance(raw, list):
        return [(("master_agent", i), e) for i, e in enumerate(raw)]
    return [] if raw is None else [(("master_agent",), raw)]


@dataclass
class Checked:
    """What :func:`check` validated (models; None where an entry was invalid)."""
    top: TopModel | None
    heartbeat: HeartbeatModel | None
    plugins: PluginsModel | None
    security: SecurityModel | None
    master_agents: list[MasterAgentModel | None]
    local_agents: list[LocalAgentModel | None]
    seds: list[SedModel | None]
    hosts: dict[str, HostModel | None]

    @property
    def master_agent(self) -> MasterAgentModel | None:
        """The first master agent (the only one of a file with one)."""
        return self.master_agents[0] if self.master_agents else None


def check(data: Any, lines: Lines | None = None) -> tuple[Checked | None, list[Problem]]:
    """Validate a whole deployment file's data; every problem at once."""
    problems: list[Problem] = []
    for loc, line, first in (lines.duplicates if lines is not None else []):
        problems.append(Problem(loc, f"duplicate key (also on line {first}; YAML would keep only the last)",
                                line=line))
    if not isinstance(data, dict):
        what = "empty" if data is None else f"a {type(data).__name__}"
        return None, [Problem((), f"a deployment file is a mapping with at least 'master_agent:'; this one is {what}")]
    _unknown(data, TOP_KEYS, (), problems)
    top = _validate(TopModel, {k: v for k, v in data.items() if k in ("name", "orphan_timeout")}, (), problems)
    hb = _validate(HeartbeatModel, data.get("heartbeat") or {}, ("heartbeat",), problems)
    _unknown(data.get("heartbeat"), HEARTBEAT_KEYS, ("heartbeat",), problems)
    plugins = _validate(PluginsModel, data.get("plugins") or {}, ("plugins",), problems)
    _unknown(data.get("plugins"), PLUGINS_KEYS, ("plugins",), problems)
    security = _validate(SecurityModel, data.get("security") or {}, ("security",), problems)
    _unknown(data.get("security"), SECURITY_KEYS, ("security",), problems)

    hosts: dict[str, HostModel | None] = {}
    raw_hosts = data.get("hosts") or {}
    if not isinstance(raw_hosts, dict):
        problems.append(Problem(("hosts",), "must be a mapping of host names to their settings"))
        raw_hosts = {}
    for hname, h in raw_hosts.items():
        _unknown(h, HOST_KEYS, ("hosts", hname), problems)
        hosts[str(hname)] = _validate(HostModel, h if h is not None else {}, ("hosts", hname), problems)

    mas = []
    if isinstance(data.get("master_agent"), list) and not data["master_agent"]:
        problems.append(Problem(("master_agent",), "an empty list: give at least one master agent "
                                                   "(- {name: MA1, host: ..., port: ...})"))
    elif not data.get("master_agent"):
        problems.append(Problem(("master_agent",), "the deployment file needs a 'master_agent: "
                                                   "{name: MA, host: ..., port: ...}' entry (or a list of them)"))
    for loc, entry in ma_entries(data):
        _unknown(entry, MA_KEYS, loc, problems)
        model = _validate(MasterAgentModel, entry, loc, problems)
        mas.append(model)
        if model is not None and model.peer_keys is not None and len(model.peer_keys) != len(model.peers):
            problems.append(Problem(loc + ("peer_keys",), f"{len(model.peer_keys)} key(s) for "
                                    f"{len(model.peers)} peer(s): give one key per peer, in the order of peers"))
        if model is not None and model.peer_hops is not None and not model.peers:
            problems.append(Problem(loc + ("peer_hops",), "peer_hops without peers: list the master agents "
                                                          "of the other trees in 'peers:'"))

    las = []
    for i, la in enumerate(_list(data, "local_agents", problems)):
        _unknown(la, LA_KEYS, ("local_agents", i), problems)
        las.append(_validate(LocalAgentModel, la, ("local_agents", i), problems))

    seds = []
    for i, sed in enumerate(_list(data, "seds", problems)):
        loc = ("seds", i)
        kind = _sed_kind(sed)
        if kind is None or not kind.names_unknown_keys:     # else its own parser names them
            _unknown(sed, SED_KEYS | (kind.keys if kind is not None else frozenset()), loc, problems)
        model = _validate(SedModel, sed, loc, problems)
        seds.append(model)
        if kind is not None and kind.check_entry is not None:
            _kind_settings(sed, kind, loc, problems)

    checked = Checked(top=top, heartbeat=hb, plugins=plugins, security=security, master_agents=mas,
                      local_agents=las, seds=seds,
                      hosts=hosts)
    _relations(data, checked, problems)
    return checked, problems


def _sed_kind(sed: Any):
    """The registered kind of a SeD entry (:mod:`gridrpc.sed.backends.registry`);
    None when the entry is not a mapping or its ``kind`` is unknown (the model
    reports that)."""
    from ..sed.backends.registry import DEFAULT_KIND, get_kind, kind_names
    if not isinstance(sed, dict):
        return None
    name = sed.get("kind") or DEFAULT_KIND
    return get_kind(name) if isinstance(name, str) and name in kind_names() else None


def _kind_settings(sed: dict, kind, loc: Loc, problems: list[Problem]) -> None:
    """The settings of a kind of SeD (batch, cloud...), checked by its own parser (one source of truth)."""
    what = f"SeD {sed.get('name')}"
    if not kind.names_unknown_keys and set(sed) - SED_KEYS - kind.keys:
        return                                   # reported as unknown keys already
    try:
        kind.check_entry(kind.settings(sed, SED_KEYS), what)
    except ConfigError as exc:
        text = str(exc)
        problems.append(Problem(loc + (_key_named(text, sed, what),), text))


def _key_named(text: str, entry: dict, what: str) -> str:
    """The key of ``entry`` an error message is about (for its line)."""
    body = text.removeprefix(what + ":").strip()
    best = None
    for k in entry:
        # "scheduler_options" is also named as "scheduler option": words apart, singular
        words = r"[ _]".join(re.escape(w) for w in str(k).split("_"))
        if str(k).endswith("s") and "_" in str(k):
            words += "?"
        m = re.search(rf"(?<![\w]){words}(?![\w])", body)
        # the earliest mention; at one place, the longest key ("scheduler_options", not "scheduler")
        if m and (best is None or (m.start(), -len(m.group())) < best[0]):
            best = ((m.start(), -len(m.group())), k)
    return best[1] if best else "name"


def _relations(data: dict, c: Checked, problems: list[Problem]) -> None:
    """Rules across entries: unique names, parents are agents, hosts exist."""
    entries: list[tuple[Loc, Any]] = [(loc, e) for loc, e in ma_entries(data) if isinstance(e, dict)]
    any_ma = bool(entries)
    for section in ("local_agents", "seds"):
        if isinstance(data.get(section), list):
            entries += [((section, i), e) for i, e in enumerate(data[section]) if isinstance(e, dict)]
    seen: dict[str, Loc] = {}
    agents = {str(e.get("name", "MA")) for loc, e in entries if loc[0] in ("master_agent", "local_agents")}
    if not any_ma:
        agents.add("MA")                     # reported missing already: no parent errors because of it
    hosts = {str(h) for h in (data.get("hosts") or {})} if isinstance(data.get("hosts"), dict) else set()
    for loc, e in entries:
        name = str(e.get("name", "MA" if loc[0] == "master_agent" else ""))
        if name in seen:
            hint = (" (each master agent needs its own name)"
                    if loc[0] == "master_agent" and seen[name][0] == "master_agent" else "")
            problems.append(Problem(loc + ("name",), f"element names must be unique: {name} is also "
                                                     f"{_field(seen[name])}{hint}"))
        else:
            seen[name] = loc
        if loc[0] != "master_agent" and "parent" in e and str(e["parent"]) not in agents:
            problems.append(Problem(loc + ("parent",), f"parent {str(e['parent'])!r} is not an agent of this "
                                                       f"deployment (agents: {', '.join(sorted(agents))})"))
        host = str(e.get("host", "localhost"))
        if host not in hosts and host not in LOCAL_HOSTS:
            problems.append(Problem(loc + ("host",), f"host {host!r} is not 'localhost' nor listed under hosts:"))
    _ma_ports(entries, problems)
    # parent cycles (LAs only can form one)
    parent = {str(e["name"]): str(e["parent"]) for loc, e in entries
              if loc[0] == "local_agents" and "name" in e and "parent" in e}
    for start in parent:
        cur, steps = start, 0
        while cur in parent and steps <= len(parent):
            cur, steps = parent[cur], steps + 1
            if cur == start:
                i = next(i for (sec, i), e in [(loc, e) for loc, e in entries if loc[0] == "local_agents"]
                         if str(e.get("name")) == start)
                problems.append(Problem(("local_agents", i, "parent"), f"parent cycle through {start}"))
                break


def _ma_ports(entries: list[tuple[Loc, Any]], problems: list[Problem]) -> None:
    """Two master agents binding one port of one host (a copied entry)."""
    taken: dict[tuple[str, int], tuple[Loc, str]] = {}
    for loc, e in entries:
        if loc[0] != "master_agent":
            continue
        host = str(e.get("host", "localhost"))
        host = "localhost" if host in LOCAL_HOSTS else host
        for key, default in (("port", 5555), ("http_port", None)):
            port = e.get(key, default)
            if not isinstance(port, int) or isinstance(port, bool) or port == 0:
                continue                     # port 0: any free port; bad values are reported already
            if (host, port) in taken:
                other, other_key = taken[(host, port)]
                default = "" if key in e else " (the default port)"
                problems.append(Problem(loc + (key if key in e else "name",),
                                        f"{key} {port}{default} on host {host} is taken by {_field(other)} "
                                        f"({other_key}): master agents on one host need their own ports "
                                        "(0: any free port)"))
            else:
                taken[(host, port)] = (loc, key)


def _field(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def format_problems(problems: list[Problem], data: Any, lines: Lines | None, source: str | None) -> str:
    """One line per problem: ``FILE:LINE: FIELD (ELEMENT): message``, in file order."""
    def element(loc: Loc) -> str:
        if len(loc) >= 2 and loc[0] == "master_agent" and isinstance(loc[1], int):
            try:
                name = data["master_agent"][loc[1]].get("name", "MA")
            except (AttributeError, IndexError, KeyError, TypeError):
                return ""
            return f" (MA {name})"
        if len(loc) >= 2 and loc[0] in ("local_agents", "seds") and isinstance(loc[1], int):
            try:
                name = data[loc[0]][loc[1]].get("name")
            except (AttributeError, IndexError, KeyError, TypeError):
                name = None
            kind = "LA" if loc[0] == "local_agents" else "SeD"
            return f" ({kind} {name})" if name is not None else ""
        return ""

    rows = []
    for p in problems:
        line = p.line or (lines.line(p.loc) if lines is not None else None)
        where = (f"{source}:{line}: " if line else f"{source}: ") if source else ""
        field = _field(p.loc)
        rows.append((line or 0, f"{where}{field}{element(p.loc)}{': ' if field else ''}{p.message}"))
    rows.sort(key=lambda r: r[0])
    text = "\n".join(r[1] for r in rows)
    if len(rows) > 1:
        head = f"{source}: {len(rows)} problems" if source else f"{len(rows)} problems"
        return f"{head}:\n" + "\n".join("  " + r[1] for r in rows)
    return text
