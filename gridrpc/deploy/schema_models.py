"""The pydantic models of deployment files' sections (:mod:`gridrpc.deploy.schema`)
and the value types their fields share: numbers that are not booleans, finite
floats, element names, ports, ``orphan_timeout`` (seconds or never), service
and plugin targets, queue policies. Unknown keys are left to
:func:`gridrpc.deploy.schema.check` (the models ignore them)."""
from __future__ import annotations

import math
import re
import shlex
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator,
                      model_validator)

__all__ = ["HostModel", "MasterAgentModel", "LocalAgentModel", "SedModel", "HeartbeatModel", "PluginsModel",
           "SecurityModel", "TopModel",
           # value types
           "Text", "Name", "Port", "SshPort", "PosInt", "NonNegInt", "PosFloat", "NonNegFloat", "Orphan", "ArgList",
           "OptionList", "Service", "Plugin", "Queue", "Peer", "PeerHops"]


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


def _ethic_option(v: float | None, info: ValidationInfo) -> float | None:
    if v is None or "queue" not in info.data:          # an invalid queue is reported on its own
        return v
    from ..core.queue import make_policy
    queue = info.data["queue"] or "fcfs"
    try:
        make_policy(queue, **{info.field_name: v})
    except ValueError as exc:
        if queue == "ethic":
            raise ValueError(str(exc).removeprefix("bad options for queue policy 'ethic': ")) from None
        raise ValueError(f"{info.field_name} applies to queue 'ethic' only (this SeD's queue is {queue!r})") from None
    return v


def _sed_kind(v: str | None) -> str | None:
    """A kind of SeD registered in :mod:`gridrpc.sed.backends.registry`."""
    from ..sed.backends.registry import kind_names
    names = kind_names()
    if v is not None and v not in names:
        quoted = [repr(n) for n in names]
        raise ValueError(f"must be {', '.join(quoted[:-1])} or {quoted[-1]} (got {v!r})")
    return v


def _finite(v: float) -> float:
    if not math.isfinite(v):
        raise ValueError("must be a finite number")
    return v


def _cpus(v: Any) -> Any:
    """CPU binding (gridrpc ma|la|sed --cpus): "0,2-3", a CPU number or a list of them; kept as text."""
    if v is None:
        return None
    from ..affinity import format_cpus, parse_cpus
    from ..errors import ConfigError
    try:
        return format_cpus(parse_cpus([v] if type(v) is int else v))
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


Cpus = Annotated[Any, AfterValidator(_cpus)]


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


def _one_or_list_raw(v: Any) -> Any:
    """One item or a list of items (each checked by the item type)."""
    if v is None:
        return []
    return v if isinstance(v, (list, tuple)) else [v]


def _none_is_empty_list(v: Any) -> Any:
    return [] if v is None else v


def _none_is_empty_dict(v: Any) -> Any:
    return {} if v is None else v


_SERVICE_RE = re.compile(r"(?:[A-Za-z_][\w.-]*=)?[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_TARGET_RE = re.compile(r"[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def _service(v: str) -> str:
    """``[name=]package.module:function[,idempotent=false][,on_orphan=...]``, as ``gridrpc sed --service``."""
    from ..errors import ConfigError
    from ..sed.services import split_spec_options
    try:
        head, _ = split_spec_options(v)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    if not _SERVICE_RE.fullmatch(head):
        raise ValueError(f"{v!r} is not a service: expected 'package.module:function' (or 'name=module:function', "
                         "options after commas: ',idempotent=false')")
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


def _peer(v: Any) -> Any:
    """A peer MA's address (tcp://host:port; host:port is completed)."""
    from ..address import parse_address
    from ..errors import ConfigError
    try:
        return parse_address(_text(v), what="peer")
    except ConfigError as exc:
        raise ValueError(str(exc).removeprefix("peer: ")) from None


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
Peer = Annotated[str, BeforeValidator(_peer)]
PeerHops = Annotated[int, BeforeValidator(_number), Field(ge=0, le=4)]


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
    #: MAs of other trees (federation: gridrpc ma --peer), tcp://host:port each
    peers: Annotated[list[Peer], BeforeValidator(_one_or_list_raw)] = []
    #: with security on: each peer's public key, same order (element name in the key directory,
    #: a .key file, or the key itself)
    peer_keys: Annotated[list[Text], BeforeValidator(_one_or_list_raw)] | None = None
    #: how far a discovery may travel from peer to peer (gridrpc ma --peer-hops; default 2)
    peer_hops: PeerHops | None = None
    #: also ask the peers when every local server would make a call wait longer than this, s
    #: (gridrpc ma --peer-busy-wait; default: only for services the tree lacks)
    peer_busy_wait: NonNegFloat | None = None
    #: false: answer every discovery by the fan-out, keep no pushed view (gridrpc ma --no-view)
    view: bool | None = None
    #: seconds a pushed snapshot counts as fresh for a view answer (gridrpc ma --view-max-age; default 1.5)
    view_max_age: NonNegFloat | None = None
    #: CPUs the process runs on (gridrpc ma --cpus): "1", "0,2-3" or a list
    cpus: Cpus = None
    # peer_keys against peers, and peer_hops without peers: schema.check (with the key's line)


class LocalAgentModel(_Model):
    name: Name
    parent: Text
    host: Text = "localhost"
    port: Port = 0
    orphan_timeout: Orphan = None
    #: false: keep no view of the subtree and push none up (gridrpc la --no-view): its SeDs are found by fan-out
    view: bool | None = None
    #: CPUs the process runs on (gridrpc la --cpus)
    cpus: Cpus = None


class SedModel(_Model):
    name: Name
    parent: Text
    host: Text = "localhost"
    port: Port = 0
    #: a kind of SeD registered in gridrpc.sed.backends.registry (sed, batch, cloud...)
    kind: Annotated[str | None, AfterValidator(_sed_kind)] = None
    services: list[Service] | None = None
    examples: bool = False
    max_concurrent: PosInt | None = None
    queue: Queue | None = None
    replicas: PosInt | None = None
    workers: PosInt | None = None
    prestart_workers: NonNegInt | None = None
    #: CPUs the SeD process and its workers run on (gridrpc sed --cpus)
    cpus: Cpus = None
    isolation: Literal["process", "inline"] | None = None
    kill_grace: NonNegFloat | None = None
    gather: NonNegFloat | None = None
    result_cache_bytes: NonNegInt | None = None
    allow: dict[str, list[Text]] | None = None       # service | "*" -> users / "@group"
    groups: dict[str, list[Text]] | None = None
    max_calls_per_user: PosInt | None = None
    data_memory_bytes: NonNegInt | None = None
    data_disk_bytes: NonNegInt | None = None
    data_policy: Literal["lru", "lfu", "fifo"] | None = None
    data_dir: Text | None = None
    data_bytes_per_user: PosInt | None = None
    max_message_size: PosInt | None = None
    orphan_timeout: Orphan = None
    args: ArgList | None = None
    scheduler: Text | None = None
    partition: Text | None = None
    options: Any = None

    _check_ethic_options = field_validator("kill_grace", "gather")(_ethic_option)

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
