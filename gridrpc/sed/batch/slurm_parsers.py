"""Pure parsers of Slurm's output, for the Slurm backend (:mod:`.slurm`).

Values first (state words, durations, timestamps, wait statuses, host lists),
then one parser per command: ``squeue -O``, ``scontrol -o show job``,
``sacct -P``, ``sinfo -o``, ``sbatch --parsable`` and ``sbatch --test-only``.
No I/O: every function takes the text a command printed (and ``now`` where a
time matters) and returns :class:`~gridrpc.sed.batch.base.JobInfo` or
:class:`~gridrpc.sed.batch.base.ClusterInfo` values, or raises ValueError.
Tested against recorded output of Slurm 22.05 (``tests/test_slurm_parsers.py``).
"""
from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from .base import ClusterInfo, JobInfo, JobState

__all__ = [
    "slurm_state", "parse_time_limit", "format_time_limit", "parse_timestamp",
    "decode_wait_status", "expand_hostlist",
    "SQUEUE_FIELDS", "SQUEUE_FORMAT", "parse_squeue", "parse_scontrol_jobs", "parse_scontrol_job",
    "SACCT_FIELDS", "parse_sacct", "SINFO_FORMAT", "SinfoRow", "parse_sinfo", "summarize_partition",
    "parse_sbatch_parsable", "parse_sbatch_test_only",
]

# Slurm prints "now + 1 year" (or garbage far in the future) for "no estimate".
_NO_ESTIMATE_AFTER = 300 * 86400.0
_UNSET = {"", "N/A", "NONE", "None", "Unknown", "(null)", "n/a"}

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



def _time_limit_or_none(text: str) -> float | None:
    """:func:`parse_time_limit`, None for a value it cannot read."""
    try:
        return parse_time_limit(text)
    except ValueError:
        return None


def _rows(text: str, fields: Sequence[str], command: str) -> Iterator[list[str]]:
    """The ``|``-separated rows of *text*, one list of ``len(fields)`` values
    each (the last field may itself hold ``|``); blank lines skipped."""
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split("|", len(fields) - 1)
        if len(f) != len(fields):
            raise ValueError(f"unexpected {command} line: {line!r}")
        yield f


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
    for f in _rows(text, SQUEUE_FIELDS, "squeue"):
        (jid, raw, reason, status, start, end, nodes, nnodes, ncpus, tlimit, part, name) = f
        st = _int_or_none(status)
        code, sig = decode_wait_status(st) if st is not None else (None, None)
        jid = jid.strip()
        jobs[jid] = _job_info(
            job_id=jid, raw_state=raw, reason=_none_if_unset(reason), exit_code=code,
            sig=sig, start=parse_timestamp(start), end=parse_timestamp(end), nodes=nodes,
            nb_nodes=_int_or_none(nnodes), nb_cpus=_int_or_none(ncpus),
            time_limit=_time_limit_or_none(tlimit),
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
        jobs[jid] = _job_info(
            job_id=jid, raw_state=f.get("JobState", ""), reason=_none_if_unset(f.get("Reason", "")),
            exit_code=code, sig=sig, start=parse_timestamp(f.get("StartTime", "")),
            end=parse_timestamp(f.get("EndTime", "")), nodes=f.get("NodeList", ""),
            nb_nodes=_int_or_none(f.get("NumNodes", "")), nb_cpus=_int_or_none(f.get("NumCPUs", "")),
            time_limit=_time_limit_or_none(f.get("TimeLimit", "")),
            partition=_none_if_unset(f.get("Partition", "")),
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
    for f in _rows(text, SACCT_FIELDS, "sacct"):
        jid, raw, exitc, start, end, nodes, nnodes, ncpus, part, tlimit, name = f
        if "." in jid:          # job steps: 42.batch, 42.0
            continue
        code, sig = _parse_exit_pair(exitc)
        jobs[jid] = _job_info(
            job_id=jid, raw_state=raw, reason=None, exit_code=code, sig=sig,
            start=parse_timestamp(start), end=parse_timestamp(end),
            nodes="" if nodes.strip() in ("None assigned",) else nodes,
            nb_nodes=_int_or_none(nnodes), nb_cpus=_int_or_none(ncpus),
            time_limit=_time_limit_or_none(tlimit),
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
