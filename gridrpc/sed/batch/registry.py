"""The batch schedulers a batch SeD can talk to, registered by name.

A scheduler is one module: its :class:`~gridrpc.sed.batch.base.BatchBackend`
class and one :func:`register_scheduler` call naming it and declaring its own
options (the ``scheduler_options`` section of a batch SeD's settings,
``--scheduler-option KEY=VALUE`` on the command line)::

    register_scheduler(Scheduler(name="sge", backend=SgeBackend,
                                 summary="Grid Engine (qsub, qstat, qacct, qdel)",
                                 options={"pe": SchedulerOption("parallel environment ...")}))

The CLI (``gridrpc sed --batch NAME``), the configuration parser and the
deployment-file validation all read this registry: a name it does not hold
is refused with the list of the known ones. The built-in schedulers are
imported on first use, so listing names imports nothing.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import ConfigError
from .base import BatchBackend

__all__ = ["Scheduler", "SchedulerOption", "register_scheduler", "get_scheduler", "scheduler_names",
           "check_scheduler_options", "make_backend"]

#: built-in schedulers: name -> module (relative to this package) that registers it
BUILTIN: dict[str, str] = {"slurm": ".slurm", "sge": ".sge", "oar": ".oar"}


@dataclass(frozen=True, slots=True)
class SchedulerOption:
    """One scheduler-specific setting: its help text and a converter
    (``str``, ``int``... or any callable raising ValueError on a bad value)."""
    help: str
    convert: Callable[[Any], Any] = str


@dataclass(frozen=True, slots=True, kw_only=True)
class Scheduler:
    """A registered scheduler. ``backend(env=, bin_dir=, command_timeout=,
    **scheduler_options)`` builds its :class:`BatchBackend`."""
    name: str
    backend: Callable[..., BatchBackend]
    summary: str = ""
    options: Mapping[str, SchedulerOption] = field(default_factory=dict)


_REGISTRY: dict[str, Scheduler] = {}


def register_scheduler(scheduler: Scheduler) -> Scheduler:
    """Make *scheduler* available as ``--batch <name>`` / ``scheduler: <name>``."""
    if not scheduler.name or not scheduler.name.replace("_", "").isalnum():
        raise ValueError(f"scheduler name {scheduler.name!r}: letters, digits and _ only")
    _REGISTRY[scheduler.name] = scheduler
    return scheduler


def scheduler_names() -> list[str]:
    """Every scheduler name, built-in or registered, sorted."""
    return sorted(set(BUILTIN) | set(_REGISTRY))


def get_scheduler(name: str, *, what: str = "batch SeD") -> Scheduler:
    """The scheduler registered as *name*; ConfigError listing the known ones."""
    if name not in _REGISTRY and name in BUILTIN:
        importlib.import_module(BUILTIN[name], __package__)
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"{what}: unknown scheduler {name!r}; known: {', '.join(scheduler_names())}") from None


def check_scheduler_options(name: str, data: Mapping[str, Any] | None, *, what: str = "batch SeD") -> dict:
    """*data* checked and converted against the options *name* declares."""
    sched = get_scheduler(name, what=what)
    out = {}
    for key, value in (data or {}).items():
        opt = sched.options.get(key)
        if opt is None:
            known = ", ".join(sorted(sched.options)) or "none"
            raise ConfigError(f"{what}: unknown scheduler option {key!r} for {name}; known: {known}")
        try:
            out[key] = opt.convert(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{what}: scheduler option {key}: {exc}") from None
    return out


def make_backend(name: str, **kwargs) -> BatchBackend:
    """Build the backend registered as *name* with keyword arguments."""
    return get_scheduler(name).backend(**kwargs)
