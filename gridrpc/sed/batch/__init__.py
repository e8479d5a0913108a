"""Batch-scheduler backends of the batch SeD (see ``docs/batch.md``).

``BatchBackend`` is the interface (``base.py``). Each scheduler is one module
registered by name in :mod:`.registry` (``slurm.py``, ``sge.py``,
``oar.py``); ``make_backend("sge", env={...})`` builds one from config and
``scheduler_names()`` lists them. The backend classes are importable from
here too (loaded on first use).
"""
from __future__ import annotations

import importlib
from collections.abc import Callable

from .base import (BatchBackend, BatchError, BatchSubmitError, BatchTimeout, ClusterInfo,
                   JobInfo, JobSpec, JobState)
from .registry import (Scheduler, SchedulerOption, get_scheduler, make_backend, register_scheduler,
                       scheduler_names)

__all__ = [
    "BatchBackend", "BatchError", "BatchSubmitError", "BatchTimeout", "ClusterInfo",
    "JobInfo", "JobSpec", "JobState", "Scheduler", "SchedulerOption", "register_scheduler",
    "get_scheduler", "scheduler_names", "make_backend", "register_backend",
    "SlurmBackend", "SgeBackend", "OarBackend", "render_job_script",
]

#: names importable from this package, loaded from their scheduler's module on first use
_LAZY = {"SlurmBackend": ".slurm", "render_job_script": ".slurm", "SgeBackend": ".sge", "OarBackend": ".oar"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register_backend(name: str, factory: Callable[..., BatchBackend]) -> None:
    """Register *factory* as scheduler *name* without options of its own
    (:func:`register_scheduler` with a :class:`Scheduler` declares them)."""
    register_scheduler(Scheduler(name=name, backend=factory))
