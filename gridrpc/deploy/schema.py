"""The schema of deployment files, checked whole before anything starts.

:func:`load_yaml` reads the YAML and remembers the line of every key and
value (PyYAML's node marks); :func:`check` validates every section with
pydantic models plus the rules pydantic cannot express (parents, unique
names, hosts, the batch and cloud settings of their own parsers), and
collects *every* problem; :func:`format_problems` turns them into one
message, one line per problem, each naming the file, the line and the field::

    deployments/x.yaml:7: seds[0].queue (SeD sed-1): unknown queue policy 'fcsf'; known: ethic, fcfs

The accepted format is the one of :mod:`gridrpc.deploy.spec` (its docstring
and ``docs/deployment.md``).
"""
from __future__ import annotations

import difflib
import math
import re
import shlex
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import yaml
from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError,
                      ValidationInfo, field_validator, model_validator)

from ..errors import ConfigError

Loc = tuple  # path inside the data: ("seds", 0, "port")

LOCAL_HOSTS = ("localhost", "local", "127.0.0.1")
TOP_KEYS = frozenset({"master_agent", "local_agents", "seds", "hosts", "name", "heartbeat", "orphan_timeout",
                      "plugins", "security"})
MA_KEYS = frozenset({"name", "host", "port", "http_port"})
LA_KEYS = frozenset({"name", "parent", "host", "port", "orphan_timeout"})
SED_KEYS = frozenset({"name", "parent", "host", "port", "services", "examples", "max_concurrent", "queue",
                      "replicas", "workers", "isolation", "kill_grace", "kind", "orphan_timeout", "args",
                      "scheduler", "partition", "options", "result_cache_bytes", "max_message_size",
                      "allow", "groups", "max_calls_per_user"})
HOST_KEYS = frozenset({"launcher", "address", "ssh", "user", "port", "key", "known_hosts", "ssh_config",
                       "connect_timeout", "python", "venv", "workdir", "env", "ssh_options", "wrapper", "node",
                       "orphan_timeout", "srun_args", "ssh_multiplex", "seds", "agents"})
HEARTBEAT_KEYS = frozenset({"interval", "timeout"})
PLUGINS_KEYS = frozenset({"aggregators"})
SECURITY_KEYS = frozenset({"enabled", "keys", "allow_insecure", "user"})


# -- YAML with line numbers ------------------------------------------------------
class Lines:
    """Line (1-based) of each key and value of a YAML document, by path."""

    def __init__(self) -> None:
        self.keys: dict[Loc, int] = {}
        self.values: dict[Loc, int] = {}
        self.duplicates: list[tuple[Loc, int, int]] = []     # (path, line, first line): YAML keeps the last

    def line(self, loc: Loc) -> int | None:
        """The line of the deepest known prefix of ``loc``: the key's line for
        a mapping entry (``port: 55x55``), the item's for a list item."""
        loc = tuple(loc)
        while True:
            if loc in self.keys:
                return self.keys[loc]
            if loc in self.values:
                return self.values[loc]
            if not loc:
                return None
            loc = loc[:-1]


def load_yaml(text: str, filename: str) -> tuple[Any, Lines]:
    """Parse ``text`` (named ``filename`` in errors); returns (data, lines).
    A syntax error raises ``yaml.YAMLError`` whose marks name ``filename``."""
    loader = yaml.SafeLoader(text)
    loader.name = filename
    lines = Lines()
    try:
        node = loader.get_single_node()
        if node is None:
            return None, lines
        data = loader.construct_document(node)

        def walk(n, path: Loc) -> None:
            lines.values[path] = n.start_mark.line + 1
            if isinstance(n, yaml.MappingNode):
                for k, v in n.value:
                    try:
                        key = loader.construct_object(k, deep=True)
                    except yaml.YAMLError:
                        continue
                    if isinstance(key, (list, dict)):
                        continue
                    if path + (key,) in lines.keys:
                        lines.duplicates.append((path + (key,), k.start_mark.line + 1, lines.keys[path + (key,)]))
                        continue
                    lines.keys[path + (key,)] = k.start_mark.line + 1
                    walk(v, path + (key,))
            elif isinstance(n, yaml.SequenceNode):
                for i, v in enumerate(n.value):
                    walk(v, path + (i,))

        walk(node, ())
        return data, lines
    finally:
        loader.dispose()


def yaml_error_text(exc: yaml.YAMLError, filename: str) -> str:
    """``FILE:LINE: not valid YAML: problem (context)`` for a syntax error."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{filename}:{mark.line + 1}" if mark is not None else filename
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    ctx_mark = getattr(exc, "context_mark", None)
    extra = ""
    if context:
        extra = f" ({context}" + (f" at line {ctx_mark.line + 1}" if ctx_mark is not None else "") + ")"
    return f"{where}: not valid YAML: {problem}{extra}"


# -- value types -------------------------------------------------------------------
def _text(v: Any) -> Any:
    """Strings; YAML numbers are taken as their text (``partition: 2024``)."""
    if isinstance(v, bool) or v is None:
        raise ValueError("must be a string")
    if isinstance(v, (int, float)):
        return str(v)
    return v


def _number(v: Any) -> Any:
    """Numbers but not booleans (YAML's ``yes`` is True, not 1)."""
    if isinstance(v, bool):
        raise ValueError(f"must be a number, not {str(v).lower()}")
    return v


def _kill_grace(v: float | None, info: ValidationInfo) -> float | None:
    if v is None or "queue" not in info.data:          # an invalid queue is reported on its own
        return v
    from ..core.queue import make_policy
    queue = info.data["queue"] or "fcfs"
    try:
        make_policy(queue, kill_grace=v)
    except ValueError:
        raise ValueError(f"kill_grace applies to queue 'ethic' only (this SeD's queue is {queue!r})") from None
    return v


def _finite(v: float) -> float:
    if not math.isfinite(v):
        raise ValueError("must be a finite number")
    return v


def _name(v: str) -> str:
    from ..core.messages import valid_name
    if not valid_name(v):
        raise ValueError(f"{v!r}: element names are 1-64 letters, digits and _ . - "
                         "(starting with a letter or digit)")
    return v


def _orphan(v: Any) -> Any:
    if v is None or v is False or (isinstance(v, str) and v.strip().lower() in ("never", "none", "null")):
        return None
    if isinstance(v, bool):
        raise ValueError(f"must be a number of seconds or null (never), got {v!r}")
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"must be a number of seconds or null (never), got {v!r}") from None
    if not math.isfinite(f) or f <= 0:
        raise ValueError(f"must be > 0 seconds (or null for never), got {v!r}")
    return f


def _args(v: Any) -> Any:
    """A list of arguments; a string is split like a shell does."""
    if isinstance(v, str):
        return shlex.split(v)
    if isinstance(v, (list, tuple)):
        return [_text(x) for x in v]
    raise ValueError("must be a list of strings")


def _one_or_list(v: Any) -> Any:
    if isinstance(v, str):
        return [v]
    if isinstance(v, (list, tuple)):
        return [_text(x) for x in v]
    raise ValueError("must be a list of strings")


def _none_is_empty_list(v: Any) -> Any:
    return [] if v is None else v


def _none_is_empty_dict(v: Any) -> Any:
    return {} if v is None else v


_SERVICE_RE = re.compile(r"(?:[A-Za-z_][\w.-]*=)?[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_TARGET_RE = re.compile(r"[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def _service(v: str) -> str:
    if not _SERVICE_RE.fullmatch(v):
        raise ValueError(f"{v!r} is not a service: expected 'package.module:function' (or 'name=module:function')")
    return v


def _plugin(v: str) -> str:
    if not _TARGET_RE.fullmatch(v):
        raise ValueError(f"{v!r} is not a plugin: expected 'package.module:Class'")
    return v


def _queue(v: str) -> str:
    from ..core.queue import make_policy
    try:
        make_policy(v)
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    return v


Text = Annotated[str, BeforeValidator(_text)]
Name = Annotated[str, BeforeValidator(_text), AfterValidator(_name)]
Port = Annotated[int, BeforeValidator(_number), Field(ge=0, le=65535)]
SshPort = Annotated[int, BeforeValidator(_number), Field(ge=1, le=65535)]
PosInt = Annotated[int, BeforeValidator(_number), Field(ge=1)]
NonNegInt = Annotated[int, BeforeValidator(_number), Field(ge=0)]
PosFloat = Annotated[float, BeforeValidator(_number), AfterValidator(_finite), Field(gt=0)]
NonNegFloat = Annotated[float, BeforeValidator(_number), AfterValidator(_finite), Field(ge=0)]
Orphan = Annotated[float | None, BeforeValidator(_orphan)]
ArgList = Annotated[list[str], BeforeValidator(_args)]
OptionList = Annotated[list[str], BeforeValidator(_one_or_list)]
Service = Annotated[str, AfterValidator(_service)]
Plugin = Annotated[str, AfterValidator(_plugin)]
Queue = Annotated[str, BeforeValidator(_text), AfterValidator(_queue)]


class _Model(BaseModel):
    # unknown keys are reported by check() itself (with suggestions, and cloud
    # entries hand theirs to the cloud parser), so the models ignore them
    model_config = ConfigDict(extra="ignore", frozen=True)


class HostModel(_Model):
    launcher: Literal["local", "ssh", "slurm"] | None = None
    address: Text | None = None
    ssh: Text | None = None
    user: Text | None = None
    port: SshPort = 22
    key: Text | None = None
    known_hosts: Text | None = None
    ssh_config: Text | None = None
    connect_timeout: PosFloat = 10.0
    python: Text | None = None
    venv: Text | None = None
    workdir: Text | None = None
    env: Annotated[dict[Text, Annotated[str, BeforeValidator(_text)]], BeforeValidator(_none_is_empty_dict)] = {}
    ssh_options: OptionList = []
    wrapper: ArgList = []
    node: Text | None = None
    orphan_timeout: Orphan = None
    srun_args: ArgList = []
    ssh_multiplex: bool = True
    seds: NonNegInt | None = None          # `deploy plan` only
    agents: bool | None = None             # `deploy plan` only

    @model_validator(mode="after")
    def _ssh_needs_a_target(self):
        if self.launcher == "ssh" and not self.ssh:
            raise ValueError("'ssh: user@host' is required for ssh hosts")
        return self


class MasterAgentModel(_Model):
    name: Name = "MA"
    host: Text = "localhost"
    port: Port = 5555
    http_port: Port | None = None


class LocalAgentModel(_Model):
    name: Name
    parent: Text
    host: Text = "localhost"
    port: Port = 0
    orphan_timeout: Orphan = None


class SedModel(_Model):
    name: Name
    parent: Text
    host: Text = "localhost"
    port: Port = 0
    kind: Literal["sed", "batch", "cloud"] | None = None
    services: list[Service] | None = None
    examples: bool = False
    max_concurrent: PosInt | None = None
    queue: Queue | None = None
    replicas: PosInt | None = None
    workers: PosInt | None = None
    isolation: Literal["process", "inline"] | None = None
    kill_grace: NonNegFloat | None = None
    result_cache_bytes: NonNegInt | None = None
    allow: dict[str, list[Text]] | None = None       # service | "*" -> users / "@group"
    groups: dict[str, list[Text]] | None = None
    max_calls_per_user: PosInt | None = None
    max_message_size: PosInt | None = None
    orphan_timeout: Orphan = None
    args: ArgList | None = None
    scheduler: Text | None = None
    partition: Text | None = None
    options: Any = None

    _check_kill_grace = field_validator("kill_grace")(_kill_grace)

    @model_validator(mode="after")
    def _what_to_serve(self):
        if not self.services and not self.examples:
            raise ValueError("give 'services: [module:function, ...]' (or 'examples: true')")
        return self


class HeartbeatModel(_Model):
    interval: PosFloat = 1.0
    timeout: PosFloat = 3.0

    @model_validator(mode="after")
    def _timeout_above_interval(self):
        if self.timeout <= self.interval:
            raise ValueError(f"timeout ({self.timeout:g} s) must be longer than interval ({self.interval:g} s): "
                             "a peer is lost after missing heartbeats for that long")
        return self


class PluginsModel(_Model):
    aggregators: Annotated[list[Plugin], BeforeValidator(_none_is_empty_list)] = []


class SecurityModel(_Model):
    #: CurveZMQ on every link; default: on when any host is not loopback
    enabled: bool | None = None
    #: the key directory (same path on every host); default: the deployment's state dir + /keys
    keys: Text | None = None
    #: needed to turn security off on non-loopback hosts (it is logged loudly)
    allow_insecure: bool = False
    #: the user key the deploy command itself uses to talk to the MA (default: the login name)
    user: Text | None = None


class TopModel(_Model):
    name: Text | None = None
    orphan_timeout: Orphan = None


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


@dataclass
class Checked:
    """What :func:`check` validated (models; None where an entry was invalid)."""
    top: TopModel | None
    heartbeat: HeartbeatModel | None
    plugins: PluginsModel | None
    security: SecurityModel | None
    master_agent: MasterAgentModel | None
    local_agents: list[LocalAgentModel | None]
    seds: list[SedModel | None]
    hosts: dict[str, HostModel | None]


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

    ma = None
    if not data.get("master_agent"):
        problems.append(Problem(("master_agent",), "the deployment file needs a 'master_agent: "
                                                   "{name: MA, host: ..., port: ...}' entry"))
    else:
        _unknown(data["master_agent"], MA_KEYS, ("master_agent",), problems)
        ma = _validate(MasterAgentModel, data["master_agent"], ("master_agent",), problems)

    las = []
    for i, la in enumerate(_list(data, "local_agents", problems)):
        _unknown(la, LA_KEYS, ("local_agents", i), problems)
        las.append(_validate(LocalAgentModel, la, ("local_agents", i), problems))

    seds = []
    for i, sed in enumerate(_list(data, "seds", problems)):
        loc = ("seds", i)
        kind = sed.get("kind") if isinstance(sed, dict) else None
        if kind == "batch":
            from ..sed.batch.config import BATCH_KEYS
            _unknown(sed, SED_KEYS | BATCH_KEYS, loc, problems)
        elif kind != "cloud":                # cloud entries: the cloud parser names unknown keys
            _unknown(sed, SED_KEYS, loc, problems)
        model = _validate(SedModel, sed, loc, problems)
        seds.append(model)
        if isinstance(sed, dict) and kind in ("batch", "cloud"):
            _kind_settings(sed, kind, loc, problems)

    checked = Checked(top=top, heartbeat=hb, plugins=plugins, security=security, master_agent=ma,
                      local_agents=las, seds=seds,
                      hosts=hosts)
    _relations(data, checked, problems)
    return checked, problems


def _kind_settings(sed: dict, kind: str, loc: Loc, problems: list[Problem]) -> None:
    """Batch and cloud settings, checked by their own parsers (one source of truth)."""
    what = f"SeD {sed.get('name')}"
    try:
        if kind == "batch":
            from ..sed.batch.config import BATCH_KEYS, batch_settings, parse_batch_config
            if set(sed) - SED_KEYS - BATCH_KEYS:
                return                                   # reported as unknown keys already
            parse_batch_config(batch_settings(sed), what=what)
        else:
            from ..sed.cloud.config import CLOUD_KEYS, parse_cloud_config
            parse_cloud_config({k: v for k, v in sed.items() if k in CLOUD_KEYS or k not in SED_KEYS}, what=what)
    except ConfigError as exc:
        text = str(exc)
        problems.append(Problem(loc + (_key_named(text, sed, what),), text))


def _key_named(text: str, entry: dict, what: str) -> str:
    """The key of ``entry`` an error message is about (for its line)."""
    body = text.removeprefix(what + ":").strip()
    best = None
    for k in entry:
        m = re.search(rf"(?<![\w]){re.escape(str(k))}(?![\w])", body)
        if m and (best is None or m.start() < best[0]):
            best = (m.start(), k)
    return best[1] if best else "name"


def _relations(data: dict, c: Checked, problems: list[Problem]) -> None:
    """Rules across entries: unique names, parents are agents, hosts exist."""
    entries: list[tuple[Loc, Any]] = []
    if isinstance(data.get("master_agent"), dict):
        entries.append((("master_agent",), data["master_agent"]))
    for section in ("local_agents", "seds"):
        if isinstance(data.get(section), list):
            entries += [((section, i), e) for i, e in enumerate(data[section]) if isinstance(e, dict)]
    seen: dict[str, Loc] = {}
    agents = {str(e.get("name", "MA")) for loc, e in entries if loc[0] in ("master_agent", "local_agents")}
    if not isinstance(data.get("master_agent"), dict):
        agents.add("MA")                     # reported missing already: no parent errors because of it
    hosts = {str(h) for h in (data.get("hosts") or {})} if isinstance(data.get("hosts"), dict) else set()
    for loc, e in entries:
        name = str(e.get("name", "MA" if loc[0] == "master_agent" else ""))
        if name in seen:
            problems.append(Problem(loc + ("name",), f"element names must be unique: {name} is also "
                                                     f"{_field(seen[name])}"))
        else:
            seen[name] = loc
        if loc[0] != "master_agent" and "parent" in e and str(e["parent"]) not in agents:
            problems.append(Problem(loc + ("parent",), f"parent {str(e['parent'])!r} is not an agent of this "
                                                       f"deployment (agents: {', '.join(sorted(agents))})"))
        host = str(e.get("host", "localhost"))
        if host not in hosts and host not in LOCAL_HOSTS:
            problems.append(Problem(loc + ("host",), f"host {host!r} is not 'localhost' nor listed under hosts:"))
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


def _field(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def format_problems(problems: list[Problem], data: Any, lines: Lines | None, source: str | None) -> str:
    """One line per problem: ``FILE:LINE: FIELD (ELEMENT): message``, in file order."""
    def element(loc: Loc) -> str:
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
