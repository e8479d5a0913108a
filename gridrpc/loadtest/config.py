"""Load-test configuration (pure: no gevent, no locust, importable anywhere).

The *mix* says what a simulated user does, as weighted entries::

    add:3,sleep:1                 3 'add' calls for 1 'sleep' call (each with discovery)
    add/bound:5,add/discover:1    bound calls (no discovery) and bare discoveries

``NAME[/MODE][:WEIGHT]``; MODE is ``call`` (default: discovery + call),
``discover`` (discovery only) or ``bound`` (the user discovers once when it
starts, then calls that SeD directly). Weights are positive numbers
(default 1).

*Arguments* per service, as JSON: ``{"add": [1, 2], "sleep": [0.01]}`` or
``add=[1,2];sleep=[0.01]``. Services without given arguments use
:data:`DEFAULT_ARGS` (the example services) or none.

Environment variables (read by :meth:`LoadConfig.from_env`, which the locust
user class and the ready locustfiles use):

=============================  ==============================================
``GRIDRPC_MA``                 master agent address (default tcp://127.0.0.1:5555)
``GRIDRPC_MIX``                the mix (default ``add``)
``GRIDRPC_ARGS``               arguments per service
``GRIDRPC_K``                  servers asked per discovery (default 1 for
                               ``discover`` entries; calls ask 3 for failover)
``GRIDRPC_TIMEOUT``            per-request timeout, seconds (default 30)
``GRIDRPC_WAIT``               pause between a user's requests, s (default 0)
``GRIDRPC_REUSE_DISCOVERY``    s a user's ``call`` entries reuse a view answer
                               (default 0.01; 0: every call asks the MA)
``GRIDRPC_MAX_REQUESTS``       requests this process may start (0 = no cap)
``GRIDRPC_SUMMARY``            write a JSON summary here when the run ends
=============================  ==============================================
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from ..errors import ConfigError

MODES = ("call", "discover", "bound")
DEFAULT_MA = "tcp://127.0.0.1:5555"
DEFAULT_ARGS: dict[str, list] = {
    "add": [1, 2], "sleep": [0.01], "echo": ["locust"], "fail": ["failure requested by the load test"],
    "noop": [], "dgemm": [[[1.0, 2.0], [3.0, 4.0]], [[1.0, 0.0], [0.0, 1.0]]],
}


@dataclass(frozen=True, slots=True)
class MixEntry:
    service: str
    mode: str = "call"
    weight: float = 1.0


def parse_mix(text: str) -> tuple[MixEntry, ...]:
    """``'add:3,sleep/bound:1'`` -> entries. Raises ConfigError on bad input."""
    out = []
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        name, sep, weight = part.rpartition(":")
        if not sep:
            name, weight = part, "1"
        service, _, mode = name.partition("/")
        service, mode = service.strip(), (mode.strip() or "call")
        if not service:
            raise ConfigError(f"mix entry {part!r}: no service name")
        if mode not in MODES:
            raise ConfigError(f"mix entry {part!r}: mode must be one of {', '.join(MODES)}")
        try:
            w = float(weight)
        except ValueError:
            raise ConfigError(f"mix entry {part!r}: weight {weight!r} is not a number") from None
        if not w > 0:
            raise ConfigError(f"mix entry {part!r}: weight must be > 0")
        out.append(MixEntry(service, mode, w))
    if not out:
        raise ConfigError("the mix is empty (give e.g. 'add:3,sleep:1')")
    return tuple(out)


def format_mix(entries) -> str:
    return ",".join(f"{e.service}{'' if e.mode == 'call' else '/' + e.mode}:{e.weight:g}" for e in entries)


def parse_args(text: str | None) -> dict[str, list]:
    """Arguments per service: JSON object, or ``name=JSON;name=JSON``."""
    if not text or not str(text).strip():
        return {}
    text = str(text).strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"arguments: not valid JSON: {exc}") from None
        items = data.items() if isinstance(data, dict) else None
        if items is None:
            raise ConfigError("arguments: a JSON object {service: [args]} is expected")
    else:
        items = []
        for part in (p.strip() for p in text.split(";")):
            if not part:
                continue
            name, sep, value = part.partition("=")
            if not sep:
                raise ConfigError(f"arguments: {part!r} is not NAME=JSON")
            try:
                items.append((name.strip(), json.loads(value)))
            except ValueError as exc:
                raise ConfigError(f"arguments of {name.strip()}: not valid JSON: {exc}") from None
    out = {}
    for name, value in items:
        out[str(name)] = list(value) if isinstance(value, list) else [value]
    return out


@dataclass(frozen=True, kw_only=True)
class LoadConfig:
    master_agent: str = DEFAULT_MA
    mix: tuple[MixEntry, ...] = (MixEntry("add"),)
    args: dict = field(default_factory=dict)
    k: int = 1
    timeout: float = 30.0
    wait: float = 0.0
    max_requests: int = 0
    reuse_discovery: float = 0.01

    def args_for(self, service: str) -> list:
        if service in self.args:
            return list(self.args[service])
        return list(DEFAULT_ARGS.get(service, []))

    @classmethod
    def from_env(cls, env=None, **override) -> "LoadConfig":
        env = os.environ if env is None else env
        kw = dict(master_agent=env.get("GRIDRPC_MA") or DEFAULT_MA,
                  mix=parse_mix(env.get("GRIDRPC_MIX") or "add"),
                  args=parse_args(env.get("GRIDRPC_ARGS")),
                  k=_num(env, "GRIDRPC_K", 1, int),
                  timeout=_num(env, "GRIDRPC_TIMEOUT", 30.0, float),
                  wait=_num(env, "GRIDRPC_WAIT", 0.0, float),
                  max_requests=_num(env, "GRIDRPC_MAX_REQUESTS", 0, int),
                  reuse_discovery=_num(env, "GRIDRPC_REUSE_DISCOVERY", 0.01, float))
        kw.update({k: v for k, v in override.items() if v is not None})
        return cls(**kw)


def _num(env, name: str, default, typ):
    v = env.get(name)
    if v in (None, ""):
        return default
    try:
        return typ(v)
    except ValueError:
        raise ConfigError(f"{name}={v!r} is not a valid {typ.__name__}") from None
