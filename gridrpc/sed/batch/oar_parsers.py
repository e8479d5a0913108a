"""Pure parsers of OAR's output, for the OAR backend (:mod:`.oar`).

``oarstat -fJ`` and ``oarstat -J`` (jobs, JSON), ``oarnodes -J`` (resources,
JSON), ``oarsub`` (the job id) and ``oarnotify -l`` (queues). No I/O: each
function takes the text a command printed and returns values or raises
ValueError. Tested against recorded output of OAR 2.5.9
(``tests/test_oar_parsers.py``).

How a job's end is read:

==============================  ============================================
``Terminated``, exit_code 0     ``COMPLETED``
``Terminated``, exit_code W     ``FAILED``; ``W`` is the raw wait status
                                (``768`` = exit 3; a signal in its low bits)
``Error`` + ``WALLTIME`` event  ``TIMEOUT`` (sarko killed it at its walltime)
``Error`` + ``FRAG_JOB_REQUEST``  ``CANCELLED`` (``oardel``; the event says by whom), or
                                ``NODE_FAIL`` when one of the job's resources
                                is ``Dead``, ``Absent`` or ``Suspected``
                                (:func:`down_nodes`): OAR frags the jobs of
                                a node that turns ``Dead`` or ``Absent``
``Error`` + ``BESTEFFORT_KILL``  ``PREEMPTED`` (a besteffort job killed for another job)
``Error`` + a node suspected    ``NODE_FAIL``
any other ``Error``             ``FAILED``, OAR's events as the reason
==============================  ============================================
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .base import ClusterInfo, JobInfo, JobState

__all__ = ["oar_state", "format_walltime", "parse_oarstat", "oar_job_info", "parse_oarsub",
           "parse_oarnodes", "summarize_resources", "parse_queues", "decode_wait_status", "down_nodes"]

_LIVE = {
    "Waiting": JobState.PENDING, "Hold": JobState.PENDING, "toLaunch": JobState.PENDING,
    "toAckReservation": JobState.PENDING, "toError": JobState.RUNNING,
    "Launching": JobState.RUNNING, "Running": JobState.RUNNING, "Finishing": JobState.RUNNING,
    "Suspended": JobState.RUNNING, "Resuming": JobState.RUNNING,
}
#: events that are bookkeeping, not the cause of an error
_ROUTINE = {"SWITCH_INTO_ERROR_STATE", "SWITCH_INTO_TERMINATE_STATE", "SEND_KILL_JOB"}
#: states of a resource whose node is down (OAR kills the jobs of a node set Dead or Absent)
DOWN_STATES = ("Dead", "Absent", "Suspected")


def decode_wait_status(status: int) -> tuple[int, int]:
    """Raw wait status -> ``(exit_code, signal)``."""
    return (status >> 8) & 0xFF, status & 0x7F


def format_walltime(seconds: float) -> str:
    """Seconds -> OAR's ``H:M:S`` (whole seconds, rounded up, at least 1)."""
    s = max(1, int(-(-seconds // 1)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _events(job: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [(str(e.get("type", "")), str(e.get("description", ""))) for e in job.get("events") or []]


def oar_state(raw: str, exit_code: int | None, events: Sequence[tuple[str, str]]
              ) -> tuple[JobState, str | None]:
    """(state, reason) of a job from its OAR state, exit code and events."""
    if raw in _LIVE:
        return _LIVE[raw], None
    if raw == "Terminated":
        if not exit_code:
            return JobState.COMPLETED, None
        code, sig = decode_wait_status(exit_code)
        return JobState.FAILED, f"killed by signal {sig}" if sig else f"exit status {code}"
    if raw == "Error":
        kinds = {t: d for t, d in events}
        if "WALLTIME" in kinds:
            return JobState.TIMEOUT, f"WALLTIME: {kinds['WALLTIME']}"
        if "BESTEFFORT_KILL" in kinds:
            return JobState.PREEMPTED, f"BESTEFFORT_KILL: {kinds['BESTEFFORT_KILL']}"
        if "FRAG_JOB_REQUEST" in kinds:
            return JobState.CANCELLED, f"FRAG_JOB_REQUEST: {kinds['FRAG_JOB_REQUEST']}"
        causes = [f"{t}: {d}" for t, d in events if t not in _ROUTINE] or [f"{t}: {d}" for t, d in events]
        state = JobState.NODE_FAIL if any("SUSPECTED" in t for t, _ in events) else JobState.FAILED
        return state, "; ".join(causes) or "OAR put the job in state Error"
    return JobState.UNKNOWN, f"OAR state {raw}"


def _positive(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if v > 0 else None


def down_nodes(job: Mapping[str, Any], resources: Sequence[Mapping[str, Any]]) -> list[str]:
    """``"HOST (STATE)"`` for each host of the job's resources (``oarstat
    -fJ``'s ``assigned_resources``) that ``oarnodes -J`` shows down now
    (:data:`DOWN_STATES`)."""
    mine = {str(r) for r in job.get("assigned_resources") or ()}
    down = (f"{r.get('network_address', '?')} ({r.get('state')})" for r in resources
            if str(r.get("resource_id")) in mine and r.get("state") in DOWN_STATES)
    return list(dict.fromkeys(down))


def oar_job_info(job: Mapping[str, Any], resources: Sequence[Mapping[str, Any]] | None = None) -> JobInfo:
    """JobInfo of one job of ``oarstat -fJ``. With *resources* (``oarnodes
    -J``), a job OAR fragged while one of its nodes is down is ``NODE_FAIL``
    (OAR frags the jobs of a node that turns ``Dead`` or ``Absent``, with the
    same ``FRAG_JOB_REQUEST`` event as an ``oardel``)."""
    raw = str(job.get("state", ""))
    exit_code = job.get("exit_code")
    exit_code = int(exit_code) if isinstance(exit_code, (int, float)) else None
    state, reason = oar_state(raw, exit_code, _events(job))
    if state is JobState.CANCELLED and resources is not None:
        down = down_nodes(job, resources)
        if down:
            state, reason = JobState.NODE_FAIL, f"{reason}; node {', '.join(down)}"
    code = sig = None
    if state.is_final:
        code, sig = decode_wait_status(exit_code) if exit_code is not None else (None, None)
    ran = state is JobState.RUNNING or (state.is_final and _positive(job.get("startTime")))
    hosts = tuple(dict.fromkeys(job.get("assigned_network_address") or ())) if ran else ()
    resources = job.get("assigned_resources") or ()
    return JobInfo(job_id=str(job.get("Job_Id", job.get("job_id", ""))), state=state, reason=reason,
                   exit_code=code, signal=sig, start_time=_positive(job.get("startTime")) if ran else None,
                   end_time=_positive(job.get("stopTime")) if state.is_final else None,
                   expected_start=_positive(job.get("scheduledStart")) if state is JobState.PENDING else None,
                   node_list=hosts, nb_nodes=len(hosts) or None, nb_cpus=len(resources) or None,
                   time_limit=_positive(job.get("walltime")), name=job.get("name") or None,
                   partition=job.get("queue") or None, raw_state=raw)


def parse_oarstat(text: str) -> dict[str, dict]:
    """The jobs of ``oarstat -J`` / ``oarstat -fJ`` (job id -> its fields)."""
    if not text.strip():
        return {}
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"unexpected oarstat output: {text[:200]!r}")
    return {str(k): v for k, v in data.items() if isinstance(v, dict)}


_JOB_ID_RE = re.compile(r"^OAR_JOB_ID=(-?\d+)\s*$", re.M)


def parse_oarsub(text: str) -> str:
    """The job id ``oarsub`` printed (``OAR_JOB_ID=42``); ValueError when it
    printed none or a negative one (a refusal)."""
    m = _JOB_ID_RE.search(text)
    if not m or int(m.group(1)) < 0:
        raise ValueError(f"no job id in oarsub output {text.strip()!r}")
    return m.group(1)


def parse_oarnodes(text: str) -> list[dict]:
    """The resources of ``oarnodes -J``."""
    return list(parse_oarstat(text).values())


def summarize_resources(resources: Sequence[Mapping[str, Any]], *, partition: str | None,
                        queues: Sequence[str]) -> ClusterInfo:
    """Totals over the resources (all queues share them): a resource is a
    CPU; free when ``Alive`` and running no job; a host is free when all its
    resources are."""
    hosts: dict[str, bool] = {}
    free = 0
    for r in resources:
        idle = r.get("state") == "Alive" and not r.get("jobs")
        free += idle
        host = str(r.get("network_address", ""))
        hosts[host] = hosts.get(host, True) and idle
    return ClusterInfo(partition=partition or "default", total_cpus=len(resources), free_cpus=free,
                       total_nodes=len(hosts), free_nodes=sum(hosts.values()), max_walltime=None,
                       available=any(r.get("state") == "Alive" for r in resources),
                       partitions=tuple(queues), default_partition="default")


def parse_queues(text: str) -> list[str]:
    """Queue names of ``oarnotify -l`` (unindented lines)."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line[0].isspace()]
