"""Configuration of a batch SeD: one frozen dataclass, parsed once.

The same keys come from the command line (``gridrpc sed --batch NAME ...``,
see :mod:`.cli`) and from a deployment file's ``kind: batch`` entry
(``scheduler: NAME, partition: debug, ...``); :func:`parse_batch_config`
checks them and raises :class:`~gridrpc.errors.ConfigError` with a clear
message. The scheduler name and its own ``scheduler_options`` are checked
against the registry (:mod:`.registry`). Per-call resource requests (the
``_batch`` keyword argument) are checked by :func:`parse_call_request`.

Durations are seconds; :func:`parse_duration` also accepts clock text
``[D-]HH:MM[:SS]`` (a string with ``:`` or ``-``).
"""
from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ...errors import ConfigError, InvalidArgument
from .pilot_config import PilotConfig, parse_pilot_config, pilot_to_cli
from .registry import check_scheduler_options, get_scheduler

__all__ = ["BatchConfig", "parse_batch_config", "parse_duration", "parse_call_request",
           "CALL_OPTION", "CALL_KEYS", "BATCH_KEYS", "CLI_FLAGS", "batch_settings", "config_to_cli"]

#: the scheduler of a batch SeD that names none
DEFAULT_SCHEDULER = "slurm"
#: the reserved keyword argument carrying per-call resource requests
CALL_OPTION = "_batch"
#: what a call may ask for in ``_batch={...}``
CALL_KEYS = ("nodes", "ntasks", "cpus_per_task", "walltime")


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchConfig:
    """Settings of one batch SeD (see ``docs/batch.md`` for each key)."""
    scheduler: str = DEFAULT_SCHEDULER
    partition: str | None = None           # None: the cluster's default partition
    account: str | None = None
    time_limit: float | None = None        # default walltime of a call's job (s); None: partition default
    max_time_limit: float | None = None    # largest walltime a call may ask for (s); None: no cap
    nodes: int | None = None               # default shape of a call's job
    ntasks: int | None = None
    cpus_per_task: int | None = None
    submit_options: tuple[str, ...] = ()   # extra options of the submit command, verbatim
    scheduler_options: Mapping[str, Any] = field(default_factory=dict)  # the scheduler's own settings
    shared_dir: str = "~/.gridrpc/batch"   # visible from the SeD host and the compute nodes
    remote_python: str = sys.executable    # the Python (with gridrpc) on the compute nodes
    poll_interval: float = 2.0             # one state query for all jobs per interval (s)
    estimate_interval: float = 5.0         # refresh of the cluster snapshot behind estimates (s)
    max_jobs: int = 1000                   # jobs of this SeD in the scheduler at once; more wait here
    env: Mapping[str, str] = field(default_factory=dict)      # scheduler commands (and their jobs)
    job_env: Mapping[str, str] = field(default_factory=dict)  # exported to the jobs only
    bin_dir: str | None = None             # where the scheduler's commands live (default: PATH)
    command_timeout: float = 30.0          # per scheduler command (s)
    cancel_timeout: float = 30.0           # how long a cancel waits for the job to be gone (s)
    cancel_on_exit: bool = False           # cancel the jobs when the SeD stops (default: keep them)
    restart_grace: float = 120.0           # clients wait this long for a restarting SeD (s)
    result_retention: float = 7 * 86400.0  # undelivered results kept on disk this long (s)
    lost_after: float = 60.0               # a job the scheduler forgot, without result, fails after (s)
    pilot: PilotConfig | None = None       # pilots: calls run on SeDs inside pilot jobs (None: a job per call)

    @property
    def state_root(self) -> str:
        return os.path.abspath(os.path.expanduser(self.shared_dir))

    def backend_options(self) -> dict:
        return {"env": dict(self.env), "bin_dir": self.bin_dir,
                "command_timeout": self.command_timeout, **self.scheduler_options}


_POSITIVE_INT = ("nodes", "ntasks", "cpus_per_task", "max_jobs")
_DURATIONS = ("time_limit", "max_time_limit")
_POSITIVE_FLOAT = ("poll_interval", "estimate_interval", "command_timeout", "cancel_timeout",
                   "restart_grace", "result_retention", "lost_after")
_ALIASES = {"time": "time_limit", "walltime": "time_limit", "batch_env": "env",
            "extra_options": "submit_options", "sbatch_options": "submit_options",
            "python": "remote_python"}


def clock_duration(text: str) -> float:
    """Seconds from clock text: ``H:M:S``, ``M:S``, ``D-H``, ``D-H:M``,
    ``D-H:M:S``; ValueError on anything else."""
    days, _, rest = text.rpartition("-") if "-" in text else ("0", "", text)
    parts = [int(p) for p in rest.split(":")]
    if "-" in text:
        if not 1 <= len(parts) <= 3:
            raise ValueError(f"bad duration {text!r}")
        parts += [0] * (3 - len(parts))
    elif len(parts) == 2:
        parts = [0, *parts]
    elif len(parts) != 3:
        raise ValueError(f"bad duration {text!r}")
    h, m, s = parts
    if min(h, m, s, int(days)) < 0:
        raise ValueError(f"bad duration {text!r}")
    return float(((int(days) * 24 + h) * 60 + m) * 60 + s)


def parse_duration(value: Any, what: str = "duration") -> float | None:
    """Seconds from a number, a numeric string, or clock text ``[D-]H:M[:S]``
    / ``M:S`` (a string holding ``:`` or ``-``); ``None``/``"unlimited"`` -> None.
    A bare number is *seconds*."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected seconds or [D-]HH:MM:SS, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip()
        if text.lower() in ("", "none", "unlimited", "infinite"):
            return None
        if ":" in text or "-" in text:
            try:
                seconds = clock_duration(text)
            except ValueError:
                raise ConfigError(f"{what}: cannot read {text!r} as [D-]HH:MM:SS") from None
        else:
            try:
                seconds = float(text)
            except ValueError:
                raise ConfigError(f"{what}: expected seconds or [D-]HH:MM:SS, got {text!r}") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{what} must be > 0 seconds, got {value!r}")
    return seconds


def _str_map(value: Any, key: str, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        out = {}
        for item in value:
            k, sep, v = str(item).partition("=")
            if not sep or not k.strip():
                raise ConfigError(f"{what}: {key} entries must be KEY=VALUE, got {item!r}")
            out[k.strip()] = v
        return out
    raise ConfigError(f"{what}: {key} must be a mapping of names to values")


def parse_batch_config(data: Mapping[str, Any], *, what: str = "batch SeD",
                       ignore: tuple[str, ...] = ()) -> BatchConfig:
    """Check *data* (YAML/CLI keys) and build a :class:`BatchConfig`. Keys in
    *ignore* (e.g. a deployment entry's ``name``/``services``) are skipped;
    unknown keys are an error."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{what}: the batch settings must be a mapping")
    known = {f.name for f in fields(BatchConfig)}
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in ignore:
            continue
        name = _ALIASES.get(key, key)
        if name not in known:
            raise ConfigError(f"{what}: unknown batch setting {key!r}; known: {', '.join(sorted(known))}")
        if value is None and name not in _DURATIONS + ("partition", "account", "bin_dir", "pilot"):
            continue
        if name in out:
            raise ConfigError(f"{what}: {key!r} repeats another key's setting ({name})")
        out[name] = value
    for k in _POSITIVE_INT:
        if k in out and out[k] is not None:
            v = out[k]
            if isinstance(v, bool) or not isinstance(v, int):
                try:
                    v = int(str(v))
                except ValueError:
                    raise ConfigError(f"{what}: {k} must be a positive integer, got {out[k]!r}") from None
            if v < 1:
                raise ConfigError(f"{what}: {k} must be a positive integer, got {out[k]!r}")
            out[k] = v
    for k in _DURATIONS:
        if k in out:
            out[k] = parse_duration(out[k], f"{what}: {k}")
    for k in _POSITIVE_FLOAT:
        if k in out:
            v = parse_duration(out[k], f"{what}: {k}")
            if v is None:
                raise ConfigError(f"{what}: {k} must be a number of seconds")
            out[k] = v
    if "submit_options" in out:
        v = out["submit_options"]
        opts = [v] if isinstance(v, str) else list(v)
        for o in opts:
            if not isinstance(o, str) or "\n" in o or not o.strip():
                raise ConfigError(f"{what}: submit_options must be option strings, got {o!r}")
        out["submit_options"] = tuple(o.strip() for o in opts)
    for k in ("env", "job_env", "scheduler_options"):
        if k in out:
            out[k] = _str_map(out[k], k, what)
    for k in ("scheduler", "shared_dir", "remote_python"):
        if k in out and (not isinstance(out[k], str) or not out[k].strip()):
            raise ConfigError(f"{what}: {k} must be a non-empty string")
    for k in ("partition", "account", "bin_dir"):
        if out.get(k) is not None:
            out[k] = str(out[k])
    if "cancel_on_exit" in out and not isinstance(out["cancel_on_exit"], bool):
        raise ConfigError(f"{what}: cancel_on_exit must be true or false")
    if "pilot" in out:
        out["pilot"] = parse_pilot_config(out["pilot"], what=what)
    scheduler = out.get("scheduler", DEFAULT_SCHEDULER)
    get_scheduler(scheduler, what=what)       # ConfigError listing the known ones
    out["scheduler_options"] = check_scheduler_options(scheduler, out.get("scheduler_options"), what=what)
    c = BatchConfig(**out)
    if c.time_limit is not None and c.max_time_limit is not None and c.time_limit > c.max_time_limit:
        raise ConfigError(f"{what}: time_limit ({c.time_limit:g}s) exceeds max_time_limit "
                          f"({c.max_time_limit:g}s)")
    if any(ch.isspace() for ch in c.state_root):
        raise ConfigError(f"{what}: shared_dir {c.state_root!r} must not contain white space "
                          "(it goes into the job scripts' directives)")
    return c


def parse_call_request(value: Any, config: BatchConfig) -> dict:
    """Check a call's ``_batch={...}`` request; InvalidArgument if wrong.

    Keys: ``nodes``, ``ntasks``, ``cpus_per_task`` (positive ints) and
    ``walltime`` (seconds, or ``[D-]HH:MM:SS``), capped by the SeD's
    ``max_time_limit``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgument(f"{CALL_OPTION} must be a dict with keys among {', '.join(CALL_KEYS)}, "
                              f"got {type(value).__name__}")
    out: dict[str, Any] = {}
    for k, v in value.items():
        key = {"time_limit": "walltime", "time": "walltime", "cpus": "cpus_per_task"}.get(k, k)
        if key not in CALL_KEYS:
            raise InvalidArgument(f"{CALL_OPTION}: unknown key {k!r}; known: {', '.join(CALL_KEYS)}")
        if key == "walltime":
            try:
                w = parse_duration(v, f"{CALL_OPTION}['walltime']")
            except ConfigError as exc:
                raise InvalidArgument(str(exc)) from None
            if w is not None and config.max_time_limit is not None and w > config.max_time_limit:
                raise InvalidArgument(f"{CALL_OPTION}: walltime {w:g}s exceeds this SeD's limit of "
                                      f"{config.max_time_limit:g}s")
            out[key] = w
        else:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidArgument(f"{CALL_OPTION}: {key} must be a positive integer, got {v!r}")
            out[key] = v
    return out


#: keys a deployment file's ``kind: batch`` SeD entry may hold besides the usual SeD keys
BATCH_KEYS = frozenset({f.name for f in fields(BatchConfig)} | set(_ALIASES))


def batch_settings(entry: Mapping[str, Any]) -> dict:
    """The batch keys of a deployment file's SeD entry (``kind: batch``).
    ``options:`` may hold more of them as a mapping, or a list of raw
    options of the submit command (= ``submit_options``)."""
    data = {k: v for k, v in entry.items() if k in BATCH_KEYS}
    extra = entry.get("options")
    if isinstance(extra, Mapping):
        data.update(extra)
    elif isinstance(extra, (list, tuple, str)):
        opts = [extra] if isinstance(extra, str) else list(extra)
        old = data.pop("sbatch_options", None) or data.pop("extra_options", None)
        data["submit_options"] = list(data.get("submit_options") or old or []) + opts
    elif extra is not None:
        raise ConfigError("options: must be a mapping of batch settings or a list of scheduler options")
    return data


def config_to_cli(c: BatchConfig) -> list[str]:
    """``gridrpc sed`` arguments reproducing *c* (for deployments)."""
    default = BatchConfig()
    args = ["--batch", c.scheduler]
    for name, flag in CLI_FLAGS.items():
        v = getattr(c, name)
        if name == "scheduler" or v == getattr(default, name):
            continue
        if name == "pilot":
            args += pilot_to_cli(v)
        elif name == "submit_options":
            args += [f"--submit-option={o}" for o in v]
        elif name in ("env", "job_env", "scheduler_options"):
            for k, val in v.items():
                args += [flag, f"{k}={val}"]
        elif name == "cancel_on_exit":
            if v:
                args.append(flag)
        elif isinstance(v, float):
            args += [flag, f"{v:g}"]
        else:
            args += [flag, str(v)]
    return args


#: the ``gridrpc sed`` flag of each BatchConfig field (the pilot's own flags: PILOT_FLAGS)
CLI_FLAGS = {
    "scheduler": "--batch", "partition": "--partition", "account": "--account",
    "time_limit": "--time-limit", "max_time_limit": "--max-time-limit", "nodes": "--nodes",
    "ntasks": "--ntasks", "cpus_per_task": "--cpus-per-task", "submit_options": "--submit-option",
    "scheduler_options": "--scheduler-option",
    "shared_dir": "--shared-dir", "remote_python": "--remote-python", "poll_interval": "--poll-interval",
    "estimate_interval": "--estimate-interval", "max_jobs": "--max-jobs", "env": "--batch-env",
    "job_env": "--job-env", "bin_dir": "--batch-bin-dir", "command_timeout": "--command-timeout",
    "cancel_timeout": "--cancel-timeout", "cancel_on_exit": "--cancel-on-exit",
    "restart_grace": "--restart-grace", "result_retention": "--result-retention",
    "lost_after": "--lost-after", "pilot": "--pilot",
}
