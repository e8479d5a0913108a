"""Settings of a pilot batch SeD (``gridrpc sed --batch NAME --pilot ...``,
or ``pilot: {...}`` in a deployment file's ``kind: batch`` entry).

A pilot is a batch job that runs one ``gridrpc sed`` inside its allocation;
it registers with the batch SeD that submitted it and serves calls until it
is idle or near its walltime (see :mod:`.pilots` and ``docs/batch.md``).
:func:`parse_pilot_config` checks the keys and raises
:class:`~gridrpc.errors.ConfigError` naming the bad one.
"""
from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ...errors import ConfigError

__all__ = ["PilotConfig", "parse_pilot_config", "PILOT_FLAGS", "pilot_to_cli"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PilotConfig:
    """How many pilots, their shape and their life (seconds for durations)."""
    min_pilots: int = 0               # pilots kept even when idle
    max_pilots: int = 4               # pilot jobs in the scheduler at once (pending, running, draining)
    backlog: int = 1                  # calls without a slot (on the pilots running or coming) that submit one more
    cores: int = 1                    # CPUs of a pilot job = calls it runs at once
    idle_timeout: float = 60.0        # a pilot without calls this long leaves (down to min_pilots)
    walltime: float = 3600.0          # walltime of a pilot job
    max_call_time: float | None = None  # declared longest call; None: the service's estimated time
    drain_margin: float = 5.0         # a call must end this long before its pilot's walltime
    start_timeout: float = 300.0      # a running pilot job whose SeD has not registered by then is cancelled
    start_guess: float = 10.0         # s from a job's start to its SeD registered, until one was measured
    max_submit_failures: int = 3      # failed submissions (or starts) in a row that pause the manager
    pause: float = 300.0              # how long a paused manager submits nothing
    host: str = "0.0.0.0"             # address a pilot's SeD binds (0.0.0.0: advertised by host name)
    sed_args: tuple[str, ...] = ()    # more ``gridrpc sed`` arguments of the pilots (e.g. --insecure)
    listen: str | None = None         # where pilots register (default: the SeD's host, any port)

    def need(self, predicted: float) -> float:
        """Seconds a call is expected to take at most: the declared
        ``max_call_time``, else the service's predicted run time."""
        if self.max_call_time is not None:
            return self.max_call_time
        return max(0.0, float(predicted))


_INTS = ("min_pilots", "max_pilots", "backlog", "cores", "max_submit_failures")
_FLOATS = ("idle_timeout", "walltime", "drain_margin", "start_timeout", "start_guess", "pause")
_ALIASES = {"min": "min_pilots", "max": "max_pilots", "cores_per_pilot": "cores"}


def parse_pilot_config(data: Any, *, what: str = "batch SeD") -> PilotConfig | None:
    """``None``/``False`` -> None (no pilots); ``True`` -> the defaults; a
    mapping -> its keys checked (ConfigError on an unknown key or bad value)."""
    from .config import parse_duration           # config imports this module
    if data is None or data is False:
        return None
    if data is True:
        return PilotConfig()
    if isinstance(data, PilotConfig):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(f"{what}: pilot must be true or a mapping of pilot settings")
    known = {f.name for f in fields(PilotConfig)}
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = _ALIASES.get(key, key)
        if name not in known:
            raise ConfigError(f"{what}: unknown pilot setting {key!r}; known: {', '.join(sorted(known))}")
        if value is None:
            continue
        if name in _INTS:
            try:
                v = None if isinstance(value, (bool, float)) else int(str(value).strip())
            except ValueError:
                v = None
            if v is None or v < (0 if name == "min_pilots" else 1):
                raise ConfigError(f"{what}: pilot {key} must be a {'non-negative' if name == 'min_pilots' else 'positive'} "
                                  f"integer, got {value!r}")
            out[name] = v
        elif name == "sed_args":
            items = shlex.split(value) if isinstance(value, str) else list(value) \
                if isinstance(value, (list, tuple)) else None
            if items is None or not all(isinstance(i, str) and i and "\n" not in i for i in items):
                raise ConfigError(f"{what}: pilot {key} must be a list of gridrpc sed arguments, got {value!r}")
            out[name] = tuple(items)
        elif name in _FLOATS or name == "max_call_time":
            v = parse_duration(value, f"{what}: pilot {key}")
            if v is None and name != "max_call_time":
                raise ConfigError(f"{what}: pilot {key} must be a number of seconds")
            out[name] = v
        else:
            if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value):
                raise ConfigError(f"{what}: pilot {key} must be an address without spaces, got {value!r}")
            out[name] = value.strip()
    c = PilotConfig(**out)
    if c.min_pilots > c.max_pilots:
        raise ConfigError(f"{what}: pilot min_pilots ({c.min_pilots}) exceeds max_pilots ({c.max_pilots})")
    longest = c.need(0.0)
    if longest + c.drain_margin >= c.walltime:
        raise ConfigError(f"{what}: pilot walltime ({c.walltime:g}s) leaves no time for a call: it must exceed "
                          f"max_call_time + drain_margin ({longest:g}s + {c.drain_margin:g}s)")
    from ...transport.security import is_loopback
    if not is_loopback(c.host) and "--insecure" not in c.sed_args:
        raise ConfigError(f"{what}: pilots bind {c.host}, not a loopback address, and their link to this SeD "
                          "is not authenticated (no CURVE yet): give pilot sed_args --insecure on a private "
                          "network you trust, or a loopback pilot host when the pilots run on this machine")
    if c.listen is not None and not c.listen.startswith(("tcp://", "ipc://")):
        raise ConfigError(f"{what}: pilot listen must be tcp://HOST:PORT or ipc://PATH, got {c.listen!r}")
    return c


#: PilotConfig field -> its ``gridrpc sed`` flag
PILOT_FLAGS = {f.name: "--pilot-" + {"min_pilots": "min", "max_pilots": "max", "sed_args": "sed_arg"}.get(f.name, f.name).replace("_", "-")
               for f in fields(PilotConfig)}


def pilot_to_cli(c: PilotConfig) -> list[str]:
    """``gridrpc sed`` arguments reproducing *c* (with ``--pilot``)."""
    default = PilotConfig()
    args = ["--pilot"]
    for name, flag in PILOT_FLAGS.items():
        v = getattr(c, name)
        if name == "sed_args":
            args += [f"{flag}={a}" for a in v]
        elif v != getattr(default, name) and v is not None:
            args += [flag, f"{v:g}" if isinstance(v, float) else str(v)]
    return args
