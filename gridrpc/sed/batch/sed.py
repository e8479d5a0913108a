"""The batch SeD: a SeD whose calls run as jobs of a batch scheduler (Slurm,
Grid Engine, OAR, or one registered by a site).

To the tree it is one SeD (``server_type: batch``) offering services; it runs
none itself: its execution back-end is :class:`~gridrpc.sed.batch.jobs.BatchJobs`
(each call one job; see that module and ``docs/batch.md``), or, with
``config.pilot`` set, :class:`~gridrpc.sed.batch.pilots.PilotJobs` (calls
relayed to SeDs running inside pilot jobs). Everything else
(queue, duplicates, pings, cancel, parent link, estimation entry point) is
the plain SeD runtime's. The modules of this package:

- :mod:`.config` the settings (:class:`BatchConfig`), from the command line
  or a deployment file's ``kind: batch`` entry, and per-call ``_batch`` requests;
- :mod:`.base` the scheduler interface (:class:`BatchBackend`), :mod:`.registry`
  the schedulers by name, :mod:`.command` what command-line backends share,
  :mod:`.slurm`, :mod:`.sge`, :mod:`.oar` the schedulers (parsers in ``*_parsers.py``);
- :mod:`.jobs` the execution back-end: submission, polling, cancel;
- :mod:`.state` its state directory (restarts, kept answers), :mod:`.replies`
  how a job's end becomes the call's answer, :mod:`.cluster` the cluster
  snapshot behind the estimates (:mod:`.estimate`, pure);
- :mod:`.jobfiles` the files of a call, :mod:`.run_job` what a job runs;
- :mod:`.pilots` the pilot back-end, :mod:`.pilot_policy` its pure policy
  (:mod:`.pilot_model` its actions and records, :mod:`.pilot_estimate` its
  estimation), :mod:`.pilot_config` its settings.
"""
from __future__ import annotations

import logging

from ...core.sed_calls import DEFAULT_RESULT_CACHE_BYTES
from ..server import SeD
from .base import BatchBackend
from .config import BatchConfig
from .jobs import BatchJobs, importable_target
from .replies import ERROR_TYPES

log = logging.getLogger(__name__)

__all__ = ["BatchSeD", "BatchJobs", "ERROR_TYPES", "importable_target"]


class BatchSeD(SeD):
    """A SeD whose calls run as batch jobs. ``backend`` is the scheduler
    (default ``make_backend(config.scheduler, **config.backend_options())``).
    Services are ``"module:function"`` (imported by the jobs; if it cannot be
    imported here it is still offered, without argument checks) or
    module-level functions."""

    def __init__(self, name: str, parent: str | None = None, *, config: BatchConfig | None = None,
                 backend: BatchBackend | None = None, address: str = "tcp://127.0.0.1:0",
                 hb_interval: float = 1.0, hb_timeout: float = 3.0, orphan_timeout: float | None = None,
                 seed: int | None = None, max_message_size: int | None = None, queue: str = "fcfs",
                 queue_options: dict | None = None,
                 result_cache_bytes: int = DEFAULT_RESULT_CACHE_BYTES, **common) -> None:
        """``common``: the plain SeD's keywords that apply to every back-end
        (``security``, ``parent_key``, ``access``, ``orphan_call_timeout``)."""
        config = config or BatchConfig()
        if backend is None:
            from . import make_backend
            backend = make_backend(config.scheduler, **config.backend_options())
        extra = {} if max_message_size is None else {"max_message_size": max_message_size}
        if config.pilot is not None:
            from .pilots import PilotJobs
            execution = PilotJobs(name, config, backend)
        else:
            execution = BatchJobs(name, config, backend)
        super().__init__(name, parent, address=address, max_concurrent=config.max_jobs, queue=queue,
                         replicas=1, hb_interval=hb_interval, hb_timeout=hb_timeout,
                         orphan_timeout=orphan_timeout, seed=seed, queue_options=queue_options,
                         result_cache_bytes=result_cache_bytes, execution=execution,
                         **extra, **common)

    # the batch back-end's settings and state, as attributes of the SeD
    @property
    def config(self) -> BatchConfig:
        return self.execution.config

    @property
    def backend(self) -> BatchBackend:
        """The batch scheduler's backend (Slurm, Grid Engine, OAR...)."""
        return self.execution.scheduler

    @property
    def state_dir(self) -> str:
        return self.execution.state_dir

    @property
    def jobs_dir(self) -> str:
        return self.execution.jobs_dir

    @property
    def targets(self) -> dict[str, str]:
        return self.execution.targets

    @property
    def history(self):
        return self.execution.history

    @property
    def records(self) -> list[dict]:
        return self.execution.records

    @property
    def batch_stats(self) -> dict:
        return self.execution.batch_stats

    @property
    def result_grace(self) -> float:
        return self.execution.result_grace

    @result_grace.setter
    def result_grace(self, seconds: float) -> None:
        self.execution.result_grace = seconds

    @property
    def snapshot(self):
        """The latest cluster snapshot behind the estimates (:class:`~.estimate.ClusterSnapshot`)."""
        return self.execution._snapshot

    @property
    def _replica(self):
        return next(iter(self.replicas.values()))

    def jobs(self) -> dict[str, dict]:
        """Call id -> {job_id, state, service, user, dir} of the live and kept calls."""
        return self.execution.jobs()
