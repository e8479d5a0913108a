"""The SeD runtime's calls: receive, answer duplicates, queue, run, stop, answer.

A mixin of :class:`~gridrpc.sed.server.SeD` (which owns the endpoint, the
replicas, the call records ``lifecycle`` and the execution back-end). Every
call is one :class:`_Call` record in :class:`~gridrpc.core.sed_calls.SedCalls`,
from its arrival to its answer; a repeated request id is answered from there
(see that module), never run twice.
"""
from __future__ import annotations

import asyncio
import functools
import math
import logging
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..core import codec
from ..core.sed_calls import ACK_SLOT, ack_delay
from ..core import messages as m
from ..core.events import EventKind, make_event
from ..core.messages import MsgType
from ..core.sed_calls import CallRecord, CallState, Drop, Expired, Fetch, Reacknowledge, Resend, Run, Stop
from ..errors import GridRPCError, InvalidArgument, ProtocolError
from ..files import read_file
from ..transport.endpoint import Incoming
from .backends import Outcome
from .services import Service

if TYPE_CHECKING:  # pragma: no cover
    from .server import Replica

log = logging.getLogger("gridrpc.sed.server")
_RESULT = MsgType.RESULT.value

#: after a read of the socket whose cancels freed running slots, the next calls start this
#: much later (cancels of users sent together reach the SeD in several reads)
CANCEL_GRACE = 0.002
#: a read that admits this many calls lets the queues start work then, pauses again for the rest
#: of the message and ends the read after it (the next read comes at the next loop iteration, after
#: the started calls reached their workers): a burst of 100 users' batches (7,000 calls for one SeD
#: process) read at once kept every replica idle for the ~0.3 s the whole read took to admit
PAUSE_CALLS = 256


@dataclass(eq=False, kw_only=True)
class _Call(CallRecord):
    """A live call: its record plus what the runtime needs to run and answer it."""
    route: list
    replica: "Replica"
    svc: Service
    args: list | None = None
    kwargs: dict | None = None
    workdir: str | None = None
    task: asyncio.Task | None = None
    options: dict = field(default_factory=dict)    # per-call options of the back-end (batch: _batch)
    last_contact: float = field(default_factory=time.time)   # last word from the client (CALL, PING): orphan detection
    orphaned: bool = False          # the client went away; left to finish (on_orphan policy)


class CallsMixin:
    def _reject(self, route: list, cid: str, kind: str, message: str, **extra) -> None:
        self.stats["rejected"] += 1
        self.endpoint.send(route, m.error_header(cid, kind, message, **extra))

    def _can_start_now(self, r) -> bool:
        """Would a call admitted now start at once on replica ``r`` (a free
        slot, nobody waiting)? Only local queues say no: a batch or cloud
        back-end's own queue is not what the pushed view showed."""
        if not getattr(self.execution, "push_estimation", False):
            return True
        return r.scheduler.has_free_slot()

    def _on_call(self, msg: Incoming) -> None:
        h, route, buffers = msg.header, msg.route, msg.buffers
        cid = h["id"]
        uid = msg.user                  # one look at the frame's User-Id: who and user come from it
        who = uid or msg.peer           # as _who(msg)
        user = _user_of(uid, h)         # as _user(msg)
        if not self.lifecycle.owned_by(cid, who):
            return self._reject(route, cid, "refused", f"call id {cid} belongs to another client of "
                                f"SeD {self.name} (a call is answered, cancelled or pinged only by its owner)")
        dup = self.lifecycle.duplicate(cid)
        if dup is None and cid in self.data.resolving:      # still fetching its data: acknowledge again
            self.data.resolving[cid][0].route = route
            return self.endpoint.send(route, self._accepted(self.data.resolving[cid][0], duplicate=True))
        if dup is not None:
            live = self.calls.get(cid)
            if live is not None:
                live.last_contact = time.time()
                live.orphaned = False
            self._answer_duplicate(route, dup)
            return
        size = sum(len(b) for b in buffers) if buffers else 0
        if size > self.max_message_size:
            return self._reject(route, cid, "too_large", f"call of {size} bytes exceeds this SeD's "
                                f"max_message_size of {self.max_message_size} bytes")
        target = h.get("sed")
        r = (next(iter(self.replicas.values())) if target is None and len(self.replicas) == 1
             else self.replicas.get(target) if isinstance(target, str) else None)
        if r is None:
            return self._reject(route, cid, "no_server", f"no SeD named {target!r} here "
                                f"(this process serves {', '.join(self.replicas)})")
        svc = self.services.get(h["service"])
        if svc is None:
            return self._reject(route, cid, "service_not_found", f"SeD {r.name} does not offer {h['service']!r}")
        refusal = self.access.check(svc.name, user, self._in_flight)
        if refusal is not None:
            return self._reject(route, cid, "refused", f"SeD {r.name}: {refusal}")
        if h.get("start_now") is True and not self._can_start_now(r):
            # the client's view saw this server free and has other candidates: never queue here
            self.stats["busy"] += 1
            err = m.error_header(cid, "busy", f"SeD {r.name} has no free slot for {svc.name} now", type_="Busy")
            err["error"]["est_wait"] = self.execution.estimate(r, svc, user, time.time()).get("est_wait", 0.0)
            return self.endpoint.send(route, err)
        ex = self.execution
        workdir = ex.new_workdir()
        try:
            sink = ex.file_sink(workdir)
            args = codec.decode(h["args"], buffers, sink, ex.copy_args)
            kwargs = codec.decode(h["kwargs"], buffers, sink, ex.copy_args)
            if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
                raise ProtocolError("kwargs must map names to values")
            kwargs, options = ex.prepare(svc, kwargs, h, buffers)
            svc.check(args, kwargs)
        except (ProtocolError, InvalidArgument) as exc:
            ex.remove_workdir(workdir)
            kind = "invalid_argument" if isinstance(exc, InvalidArgument) else "protocol"
            return self._reject(route, cid, kind, str(exc), type_=type(exc).__name__)
        now = time.time()
        call = _Call(id=cid, sed=r.name, service=svc.name, user=user, owner=who,
                     optional=bool(h.get("optional", False)), received=now, route=route, replica=r, svc=svc,
                     args=args, kwargs=kwargs, options=options, workdir=workdir, last_contact=now)
        self.stats["calls"] += 1
        r.last_solve = now
        log.debug("SeD %s: call %s %s from %s%s", r.name, cid, svc.name, call.user,
                  " (optional)" if call.optional else "")
        try:
            if self.data.on_call(call, h):          # kept result; references fetched first, then admitted
                return
        except GridRPCError as exc:
            ex.remove_workdir(workdir)
            return self._reject(route, cid, "data", str(exc), type_=type(exc).__name__)
        self.admit(call, now)
        if self.lifecycle.paused:
            self._paused_calls += 1
            if self._paused_calls >= PAUSE_CALLS and self._resume_timer is None and not self._freed_by_cancel:
                self._paused_calls = 0
                self._resume_now()
                self.lifecycle.pause()
                if self.endpoint.channel is not None:
                    self.endpoint.channel.end_drain = True
        if self.calls.get(cid) is not call:
            return
        starts = call.state is CallState.RUNNING or (
            self.lifecycle.paused and len(r.scheduler.requests) <= r.scheduler.max_concurrent)  # at the resume
        delay = ack_delay(ex.ack_delay, starts, svc.idempotent, h.get("ack_ms"))
        if delay > 0:
            # a call answered before ``delay`` needs no separate ACCEPTED: the RESULT
            # acknowledges it (one message less per call, each way)
            self._hold_ack(call, delay)
        else:
            self.endpoint.send(route, self._accepted(call))

    def admit(self, call: _Call, now: float | None = None) -> None:
        """Queue a call (also used by back-ends: calls recovered after a restart)."""
        now = time.time() if now is None else now
        self._event(EventKind.CALL_QUEUED, call, now)
        _count(self._in_flight, call.user, 1)
        _count(self._by_owner, call.owner, 1)
        self._apply(call.replica, self.lifecycle.submit(call, now))

    def _accepted(self, call: _Call, duplicate: bool = False) -> dict:
        h = m.make(MsgType.ACCEPTED, call.id, sed=call.replica.name)
        if duplicate:
            h["duplicate"] = True
        h["state"] = "running" if call.state is CallState.RUNNING else "queued"
        if not call.svc.idempotent:
            h["idempotent"] = False
        h.update(self.execution.ack_fields(call))
        return h

    def _hold_ack(self, call: _Call, delay: float) -> None:
        """ACCEPTED in ``delay`` s unless the call is answered first; the held
        ACCEPTEDs of one slot (``ACK_SLOT``) go out together, one batch per client."""
        loop = asyncio.get_running_loop()
        slot = math.ceil((loop.time() + delay) / ACK_SLOT)
        held = self._acks.get(slot)
        if held is None:
            held = self._acks[slot] = []
            loop.call_at(slot * ACK_SLOT, self._send_acks, slot)
        held.append(call)

    def _send_acks(self, slot: int) -> None:
        by_route: dict[bytes, list] = {}
        for call in self._acks.pop(slot, ()):
            if self.calls.get(call.id) is call and call.route:   # not answered meanwhile
                by_route.setdefault(call.route[0], []).append(call)
        for calls in by_route.values():
            self.endpoint.send_many(calls[0].route, [self._accepted(c) for c in calls])

    def _answer_duplicate(self, route: list, dup) -> None:
        if isinstance(dup, Reacknowledge):          # queued or running: acknowledge again
            dup.call.route = route
            self.endpoint.send(route, self._accepted(dup.call, duplicate=True))
        elif isinstance(dup, Resend):               # finished: the same answer again
            self.endpoint.send_frames(route, dup.frames)
        elif isinstance(dup, Fetch):                # the back-end keeps the answer
            self._deliver_kept(route, dup.call_id, dup.frames)
        elif isinstance(dup, Expired):
            self.endpoint.send(route, self._gone(dup.call_id))

    def _gone(self, cid: str) -> dict:
        return m.error_header(cid, "result_gone", f"call {cid} already ran on SeD {self.name}; its answer is no "
                              f"longer kept (result cache of {self.lifecycle.cache.max_bytes} bytes) and it is "
                              "not run again", type_="ResultGone")

    def _deliver_kept(self, route: list, cid: str, frames: list | None) -> None:
        if frames is None:
            self._spawn(self._fetch_and_deliver(route, cid))
        elif self.endpoint.send_frames(route, frames):
            self._kept_delivered(cid, None)

    async def _fetch_and_deliver(self, route: list, cid: str) -> None:
        frames = await self.execution.fetch_kept(cid)
        if frames is None or not self.lifecycle.cache.held(cid) or self.endpoint.closed:
            return
        if self.endpoint.send_frames(route, frames):
            self._kept_delivered(cid, frames)

    def _kept_delivered(self, cid: str, frames: list | None) -> None:
        self.lifecycle.delivered(cid, frames)
        self.execution.kept_delivered(cid)

    def _on_cancel(self, msg: Incoming) -> None:
        cid = msg.id
        if not self.lifecycle.owned_by(cid, _who(msg)):
            self.stats["rejected"] += 1
            return self.endpoint.reply_error(msg, "refused", f"call {cid} belongs to another client: "
                                             "only its owner may cancel it")
        if self.data.cancel(cid):
            self.stats["cancelled"] += 1
            return self.endpoint.reply(msg, m.make(MsgType.CANCELLED, cid, state="queued"))
        call = self.calls.get(cid)
        if call is not None:
            self.stats["cancelled"] += 1
        prev, actions = self.lifecycle.cancel(cid, time.time())
        if prev == "running" and self.lifecycle.paused:
            self._freed_by_cancel = True
        # the timing of the work done (started, ended now), as the call's own answer has it:
        # whichever of the two reaches the client first, the killed work is accounted
        extra = self.timing(call) if call is not None else {}
        if call is not None:
            self._apply(call.replica, actions)
        self.endpoint.reply(msg, m.make(MsgType.CANCELLED, cid, state=prev, **extra))

    def _on_ping(self, msg: Incoming) -> None:
        ids = msg.header.get("ids")
        states: dict[str, str] = {}
        cache = self.lifecycle.cache
        who = _who(msg)
        for i in ids if isinstance(ids, list) else []:
            if not isinstance(i, str) or i in states:
                continue
            if not self.lifecycle.owned_by(i, who):
                states[i] = "unknown"           # another client's call: nothing to see
                continue
            states[i] = self.data.state(i) or self.lifecycle.state(i)
            call = self.calls.get(i)
            if call is not None:
                call.route = msg.route          # the asker may have a new route (reconnected)
                call.last_contact = time.time()
                call.orphaned = False
            elif cache.held(i):                 # an answer kept for a client who was away
                self._deliver_kept(msg.route, i, cache.answer(i))
            elif states[i] == "done" and cache.answer(i) is None:
                self.endpoint.send(msg.route, self._gone(i))    # a client still waits: say so
        self.endpoint.reply(msg, m.make(MsgType.PONG, msg.id, name=self.name, calls=states))

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
                if not self._closing:
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
                self.answer(a.call, m.error_header(a.call.id, "cancelled", "call cancelled while queued",
                                                   **self.timing(a.call)), ok=False)
        self._view_changed(r)
        wake = self.lifecycle.next_wakeup(r.name, time.time())
        if wake is not None:
            if r.timer is not None:
                r.timer.cancel()
            r.timer = asyncio.get_running_loop().call_later(max(0.0, wake - time.time()) + 0.001, self._tick, r)

    def _tick(self, r: Replica) -> None:
        r.timer = None
        self._apply(r, self.lifecycle.tick(r.name, time.time()))

    def _stop(self, call: _Call, reason: str) -> None:
        if reason == "preempted":
            self.stats["preempted"] += 1
        if not self.execution.kill(call) and call.task:
            call.task.cancel()
        kind = "preempted" if reason == "preempted" else "cancelled"
        self.answer(call, m.error_header(
            call.id, kind, f"call {reason} on {call.replica.name}" + (
                " (a mandatory request needed the server)" if kind == "preempted" else ""),
            **self.timing(call)), ok=False)

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

    def timing(self, call: _Call) -> dict:
        t = {"received": call.received, "started": call.started, "ended": time.time()}
        more = self.execution.timing(call)
        if more:
            t.update(more)
        return {"server": call.replica.name, "timing": t}

    async def _execute(self, call: _Call) -> None:
        try:
            out = await self.execution.run(call)
        except asyncio.CancelledError:
            return
        except Exception as exc:  # noqa: BLE001 - a back-end bug: answer the call, keep serving
            log.exception("SeD %s: back-end %s failed on call %s", self.name, self.execution.name, call.id)
            out = Outcome(ok=False, kind="internal", error=(type(exc).__name__, f"SeD {self.name} could not "
                                                            f"run the call: {exc}", traceback.format_exc()))
        self._ran(call, out)

    def _ran(self, call: _Call, out: Outcome | None) -> None:
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

    def _answer_of(self, call: _Call, out: Outcome) -> tuple[dict, list, bool]:
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

    def answer(self, call: _Call, header: dict, buffers: list = (), *, ok: bool) -> None:
        """Answer a call that ended (any way) and close its record; the queue
        may start the next calls. Also for back-ends (e.g. at shutdown)."""
        if self.calls.get(call.id) is not call:
            return
        header, buffers, ok = self.data.answering(call, header, buffers, ok)   # kept results, data waiters
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
        _count(self._in_flight, call.user, -1)
        _count(self._by_owner, call.owner, -1)
        actions = self.lifecycle.complete(call.id, frames, ok=ok, now=now)
        self.execution.finished(call, header, frames, delivered)
        call.args = call.kwargs = None          # the record may outlive the call (tasks): free the data
        self._apply(call.replica, actions)

    # -- events (VizDIET's BEGIN_SOLVE / END_SOLVE...) ----------------------
    def _event(self, kind: EventKind, call: _Call, now: float, *, duration: float | None = None,
               detail: str | None = None) -> None:
        self.outbox.emit(make_event(kind, now, call.replica.name, id=call.id, user=call.user,
                                    service=call.service, server=call.replica.name, duration=duration,
                                    optional=call.optional, detail=detail))

    def _ended_event(self, call: _Call, header: dict, now: float) -> None:
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


def _count(counts: dict, key, step: int) -> None:
    n = counts.get(key, 0) + step
    if n > 0:
        counts[key] = n
    else:
        counts.pop(key, None)


def _who(msg: Incoming) -> object:
    """Who is asking: the authenticated key under security, else the connection."""
    return msg.user or msg.peer


def _user(msg: Incoming) -> str:
    """The user a call is accounted to (fair queue, limits, events): the
    key's user under security, never the header's; an element key (a cloud
    SeD relaying a call) speaks for the user it names. Without security the
    header says (unauthenticated)."""
    return _user_of(msg.user, msg.header)


def _user_of(uid: str | None, header: dict) -> str:
    """:func:`_user` from the message's authenticated identity and header."""
    if uid is not None and uid.startswith("user:"):
        return uid[5:]
    return str(header.get("user") or "anonymous")
