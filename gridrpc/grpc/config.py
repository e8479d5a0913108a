"""The client configuration file of ``grpc_initialize`` (TOML)."""
from __future__ import annotations

import logging
import os
import tomllib
from dataclasses import dataclass, field

from ..errors import ConfigError
from .codes import E, GridRPCErrorCode

log = logging.getLogger(__name__)


_NUM = (int, float)
#: accepted keys of the TOML file -> (types, meaning); all but master_agent optional
CONFIG_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "master_agent": ((str,), "address of the Master Agent, e.g. tcp://127.0.0.1:5555 (required)"),
    "user": ((str,), "user name sent with calls (default: login name)"),
    "timeout": (_NUM, "per-call timeout in seconds (default: none)"),
    "discovery_timeout": (_NUM, "how long the MA has to answer a discovery, s (5)"),
    "ack_timeout": (_NUM, "how long a SeD has to accept a call before the next one is tried, s (5)"),
    "ping_interval": (_NUM, "liveness pings to the SeD during a call, s (1)"),
    "ping_timeout": (_NUM, "a SeD silent this long has vanished, s (4)"),
    "failover": ((bool,), "retry on the next discovered server when one dies (true)"),
    "max_candidates": ((int,), "servers asked for per discovery (3)"),
    "max_message_size": ((int,), "largest call message in bytes (512 MiB)"),
    "aggregator": ((str, dict), "aggregator for discoveries: a name or {name=, params={}}"),
    "download_dir": ((str,), "where files returned by services are written"),
    "reuse_discovery": (_NUM0 := (int, float), "s a view answer of the MA serves the next calls of a service "
                        "(0.01; 0: every call asks the MA)"),
}


@dataclass(frozen=True, kw_only=True)
class Config:
    master_agent: str
    client_options: dict = field(default_factory=dict)


def load_config(path) -> Config | GridRPCErrorCode:
    """The parsed file, or GRPC_CONFIGFILE_NOT_FOUND / GRPC_CONFIGFILE_ERROR
    (the reason is logged). ``path`` None: ``$GRIDRPC_CONFIG``."""
    if path is None:
        path = os.environ.get("GRIDRPC_CONFIG")
        if not path:
            return E.GRPC_CONFIGFILE_NOT_FOUND
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return E.GRPC_CONFIGFILE_NOT_FOUND
    except (OSError, TypeError, ValueError) as exc:
        log.error("grpc_initialize: cannot read %r: %s", path, exc)
        return E.GRPC_CONFIGFILE_ERROR
    try:
        data = tomllib.loads(raw.decode("utf-8"))
        return check_config(data)
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, ConfigError, ValueError) as exc:
        log.error("grpc_initialize: bad configuration file %s: %s", path, exc)
        return E.GRPC_CONFIGFILE_ERROR


def check_config(data: dict) -> Config:
    """Validate a decoded file: unknown keys, wrong types and bad values are
    errors (a typo must not be silently ignored)."""
    unknown = sorted(set(data) - set(CONFIG_KEYS))
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(CONFIG_KEYS)}")
    for key, value in data.items():
        types = CONFIG_KEYS[key][0]
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            raise ConfigError(f"{key} must be of type {' or '.join(t.__name__ for t in types)}, "
                              f"not {type(value).__name__}")
        if types is _NUM and not value > 0:
            raise ConfigError(f"{key} must be > 0")
        if types is _NUM0 and not 0 <= value <= 60:
            raise ConfigError(f"{key} must be between 0 and 60")
    ma = data.get("master_agent")
    if ma is None:
        raise ConfigError("master_agent = \"tcp://host:port\" is required")
    scheme, sep, rest = ma.partition("://")
    if not sep or scheme not in ("tcp", "ipc", "inproc") or not rest:
        raise ConfigError(f"master_agent must look like tcp://host:port, not {ma!r}")
    if "aggregator" in data:
        from ..core.aggregators import check_spec
        check_spec(data["aggregator"])   # shape only: the agents decide which names exist
    opts = {k: v for k, v in data.items() if k != "master_agent"}
    return Config(master_agent=ma, client_options=opts)
