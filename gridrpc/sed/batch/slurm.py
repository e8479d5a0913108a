"""Slurm backend of the batch SeD: ``sbatch``, ``squeue``, ``scontrol``,
``scancel``, ``sinfo``, ``sacct`` with parsable ``-o``/``-O`` output.

``--json`` is avoided on purpose: its schema changes between Slurm versions,
while the format letters/fields used here are stable since Slurm 17.
The parsing lives in pure functions (``parse_*``) tested against recorded
output of Slurm 22.05 (``tests/test_slurm_parsers.py``).

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
import math
import os
import re
import shlex
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from .base import (BatchError, BatchSubmitError, BatchTimeout, ClusterInfo, JobInfo,
                   JobSpec, JobState)

__all__ = [
    "SlurmBackend", "render_job_script", "sbatch_options",
    "parse_squeue", "parse_scontrol_job", "parse_scontrol_jobs", "parse_sacct",
    "parse_sinfo", "summarize_partition", "parse_sbatch_parsable", "parse_sbatch_test_only",
    "parse_time_limit", "format_time_limit", "parse_timestamp", "expand_hostlist",
    "slurm_state", "decode_wait_status", "SinfoRow",
]

log = logging.getLogger(__name__)

# Slurm prints "now + 1 year" (or garbage far in the future) for "no estimate".
_NO_ESTIMATE_AFTER = 300 * 86400.0
_UNSET = {"", "N/A", "NONE", "None", "Unknown", "(null)", "n/a"}

# ---------------------------------------------------------------------------
# pure helpers
# ---------------------------------------------------------------------------

_STATE_MAP = {
    "PENDING": JobState.PENDING, "REQUEUED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING, "REQUEUE_FED": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING, "SPECIAL_EXIT": JobState.PENDING,
    "RUNNING": JobState.RUNNING, "CONFIGURING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING, "SUSPENDED": JobState.RUNNING,
    "STOPPED": JobState.RUNNING, "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING, "RESIZING": JobState.RUNNING,
    "COMPLETED": JobState.COMPLETED,
    "FAILED": JobState.FAILED,
    "CANCELLED": JobState.CANCELLED, "REVOKED": JobState.CANCELLED,
    "TIMEOUT": JobState.TIMEOUT, "DEADLINE": JobState.TIMEOUT,
    "NODE_FAIL": JobState.NODE_FAIL, "BOOT_FAIL": JobState.NODE_FAIL,
    "PREEMPTED": JobState.PREEMPTED,
    "OUT_OF_MEMORY": JobState.OUT_OF_MEMORY,
}


def slurm_state(raw: str) -> JobState:
    """Map a Slurm state word (``squeue %T``, ``JobState=``, sacct's
    ``CANCELLED by 0``, ``RUNNING+``...) to a :class:`JobState`.
    ``COMPLETING`` counts as RUNNING: processes may still be alive."""
    word = raw.strip().split(" ", 1)[0].rstrip("+").upper()
    return _STATE_MAP.get(word, JobState.UNKNOWN)


def parse_time_limit(text: str) -> float | None:
    """Slurm duration -> seconds; ``None`` for unlimited/unset.

    Accepts ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``,
    ``UNLIMITED``/``INFINITE``/``infinite``, ``NOT_SET``, ``N/A``.
    Raises ValueError on anything else."""
    t = text.strip()
    if t.upper() in {"UNLIMITED", "INFINITE", "NOT_SET", "N/A", "NONE", ""}:
        return None
    days = 0
    if "-" in t:
        d, t = t.split("-", 1)
        days = int(d)
        parts = [int(p) for p in t.split(":")]
        if not 1 <= len(parts) <= 3:
            raise ValueError(f"bad Slurm time {text!r}")
        parts += [0] * (3 - len(parts))
        h, m, s = parts
    else:
        parts = [int(p) for p in t.split(":")]
        if len(parts) == 1:
            h, m, s = 0, parts[0], 0
        elif len(parts) == 2:
            h, m, s = 0, parts[0], parts[1]
        elif len(parts) == 3:
            h, m, s = parts
        else:
            raise ValueError(f"bad Slurm time {text!r}")
    return float(((days * 24 + h) * 60 + m) * 60 + s)


def format_time_limit(seconds: float) -> str:
    """Seconds -> Slurm ``D-HH:MM:SS`` rounded *up* to whole minutes (Slurm's
    resolution), at least one minute."""
    minutes = max(1, math.ceil(seconds / 60.0))
    d, rem = divmod(minutes, 24 * 60)
    h, m = divmod(rem, 60)
    return f"{d}-{h:02d}:{m:02d}:00"


def parse_timestamp(text: str) -> float | None:
    """Slurm local ``YYYY-MM-DDTHH:MM:SS`` -> POSIX time; ``None`` if unset."""
    t = text.strip()
    if t in _UNSET:
        return None
    try:
        return datetime.fromisoformat(t).timestamp()
    except ValueError:
        return None


def decode_wait_status(status: int) -> tuple[int, int]:
    """Raw wait status (``squeue -O exit_code``) -> ``(exit_code, signal)``,
    Slurm's ``ExitCode=exit:signal``."""
    sig = status & 0x7F
    return ((status >> 8) & 0xFF, sig)


def _parse_exit_pair(text: str) -> tuple[int | None, int | None]:
    try:
        code, sig = text.strip().split(":", 1)
        return int(code), int(sig)
    except ValueError:
        return None, None


_RANGE_RE = re.compile(r"\[([^\]]*)\]")


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Expand a Slurm host list (``n[01-03,7],gpu[1-2]-ib``) like
    ``scontrol show hostnames`` does (zero padding kept)."""
    text = text.strip()
    if text in _UNSET:
        return ()
    # split on commas outside brackets
    items, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += ch == "["
        depth -= ch == "]"
        cur += ch
    items.append(cur)
    hosts: list[str] = []
    for item in filter(None, items):
        expanded = [""]
        pos = 0
        for m in _RANGE_RE.finditer(item):
            prefix = item[pos:m.start()]
            choices = []
            for part in m.group(1).split(","):
                if "-" in part:
                    lo, hi = part.split("-", 1)
                    width = len(lo)
                    choices += [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
                else:
                    choices.append(part)
            expanded = [e + prefix + c for e in expanded for c in choices]
            pos = m.end()
        hosts += [e + item[pos:] for e in expanded]
    return tuple(hosts)


def _int_or_none(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def _none_if_unset(text: str) -> str | None:
    t = text.strip()
    return None if t in _UNSET else t


def _job_info(*, job_id: str, raw_state: str, reason: str | None, exit_code: int | None,
              sig: int | None, start: float | None, end: float | None, nodes: str,
              nb_nodes: int | None, nb_cpus: int | None, time_limit: float | None,
              partition: str | None, name: str | None, now: float) -> JobInfo:
    state = slurm_state(raw_state)
    node_list = expand_hostlist(nodes)
    expected = None
    if state is JobState.PENDING:
        if start is not None and start - now < _NO_ESTIMATE_AFTER:
            expected = start
        start = end = None
        node_list = ()
    elif state is JobState.RUNNING:
        end = None               # Slurm puts the time-limit end here
    elif not node_list:          # ended before it ever ran (cancelled while pending)
        start = None
    if not state.is_final:
        exit_code = sig = None
    return JobInfo(job_id=job_id, state=state, reason=reason, exit_code=exit_code,
                   signal=sig, start_time=start, end_time=end, expected_start=expected,
                   node_list=node_list, nb_nodes=nb_nodes, nb_cpus=nb_cpus,
                   time_limit=time_limit, name=name, partition=partition,
                   raw_state=raw_state.strip())


# -- squeue ----------------------------------------------------------------

SQUEUE_FIELDS = ("JobID", "State", "Reason", "exit_code", "StartTime", "EndTime",
                 "NodeList", "NumNodes", "NumCPUs", "TimeLimit", "Partition", "Name")
# width 0 = no padding; "|" suffix separates; Name last (it may hold "|")
SQUEUE_FORMAT = ",".join(f"{f}:0|" for f in SQUEUE_FIELDS[:-1]) + f",{SQUEUE_FIELDS[-1]}:0"


def parse_squeue(text: str, *, now: float | None = None) -> dict[str, JobInfo]:
    """Parse ``squeue -h -t all -O SQUEUE_FORMAT`` output."""
    now = time.time() if now is None else now
    jobs: dict[str, JobInfo] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split("|", len(SQUEUE_FIELDS) - 1)
        if len(f) != len(SQUEUE_FIELDS):
            raise ValueError(f"unexpected squeue line: {line!r}")
        (jid, raw, reason, status, start, end, nodes, nnodes, ncpus, tlimit, part, name) = f
        st = _int_or_none(status)
        code, sig = decode_wait_status(st) if st is not None else (None, None)
        try:
            limit = parse_time_limit(tlimit)
        except ValueError:
            limit = None
        jid = jid.strip()
        jobs[jid] = _job_info(
            job_id=jid, raw_state=raw, reason=_none_if_unset(reason), exit_code=code,
            sig=sig, start=parse_timestamp(start), end=parse_timestamp(end), nodes=nodes,
            nb_nodes=_int_or_none(nnodes), nb_cpus=_int_or_none(ncpus), time_limit=limit,
            partition=_none_if_unset(part), name=name.strip() or None, now=now)
    return jobs


# -- scontrol ----------------------------------------------------------------

_KV_SPLIT = re.compile(r"\s+(?=[A-Za-z][A-Za-z0-9_:/]*=)")


def _scontrol_fields(line: str) -> dict[str, str]:
    out = {}
    for item in _KV_SPLIT.split(line.strip()):
        if "=" in item:
            k, v = item.split("=", 1)
            out[k] = v.strip()
    return out


def parse_scontrol_jobs(text: str, *, now: float | None = None) -> dict[str, JobInfo]:
    """Parse ``scontrol -o show job [ID]`` (one job per line)."""
    now = time.time() if now is None else now
    jobs = {}
    for line in text.splitlines():
        if not line.startswith("JobId="):
            continue
        f = _scontrol_fields(line)
        jid = f.get("JobId", "")
        if f.get("ArrayJobId") and f.get("ArrayTaskId") not in (None, "", "N/A"):
            jid = f"{f['ArrayJobId']}_{f['ArrayTaskId']}"
        code, sig = _parse_exit_pair(f.get("ExitCode", ""))
        try:
            limit = parse_time_limit(f.get("TimeLimit", ""))
        except ValueError:
            limit = None
        jobs[jid] = _job_info(
            job_id=jid, raw_state=f.get("JobState", ""), reason=_none_if_unset(f.get("Reason", "")),
            exit_code=code, sig=sig, start=parse_timestamp(f.get("StartTime", "")),
            end=parse_timestamp(f.get("EndTime", "")), nodes=f.get("NodeList", ""),
            nb_nodes=_int_or_none(f.get("NumNodes", "")), nb_cpus=_int_or_none(f.get("NumCPUs", "")),
            time_limit=limit, partition=_none_if_unset(f.get("Partition", "")),
            name=_none_if_unset(f.get("JobName", "")), now=now)
    return jobs


def parse_scontrol_job(text: str, *, now: float | None = None) -> JobInfo | None:
    """The first job of ``scontrol -o show job ID`` output, or None."""
    jobs = parse_scontrol_jobs(text, now=now)
    return next(iter(jobs.values()), None)


# -- sacct ---------------------------------------------------------------------

SACCT_FIELDS = ("JobID", "State", "ExitCode", "Start", "End", "NodeList", "NNodes",
                "NCPUS", "Partition", "Timelimit", "JobName")


def parse_sacct(text: str, *, now: float | None = None) -> dict[str, JobInfo]:
    """Parse ``sacct -n -P -o SACCT_FIELDS`` (also with ``-c``); steps skipped."""
    now = time.time() if now is None else now
    jobs = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split("|", len(SACCT_FIELDS) - 1)
        if len(f) != len(SACCT_FIELDS):
            raise ValueError(f"unexpected sacct line: {line!r}")
        jid, raw, exitc, start, end, nodes, nnodes, ncpus, part, tlimit, name = f
        if "." in jid:          # job steps: 42.batch, 42.0
            continue
        code, sig = _parse_exit_pair(exitc)
        try:
            limit = parse_time_limit(tlimit)
        except ValueError:
            limit = None
        jobs[jid] = _job_info(
            job_id=jid, raw_state=raw, reason=None, exit_code=code, sig=sig,
            start=parse_timestamp(start), end=parse_timestamp(end),
            nodes="" if nodes.strip() in ("None assigned",) else nodes,
            nb_nodes=_int_or_none(nnodes), nb_cpus=_int_or_none(ncpus), time_limit=limit,
            partition=_none_if_unset(part), name=_none_if_unset(name), now=now)
    return jobs


# -- sinfo ---------------------------------------------------------------------

SINFO_FORMAT = "%P|%a|%l|%D|%F|%C"


@dataclass(frozen=True, slots=True, kw_only=True)
class SinfoRow:
    partition: str
    default: bool
    available: bool
    max_walltime: float | None
    nodes: int
    nodes_alloc: int
    nodes_idle: int
    nodes_other: int
    cpus_alloc: int
    cpus_idle: int
    cpus_other: int
    cpus_total: int


def parse_sinfo(text: str) -> list[SinfoRow]:
    """Parse ``sinfo -h -o SINFO_FORMAT`` (``%F`` and ``%C`` are A/I/O/T)."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.strip().split("|")
        if len(f) != 6:
            raise ValueError(f"unexpected sinfo line: {line!r}")
        part, avail, limit, nodes, nstate, cstate = f
        na, ni, no, _nt = (int(x) for x in nstate.split("/"))
        ca, ci, co, ct = (int(x) for x in cstate.split("/"))
        rows.append(SinfoRow(
            partition=part.rstrip("*"), default=part.endswith("*"),
            available=avail.strip().lower() == "up", max_walltime=parse_time_limit(limit),
            nodes=int(nodes), nodes_alloc=na, nodes_idle=ni, nodes_other=no,
            cpus_alloc=ca, cpus_idle=ci, cpus_other=co, cpus_total=ct))
    return rows


def summarize_partition(rows: Sequence[SinfoRow], partition: str | None = None) -> ClusterInfo:
    """Totals of one partition (the default one if None) from sinfo rows.
    Raises KeyError if the partition does not exist."""
    names = tuple(dict.fromkeys(r.partition for r in rows))
    default = next((r.partition for r in rows if r.default), names[0] if names else None)
    target = partition or default
    mine = [r for r in rows if r.partition == target]
    if not mine:
        raise KeyError(target)
    limits = [r.max_walltime for r in mine]
    return ClusterInfo(
        partition=target,
        total_cpus=sum(r.cpus_total for r in mine),
        free_cpus=sum(r.cpus_idle for r in mine),
        total_nodes=sum(r.nodes for r in mine),
        free_nodes=sum(r.nodes_idle for r in mine),
        max_walltime=None if None in limits else max(limits),
        available=any(r.available for r in mine),
        partitions=names, default_partition=default)


# -- sbatch ----------------------------------------------------------------------

def parse_sbatch_parsable(text: str) -> str:
    """``sbatch --parsable`` prints ``ID`` or ``ID;cluster``."""
    line = text.strip().splitlines()[-1] if text.strip() else ""
    jid = line.split(";", 1)[0].strip()
    if not jid or not jid.replace("_", "").isdigit():
        raise ValueError(f"no job id in sbatch output {text!r}")
    return jid


_TEST_ONLY_RE = re.compile(
    r"Job (?P<id>\S+) to start at (?P<start>\S+) using (?P<cpus>\d+) processors"
    r" on nodes (?P<nodes>\S+) in partition (?P<part>\S+)")


def parse_sbatch_test_only(text: str, *, now: float | None = None) -> float | None:
    """Start time (POSIX) from ``sbatch --test-only`` (stderr) output; None
    when there is no usable estimate (Slurm's "in a year" or beyond)."""
    now = time.time() if now is None else now
    m = _TEST_ONLY_RE.search(text)
    if not m:
        raise ValueError(f"no estimate in sbatch --test-only output {text!r}")
    start = parse_timestamp(m.group("start"))
    if start is None or start - now >= _NO_ESTIMATE_AFTER:
        return None
    return start


def sbatch_options(spec: JobSpec) -> list[str]:
    """The sbatch options (``--opt=value``) for *spec*'s resources."""
    opts = [f"--job-name={spec.name}"]
    if spec.workdir:
        opts.append(f"--chdir={spec.workdir}")
    if spec.partition:
        opts.append(f"--partition={spec.partition}")
    if spec.account:
        opts.append(f"--account={spec.account}")
    if spec.time_limit is not None:
        opts.append(f"--time={format_time_limit(spec.time_limit)}")
    if spec.nodes is not None:
        opts.append(f"--nodes={spec.nodes}")
    if spec.ntasks is not None:
        opts.append(f"--ntasks={spec.ntasks}")
    if spec.cpus_per_task is not None:
        opts.append(f"--cpus-per-task={spec.cpus_per_task}")
    if spec.output:
        opts.append(f"--output={spec.output}")
    if spec.error:
        opts.append(f"--error={spec.error}")
    opts += list(spec.extra_options)
    for o in opts:
        if "\n" in o or "\r" in o:
            raise ValueError(f"newline in sbatch option {o!r}")
    return opts


def render_job_script(spec: JobSpec, command: Sequence[str], *,
                      shell: str = "/bin/bash") -> str:
    """A batch script running *command* with ``#SBATCH`` lines for *spec* and
    DIET-like meta variables exported before it:

    - ``GRIDRPC_JOB_ID``      the job id (``$SLURM_JOB_ID``)
    - ``GRIDRPC_NODELIST``    allocated hosts, expanded, space-separated
    - ``GRIDRPC_NODEFILE``    a file with one allocated host per line
    - ``GRIDRPC_NB_NODES``    number of nodes
    - ``GRIDRPC_NB_TASKS``    number of tasks
    - ``GRIDRPC_CPUS_PER_TASK``  CPUs per task
    - ``GRIDRPC_JOB_STARTED`` when the script began (POSIX seconds, for run-time accounting)
    The script exits with *command*'s status. ``spec.script`` is ignored here
    (this function produces that text)."""
    if not command:
        raise ValueError("empty command")
    for o in sbatch_options(spec):
        if any(c.isspace() for c in o):
            raise ValueError(f"whitespace in #SBATCH option {o!r}; pass it on the "
                             "command line (JobSpec fields are) instead")
    lines = [f"#!{shell}"]
    lines += [f"#SBATCH {o}" for o in sbatch_options(spec)]
    lines += [
        "# generated by gridrpc.sed.batch.slurm.render_job_script",
        'export GRIDRPC_JOB_STARTED="$(date +%s.%N 2>/dev/null)"',
        'export GRIDRPC_JOB_ID="$SLURM_JOB_ID"',
        'GRIDRPC_NODELIST="$(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null'
        ' | tr \'\\n\' \' \' | sed \'s/ *$//\')"',
        '[ -n "$GRIDRPC_NODELIST" ] || GRIDRPC_NODELIST="$SLURM_JOB_NODELIST"',
        "export GRIDRPC_NODELIST",
        'export GRIDRPC_NODEFILE="${TMPDIR:-/tmp}/gridrpc-nodes.$SLURM_JOB_ID"',
        'echo "$GRIDRPC_NODELIST" | tr \' \' \'\\n\' > "$GRIDRPC_NODEFILE"',
        "trap 'rm -f \"$GRIDRPC_NODEFILE\"' EXIT",
        'export GRIDRPC_NB_NODES="${SLURM_JOB_NUM_NODES:-1}"',
        'export GRIDRPC_NB_TASKS="${SLURM_NTASKS:-${SLURM_NPROCS:-$GRIDRPC_NB_NODES}}"',
        'export GRIDRPC_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-1}"',
        shlex.join(list(command)),
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# the backend
# ---------------------------------------------------------------------------

class SlurmBackend:
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

    def __init__(self, env: Mapping[str, str] | None = None, *, bin_dir: str | None = None,
                 command_timeout: float = 30.0, poll_interval: float = 0.5):
        self.extra_env = dict(env or {})
        self.bin_dir = bin_dir
        self.command_timeout = command_timeout
        self.poll_interval = poll_interval

    # -- plumbing ----------------------------------------------------------
    def _cmd(self, name: str) -> str:
        return os.path.join(self.bin_dir, name) if self.bin_dir else name

    def _run(self, args: Sequence[str], *, input: str | None = None,
             job_env: Mapping[str, str] | None = None, check: bool = True,
             timeout: float | None = None) -> subprocess.CompletedProcess:
        cmd = [self._cmd(args[0]), *args[1:]]
        env = {**os.environ, **self.extra_env, **(job_env or {})}
        timeout = self.command_timeout if timeout is None else timeout
        log.debug("running %s", shlex.join(cmd))
        try:
            r = subprocess.run(cmd, input=input, env=env, capture_output=True, text=True,
                               timeout=timeout, stdin=None if input is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise BatchTimeout(f"{args[0]} did not answer within {timeout:g}s", cmd=cmd,
                               stderr=(exc.stderr or b"").decode(errors="replace")
                               if isinstance(exc.stderr, bytes) else (exc.stderr or "")) from exc
        except OSError as exc:
            raise BatchError(f"cannot run {args[0]}: {exc}", cmd=cmd) from exc
        if check and r.returncode != 0:
            raise BatchError(f"{args[0]} failed", cmd=cmd, returncode=r.returncode,
                             stderr=r.stderr)
        return r

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
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            info = self.states([job_id])[job_id]
            if info.state.is_final or info.state is JobState.UNKNOWN:
                log.info("Slurm job %s cancelled: %s", job_id, info.raw_state or info.state.value)
                return info
            if time.monotonic() >= deadline:
                raise BatchTimeout(f"job {job_id} still {info.raw_state} {timeout:g}s after scancel",
                                   cmd=["scancel", job_id])
            time.sleep(delay)
            delay = min(delay * 2, self.poll_interval)

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
