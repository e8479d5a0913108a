"""The SeD runtime's calls, second half: run them and answer them.

:class:`RunsMixin` is the part of :class:`~gridrpc.sed.calls.receive.CallsMixin`
(and so of :class:`~gridrpc.sed.server.SeD`) that starts what the queues
say (``Run``, ``Stop``, ``Drop`` of :mod:`gridrpc.core.sed_calls`) on the
execution back-end, pauses the queues for the length of one read of the
socket, answers each call when its run ends and emits the lifecycle events.
How calls arrive, are acknowledged, cancelled and pinged is in
:mod:`gridrpc.sed.calls.receive`.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time
import traceback
from typing import TYPE_CHECKING

from ...core import codec
from ...core import messages as m
from ...core.events import EventKind, make_event
from ...core.messages import MsgType
from ...core.tally import tally
from ...core.sed_calls import CANCEL_GRACE, CallState, Drop, Run, Stop
from ...core.sed_protocol import drop_error, stop_error
from ...errors import GridRPCError
from ...files import read_file
from ..backends import Outcome

if TYPE_CHECKING:  # pragma: no cover
    from .receive import LiveCall
    from ..server import Replica

log = logging.getLogger("gridrpc.sed.server")
_RESULT = MsgType.RESULT.value



class RunsMixin:
    """Runs the calls the queues start and answers them (a mixin of the SeD, through CallsMixin)."""

    # -- one read of the socket ---------------------------------------------
    def _read_begin(self) -> None:
        """The messages of one wake-up of the socket (several clients'
        batches, transport.channel) are taken as one: no call starts (or is
        preempted) before the end, so 100 users cancelling their calls at a
        common deadline do not start, then kill, each next call in turn. A read
        that brings more than PAUSE_CALLS calls resumes after each PAUSE_CALLS."""
        self._paused_calls = 0
        self.lifecycle.pause()

    def _read_end(self) -> None:
        if self._freed_by_cancel:
            # cancels freed running slots: other users' cancels sent at the same moment
            # may be a few hundred µs behind (another socket, another wake-up); wait
            # CANCEL_GRACE before starting the next calls, reads meanwhile stay paused
            self._freed_by_cancel = False
            if self._resume_timer is None:
                self._resume_timer = asyncio.get_running_loop().call_later(CANCEL_GRACE, self._resume_now)
            return
        if self._resume_timer is None:
            self._resume_now()

    def _resume_now(self) -> None:
        self._resume_timer = None
        for sed, actions in self.lifecycle.resume(time.time()):
            r = self.replicas.get(sed)
            if r is not None:
                self._apply(r, actions)

    # -- execution ------------------------------------------------------
    def _apply(self, r: Replica, actions: list) -> None:
        for a in actions:
            if isinstance(a, Run):
                if r.ahead is a.call:
                    r.ahead = None              # it starts: the back-end already has it
                if not self.closing:
                    now = time.time()
                    if not a.call.svc.idempotent and a.call.route:
                        # tell the client before the work starts: from now on it is not moved elsewhere
                        self.endpoint.send(a.call.route, m.make(MsgType.PONG, a.call.id, name=a.call.replica.name,
                                                                calls={a.call.id: "running"}))
                    self._event(EventKind.CALL_STARTED, a.call, now, duration=now - a.call.received)
                    if not self.execution.start_now(a.call, functools.partial(self._ran, a.call)):
                        a.call.task = asyncio.get_running_loop().create_task(self._execute(a.call))
            elif isinstance(a, Stop):
                self._stop(a.call, a.reason)
            elif isinstance(a, Drop):
                self.answer(a.call, drop_error(a.call.id, **self.timing(a.call)), ok=False)
        if r.ahead is None and not self.closing:
            self._send_ahead(r)
        self._view_changed(r)
        wake = self.lifecycle.next_wakeup(r.name, time.time())
        if wake is not None:
            if r.timer is not None:
                r.timer.cancel()
            r.timer = asyncio.get_running_loop().call_later(max(0.0, wake - time.time()) + 0.001, self._tick, r)

    def _send_ahead(self, r: Replica) -> None:
        """A worker kept hot: with one slot busy in an arrival-ordered queue,
        the call that starts next is known; the back-end may put it where
        the running call runs, so that it starts the moment that one ends
        (not after the SeD has read the answer and sent it). It is started
        (Run) or withdrawn (``answer``) as any queued call; only idempotent
        services (a non-idempotent one is told "running" before it starts)."""
        sch = r.scheduler
        if sch.max_concurrent != 1:
            return
        nxt = sch.next_waiting()
        call = self.calls.get(nxt) if nxt is not None else None
        if call is None or call.state is not CallState.QUEUED or not call.svc.idempotent:
            return
        after = self.calls.get(next(iter(sch.running)))
        if after is not None and after.state is CallState.RUNNING and self.execution.send_ahead(call, after):
            r.ahead = call
            sch.promise_next(call.id)       # a call admitted later cannot come before it any more

    def _tick(self, r: Replica) -> None:
        r.timer = None
        self._apply(r, self.lifecycle.tick(r.name, time.time()))

    def _stop(self, call: LiveCall, reason: str) -> None:
        if reason == "preempted":
            self.stats["preempted"] += 1
        if not self.execution.kill(call) and call.task:
            call.task.cancel()
        self.answer(call, stop_error(call.id, reason, call.replica.name, **self.timing(call)), ok=False)

    def sweep_orphans(self, now: float) -> None:
        """Calls whose client sent nothing for ``orphan_call_timeout`` (it
        pings every ``ping_interval`` while it waits): killed, or left to
        finish with the answer kept for a client that comes back, per the
        service's ``on_orphan`` policy."""
        limit = self.orphan_call_timeout
        if limit is None or limit <= 0:
            return
        for call in list(self.calls.values()):
            if call.orphaned or now - call.last_contact <= limit:
                continue
            policy = call.svc.orphan_policy()
            if policy == "kill":
                self.stats["orphans_killed"] += 1
                log.warning("SeD %s: call %s of %s: client silent for %.0fs: killed (orphan)", call.replica.name,
                            call.id, call.service, now - call.last_contact)
                _prev, actions = self.lifecycle.cancel(call.id, now)
                self._apply(call.replica, actions)
            else:
                call.orphaned = True
                self.stats["orphans_finished"] += 1
                log.warning("SeD %s: call %s of %s: client silent for %.0fs: left to finish, answer kept "
                            "(orphan)", call.replica.name, call.id, call.service, now - call.last_contact)

    def timing(self, call: LiveCall) -> dict:
        t = {"received": call.received, "started": call.started, "ended": time.time()}
        more = self.execution.timing(call)
        if more:
            t.update(more)
        return {"server": call.replica.name, "timing": t}

    async def _execute(self, call: LiveCall) -> None:
        try:
            out = await self.execution.run(call)
        except asyncio.CancelledError:
            return
        except Exception as exc:  # noqa: BLE001 - a back-end bug: answer the call, keep serving
            log.exception("SeD %s: back-end %s failed on call %s", self.name, self.execution.name, call.id)
            out = Outcome(ok=False, kind="internal", error=(type(exc).__name__, f"SeD {self.name} could not "
                                                            f"run the call: {exc}", traceback.format_exc()))
        self._ran(call, out)

    def _ran(self, call: LiveCall, out: Outcome | None) -> None:
        """A call's run ended (``out`` None: stopped, the runtime answered it): answer it."""
        if out is None or self.calls.get(call.id) is not call or call.state is not CallState.RUNNING:
            return                      # stopped: answered by Stop
        header, buffers, ok = self._answer_of(call, out)
        r = call.replica
        if ok:
            r.completed += 1
            if out.run_time is not None:
                r.predictor.observe(call.service, out.run_time)
        else:
            r.failed += 1
        self.answer(call, header, buffers, ok=ok)

    def _answer_of(self, call: LiveCall, out: Outcome) -> tuple[dict, list, bool]:
        timing = self.timing(call)
        if out.timing:
            timing["timing"].update(out.timing)
        if out.header is not None:      # prepared by the back-end: a job's result, a VM's answer
            return {**out.header, "id": call.id, **timing}, list(out.buffers), out.ok
        if out.ok:
            buffers: list = []
            try:
                tree = codec.encode(out.value, buffers, read_file)
                return m.make(MsgType.RESULT, call.id, value=tree, **timing), buffers, True
            except GridRPCError as exc:
                out = Outcome(ok=False, error=(type(exc).__name__, f"the result cannot be sent: {exc}", ""))
        rtype, message, tb = out.error
        return m.error_header(call.id, out.kind, message, type_=rtype, traceback=tb, **timing), [], False

    def answer(self, call: LiveCall, header: dict, buffers: list = (), *, ok: bool) -> None:
        """Answer a call that ended (any way) and close its record; the queue
        may start the next calls. Also for back-ends (e.g. at shutdown)."""
        if self.calls.get(call.id) is not call:
            return
        header, buffers, ok = self.data.answering(call, header, buffers, ok)   # kept results, data waiters
        if call.replica.ahead is call:          # sent ahead, ended before it started (cancelled, shutdown)
            call.replica.ahead = None
            self.execution.kill(call)
        task = call.task
        if call.state is CallState.RUNNING and task is not None and task is not asyncio.current_task():
            task.cancel()                       # answered by its back-end (e.g. at shutdown): stop waiting
        frames = [m.dumps(header), *buffers]
        # a client with many calls here gets its answers in batches (messages.linger), where the
        # back-end allows it: a lingering answer that then cannot leave was counted as sent
        delay = m.linger(self._by_owner.get(call.owner, 0)) if self.execution.linger_answers else 0.0
        delivered = bool(call.route) and not self.endpoint.closed and self.endpoint.linger(call.route, frames, delay)
        if call.route and not delivered:
            log.info("SeD %s: answer to %s not delivered", self.name, call.id)
        now = time.time()
        self._ended_event(call, header, now)
        tally(self._in_flight, call.user, -1)
        tally(self._by_owner, call.owner, -1)
        if call.arg_bytes:
            tally(self._arg_bytes, call.user, -call.arg_bytes)
        actions = self.lifecycle.complete(call.id, frames, ok=ok, now=now)
        self.execution.finished(call, header, frames, delivered)
        call.args = call.kwargs = None          # the record may outlive the call (tasks): free the data
        self._apply(call.replica, actions)

    # -- events (VizDIET's BEGIN_SOLVE / END_SOLVE...) ----------------------
    def _event(self, kind: EventKind, call: LiveCall, now: float, *, duration: float | None = None,
               detail: str | None = None) -> None:
        self.outbox.emit(make_event(kind, now, call.replica.name, id=call.id, user=call.user,
                                    service=call.service, server=call.replica.name, duration=duration,
                                    optional=call.optional, detail=detail))

    def _ended_event(self, call: LiveCall, header: dict, now: float) -> None:
        ran = None if call.started is None else now - call.started
        if header.get("type") == _RESULT:
            return self._event(EventKind.CALL_FINISHED, call, now, duration=ran)
        err = header.get("error") if isinstance(header.get("error"), dict) else {}
        kind, detail = err.get("kind"), f"{err.get('type', '')}: {err.get('message', '')}"
        if kind == "cancelled":
            self._event(EventKind.CALL_CANCELLED, call, now, duration=ran)
        elif kind == "preempted":
            self._event(EventKind.CALL_PREEMPTED, call, now, duration=ran)
        else:
            if kind == "worker_died":
                self._event(EventKind.WORKER_DIED, call, now, detail=detail)
            self._event(EventKind.CALL_FAILED, call, now, duration=ran, detail=detail)

    def _spawn(self, coro) -> asyncio.Task:
        t = asyncio.get_running_loop().create_task(coro)
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)
        return t

