"""The pilot manager's values (:mod:`.pilot_policy` is the policy using them):
the actions the pure :class:`~.pilot_policy.PilotPool` returns for the
runtime (:mod:`.pilots`) to carry out, and its records of pilots and calls.

=================  ==========================================================
``SubmitPilot``    submit pilot job ``name``
``CancelPilot``    cancel its job (it has no call left)
``Dispatch``       relay call ``call_id`` to pilot ``pilot``
``FailCall``       answer the call with this error (paused, impossible, pilot lost)
``Note``           something an operator should see: an event and a log line
=================  ==========================================================
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SubmitPilot", "CancelPilot", "Dispatch", "FailCall", "Note", "Pilot", "PilotCall", "COMING"]


@dataclass(frozen=True, slots=True)
class SubmitPilot:
    name: str


@dataclass(frozen=True, slots=True)
class CancelPilot:
    name: str
    job_id: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class Dispatch:
    call_id: str
    pilot: str


@dataclass(frozen=True, slots=True)
class FailCall:
    call_id: str
    message: str


@dataclass(frozen=True, slots=True)
class Note:
    what: str           # pilot_started | pilot_stopped | draining | paused | resumed
    pilot: str | None
    detail: str


@dataclass(slots=True)
class Pilot:
    name: str
    submitted: float
    state: str = "submitting"
    job_id: str | None = None
    started: float | None = None        # the job's start (scheduler), POSIX s
    start_exact: bool = False           # ``started`` is the scheduler's (not the submission time)
    registered: float | None = None
    address: str | None = None
    calls: set = field(default_factory=set)
    idle_since: float = 0.0
    served: int = 0
    doomed: bool = False                # cancel as soon as the job id is known
    expected_wait: float = 0.0          # the scheduler's predicted pending time when it was submitted

    def end(self, walltime: float) -> float | None:
        return None if self.started is None else self.started + walltime



@dataclass(slots=True)
class PilotCall:
    """A call the pool knows: waiting (``pilot`` None) or dispatched."""
    id: str
    need: float
    arrived: float
    pilot: str | None = None
    dispatched: float | None = None



#: the states of a pilot on its way (submitted, its SeD not registered yet)
COMING = ("submitting", "pending", "starting")
