"""Pure parsers of Grid Engine's output, for the Grid Engine backend (:mod:`.sge`).

``qstat -xml`` (jobs, and queue instances with ``-f``), ``qacct -j``,
``qstat -j`` (a job's error reason), ``qconf -sq`` (a queue's ``h_rt``) and
``qconf -sconf`` (when accounting records are written). No I/O: each
function takes the text a command printed and returns values or raises
ValueError. Tested against recorded output of Son of Grid Engine 8.1.9
(``tests/test_sge_parsers.py``).

How a job's end is read (``qacct``'s ``failed`` and ``exit_status``):

=================================  ============================================
``failed 0``, exit 0               ``COMPLETED``
``failed 0``, exit N               ``FAILED`` (reason ``exit status N``)
``failed 37`` (qmaster enforced    ``TIMEOUT`` (``OUT_OF_MEMORY`` when the job
h_rt, h_cpu or h_vmem)             asked for ``h_vmem`` and no time limit)
``failed 100`` (assumedly after    killed by a signal: SIGKILL is ``CANCELLED``
job), exit 128+S                   (``qdel``; Grid Engine does not tell a qdel
                                   from another SIGKILL), others ``FAILED``
``failed 19`` (before writing      ``NODE_FAIL``: the job's shepherd died with
exit_status), ``failed 21`` (in    it (the host crashed, or its execd was
recognizing job)                   killed with its jobs) or the host's execd no
                                   longer knows the job (its spool was lost)
any other ``failed N``             ``FAILED`` (the job could not start or run:
                                   Grid Engine's own words are the reason)
=================================  ============================================
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from .base import ClusterInfo, JobInfo, JobState

__all__ = [
    "QstatJob", "QueueInstance", "sge_state", "parse_sge_time", "format_h_rt", "parse_qstat_jobs",
    "live_job_info", "parse_qacct", "qacct_job_info", "parse_qstat_queues", "summarize_queues",
    "parse_queue_limits", "parse_error_reason", "parse_qsub_terse", "accounting_is_immediate",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class QstatJob:
    """One job of ``qstat -xml -g t`` (its task lines merged)."""
    job_id: str
    raw_state: str
    name: str | None
    start: float | None
    queues: tuple[str, ...]      # queue instances (queue@host), master first
    slots: int


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueInstance:
    """One queue instance (``queue@host``) of ``qstat -f -xml``."""
    queue: str
    host: str
    used: int
    reserved: int
    total: int
    state: str

    @property
    def usable(self) -> bool:
        """Accepts jobs: not disabled (d/D), unreachable (u), in error (E),
        suspended (s/S/C) or orphaned (o)."""
        return not set(self.state) & set("dDuESsCo")


def sge_state(raw: str) -> JobState:
    """A live job's state letters (``qw``, ``hqw``, ``r``, ``t``, ``dr``,
    ``Eqw``, ``s``...) as a :class:`JobState`. ``E`` (error: the job can
    never start) is ``FAILED``; ``z`` (finished) is ``UNKNOWN`` here, its
    end is read from ``qacct``."""
    if "E" in raw:
        return JobState.FAILED
    if "z" in raw:
        return JobState.UNKNOWN
    if set(raw) & set("rtRsST"):
        return JobState.RUNNING
    if "q" in raw or "h" in raw or "w" in raw:
        return JobState.PENDING
    return JobState.UNKNOWN


def parse_sge_time(text: str) -> float | None:
    """Grid Engine time value -> seconds: ``INFINITY`` (None), ``H:M:S``
    or plain seconds."""
    t = text.strip()
    if t.upper() in ("INFINITY", "NONE", ""):
        return None
    if ":" in t:
        h, m, s = (int(p or 0) for p in t.split(":"))
        return float(h * 3600 + m * 60 + s)
    return float(t)


def format_h_rt(seconds: float) -> str:
    """Seconds -> ``h_rt`` value (whole seconds, rounded up, at least 1)."""
    return str(max(1, int(-(-seconds // 1))))


def _timestamp(text: str | None) -> float | None:
    t = (text or "").strip()
    if not t or t == "-/-":
        return None
    for parse in (datetime.fromisoformat, lambda s: datetime.strptime(s, "%a %b %d %H:%M:%S %Y")):
        try:
            return parse(t).timestamp()
        except ValueError:
            continue
    return None


def _text(el: ET.Element, tag: str) -> str | None:
    child = el.find(tag)
    return None if child is None or child.text is None else child.text.strip()


def parse_qstat_jobs(text: str) -> dict[str, QstatJob]:
    """Jobs of ``qstat -xml [-s prsz] [-g t]``: pending, running and finished
    (``z``) ones; the lines of a parallel job's tasks are merged."""
    root = ET.fromstring(text)
    jobs: dict[str, QstatJob] = {}
    for el in root.iter("job_list"):
        jid = _text(el, "JB_job_number")
        if not jid:
            continue
        task = _text(el, "tasks")
        if task:
            jid = f"{jid}.{task}"
        queue = _text(el, "queue_name") or ""
        slots = int(_text(el, "slots") or 1)
        old = jobs.get(jid)
        if old is not None:
            queues = old.queues + ((queue,) if queue else ())
            if _text(el, "master") == "MASTER":
                queues = (queue, *old.queues)
            jobs[jid] = QstatJob(job_id=jid, raw_state=old.raw_state, name=old.name, start=old.start,
                                 queues=queues, slots=old.slots + slots)
            continue
        jobs[jid] = QstatJob(job_id=jid, raw_state=_text(el, "state") or "", name=_text(el, "JB_name"),
                             start=_timestamp(_text(el, "JAT_start_time")),
                             queues=(queue,) if queue else (), slots=slots)
    return jobs


def _hosts(queues: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(q.partition("@")[2] for q in queues if "@" in q))


def live_job_info(job: QstatJob, *, reason: str | None = None) -> JobInfo:
    """JobInfo of a pending or running job as ``qstat`` shows it."""
    state = sge_state(job.raw_state)
    running = state is JobState.RUNNING
    queue = job.queues[0].partition("@")[0] if job.queues else None
    return JobInfo(job_id=job.job_id, state=state, reason=reason, start_time=job.start if running else None,
                   node_list=_hosts(job.queues) if running else (),
                   nb_nodes=len(_hosts(job.queues)) if running else None, nb_cpus=job.slots,
                   name=job.name, partition=queue, raw_state=job.raw_state)


def parse_qacct(text: str) -> list[dict[str, str]]:
    """The records of ``qacct -j ID`` (one per task of a parallel job,
    several if the id was reused), each a dict of its fields."""
    records: list[dict[str, str]] = []
    for line in text.splitlines():
        if line.startswith("====="):
            records.append({})
            continue
        if not records or not line.strip():
            continue
        key, _, value = line.partition(" ")
        records[-1][key.strip()] = value.strip()
    return [r for r in records if r]


_FAILED_RE = re.compile(r"^\s*(\d+)\s*(?::\s*(.*))?$")
_LIMIT_RE = re.compile(r"(?:^|[\s,])(?:h_rt|s_rt|h_cpu)=([0-9:]+)")
_H_RT_RE = re.compile(r"(?:^|[\s,])h_rt=([0-9:]+)")
#: ``failed`` codes of a job lost with its host: no exit status written (19), unknown to the execd (21)
_NODE_LOST = {19, 21}


def qacct_job_info(records: Sequence[dict[str, str]], job_id: str) -> JobInfo:
    """The final JobInfo of a job from its ``qacct`` records (see the module
    doc for the states). With several records (a parallel job's tasks) the
    master's -- the one that ran longest -- decides; the hosts of all count."""
    if not records:
        raise ValueError(f"no accounting record for job {job_id}")
    rec = max(records, key=lambda r: _float(r.get("ru_wallclock", "0").rstrip("s")))
    m = _FAILED_RE.match(rec.get("failed", "0"))
    failed, failed_text = (int(m.group(1)), (m.group(2) or "").strip()) if m else (0, "")
    status = int((rec.get("exit_status", "0").split() or ["0"])[0])
    category = rec.get("category", "")
    sig = status - 128 if status > 128 and failed in (37, 100) else 0
    code = 0 if sig else status
    if failed == 0:
        state = JobState.COMPLETED if status == 0 else JobState.FAILED
        reason = None if status == 0 else f"exit status {status}"
    elif failed == 37:
        vmem_only = "vmem" in category and not _LIMIT_RE.search(category)
        state = JobState.OUT_OF_MEMORY if vmem_only else JobState.TIMEOUT
        reason = f"failed 37: {failed_text}"
    elif failed in _NODE_LOST:
        state = JobState.NODE_FAIL
        reason = f"failed {failed}: {failed_text}"
    elif failed == 100 and sig == 9:
        state = JobState.CANCELLED
        reason = f"failed 100: {failed_text}; killed by SIGKILL (qdel, or a kill outside Grid Engine)"
    else:
        state = JobState.FAILED
        reason = f"failed {failed}: {failed_text}" + (f"; killed by signal {sig}" if sig else "")
    limit = _H_RT_RE.search(category)
    hosts = tuple(dict.fromkeys(r["hostname"] for r in records if r.get("hostname")))
    start = _timestamp(rec.get("start_time"))
    return JobInfo(job_id=job_id, state=state, reason=reason, exit_code=code, signal=sig,
                   start_time=start, end_time=_timestamp(rec.get("end_time")) if start else None,
                   node_list=hosts if start or state is JobState.NODE_FAIL else (), nb_nodes=len(hosts) or None,
                   nb_cpus=int(_float(rec.get("slots", "0"))) or None,
                   time_limit=parse_sge_time(limit.group(1)) if limit else None,
                   name=rec.get("jobname"), partition=rec.get("qname"),
                   raw_state=f"failed {failed}, exit_status {status}")


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def parse_qstat_queues(text: str) -> list[QueueInstance]:
    """Queue instances of ``qstat -f -xml``."""
    root = ET.fromstring(text)
    out = []
    for el in root.iter("Queue-List"):
        name = _text(el, "name") or ""
        queue, _, host = name.partition("@")
        out.append(QueueInstance(queue=queue, host=host, used=int(_text(el, "slots_used") or 0),
                                 reserved=int(_text(el, "slots_resv") or 0),
                                 total=int(_text(el, "slots_total") or 0), state=_text(el, "state") or ""))
    return out


def summarize_queues(instances: Sequence[QueueInstance], queue: str | None, *,
                     limits: dict[str, float | None], queues: Sequence[str]) -> ClusterInfo:
    """Slots and hosts of *queue* (every queue when None, named ``*``):
    free slots are those of usable instances; a host is free when none of
    its usable instances runs anything. KeyError if the queue has no instance."""
    mine = [q for q in instances if queue is None or q.queue == queue]
    if not mine:
        raise KeyError(queue)
    hosts: dict[str, bool] = {}
    for q in mine:
        hosts[q.host] = hosts.get(q.host, True) and q.usable and q.used + q.reserved == 0
    wanted = [limits.get(q) for q in ({queue} if queue else set(limits))]
    return ClusterInfo(
        partition=queue or "*",
        total_cpus=sum(q.total for q in mine),
        free_cpus=sum(max(0, q.total - q.used - q.reserved) for q in mine if q.usable),
        total_nodes=len(hosts), free_nodes=sum(hosts.values()),
        max_walltime=None if not wanted or None in wanted else max(wanted),
        available=any(q.usable for q in mine), partitions=tuple(queues), default_partition=None)


def parse_queue_limits(text: str) -> dict[str, float | None]:
    """Queue name -> ``h_rt`` (seconds, None = unlimited) from ``qconf -sq Q1,Q2``."""
    out: dict[str, float | None] = {}
    name = None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "qname":
            name = value.strip()
            out[name] = None
        elif key == "h_rt" and name is not None:
            value = value.strip()
            # a per-host override looks like "INFINITY,[host=1:00:00]": the first value is the queue's
            out[name] = parse_sge_time(value.split(",", 1)[0])
    return out


def parse_error_reason(text: str) -> str | None:
    """The ``error reason`` lines of ``qstat -j ID`` (a job in state E)."""
    reasons = [line.split(":", 1)[1].strip() for line in text.splitlines()
               if line.startswith("error reason")]
    return "; ".join(reasons) or None


def parse_qsub_terse(text: str) -> str:
    """``qsub -terse`` prints the job id (``42``, ``42.1-10:1`` for arrays)."""
    line = text.strip().splitlines()[-1] if text.strip() else ""
    jid = line.split(".", 1)[0].strip()
    if not jid.isdigit():
        raise ValueError(f"no job id in qsub output {text!r}")
    return jid


def accounting_is_immediate(sconf: str) -> bool:
    """True when ``qconf -sconf``'s ``reporting_params`` write accounting
    records at once (``accounting_flush_time`` 0, or ``flush_time`` 0 when
    it is not set): a finished job without a record then never ran."""
    text = sconf.replace("\\\n", " ")
    line = next((ln for ln in text.splitlines() if ln.startswith("reporting_params")), "")
    params = dict(p.split("=", 1) for p in line.split()[1:] if "=" in p)
    value = params.get("accounting_flush_time", params.get("flush_time", "00:00:15"))
    try:
        return parse_sge_time(value) == 0
    except ValueError:
        return False
