"""Optional computations from the client: ``run_optional`` (DIET-ethic).

The runtime of the pure dispatchers of :mod:`gridrpc.core.dispatcher`: it
discovers servers, applies the dispatcher's actions with real calls
(:class:`~gridrpc.core.dispatcher.Submit` → a call bound to that server,
:class:`~gridrpc.core.dispatcher.Cancel` → cancel it), feeds every reply back
(:meth:`on_done`) and wakes the dispatcher at its deadline (:meth:`on_tick`),
on the wall clock. Whatever happens (normal end, error, the caller's task
being cancelled), every call still outstanding is cancelled before returning.

Users call it through the clients::

    async with gridrpc.AsyncClient(ma, user="alice") as client:
        out = await client.run_optional("sleep", mandatory=[1.0] * 3,
                                        optional=itertools.repeat(1.0), deadline=100)
    out.mandatory      # the 3 mandatory results, in order
    out.optional       # [(args, result), ...] of the optional calls that completed

See ``docs/optional-computations.md``.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from ..core.dispatcher import (Cancel, CallRecord, Finish, LegacyDispatcher, OptionalDispatcher, Submit,
                               Dispatcher, mandatory_first, send_order)
from ..errors import (CallCancelled, CallPreempted, CommunicationError, GridRPCError, NoServerAvailable,
                      Timeout)
from .futures import Call, ServerInfo

log = logging.getLogger(__name__)

__all__ = ["OptionalResult", "run_optional", "drive", "DeadlineAwareDispatcher"]


class DeadlineAwareDispatcher(OptionalDispatcher):
    """An :class:`OptionalDispatcher` that stops feeding a server when the
    next optional call could not finish before the deadline: it estimates a
    call's duration from the server-side run time of completed calls (the
    ``started`` time of :meth:`on_done`; the median of the last 20) and sends
    nothing that would end after ``deadline``. Such calls would be cancelled
    at cleanup anyway — killed work that counts against the user's share
    and delays nobody's results. Before the first completion it behaves like
    its parent. Pure (no I/O, no clock)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._durations: list[float] = []

    @property
    def estimate(self) -> float | None:
        if not self._durations:
            return None
        recent = sorted(self._durations[-20:])
        return recent[len(recent) // 2]

    def on_done(self, call_key, ok, now, *, retry=True, started=None):
        if ok and started is not None and now >= started:
            self._durations.append(now - started)
        return super().on_done(call_key, ok, now, retry=retry, started=started)

    def _optional_done(self, rec, ok, can_retry, now):
        est = self.estimate
        if est is not None and now + est > self.deadline:
            return []
        return super()._optional_done(rec, ok, can_retry, now)


@dataclass
class OptionalResult:
    """What :func:`run_optional` returns.

    ``mandatory``: the results of the mandatory calls, in the order of the
    ``mandatory`` arguments (``None`` where one failed for good, see
    ``errors``). ``optional``: ``(args, result)`` of every optional call that
    completed, in completion order. ``errors``: index of a mandatory argument →
    its exception. ``ok``: every mandatory call completed by the deadline.
    ``records`` are the dispatcher's call records (every submission, with its
    status), ``events`` the run's event log in the format of
    :mod:`gridrpc.core.metrics` (user events and, from the servers' timing,
    ``call_start``/``call_end``), on the ``clock`` given (default
    :func:`time.time`)."""
    mandatory: list
    optional: list
    errors: dict = field(default_factory=dict)
    ok: bool = True
    deadline: float = 0.0
    mandatory_done_at: float | None = None
    records: tuple[CallRecord, ...] = ()
    events: list = field(default_factory=list)
    statistics: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.mandatory) - len(self.errors) + len(self.optional)


def _as_args(item: Any) -> tuple:
    """A tuple is the positional arguments of one call; anything else is its
    single argument."""
    return item if isinstance(item, tuple) else (item,)


def _classify(exc: BaseException) -> tuple[str, bool]:
    """(event status, retry) for a failed call."""
    if isinstance(exc, CallPreempted):
        return "killed", True
    if isinstance(exc, CallCancelled):
        return "cancelled", True
    if isinstance(exc, (CommunicationError, NoServerAvailable, Timeout)):
        return "failed", True
    return "failed", False


_MANDATORY_FIRST_STEPS = 3     # loop steps: the submit tasks run, launch their calls, the driver flushes


async def drive(client, service: str, dispatcher: Dispatcher, servers: Sequence[ServerInfo], *,
                clock: Callable[[], float] = time.time, kwargs: dict | None = None,
                cancel_timeout: float = 10.0) -> dict[str, Call]:
    """Run ``dispatcher`` (not started yet) to its end with real calls of
    ``service`` through ``client`` (an :class:`AsyncClient`), on ``clock``.
    Returns every call made, by dispatcher key. On the way out, normal or not,
    every outstanding call is cancelled and the cancellations awaited (each
    at most ``cancel_timeout``)."""
    by_name = {s.name: s for s in servers}
    kwargs = kwargs or {}
    calls: dict[str, Call] = {}
    done_q: asyncio.Queue[str] = asyncio.Queue()
    cancelling: list[asyncio.Task] = []
    loop = asyncio.get_running_loop()

    def finished(key: str):
        return lambda _task: done_q.put_nowait(key)

    def apply(actions) -> None:
        stop: list[Call] = []
        for a in send_order(actions):
            if isinstance(a, Submit):
                call = client.submit_nowait(service, *_as_args(a.args), optional=a.optional,
                                     server=by_name[a.server], **kwargs)
                calls[a.key] = call
                call._task.add_done_callback(finished(a.key))     # in the loop: no thread-side future
            elif isinstance(a, Cancel):
                call = calls.get(a.key)
                if call is not None and not call.done():
                    stop.append(call)
            elif isinstance(a, Finish):
                pass
        if stop:            # one wait for all (a deadline cancels every outstanding call at once)
            cancelling.append(loop.create_task(_cancel_all(client, stop, cancel_timeout)))

    try:
        mandatory, first = mandatory_first(dispatcher.start(clock()))
        if mandatory:
            # the mandatory calls leave first, in their own batch: the loop runs their send tasks and
            # flushes before the optional calls exist, so users arriving together in one process all
            # send their mandatory calls before anyone's optional ones (core.dispatcher.mandatory_first)
            apply(mandatory)
            for _ in range(_MANDATORY_FIRST_STEPS):
                await asyncio.sleep(0)
        apply(first)
        while not dispatcher.finished:
            wake = dispatcher.next_deadline
            try:
                if wake is None:
                    key = await done_q.get()
                else:
                    key = await asyncio.wait_for(done_q.get(), max(0.0, wake - clock()))
            except asyncio.TimeoutError:
                apply(dispatcher.on_tick(clock()))
                continue
            call = calls[key]
            now = clock()
            exc = _exception(call)
            started = (call.timing or {}).get("started")
            if exc is None:
                apply(dispatcher.on_done(key, True, now, started=started))
            else:
                _status, retry = _classify(exc)
                log.debug("optional run: call %s (%s) failed: %s", key, call.id, exc)
                apply(dispatcher.on_done(key, False, now, retry=retry, started=started))
    finally:
        stop = [calls[key] for key in dispatcher.outstanding      # interrupted: the dispatcher did not clean up
                if key in calls and not calls[key].done()]
        if stop:
            cancelling.append(loop.create_task(_cancel_all(client, stop, cancel_timeout)))
        if cancelling:
            await asyncio.shield(asyncio.gather(*cancelling, return_exceptions=True))
        leftover = [c for c in calls.values() if not c.done()]
        if leftover:
            await asyncio.shield(_cancel_all(client, leftover, cancel_timeout))
    return calls


def _exception(call: Call) -> BaseException | None:
    """The failure of a finished call, read in the loop from its task (None: it succeeded)."""
    task = call._task
    if task is None or not task.done():
        return None
    if task.cancelled():
        return CallCancelled(f"call to {call.service} cancelled")
    return task.exception()


async def _cancel_all(client, calls: list[Call], timeout: float) -> None:
    try:
        await client.cancel_calls(calls, timeout)
    except GridRPCError as exc:
        log.info("cancel of %d call(s) failed: %s", len(calls), exc)
    left = sum(1 for c in calls if not c.done())
    if left:
        log.info("cancel of %d call(s) not confirmed within %.3gs", left, timeout)


def call_events(calls: dict[str, Call], records: Iterable[CallRecord], user: str) -> list[dict]:
    """``call_start``/``call_end`` events from the servers' timing of each call
    (unix times). Calls that never started on a server give no event."""
    recs = {r.key: r for r in records}
    out: list[dict] = []
    for key, call in calls.items():
        timing = call.timing or {}
        started, ended = timing.get("started"), timing.get("ended")
        if started is None:
            continue
        rec = recs.get(key)
        optional = rec.optional if rec is not None else call.optional
        if not call.done():
            status = None
        else:
            exc = call.exception(0)
            status = "completed" if exc is None else _classify(exc)[0]
        cid = call.id or key
        out.append({"type": "call_start", "t": started, "call": cid, "user": user,
                    "optional": optional, "server": call.server, "key": key})
        if status is not None and ended is not None:
            out.append({"type": "call_end", "t": ended, "call": cid, "status": status})
    return out


async def run_optional(client, service: str, mandatory: Sequence[Any] = (), optional: Iterable[Any] = (),
                       deadline: float = 60.0, max_servers: int | None = None, *,
                       servers: Sequence[ServerInfo] | None = None, n_submit: int | None = None,
                       strict: bool = True, skip_late: bool = False,
                       clock: Callable[[], float] = time.time, **kwargs) -> OptionalResult:
    """Run ``mandatory`` calls of ``service`` and as many ``optional`` ones as
    fit before ``deadline`` (seconds from now), fairly with other users when
    the servers use the ``ethic`` queue.

    Each item of ``mandatory``/``optional`` is the argument of one call (a
    tuple is unpacked as positional arguments); ``optional`` may be lazy and
    infinite. ``max_servers``: how many servers to discover (default: one per
    request when ``optional`` has a length, else 1000); ``servers``: use these
    instead of discovering. ``n_submit``: the *legacy* client instead (submit
    ``n_submit`` requests at once, no optional feeding) — for baselines.
    ``skip_late``: do not send an optional call that would end after the
    deadline (duration estimated from completed calls;
    :class:`DeadlineAwareDispatcher`) — less killed work.
    Extra keyword arguments go to every call. Returns an
    :class:`OptionalResult`; with ``strict`` (default) a mandatory call that
    failed for good raises its error after cleanup. Leaves when every
    mandatory call is done and the deadline has passed (or earlier if
    nothing is left to run); every call still running is then cancelled."""
    if deadline < 0:
        raise ValueError("deadline must be >= 0 seconds")
    mandatory = [m for m in mandatory]
    if servers is None:
        if max_servers is None:
            try:
                max_servers = max(1, len(mandatory) + len(optional))   # type: ignore[arg-type]
            except TypeError:
                max_servers = 1000
        servers = await client.discover(service, max_servers)
        if not servers:
            raise NoServerAvailable(f"no server offers {service!r}")
    servers = list(servers)
    start = clock()
    abs_deadline = start + deadline
    names = [s.name for s in servers]
    if n_submit is None:
        cls = DeadlineAwareDispatcher if skip_late else OptionalDispatcher
        disp: Dispatcher = cls(mandatory, optional, abs_deadline, names)
    else:
        disp = LegacyDispatcher(n_submit, mandatory, optional, abs_deadline, names)
    calls = await drive(client, service, disp, servers, clock=clock, kwargs=kwargs)
    return _result(client, disp, calls, len(mandatory), strict)


def _result(client, disp: Dispatcher, calls: dict[str, Call], n_mandatory: int, strict: bool) -> OptionalResult:
    mand: list = [None] * n_mandatory
    errors: dict[int, BaseException] = {}
    opt: list[tuple[Any, Any, float]] = []
    for rec in disp.records:
        call = calls.get(rec.key)
        if call is None or not call.done():
            continue
        exc = call.exception(0)
        if rec.optional:
            # a call the run was cancelling may still have finished first: its
            # result arrived, the server did the work, so the user gets it
            if exc is None:
                ended = rec.ended or (call.timing or {}).get("ended") or 0.0
                opt.append((rec.args, call.result(0), ended))
        else:
            i = int(rec.slot[1:])
            if exc is None:
                mand[i] = call.result(0)
                errors.pop(i, None)
            elif rec.status == "failed" and mand[i] is None:
                errors[i] = exc
    opt.sort(key=lambda t: t[2])
    user = getattr(client, "user", "anonymous")
    events = disp.events(user) + call_events(calls, disp.records, user)
    done_at = disp.mandatory_done_at
    ok = not errors and done_at is not None and done_at <= disp.deadline
    out = OptionalResult(mandatory=mand, optional=[(a, v) for a, v, _ in opt], errors=errors, ok=ok,
                         deadline=disp.deadline, mandatory_done_at=done_at, records=disp.records,
                         events=events, statistics=disp.statistics())
    if strict and errors:
        first = errors[min(errors)]
        first.partial = out          # type: ignore[attr-defined]
        raise first
    return out
