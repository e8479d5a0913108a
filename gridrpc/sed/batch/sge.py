"""Grid Engine backend of the batch SeD (``--batch sge``): ``qsub``, ``qstat
-xml``, ``qacct``, ``qdel``, ``qconf``. Tested with Son of Grid Engine 8.1.9.

============================  ==============================================
``submit``                    ``qsub -terse [options]`` (script on stdin)
``states``                    ``qstat -xml -s prsz -g t`` (the user's jobs,
                              finished ones included), then per finished
                              job ``qacct -j ID``; a job in error state
                              (``Eqw``) costs a ``qstat -j ID`` and is deleted
``cancel``                    ``qdel ID``, then ``states`` until final/gone
``estimate_start``            ``qsub -w p`` (could it start now?), then
                              ``qsub -w v`` (could it ever start?)
``cluster_info``              ``qconf -sql``, ``qstat -f -xml``, ``qconf -sq Q``
``queue_length``              ``qstat -xml -u '*' -s p``
============================  ==============================================

Resources: a partition is a queue (``-q``), an account ``-A``, the time
limit ``-l h_rt=SECONDS`` (whole seconds), and a job of more than one slot
(``max(nodes, ntasks * cpus_per_task)``) runs in the parallel environment
named by the scheduler option ``pe`` (``-pe PE SLOTS``; its allocation rule
decides how slots spread over hosts). Grid Engine gives no start estimate:
``estimate_start`` says "now" (0) or "no idea" (None), and refuses a job no
queue can ever hold. Parsing is in :mod:`.sge_parsers`.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import shlex
from collections.abc import Iterable, Sequence

from .base import BatchError, BatchSubmitError, ClusterInfo, JobInfo, JobSpec, JobState, meta_variables
from .command import CommandBackend
from .registry import Scheduler, SchedulerOption, register_scheduler
from .sge_parsers import (accounting_is_immediate, format_h_rt, live_job_info, parse_error_reason,
                          parse_qacct, parse_qstat_jobs, parse_qstat_queues, parse_qsub_terse,
                          parse_queue_limits, qacct_job_info, sge_state, summarize_queues)

__all__ = ["SgeBackend", "qsub_options", "render_job_script", "job_slots"]

log = logging.getLogger(__name__)


def job_slots(spec: JobSpec) -> int:
    """Slots of a job: ``max(nodes, ntasks * cpus_per_task)``."""
    return max(spec.nodes or 1, (spec.ntasks or 1) * (spec.cpus_per_task or 1))


def _job_name(name: str) -> str:
    # Grid Engine refuses / : @ \ * ? and white space in names
    name = re.sub(r"[^\w.+-]", "_", name) or "gridrpc"
    return name if not name[0].isdigit() else f"j{name}"


def qsub_options(spec: JobSpec, *, pe: str | None = None, shell: str = "/bin/bash") -> list[list[str]]:
    """The qsub options for *spec*, one list of words per option (an entry of
    ``extra_options`` may hold an option and its value: ``-l h_vmem=2G``).
    ValueError for a multi-slot job without a parallel environment."""
    opts = [["-N", _job_name(spec.name)], ["-S", shell], ["-V"]]
    opts.append(["-wd", spec.workdir] if spec.workdir else ["-cwd"])
    if spec.output:
        opts.append(["-o", spec.output])
    opts.append(["-e", spec.error] if spec.error else ["-j", "y"])
    if spec.partition:
        opts.append(["-q", spec.partition])
    if spec.account:
        opts.append(["-A", spec.account])
    if spec.time_limit is not None:
        opts.append(["-l", f"h_rt={format_h_rt(spec.time_limit)}"])
    slots = job_slots(spec)
    if slots > 1:
        if not pe:
            raise ValueError(f"a job of {slots} slots needs a parallel environment: set the scheduler "
                             "option pe (qconf -spl lists them)")
        opts.append(["-pe", pe, str(slots)])
    opts += [shlex.split(o) for o in spec.extra_options]
    # rerun after a host failure (the queue's "rerun" otherwise); after the extra options, so
    # that the call's semantics win over a site's -r y
    if spec.requeue is not None:
        opts.append(["-r", "y" if spec.requeue else "n"])
    for words in opts:
        if any("\n" in w or "\r" in w for w in words):
            raise ValueError(f"newline in qsub option {words!r}")
    return opts


def _flat(opts: list[list[str]]) -> list[str]:
    return [w for words in opts for w in words]


def render_job_script(spec: JobSpec, command: Sequence[str], *, pe: str | None = None,
                      shell: str = "/bin/bash") -> str:
    """A job script running *command* with ``#$`` lines for *spec* and the
    meta variables (:meth:`~gridrpc.sed.batch.base.BatchBackend.render_script`),
    read from Grid Engine's ``$JOB_ID`` and ``$PE_HOSTFILE``. It exits with *command*'s status."""
    if not command:
        raise ValueError("empty command")
    opts = qsub_options(spec, pe=pe, shell=shell)
    for words in opts:
        if any(any(c.isspace() for c in w) for w in words):
            raise ValueError(f"white space in #$ option {words!r}")
    cpt = spec.cpus_per_task or 1
    # in the call's directory (shared, removed with it) when there is one: a killed job leaves nothing
    nodefile = (shlex.quote(os.path.join(spec.workdir, "gridrpc-nodes")) if spec.workdir
                else '"${TMPDIR:-/tmp}/gridrpc-nodes.$JOB_ID"')
    tasks = str(spec.ntasks) if spec.ntasks else f"$(( ${{NSLOTS:-1}} / {cpt} ))"
    lines = [f"#!{shell}", *(f"#$ {' '.join(words)}" for words in opts), *[
        "# generated by gridrpc.sed.batch.sge.render_job_script",
        *meta_variables("$JOB_ID", [
            'if [ -n "$PE_HOSTFILE" ] && [ -r "$PE_HOSTFILE" ]; then',
            '  GRIDRPC_NODELIST="$(awk \'!seen[$1]++ {print $1}\' "$PE_HOSTFILE" | tr \'\\n\' \' \' | sed \'s/ *$//\')"',
            "else",
            '  GRIDRPC_NODELIST="$(hostname)"',
            "fi"], nodefile, '$(wc -w <<< "$GRIDRPC_NODELIST")', tasks, str(cpt)),
        shlex.join(list(command)),
        "",
    ]]
    return "\n".join(lines)


class SgeBackend(CommandBackend):
    """:class:`~gridrpc.sed.batch.base.BatchBackend` for Grid Engine.

    :param env: variables added to every command (``SGE_ROOT``, ``SGE_CELL``,
        ``SGE_QMASTER_PORT``... select the cell); inherited otherwise.
    :param pe: parallel environment of multi-slot jobs (none: such jobs are refused).

    Trade-offs: stateless; ``states`` is one ``qstat`` per poll for any number
    of jobs plus one ``qacct`` per job that ended (``qacct`` reads the whole
    accounting file: slow where it is huge). Grid Engine does not tell a
    ``qdel`` from another SIGKILL, nor gives start estimates.
    """

    name = "sge"

    def __init__(self, env=None, *, bin_dir=None, command_timeout: float = 30.0, poll_interval: float = 0.5,
                 pe: str | None = None, shell: str = "/bin/bash"):
        super().__init__(env, bin_dir=bin_dir, command_timeout=command_timeout, poll_interval=poll_interval)
        self.pe = pe
        self.shell = shell
        self._immediate: bool | None = None     # accounting records written at once (cell config)

    def _options(self, spec: JobSpec) -> list[str]:
        try:
            return _flat(qsub_options(spec, pe=self.pe, shell=self.shell))
        except ValueError as exc:
            raise BatchSubmitError(str(exc), cmd=["qsub"]) from exc

    # -- BatchBackend ------------------------------------------------------
    def submit(self, spec: JobSpec) -> str:
        cmd = ["qsub", "-terse", *self._options(spec)]
        r = self._run(cmd, input=spec.script, job_env=spec.env, check=False)
        if r.returncode != 0:
            raise BatchSubmitError("qsub refused the job", cmd=cmd, returncode=r.returncode,
                                   stderr=r.stderr + r.stdout)
        try:
            job_id = parse_qsub_terse(r.stdout)
        except ValueError as exc:
            raise BatchSubmitError(str(exc), cmd=cmd, stderr=r.stderr) from exc
        log.info("submitted Grid Engine job %s (%s)", job_id, spec.name)
        return job_id

    def states(self, job_ids: Iterable[str]) -> dict[str, JobInfo]:
        ids = list(dict.fromkeys(str(j) for j in job_ids))
        if not ids:
            return {}
        r = self._run(["qstat", "-xml", "-s", "prsz", "-g", "t"])
        try:
            live = parse_qstat_jobs(r.stdout)
        except Exception as exc:  # noqa: BLE001 - xml.etree's ParseError and friends
            raise BatchError(f"cannot parse qstat -xml output: {exc}", cmd=["qstat", "-xml"]) from exc
        out = {}
        for jid in ids:
            job = live.get(jid)
            if job is None or sge_state(job.raw_state) is JobState.UNKNOWN:
                out[jid] = self._ended(jid, listed=job is not None)
            elif "E" in job.raw_state:
                out[jid] = self._in_error(jid, job)
            else:
                out[jid] = live_job_info(job)
        return out

    def _ended(self, job_id: str, *, listed: bool) -> JobInfo:
        r = self._run(["qacct", "-j", job_id], check=False)
        if r.returncode == 0:
            try:
                return qacct_job_info(parse_qacct(r.stdout), job_id)
            except ValueError as exc:
                log.warning("cannot read qacct -j %s: %s", job_id, exc)
        if listed and self._accounting_immediate():
            return JobInfo(job_id=job_id, state=JobState.CANCELLED, raw_state="z",
                           reason="deleted before it started (finished, without an accounting record)")
        why = "finished; no accounting record yet" if listed else "unknown to qstat and qacct"
        return JobInfo(job_id=job_id, state=JobState.UNKNOWN, reason=why, raw_state="z" if listed else "")

    def _accounting_immediate(self) -> bool:
        if self._immediate is None:
            r = self._run(["qconf", "-sconf"], check=False)
            self._immediate = r.returncode == 0 and accounting_is_immediate(r.stdout)
        return self._immediate

    def _in_error(self, job_id: str, job) -> JobInfo:
        """A job in error state never runs: its reason, then it is deleted."""
        r = self._run(["qstat", "-j", job_id], check=False)
        reason = parse_error_reason(r.stdout) or "error state"
        self._run(["qdel", job_id], check=False)
        log.warning("Grid Engine job %s in error state %s (%s): deleted", job_id, job.raw_state, reason)
        info = live_job_info(job, reason=f"error state {job.raw_state}: {reason} (job deleted)")
        return dataclasses.replace(info, state=JobState.FAILED)

    def cancel(self, job_id: str, *, timeout: float = 30.0) -> JobInfo:
        job_id = str(job_id)
        r = self._run(["qdel", job_id], check=False)
        if r.returncode != 0 and "does not exist" not in r.stdout + r.stderr:
            raise BatchError("qdel failed", cmd=["qdel", job_id], returncode=r.returncode,
                             stderr=r.stderr + r.stdout)
        return self._wait_gone(job_id, timeout, ["qdel", job_id])

    def render_script(self, spec: JobSpec, command: Sequence[str]) -> str:
        return render_job_script(spec, command, pe=self.pe, shell=self.shell)

    def estimate_start(self, spec: JobSpec) -> float | None:
        opts = self._options(spec)
        now_cmd = ["qsub", "-w", "p", *opts]
        if self._run(now_cmd, input=spec.script, job_env=spec.env, check=False).returncode == 0:
            return 0.0
        ever_cmd = ["qsub", "-w", "v", *opts]
        r = self._run(ever_cmd, input=spec.script, job_env=spec.env, check=False)
        if r.returncode != 0:
            raise BatchSubmitError("qsub -w v: the job could never run", cmd=ever_cmd,
                                   returncode=r.returncode, stderr=r.stderr + r.stdout)
        return None

    def cluster_info(self, partition: str | None = None) -> ClusterInfo:
        queues = self._run(["qconf", "-sql"]).stdout.split()
        if partition and partition not in queues:
            raise BatchError(f"no queue {partition!r} (queues: {', '.join(queues)})", cmd=["qconf", "-sql"])
        wanted = [partition] if partition else queues
        limits = parse_queue_limits(self._run(["qconf", "-sq", ",".join(wanted)]).stdout) if wanted else {}
        r = self._run(["qstat", "-f", "-xml"])
        try:
            return summarize_queues(parse_qstat_queues(r.stdout), partition, limits=limits, queues=queues)
        except KeyError:
            raise BatchError(f"queue {partition!r} has no queue instance", cmd=["qstat", "-f"]) from None
        except Exception as exc:  # noqa: BLE001 - xml.etree's ParseError
            raise BatchError(f"cannot parse qstat -f -xml output: {exc}", cmd=["qstat", "-f", "-xml"]) from exc

    def queue_length(self, partition: str | None = None) -> int:
        """Pending jobs of every user (a pending job has no queue yet: *partition* is not used)."""
        r = self._run(["qstat", "-xml", "-u", "*", "-s", "p"])
        return sum(1 for j in parse_qstat_jobs(r.stdout).values() if sge_state(j.raw_state) is JobState.PENDING)


register_scheduler(Scheduler(
    name="sge", backend=SgeBackend, summary="Grid Engine (qsub, qstat, qacct, qdel, qconf)",
    options={"pe": SchedulerOption("parallel environment of jobs of more than one slot (qconf -spl)"),
             "shell": SchedulerOption("shell of the job scripts (qsub -S; default /bin/bash)")}))
