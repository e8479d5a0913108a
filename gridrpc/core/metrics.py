"""Fairness metrics of an optional-computation run (Klein-Halmaghi 2012, ch. 7).

Definitions (``/work/shared/notes/optional-computations.md``):

* **unhappy users** — users whose mandatory requests were not all done by their
  deadline ``d_i`` (``mandatory_done_time`` is ``None`` or ``> d_i``);
* ``S_j`` — the j-th element of the sorted set ``{t0_i} ∪ {d_i}``;
  ``U_j = {i : t0_i <= S_j and S_{j+1} <= d_i}``;
  ``deserved_i = Σ_{j : i ∈ U_j} n_R (S_{j+1} - S_j) / |U_j|``;
* ``allocated_i`` — server-seconds used by the user's requests, **killed,
  cancelled-while-running and failed work included** (it occupied a server);
* ``satisfaction_i = allocated_i / deserved_i``;
  ``unfairness = max_i satisfaction_i - min_i satisfaction_i``;
* **completed** — all completed requests, mandatory and optional.

A user whose ``deserved`` is 0 (only possible when ``d_i == t0_i``) has no
defined satisfaction: it is left out of ``satisfaction`` and of the unfairness.
With fewer than two satisfactions the unfairness is 0.

Event log
---------
The experiment runner writes a flat list of JSON objects, one per event, in
any order (they are sorted stably by ``t``). Every event has ``type`` and ``t``
(seconds, the run's clock). Types and their fields:

``user_arrive``     ``user``, ``deadline`` (absolute time), ``n_min``
                    (optional: ``n_max``). ``t`` is the user's ``t0``.
``mandatory_done``  ``user``. The user's last mandatory result arrived.
                    Optional: when absent, the time of the user's ``n_min``-th
                    completed mandatory call (``call_end``) is used instead.
``user_leave``      ``user``. Informational; closes calls left open.
``call_start``      ``call`` (request id, unique in the log), ``user``,
                    ``optional`` (bool); optional: ``server``. Written when a
                    SeD *starts running* the call (not when it is queued).
``call_end``        ``call``, ``status``: ``"completed"``, ``"killed"``
                    (preempted by the queue), ``"cancelled"`` (client
                    cancelled while running) or ``"failed"``. A ``call_end``
                    without ``call_start`` (cancelled while waiting) is ignored:
                    it used no server time.

Unknown event types are ignored (so the log may carry more, e.g.
``call_submit``). A call with ``call_start`` but no ``call_end`` is closed at
its user's ``user_leave`` time, or else at the log's last time, and counts as
neither completed nor killed.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["UserRecord", "RequestRecord", "EthicMetrics", "compute_metrics",
           "deserved_shares", "records_from_events", "metrics_from_events"]

CALL_STATUSES = frozenset({"completed", "killed", "cancelled", "failed"})


@dataclass(frozen=True, slots=True)
class UserRecord:
    user: str
    t0: float
    deadline: float                      # absolute time d_i
    n_min: int
    mandatory_done_time: float | None = None


@dataclass(frozen=True, slots=True)
class RequestRecord:
    user: str
    start: float                         # server started running it
    end: float                           # server stopped running it
    completed: bool = False
    killed: bool = False
    optional: bool = False

    @property
    def duration(self) -> float:
        return max(0.0, self.end - self.start)


@dataclass(frozen=True, slots=True, kw_only=True)
class EthicMetrics:
    unhappy_users: int
    unfairness: float
    completed: int
    satisfaction: Mapping[str, float]
    deserved: Mapping[str, float]
    allocated: Mapping[str, float]
    unhappy: tuple[str, ...] = ()
    completed_mandatory: int = 0
    completed_optional: int = 0
    killed: int = 0
    killed_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("satisfaction", "deserved", "allocated"):
            d[k] = dict(d[k])
        d["unhappy"] = list(self.unhappy)
        return d


def deserved_shares(users: Sequence[UserRecord], n_R: int) -> dict[str, float]:
    """``deserved_i`` for every user (the equal share of ``n_R`` servers over
    the intervals during which the user was present)."""
    deserved = {u.user: 0.0 for u in users}
    points = sorted({u.t0 for u in users} | {u.deadline for u in users})
    for s_j, s_next in zip(points, points[1:]):
        present = [u.user for u in users if u.t0 <= s_j and s_next <= u.deadline]
        if present:
            share = n_R * (s_next - s_j) / len(present)
            for name in present:
                deserved[name] += share
    return deserved


def compute_metrics(users: Sequence[UserRecord], requests: Iterable[RequestRecord],
                    n_R: int, *, tolerance: float = 0.0) -> EthicMetrics:
    """Metrics of a run. ``tolerance`` (seconds) is the slack allowed when
    comparing ``mandatory_done_time`` with the deadline."""
    if n_R <= 0:
        raise ValueError(f"n_R must be positive, got {n_R}")
    names = [u.user for u in users]
    if len(set(names)) != len(names):
        raise ValueError("duplicate user in user records")
    allocated = {name: 0.0 for name in names}
    completed = completed_mand = completed_opt = killed = 0
    killed_seconds = 0.0
    for r in requests:
        if r.user not in allocated:
            raise ValueError(f"request of unknown user {r.user!r}")
        allocated[r.user] += r.duration
        if r.completed:
            completed += 1
            if r.optional:
                completed_opt += 1
            else:
                completed_mand += 1
        if r.killed:
            killed += 1
            killed_seconds += r.duration
    deserved = deserved_shares(users, n_R)
    satisfaction = {name: allocated[name] / deserved[name]
                    for name in names if deserved[name] > 0.0}
    sats = list(satisfaction.values())
    unfairness = (max(sats) - min(sats)) if len(sats) >= 2 else 0.0
    unhappy = tuple(u.user for u in users
                    if u.mandatory_done_time is None
                    or u.mandatory_done_time > u.deadline + tolerance)
    return EthicMetrics(unhappy_users=len(unhappy), unfairness=unfairness,
                        completed=completed, satisfaction=satisfaction,
                        deserved=deserved, allocated=allocated, unhappy=unhappy,
                        completed_mandatory=completed_mand,
                        completed_optional=completed_opt,
                        killed=killed, killed_seconds=killed_seconds)


def _field(ev: Mapping[str, Any], name: str) -> Any:
    try:
        return ev[name]
    except KeyError:
        raise ValueError(f"event {ev.get('type')!r} lacks field {name!r}: {ev!r}") from None


def records_from_events(events: Iterable[Mapping[str, Any]]
                        ) -> tuple[list[UserRecord], list[RequestRecord]]:
    """Build the metric records from a flat event log (format in the module
    docstring)."""
    evs = sorted(events, key=lambda e: float(_field(e, "t")))
    arrivals: dict[str, Mapping[str, Any]] = {}
    done_explicit: dict[str, float] = {}
    leave: dict[str, float] = {}
    open_calls: dict[str, Mapping[str, Any]] = {}
    seen_calls: set[str] = set()
    closed: list[tuple[Mapping[str, Any], float, str | None]] = []
    last_t = 0.0
    for ev in evs:
        kind = _field(ev, "type")
        t = float(ev["t"])
        last_t = max(last_t, t)
        if kind == "user_arrive":
            user = _field(ev, "user")
            if user in arrivals:
                raise ValueError(f"user {user!r} arrives twice")
            _field(ev, "deadline")
            _field(ev, "n_min")
            arrivals[user] = ev
        elif kind == "mandatory_done":
            done_explicit.setdefault(_field(ev, "user"), t)
        elif kind == "user_leave":
            leave.setdefault(_field(ev, "user"), t)
        elif kind == "call_start":
            call = _field(ev, "call")
            _field(ev, "user")
            if call in seen_calls:
                raise ValueError(f"call {call!r} starts twice")
            seen_calls.add(call)
            open_calls[call] = ev
        elif kind == "call_end":
            call = _field(ev, "call")
            status = _field(ev, "status")
            if status not in CALL_STATUSES:
                raise ValueError(f"unknown call status {status!r} in {ev!r}")
            start_ev = open_calls.pop(call, None)
            if start_ev is not None:
                closed.append((start_ev, t, status))
        # other types: ignored on purpose
    for start_ev in open_calls.values():
        closed.append((start_ev, leave.get(start_ev["user"], last_t), None))

    requests: list[RequestRecord] = []
    mandatory_ends: dict[str, list[float]] = {}
    for start_ev, end, status in closed:
        optional = bool(start_ev.get("optional", False))
        rec = RequestRecord(user=start_ev["user"], start=float(start_ev["t"]), end=end,
                            completed=status == "completed",
                            killed=status in ("killed", "cancelled"),
                            optional=optional)
        requests.append(rec)
        if rec.completed and not optional:
            mandatory_ends.setdefault(rec.user, []).append(end)

    users: list[UserRecord] = []
    for user, ev in arrivals.items():
        n_min = int(ev["n_min"])
        t0 = float(ev["t"])
        done = done_explicit.get(user)
        if done is None:
            ends = sorted(mandatory_ends.get(user, []))
            if n_min <= 0:
                done = t0
            elif len(ends) >= n_min:
                done = ends[n_min - 1]
        users.append(UserRecord(user=user, t0=t0, deadline=float(ev["deadline"]),
                                n_min=n_min, mandatory_done_time=done))
    return users, requests


def metrics_from_events(events: Iterable[Mapping[str, Any]], n_R: int, *,
                        tolerance: float = 0.0) -> EthicMetrics:
    users, requests = records_from_events(events)
    return compute_metrics(users, requests, n_R, tolerance=tolerance)
