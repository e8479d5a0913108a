"""The batch-scheduler backend interface of the batch SeD.

A batch SeD turns each call into a batch job. It talks to the scheduler only
through a :class:`BatchBackend`: a small, blocking, stateless object (the SeD
calls it from a worker thread), registered by name (:mod:`.registry`):
:class:`~gridrpc.sed.batch.slurm.SlurmBackend`, :class:`~gridrpc.sed.batch.sge.SgeBackend`,
:class:`~gridrpc.sed.batch.oar.OarBackend`; a further scheduler is one more
module (see ``docs/batch.md``).

Values crossing the interface are frozen, keyword-only dataclasses:

- :class:`JobSpec`  what to submit (script text + resources);
- :class:`JobInfo`  what the scheduler says about one job;
- :class:`ClusterInfo`  the resources of a partition, for estimation vectors.

Times are seconds: durations as ``float`` seconds, instants as POSIX
timestamps (``time.time()`` scale), ``None`` when unknown or unlimited.

Errors: every failure of a scheduler command raises :class:`BatchError`
(a :class:`gridrpc.errors.GridRPCError`) carrying the command line, exit
status and stderr; :class:`BatchTimeout` when the command did not answer in
time; :class:`BatchSubmitError` when a submission was refused.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from gridrpc.errors import GridRPCError

__all__ = [
    "BatchBackend", "BatchError", "BatchTimeout", "BatchSubmitError",
    "JobSpec", "JobState", "JobInfo", "ClusterInfo",
]


# -- errors -----------------------------------------------------------------

class BatchError(GridRPCError):
    """A batch-scheduler command failed.

    ``cmd`` is the argument list, ``returncode`` its exit status (``None`` if
    it did not finish or could not start), ``stderr`` what it printed."""

    def __init__(self, message: str, *, cmd: Sequence[str] = (),
                 returncode: int | None = None, stderr: str = ""):
        detail = message
        if cmd:
            detail += f" [command: {' '.join(cmd)}"
            if returncode is not None:
                detail += f"; exit status {returncode}"
            detail += "]"
        if stderr.strip():
            detail += f": {stderr.strip()}"
        super().__init__(detail)
        self.cmd = list(cmd)
        self.returncode = returncode
        self.stderr = stderr


class BatchTimeout(BatchError):
    """A scheduler command did not answer within its timeout."""


class BatchSubmitError(BatchError):
    """The scheduler refused a job (bad partition, impossible resources...)."""


# -- values -----------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """A job to submit.

    ``script`` is the full job script text (see ``render_job_script`` of a
    backend module to produce one with the scheduler's directives). Resource
    fields set here are passed as command-line options, which override the
    script's own directives. ``None`` leaves a field to the scheduler's default.
    """
    script: str
    name: str = "gridrpc"
    workdir: str | None = None          # the job's working directory (and output files)
    partition: str | None = None
    account: str | None = None
    time_limit: float | None = None     # seconds (Slurm rounds up to whole minutes)
    nodes: int | None = None
    ntasks: int | None = None
    cpus_per_task: int | None = None
    output: str | None = None           # stdout file (scheduler default if None)
    error: str | None = None            # stderr file (joined with stdout if None)
    extra_options: tuple[str, ...] = () # passed verbatim, e.g. ("--mem=1G",) or ("-l h_vmem=1G",)
    env: Mapping[str, str] = field(default_factory=dict)  # exported to the job
    # may the scheduler run the job again on its own (node failure, preemption)? False: never
    # (a non-idempotent call: Slurm --no-requeue, Grid Engine -r n, OAR: no "idempotent" type);
    # True: allowed (Slurm --requeue, Grid Engine -r y); None: the scheduler's default
    requeue: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.script, str) or not self.script.strip():
            raise ValueError("JobSpec.script must be a non-empty string")
        for name in ("nodes", "ntasks", "cpus_per_task"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"JobSpec.{name} must be a positive int, not {v!r}")
        if self.requeue is not None and not isinstance(self.requeue, bool):
            raise ValueError(f"JobSpec.requeue must be True, False or None, not {self.requeue!r}")
        if self.time_limit is not None and self.time_limit <= 0:
            raise ValueError(f"JobSpec.time_limit must be > 0 seconds, not {self.time_limit!r}")
        # accept lists for convenience, store tuples (frozen, hashable)
        object.__setattr__(self, "extra_options", tuple(self.extra_options))
        object.__setattr__(self, "env", dict(self.env))


class JobState(enum.Enum):
    """Scheduler-neutral job states. Backends map their own states here."""
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    UNKNOWN = "UNKNOWN"   # the scheduler no longer knows the job (or said something new)

    @property
    def is_final(self) -> bool:
        """True once the job has ended and its processes are gone."""
        return self in _FINAL


_FINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT,
                    JobState.NODE_FAIL, JobState.PREEMPTED, JobState.OUT_OF_MEMORY})


@dataclass(frozen=True, slots=True, kw_only=True)
class JobInfo:
    """What the scheduler reports about one job.

    ``exit_code``/``signal`` are set for final states only (``signal`` is the
    number of the signal that ended the job's script, 0 if none).
    ``start_time`` is the real start (``None`` while pending);
    ``expected_start`` the scheduler's estimate for a pending job, if it has
    one. ``raw_state`` is the scheduler's own word (e.g. ``COMPLETING``).
    """
    job_id: str
    state: JobState
    reason: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    start_time: float | None = None
    end_time: float | None = None
    expected_start: float | None = None
    node_list: tuple[str, ...] = ()     # expanded host names
    nb_nodes: int | None = None
    nb_cpus: int | None = None
    time_limit: float | None = None     # seconds, None if unlimited/unknown
    name: str | None = None
    partition: str | None = None
    raw_state: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterInfo:
    """Resources of one partition (all nodes, whatever their state)."""
    partition: str
    total_cpus: int
    free_cpus: int           # idle CPUs on usable nodes
    total_nodes: int
    free_nodes: int          # fully idle nodes
    max_walltime: float | None   # seconds; None = unlimited
    available: bool = True   # the partition accepts jobs (state UP)
    partitions: tuple[str, ...] = ()   # every partition of the cluster
    default_partition: str | None = None


# -- the interface ------------------------------------------------------------

@runtime_checkable
class BatchBackend(Protocol):
    """A batch scheduler, seen from the batch SeD.

    All methods block (call them from a thread) and are safe to call from
    several threads at once; each scheduler command runs with a timeout.
    Job ids are strings (Slurm ``"42"``, PBS ``"42.server"``, OAR ``"42"``).
    """

    name: str   # registry name, e.g. "slurm"

    def submit(self, spec: JobSpec) -> str:
        """Submit *spec*; return the job id. :class:`BatchSubmitError` if refused."""
        ...

    def states(self, job_ids: Iterable[str]) -> dict[str, JobInfo]:
        """Current information on each job, one scheduler query for all of
        them (with per-job fallbacks for jobs the live queue forgot). Every
        requested id is in the result; unknown ones have state ``UNKNOWN``."""
        ...

    def cancel(self, job_id: str, *, timeout: float = 30.0) -> JobInfo:
        """Cancel the job and wait (up to *timeout*) until it is final or gone;
        return its last known information. Cancelling a finished job is not an
        error. :class:`BatchTimeout` if it is still alive after *timeout*."""
        ...

    def estimate_start(self, spec: JobSpec) -> float | None:
        """Seconds from now until *spec* would start if submitted now
        (0.0 = immediately), ``None`` if the scheduler cannot tell."""
        ...

    def cluster_info(self, partition: str | None = None) -> ClusterInfo:
        """CPUs/nodes, total and free, of *partition* (default partition if None)."""
        ...

    def queue_length(self, partition: str | None = None) -> int:
        """Number of jobs waiting (pending) in *partition* (all if None)."""
        ...

    def render_script(self, spec: JobSpec, command: Sequence[str]) -> str:
        """A job script for this scheduler running *command* (an argument
        list) with *spec*'s resources as directives and the meta variables
        ``GRIDRPC_JOB_ID``, ``GRIDRPC_NODELIST``, ``GRIDRPC_NODEFILE``,
        ``GRIDRPC_NB_NODES``, ``GRIDRPC_NB_TASKS``, ``GRIDRPC_CPUS_PER_TASK``
        exported; it exits with the command's status."""
        ...


def meta_variables(job_id: str, nodelist: Sequence[str], nodefile: str, nb_nodes: str, nb_tasks: str,
                   cpus_per_task: str) -> list[str]:
    """The lines of a job script that export the batch meta variables a
    service sees (``GRIDRPC_JOB_STARTED``, ``GRIDRPC_JOB_ID``,
    ``GRIDRPC_NODELIST``, ``GRIDRPC_NODEFILE``, ``GRIDRPC_NB_NODES``,
    ``GRIDRPC_NB_TASKS``, ``GRIDRPC_CPUS_PER_TASK``), whatever the scheduler:
    ``job_id`` and the counts are shell expressions of the scheduler's own
    variables, ``nodelist`` the lines that set ``GRIDRPC_NODELIST`` (hosts,
    space-separated), ``nodefile`` where the host file is written (removed
    when the job ends)."""
    return ['export GRIDRPC_JOB_STARTED="$(date +%s.%N 2>/dev/null)"',
            f'export GRIDRPC_JOB_ID="{job_id}"',
            *nodelist,
            "export GRIDRPC_NODELIST",
            f"export GRIDRPC_NODEFILE={nodefile}",
            'echo "$GRIDRPC_NODELIST" | tr \' \' \'\\n\' > "$GRIDRPC_NODEFILE"',
            "trap 'rm -f \"$GRIDRPC_NODEFILE\"' EXIT",
            f'export GRIDRPC_NB_NODES="{nb_nodes}"',
            f'export GRIDRPC_NB_TASKS="{nb_tasks}"',
            f'export GRIDRPC_CPUS_PER_TASK="{cpus_per_task}"']
