"""Slurm backend of the batch SeD: ``sbatch``, ``squeue``, ``scontrol``,
``scancel``, ``sinfo``, ``sacct`` with parsable ``-o``/``-O`` output.

``--json`` is avoided on purpose: its schema changes between Slurm versions,
while the format letters/fields used here are stable since Slurm 17.
This module runs the commands (:meth:`SlurmBackend._run`) and is the backend;
the parsing of their output lives in pure functions (``parse_*``,
:mod:`.slurm_parsers`) tested against recorded output of Slurm 22.05
(``tests/test_slurm_parsers.py``), and the job script in :mod:`.slurm_script`.
Both are re-exported here.

Commands used (``ids`` comma-separated):

============================  ==============================================
``submit``                    ``sbatch --parsable [options]`` (script on stdin)
``states``                    ``squeue -h -t all -j ids -O <fields>``, then per
                              missing job ``scontrol -o show job ID``, then
                              ``sacct -n -P -j ids -o ...`` (``sacct -c``, the
                              job-completion log, when accounting is off)
``cancel``                    ``scancel ID``, then ``states`` until final/gone
``estimate_start``            ``sbatch --test-only [options]``
``cluster_info``              ``sinfo -h -o '%P|%a|%l|%D|%F|%C'``
``queue_length``              ``squeue -h -r -t PENDING -o %i [-p P]``
============================  ==============================================
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence

from .base import BatchError, BatchSubmitError, ClusterInfo, JobInfo, JobSpec, JobState
from .command import CommandBackend
from .registry import Scheduler, register_scheduler
from .slurm_parsers import (  # noqa: F401 - re-exported: the parsers the backend's users test against
    SACCT_FIELDS, SINFO_FORMAT, SQUEUE_FIELDS, SQUEUE_FORMAT, SinfoRow, decode_wait_status,
    expand_hostlist, format_time_limit, parse_sacct, parse_sbatch_parsable, parse_sbatch_test_only,
    parse_scontrol_job, parse_scontrol_jobs, parse_sinfo, parse_squeue, parse_time_limit,
    parse_timestamp, slurm_state, summarize_partition)
from .slurm_script import render_job_script, sbatch_options  # noqa: F401 - re-exported

__all__ = [
    "SlurmBackend", "render_job_script", "sbatch_options",
    "parse_squeue", "parse_scontrol_job", "parse_scontrol_jobs", "parse_sacct",
    "parse_sinfo", "summarize_partition", "parse_sbatch_parsable", "parse_sbatch_test_only",
    "parse_time_limit", "format_time_limit", "parse_timestamp", "expand_hostlist",
    "slurm_state", "decode_wait_status", "SinfoRow",
]

log = logging.getLogger(__name__)


class SlurmBackend(CommandBackend):
    """:class:`~gridrpc.sed.batch.base.BatchBackend` for Slurm.

    :param env: variables added to the environment of every Slurm command
        (e.g. ``{"SLURM_CONF": ...}``); the SeD's own environment is inherited.
    :param bin_dir: directory of the Slurm commands (default: found on PATH).
    :param command_timeout: seconds each command may take before
        :class:`BatchTimeout`.
    :param poll_interval: longest pause between polls in :meth:`cancel`.

    Trade-offs: stateless (every call asks Slurm; nothing is cached), so a
    SeD restart loses nothing; ``states`` costs one ``squeue`` per poll for any
    number of jobs; jobs the controller has purged (after ``MinJobAge``) cost
    one ``scontrol`` each plus one ``sacct`` for all of them.
    """

    name = "slurm"

    # -- BatchBackend ------------------------------------------------------
    def submit(self, spec: JobSpec) -> str:
        r = self._run(["sbatch", "--parsable", *sbatch_options(spec)], input=spec.script,
                      job_env=spec.env, check=False)
        if r.returncode != 0:
            raise BatchSubmitError("sbatch refused the job", cmd=["sbatch", *sbatch_options(spec)],
                                   returncode=r.returncode, stderr=r.stderr)
        try:
            job_id = parse_sbatch_parsable(r.stdout)
        except ValueError as exc:
            raise BatchSubmitError(str(exc), cmd=["sbatch"], stderr=r.stderr) from exc
        log.info("submitted Slurm job %s (%s)", job_id, spec.name)
        return job_id

    def states(self, job_ids: Iterable[str]) -> dict[str, JobInfo]:
        ids = list(dict.fromkeys(str(j) for j in job_ids))
        if not ids:
            return {}
        r = self._run(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-O", SQUEUE_FORMAT],
                      check=False)
        if r.returncode == 0:
            found = parse_squeue(r.stdout)
        elif "Invalid job id" in r.stderr:
            found = {}     # a single id that squeue no longer knows
        else:
            raise BatchError("squeue failed", cmd=["squeue", "-j", ",".join(ids)],
                             returncode=r.returncode, stderr=r.stderr)
        missing = [j for j in ids if j not in found]
        for j in missing:
            found.update(self._scontrol(j))
        missing = [j for j in ids if j not in found]
        if missing:
            found.update(self._sacct(missing))
        return {j: found.get(j) or JobInfo(job_id=j, state=JobState.UNKNOWN,
                                            reason="unknown to squeue, scontrol and sacct")
                for j in ids}

    def _scontrol(self, job_id: str) -> dict[str, JobInfo]:
        r = self._run(["scontrol", "-o", "show", "job", job_id], check=False)
        if r.returncode != 0:
            if "Invalid job id" in r.stderr:
                return {}
            raise BatchError("scontrol show job failed", cmd=["scontrol", "-o", "show", "job", job_id],
                             returncode=r.returncode, stderr=r.stderr)
        return {k: v for k, v in parse_scontrol_jobs(r.stdout).items() if k == job_id}

    def _sacct(self, job_ids: Sequence[str]) -> dict[str, JobInfo]:
        base = ["sacct", "-n", "-P", "-j", ",".join(job_ids), "-o", ",".join(SACCT_FIELDS)]
        r = self._run(base, check=False)
        if r.returncode != 0 and "accounting storage is disabled" in r.stderr.lower():
            r = self._run([base[0], "-c", *base[1:]], check=False)   # job-completion log
        if r.returncode != 0:
            log.warning("sacct failed for jobs %s: %s", ",".join(job_ids), r.stderr.strip())
            return {}
        try:
            return parse_sacct(r.stdout)
        except ValueError as exc:
            log.warning("cannot parse sacct output: %s", exc)
            return {}

    def cancel(self, job_id: str, *, timeout: float = 30.0) -> JobInfo:
        job_id = str(job_id)
        r = self._run(["scancel", job_id], check=False)
        if r.returncode != 0 and "Invalid job id" not in r.stderr:
            raise BatchError("scancel failed", cmd=["scancel", job_id],
                             returncode=r.returncode, stderr=r.stderr)
        return self._wait_gone(job_id, timeout, ["scancel", job_id])

    def render_script(self, spec: JobSpec, command: Sequence[str]) -> str:
        """The job script running *command* for *spec* (:func:`render_job_script`)."""
        return render_job_script(spec, command)

    def estimate_start(self, spec: JobSpec) -> float | None:
        cmd = ["sbatch", "--test-only", *sbatch_options(spec)]
        now = time.time()
        r = self._run(cmd, input=spec.script, job_env=spec.env, check=False)
        if r.returncode != 0:
            raise BatchSubmitError("sbatch --test-only: the job could never run", cmd=cmd,
                                   returncode=r.returncode, stderr=r.stderr)
        try:
            start = parse_sbatch_test_only(r.stderr + r.stdout, now=now)
        except ValueError as exc:
            raise BatchError(str(exc), cmd=cmd, stderr=r.stderr) from exc
        return None if start is None else max(0.0, start - now)

    def cluster_info(self, partition: str | None = None) -> ClusterInfo:
        r = self._run(["sinfo", "-h", "-o", SINFO_FORMAT])
        try:
            return summarize_partition(parse_sinfo(r.stdout), partition)
        except KeyError:
            raise BatchError(f"no partition {partition!r}", cmd=["sinfo", "-h", "-o", SINFO_FORMAT],
                             stderr=r.stdout) from None
        except ValueError as exc:
            raise BatchError(f"cannot parse sinfo output: {exc}", cmd=["sinfo"]) from exc

    def queue_length(self, partition: str | None = None) -> int:
        args = ["squeue", "-h", "-r", "-t", "PENDING", "-o", "%i"]
        if partition:
            args += ["-p", partition]
        return len(self._run(args).stdout.split())


register_scheduler(Scheduler(name="slurm", backend=SlurmBackend,
                             summary="Slurm (sbatch, squeue, scontrol, sacct, scancel, sinfo)"))
