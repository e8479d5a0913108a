"""Batch-scheduler backends of the batch SeD (see ``docs/batch.md``).

``BatchBackend`` is the interface (``base.py``); ``SlurmBackend`` the Slurm
implementation (``slurm.py``). Backends are registered by name in
``BACKENDS``; ``make_backend("slurm", env={...})`` builds one from config.
"""
from __future__ import annotations

from collections.abc import Callable

from gridrpc.errors import ConfigError

from .base import (BatchBackend, BatchError, BatchSubmitError, BatchTimeout, ClusterInfo,
                   JobInfo, JobSpec, JobState)
from .slurm import SlurmBackend, render_job_script

__all__ = [
    "BatchBackend", "BatchError", "BatchSubmitError", "BatchTimeout", "ClusterInfo",
    "JobInfo", "JobSpec", "JobState", "SlurmBackend", "render_job_script",
    "BACKENDS", "register_backend", "make_backend",
]

BACKENDS: dict[str, Callable[..., BatchBackend]] = {"slurm": SlurmBackend}


def register_backend(name: str, factory: Callable[..., BatchBackend]) -> None:
    """Make *factory* available as ``scheduler: <name>`` (PBS, OAR, ...)."""
    BACKENDS[name] = factory


def make_backend(name: str, **kwargs) -> BatchBackend:
    """Build the backend registered as *name* with keyword arguments."""
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise ConfigError(f"unknown batch scheduler {name!r}; known: {sorted(BACKENDS)}") from None
    return factory(**kwargs)
