"""Client-side dispatchers for optional computations, as pure state machines.

:class:`OptionalDispatcher` is the DIET-ethic client (Klein-Halmaghi 2012,
ch. 7), in three phases:

* **setup** (:meth:`~OptionalDispatcher.start`): mandatory requests are sent
  round-robin over the discovered servers, then one optional request to each
  server;
* **monitoring** (:meth:`~OptionalDispatcher.on_done`,
  :meth:`~OptionalDispatcher.on_tick`): when an optional request completes,
  the next optional one goes to the same server; an optional request that
  failed because it was killed/preempted (``retry=True``, the default) is
  resubmitted with the same arguments to the same server; the dispatcher stays
  until all mandatory requests are done *and* the deadline has passed
  (optional requests keep flowing while it waits for late mandatory ones);
* **cleanup**: every call still submitted is cancelled, then :class:`Finish`.

:class:`LegacyDispatcher` is the paper's baseline client: it submits ``n_min``
mandatory then ``n_submit - n_min`` optional requests at once, round-robin,
waits for the mandatory ones and for the deadline, then cancels the rest.

Both finish early when nothing can change any more (all mandatory requests
settled, no call outstanding, no optional work left to send).

The runtime applies the returned actions: :class:`Submit` (send ``args`` to
``server``; ``key`` is unique per dispatcher and new for every resubmission,
because a SeD drops duplicate request ids — prefix it with a client id to make
it globally unique), :class:`Cancel` (cancel or kill that call) and
:class:`Finish`. It calls :meth:`on_tick` at :attr:`next_deadline` and
:meth:`on_done` for every reply (``ok``; ``retry=False`` for an application
error that a resubmission would not cure; optionally ``started``, the time the
server began running the call, if the reply carries it). Replies for unknown
or already-settled keys are ignored, as are all inputs after :class:`Finish`.

Failures of mandatory requests: retryable ones are resubmitted to the *next*
server (the failure is likely the server's); a non-retryable one settles the
request as failed, so the user will be unhappy but still leaves at the deadline.
``max_attempts`` (default unlimited) bounds submissions per request.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any, Iterable, Iterator, Sequence

__all__ = ["Submit", "Cancel", "Finish", "DispatchAction", "CallRecord", "Phase",
           "OptionalDispatcher", "LegacyDispatcher", "send_order", "mandatory_first"]


@dataclass(frozen=True, slots=True)
class Submit:
    key: str
    server: str
    args: Any
    optional: bool


@dataclass(frozen=True, slots=True)
class Cancel:
    key: str


@dataclass(frozen=True, slots=True)
class Finish:
    pass


DispatchAction = Submit | Cancel | Finish


def send_order(actions: Iterable[DispatchAction]) -> list[DispatchAction]:
    """The order in which a runtime applies one step's actions: every
    :class:`Submit` (and :class:`Finish`) in the dispatcher's order, then the
    :class:`Cancel` actions newest first. On a FCFS server the oldest call is the
    running one: cancelling it first would start the next queued call only to
    cancel it a moment later."""
    actions = list(actions)
    return [a for a in actions if not isinstance(a, Cancel)] + [a for a in actions if isinstance(a, Cancel)][::-1]


def mandatory_first(actions: Sequence[DispatchAction]) -> tuple[list[DispatchAction], list[DispatchAction]]:
    """Split a dispatcher's first actions (:meth:`OptionalDispatcher.start`)
    into ``(mandatory, rest)``: the mandatory :class:`Submit` actions, which the
    runtime sends in a batch of their own, and what it sends once other
    ready work had its turn (the optional calls). Users starting together in
    one process then all send their mandatory calls before anyone's optional
    ones, so no user's optional calls take the idle servers only to be
    preempted there by another user's mandatory calls a moment later (killed
    work counts as allocated to its user). ``([], actions)`` when there is
    nothing to split (no mandatory call, or nothing else)."""
    actions = list(actions)
    mand = [a for a in actions if isinstance(a, Submit) and not a.optional]
    if not mand or len(mand) == len(actions):
        return [], actions
    return mand, [a for a in actions if not (isinstance(a, Submit) and not a.optional)]


class Phase(enum.Enum):
    SETUP = "setup"              # before start()
    MONITORING = "monitoring"
    FINISHED = "finished"        # after cleanup


@dataclass(frozen=True, slots=True, kw_only=True)
class CallRecord:
    """One submission. ``status``: pending, completed, killed (retryable
    failure), failed, cancelled."""
    key: str
    slot: str                    # the logical request ("m0", "o3"); shared by resubmissions
    args: Any
    server: str
    optional: bool
    attempt: int                 # 1 for the first submission of the slot
    submitted: float
    started: float | None = None
    ended: float | None = None
    status: str = "pending"


class Dispatcher:
    def __init__(self, mandatory: Sequence[Any], optional: Iterable[Any], deadline: float,
                 servers: Sequence[str], *, max_attempts: int | None = None) -> None:
        if not servers:
            raise ValueError("a dispatcher needs at least one server")
        if max_attempts is not None and max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self.mandatory_args = list(mandatory)
        self._optional: Iterator[Any] = iter(optional)
        self._lookahead: list[Any] = []
        self.deadline = float(deadline)
        self.servers = list(servers)
        self.max_attempts = max_attempts
        self.phase = Phase.SETUP
        self._records: dict[str, CallRecord] = {}
        self._pending: dict[str, CallRecord] = {}
        self._attempts: dict[str, int] = {}
        self._n_optional = 0
        self._mandatory_left = len(self.mandatory_args)
        self.mandatory_failed = 0
        self.started_at: float | None = None
        self.mandatory_done_at: float | None = None
        self.finished_at: float | None = None
        self._deadline_seen = False

    # -- queries ----------------------------------------------------------
    @property
    def n_min(self) -> int:
        return len(self.mandatory_args)

    @property
    def finished(self) -> bool:
        return self.phase is Phase.FINISHED

    @property
    def next_deadline(self) -> float | None:
        """When the runtime must call :meth:`on_tick` (``None``: no timer needed)."""
        if self.finished or self._deadline_seen:
            return None
        return self.deadline

    @property
    def records(self) -> tuple[CallRecord, ...]:
        return tuple(self._records.values())

    @property
    def outstanding(self) -> tuple[str, ...]:
        return tuple(self._pending)

    def count(self, status: str = "completed", *, optional: bool | None = None) -> int:
        return sum(1 for r in self._records.values() if r.status == status
                   and (optional is None or r.optional == optional))

    def statistics(self) -> dict[str, Any]:
        return {"phase": self.phase.value, "n_min": self.n_min,
                "mandatory_left": self._mandatory_left,
                "mandatory_failed": self.mandatory_failed,
                "completed_mandatory": self.count(optional=False),
                "completed_optional": self.count(optional=True),
                "killed": self.count("killed"), "outstanding": len(self._pending),
                "mandatory_done_at": self.mandatory_done_at,
                "finished_at": self.finished_at}

    def events(self, user: str) -> list[dict[str, Any]]:
        """The user-level events of the metrics event log
        (:mod:`gridrpc.core.metrics`): arrival, mandatory completion, leave.
        Call events come from the SeDs, which know when calls really ran."""
        out: list[dict[str, Any]] = []
        if self.started_at is not None:
            out.append({"type": "user_arrive", "t": self.started_at, "user": user,
                        "deadline": self.deadline, "n_min": self.n_min})
        if self.mandatory_done_at is not None:
            out.append({"type": "mandatory_done", "t": self.mandatory_done_at, "user": user})
        if self.finished_at is not None:
            out.append({"type": "user_leave", "t": self.finished_at, "user": user})
        return out

    # -- inputs -----------------------------------------------------------
    def start(self, now: float) -> list[DispatchAction]:
        if self.phase is not Phase.SETUP:
            raise RuntimeError("dispatcher already started")
        self.started_at = now
        actions: list[DispatchAction] = []
        for i, args in enumerate(self.mandatory_args):
            actions.append(self._submit(f"m{i}", args, self._server(i), False, now))
        actions += self._setup_optional(now)
        self.phase = Phase.MONITORING
        if self._mandatory_left == 0:
            self.mandatory_done_at = now
        return actions + self._maybe_finish(now)

    def on_done(self, call_key: str, ok: bool, now: float, *, retry: bool = True,
                started: float | None = None) -> list[DispatchAction]:
        if self.phase is not Phase.MONITORING:
            return []
        rec = self._pending.pop(call_key, None)
        if rec is None:
            return []
        status = "completed" if ok else ("killed" if retry else "failed")
        rec = replace(rec, status=status, ended=now, started=started)
        self._records[call_key] = rec
        can_retry = not ok and retry and (self.max_attempts is None
                                          or self._attempts[rec.slot] < self.max_attempts)
        actions: list[DispatchAction] = []
        if not rec.optional:
            if can_retry:
                nxt = self.servers[(self.servers.index(rec.server) + 1) % len(self.servers)]
                actions.append(self._submit(rec.slot, rec.args, nxt, False, now))
            else:
                self._mandatory_left -= 1
                if not ok:
                    self.mandatory_failed += 1
                if self._mandatory_left == 0 and self.mandatory_failed == 0:
                    self.mandatory_done_at = now
        else:
            actions += self._optional_done(rec, ok, can_retry, now)
        return actions + self._maybe_finish(now)

    def on_tick(self, now: float) -> list[DispatchAction]:
        if self.phase is not Phase.MONITORING:
            return []
        return self._maybe_finish(now)

    # -- hooks ------------------------------------------------------------
    def _setup_optional(self, now: float) -> list[DispatchAction]:
        raise NotImplementedError

    def _optional_done(self, rec: CallRecord, ok: bool, can_retry: bool,
                       now: float) -> list[DispatchAction]:
        raise NotImplementedError

    # -- internals --------------------------------------------------------
    def _server(self, i: int) -> str:
        return self.servers[i % len(self.servers)]

    def _has_optional(self) -> bool:
        if not self._lookahead:
            try:
                self._lookahead.append(next(self._optional))
            except StopIteration:
                return False
        return True

    def _next_optional(self) -> tuple[str, Any] | None:
        if not self._has_optional():
            return None
        slot = f"o{self._n_optional}"
        self._n_optional += 1
        return slot, self._lookahead.pop()

    def _submit(self, slot: str, args: Any, server: str, optional: bool,
                now: float) -> Submit:
        attempt = self._attempts.get(slot, 0) + 1
        self._attempts[slot] = attempt
        key = slot if attempt == 1 else f"{slot}.{attempt - 1}"
        rec = CallRecord(key=key, slot=slot, args=args, server=server, optional=optional,
                         attempt=attempt, submitted=now)
        self._records[key] = rec
        self._pending[key] = rec
        return Submit(key, server, args, optional)

    def _more_work(self) -> bool:
        """Could anything still happen without a new reply? (subclass hook)"""
        return bool(self._pending)

    def _maybe_finish(self, now: float) -> list[DispatchAction]:
        if now >= self.deadline:
            self._deadline_seen = True
        if self._mandatory_left > 0:
            return []
        if now >= self.deadline or not self._more_work():
            return self._cleanup(now)
        return []

    def _cleanup(self, now: float) -> list[DispatchAction]:
        actions: list[DispatchAction] = []
        for key, rec in self._pending.items():
            self._records[key] = replace(rec, status="cancelled", ended=now)
            actions.append(Cancel(key))
        self._pending.clear()
        self.phase = Phase.FINISHED
        self.finished_at = now
        actions.append(Finish())
        return actions


class OptionalDispatcher(Dispatcher):
    """The DIET-ethic client: ``mandatory`` is the list of the ``n_min``
    mandatory arguments, ``optional`` an iterable (possibly lazy, possibly
    infinite) of optional arguments (``n_max - n_min`` of them), ``deadline``
    an absolute time, ``servers`` the discovered server names (up to
    ``n_max``)."""

    def _setup_optional(self, now: float) -> list[DispatchAction]:
        actions: list[DispatchAction] = []
        for server in self.servers:
            nxt = self._next_optional()
            if nxt is None:
                break
            actions.append(self._submit(nxt[0], nxt[1], server, True, now))
        return actions

    def _optional_done(self, rec: CallRecord, ok: bool, can_retry: bool,
                       now: float) -> list[DispatchAction]:
        if self._mandatory_left == 0 and now >= self.deadline:
            return []            # about to clean up: do not start new work
        if can_retry:
            return [self._submit(rec.slot, rec.args, rec.server, True, now)]
        nxt = self._next_optional()
        if nxt is None:
            return []
        return [self._submit(nxt[0], nxt[1], rec.server, True, now)]

    def _more_work(self) -> bool:
        return bool(self._pending) or self._has_optional()


class LegacyDispatcher(Dispatcher):
    """The baseline client: ``n_submit`` requests in all (``n_min =
    len(mandatory)`` mandatory, then up to ``n_submit - n_min`` optional taken
    from ``optional``), all submitted at :meth:`start`, round-robin over
    ``servers``. Optional requests are never resubmitted."""

    def __init__(self, n_submit: int, mandatory: Sequence[Any], optional: Iterable[Any],
                 deadline: float, servers: Sequence[str], *,
                 max_attempts: int | None = None) -> None:
        super().__init__(mandatory, optional, deadline, servers, max_attempts=max_attempts)
        if n_submit < self.n_min:
            raise ValueError(f"n_submit ({n_submit}) < n_min ({self.n_min})")
        self.n_submit = n_submit

    def _setup_optional(self, now: float) -> list[DispatchAction]:
        actions: list[DispatchAction] = []
        for k in range(self.n_submit - self.n_min):
            nxt = self._next_optional()
            if nxt is None:
                break
            actions.append(self._submit(nxt[0], nxt[1], self._server(self.n_min + k), True, now))
        return actions

    def _optional_done(self, rec: CallRecord, ok: bool, can_retry: bool,
                       now: float) -> list[DispatchAction]:
        return []
