"""OAR backend of the batch SeD (``--batch oar``): ``oarsub``, ``oarstat -J``,
``oardel``, ``oarnodes -J``, ``oarnotify -l``. Tested with OAR 2.5.9.

============================  ==============================================
``submit``                    the script is written next to the job's output
                              (``oar_job.sh`` in its working directory), then
                              ``oarsub [options] SCRIPT``
``states``                    ``oarstat -fJ -j ID1 -j ID2 ...`` (one query;
                              OAR keeps ended jobs in its database), and
                              ``oarnodes -J`` when a job was fragged (a
                              node down, or ``oardel``)
``cancel``                    ``oardel ID``, then ``states`` until final
``estimate_start``            ``oarnodes -J`` and ``oarstat -J``: 0 when the
                              job fits in the idle resources and nobody waits,
                              else None (``oarsub`` refuses impossible jobs)
``cluster_info``              ``oarnodes -J`` (+ ``oarnotify -l``, the queues)
``queue_length``              ``oarstat -J`` (Waiting and Hold jobs)
============================  ==============================================

Resources: a partition is a queue (``-q``), an account a project
(``--project``), the time limit ``walltime=H:M:S``, and the shape
``-l /nodes=N/core=C`` (``C`` = the job's CPUs per node; the resource property
counted as a CPU is the scheduler option ``core``). OAR gives a start estimate
for a job once it waits (``JobInfo.expected_start``, its ``scheduledStart``),
not for a job not yet submitted. OAR jobs start from the submitting user's
login environment, not from the submitter's: the script exports the backend's
``env`` and the job's own variables. Parsing is in :mod:`.oar_parsers`.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import shlex
import tempfile
from collections.abc import Iterable, Mapping, Sequence

from .base import BatchError, BatchSubmitError, ClusterInfo, JobInfo, JobSpec, JobState, meta_variables
from .command import CommandBackend
from .oar_parsers import (format_walltime, oar_job_info, parse_oarnodes, parse_oarstat, parse_oarsub,
                          parse_queues, summarize_resources)
from .registry import Scheduler, SchedulerOption, register_scheduler

__all__ = ["OarBackend", "oarsub_options", "render_job_script", "SCRIPT_NAME"]

log = logging.getLogger(__name__)

#: the job script the backend writes in the job's working directory
SCRIPT_NAME = "oar_job.sh"


def _slots(spec: JobSpec) -> int:
    return max(spec.nodes or 1, (spec.ntasks or 1) * (spec.cpus_per_task or 1))


def resource_request(spec: JobSpec, *, core: str = "core") -> str:
    """The ``-l`` value: ``/nodes=N/core=C`` (or ``/core=C`` without a node
    count) and the walltime."""
    slots = _slots(spec)
    res = f"/nodes={spec.nodes}/{core}={math.ceil(slots / spec.nodes)}" if spec.nodes else f"/{core}={slots}"
    if spec.time_limit is not None:
        res += f",walltime={format_walltime(spec.time_limit)}"
    return res


def oarsub_options(spec: JobSpec, *, core: str = "core") -> list[str]:
    """The oarsub options for *spec* (an entry of ``extra_options`` may hold
    an option and its value: ``-t besteffort``)."""
    opts = ["-n", spec.name, "-l", resource_request(spec, core=core)]
    if spec.workdir:
        opts += ["-d", spec.workdir]
    if spec.output:
        opts += ["-O", spec.output, "-E", spec.error or spec.output]
    elif spec.error:
        opts += ["-E", spec.error]
    if spec.partition:
        opts += ["-q", spec.partition]
    if spec.account:
        opts += ["--project", spec.account]
    extra = [w for o in spec.extra_options for w in shlex.split(o)]
    opts += _without_idempotent_type(extra) if spec.requeue is False else extra
    if any("\n" in o or "\r" in o for o in opts):
        raise ValueError(f"newline in oarsub options {opts!r}")
    return opts


def _without_idempotent_type(words: list[str]) -> list[str]:
    """``words`` (oarsub options) less OAR's ``idempotent`` job type (``-t
    idempotent``, ``--type=idempotent``, ``-t besteffort,idempotent``...): OAR
    resubmits a job of that type that ends with exit code 99 or is killed as
    besteffort; a job of a non-idempotent call must never be run again.
    Without that type OAR never runs a job twice."""
    out: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        if w in ("-t", "--type") and i + 1 < len(words):
            flag, value, i = w, words[i + 1], i + 2
            joined = False
        elif w.startswith("--type=") or (w.startswith("-t") and len(w) > 2 and not w.startswith("--")):
            flag, value = ("--type", w[7:]) if w.startswith("--type=") else ("-t", w[2:].lstrip("="))
            i += 1
            joined = True
        else:
            out.append(w)
            i += 1
            continue
        kept = [t for t in value.split(",") if t != "idempotent"]
        if kept:
            out += [f"{flag}={','.join(kept)}"] if joined else [flag, ",".join(kept)]
    return out


def render_job_script(spec: JobSpec, command: Sequence[str], *, env: Mapping[str, str] | None = None,
                      core: str = "core", shell: str = "/bin/bash") -> str:
    """A job script running *command* with ``#OAR`` lines for *spec*, the
    variables of *env* and ``spec.env`` exported (OAR does not carry the
    submitter's environment), and the meta variables read from
    ``$OAR_JOB_ID`` and ``$OAR_NODEFILE`` (one line per resource). It exits
    with *command*'s status."""
    if not command:
        raise ValueError("empty command")
    own = oarsub_options(dataclasses.replace(spec, extra_options=()), core=core)
    directives = [shlex.join(own[i:i + 2]) for i in range(0, len(own), 2)]
    for o in spec.extra_options:
        words = shlex.split(o)
        words = _without_idempotent_type(words) if spec.requeue is False else words
        if words:
            directives.append(shlex.join(words))
    cpt = spec.cpus_per_task or 1
    # in the call's directory (shared, removed with it) when there is one: a killed job leaves nothing
    nodefile = (shlex.quote(os.path.join(spec.workdir, "gridrpc-nodes")) if spec.workdir
                else '"${TMPDIR:-/tmp}/gridrpc-nodes.$OAR_JOB_ID"')
    tasks = str(spec.ntasks) if spec.ntasks else f"$(( $(wc -l < \"$OAR_NODEFILE\") / {cpt} ))"
    lines = [f"#!{shell}", *(f"#OAR {d}" for d in directives),
             "# generated by gridrpc.sed.batch.oar.render_job_script"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in {**(env or {}), **spec.env}.items()
              if k.isidentifier()]
    lines += [
        *meta_variables("$OAR_JOB_ID", [
            'GRIDRPC_NODELIST="$(awk \'!seen[$1]++ {print $1}\' "$OAR_NODEFILE" | tr \'\\n\' \' \' | sed \'s/ *$//\')"',
            '[ -n "$GRIDRPC_NODELIST" ] || GRIDRPC_NODELIST="$(hostname)"'],
            nodefile, '$(wc -w <<< "$GRIDRPC_NODELIST")', tasks, str(cpt)),
        shlex.join(list(command)),
        "",
    ]
    return "\n".join(lines)


class OarBackend(CommandBackend):
    """:class:`~gridrpc.sed.batch.base.BatchBackend` for OAR.

    :param env: variables added to every command, and exported by the job scripts.
    :param core: the resource property counted as one CPU (``core``; ``cpu`` on some sites).

    Trade-offs: stateless; ``states`` is one ``oarstat`` per poll for any number
    of jobs, ended ones included (OAR's database keeps them). OAR refuses jobs
    of root and of ``oar``: run the SeD as an ordinary user.
    """

    name = "oar"

    def __init__(self, env=None, *, bin_dir=None, command_timeout: float = 30.0, poll_interval: float = 0.5,
                 core: str = "core", shell: str = "/bin/bash"):
        super().__init__(env, bin_dir=bin_dir, command_timeout=command_timeout, poll_interval=poll_interval)
        self.core = core
        self.shell = shell

    def _options(self, spec: JobSpec) -> list[str]:
        try:
            return oarsub_options(spec, core=self.core)
        except ValueError as exc:
            raise BatchSubmitError(str(exc), cmd=["oarsub"]) from exc

    # -- BatchBackend ------------------------------------------------------
    def submit(self, spec: JobSpec) -> str:
        opts = self._options(spec)
        script = self._write_script(spec)
        cmd = ["oarsub", *opts, script]
        r = self._run(cmd, check=False)
        try:
            job_id = parse_oarsub(r.stdout)
        except ValueError:
            job_id = None
        if r.returncode != 0 or job_id is None:
            raise BatchSubmitError("oarsub refused the job", cmd=cmd, returncode=r.returncode,
                                   stderr=(r.stderr + r.stdout).strip())
        log.info("submitted OAR job %s (%s)", job_id, spec.name)
        return job_id

    def _write_script(self, spec: JobSpec) -> str:
        """(the submitting thread) The script as a file the node can run."""
        if spec.workdir:
            path = os.path.join(spec.workdir, SCRIPT_NAME)
        else:
            fd, path = tempfile.mkstemp(prefix="gridrpc-oar-", suffix=".sh")
            os.close(fd)
        try:
            with open(path, "w") as fh:
                fh.write(spec.script)
            os.chmod(path, 0o755)
        except OSError as exc:
            raise BatchSubmitError(f"cannot write the job script {path}: {exc}", cmd=["oarsub"]) from exc
        return path

    def states(self, job_ids: Iterable[str]) -> dict[str, JobInfo]:
        ids = list(dict.fromkeys(str(j) for j in job_ids))
        if not ids:
            return {}
        cmd = ["oarstat", "-fJ", *(a for j in ids for a in ("-j", j))]
        r = self._run(cmd, check=False)
        try:
            jobs = parse_oarstat(r.stdout)
        except ValueError as exc:
            if r.returncode == 0:
                raise BatchError(f"cannot parse oarstat output: {exc}", cmd=cmd[:2]) from exc
            jobs = {}
        if r.returncode != 0 and not jobs:
            raise BatchError("oarstat failed", cmd=cmd[:3], returncode=r.returncode, stderr=r.stderr)
        out = {j: oar_job_info(jobs[j]) if j in jobs else
               JobInfo(job_id=j, state=JobState.UNKNOWN, reason="unknown to oarstat") for j in ids}
        fragged = [j for j, info in out.items() if info.state is JobState.CANCELLED and j in jobs]
        if fragged:     # an oardel, or a node turned Dead/Absent: the same event; the nodes tell
            try:
                resources = self._resources()
            except BatchError as exc:       # the jobs stay CANCELLED, without the nodes' word
                log.warning("oarnodes could not tell why %s ended: %s", ", ".join(fragged), exc)
            else:
                out.update({j: oar_job_info(jobs[j], resources) for j in fragged})
        return out

    def cancel(self, job_id: str, *, timeout: float = 30.0) -> JobInfo:
        job_id = str(job_id)
        r = self._run(["oardel", job_id], check=False)
        if r.returncode != 0:
            info = self.states([job_id])[job_id]
            if info.state.is_final or info.state is JobState.UNKNOWN:
                return info
            raise BatchError("oardel failed", cmd=["oardel", job_id], returncode=r.returncode,
                             stderr=r.stderr + r.stdout)
        return self._wait_gone(job_id, timeout, ["oardel", job_id])

    def render_script(self, spec: JobSpec, command: Sequence[str]) -> str:
        return render_job_script(spec, command, env=self.extra_env, core=self.core, shell=self.shell)

    def estimate_start(self, spec: JobSpec) -> float | None:
        """0 when the job fits in the idle resources now and nobody waits,
        else None (OAR predicts a start only for a job it holds). No job is
        refused here: ``oarsub`` itself refuses one the cluster cannot hold
        ("There are not enough resources for your request")."""
        slots, nodes = _slots(spec), spec.nodes or 1
        per_node = math.ceil(slots / nodes)
        idle: dict[str, int] = {}
        for r in self._resources():
            host = str(r.get("network_address", ""))
            idle[host] = idle.get(host, 0) + (r.get("state") == "Alive" and not r.get("jobs"))
        free_now = sum(n >= per_node for n in idle.values()) >= nodes and sum(idle.values()) >= slots
        return 0.0 if free_now and self.queue_length(spec.partition) == 0 else None

    def _resources(self) -> list[dict]:
        r = self._run(["oarnodes", "-J"])
        try:
            return parse_oarnodes(r.stdout)
        except ValueError as exc:
            raise BatchError(f"cannot parse oarnodes output: {exc}", cmd=["oarnodes", "-J"]) from exc

    def _queues(self) -> list[str]:
        r = self._run(["oarnotify", "-l"], check=False)
        return parse_queues(r.stdout) if r.returncode == 0 else []

    def cluster_info(self, partition: str | None = None) -> ClusterInfo:
        queues = self._queues()
        if partition and queues and partition not in queues:
            raise BatchError(f"no queue {partition!r} (queues: {', '.join(queues)})", cmd=["oarnotify", "-l"])
        return summarize_resources(self._resources(), partition=partition, queues=queues)

    def queue_length(self, partition: str | None = None) -> int:
        r = self._run(["oarstat", "-J"])
        try:
            jobs = parse_oarstat(r.stdout)
        except ValueError as exc:
            raise BatchError(f"cannot parse oarstat output: {exc}", cmd=["oarstat", "-J"]) from exc
        return sum(1 for j in jobs.values() if j.get("state") in ("Waiting", "Hold")
                   and (not partition or j.get("queue") == partition))


register_scheduler(Scheduler(
    name="oar", backend=OarBackend, summary="OAR (oarsub, oarstat, oardel, oarnodes)",
    options={"core": SchedulerOption("resource property counted as one CPU in -l requests (default core)"),
             "shell": SchedulerOption("shell of the job scripts (default /bin/bash)")}))
