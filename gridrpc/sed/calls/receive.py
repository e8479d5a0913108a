"""The SeD runtime's calls: receive, check, answer duplicates, queue, acknowledge, cancel, ping
(running and answering them: :mod:`gridrpc.sed.calls.run`).

A mixin of :class:`~gridrpc.sed.server.SeD` (which owns the endpoint, the
replicas, the call records ``lifecycle`` and the execution back-end). Every
call is one :class:`LiveCall` record in :class:`~gridrpc.core.sed_calls.SedCalls`,
from its arrival to its answer; a repeated request id is answered from there
(see that module), never run twice.
"""
from __future__ import annotations

import asyncio
import math
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...core import codec
from ...core.sed_calls import ACK_SLOT, PAUSE_CALLS, ack_delay
from ...core import messages as m
from ...core.events import EventKind
from ...core.messages import MsgType
from ...core.tally import tally
from ...core.sed_calls import CallRecord, CallState, Expired, Fetch, Reacknowledge, Resend
from ...core.sed_protocol import accepted_header, busy_error, call_replica, gone_error, not_owner_error
from ...errors import GridRPCError, InvalidArgument, ProtocolError, wire_kind
from ...transport.endpoint import Incoming
from .run import RunsMixin
from ..services import Service

if TYPE_CHECKING:  # pragma: no cover
    from ..server import Replica

log = logging.getLogger("gridrpc.sed.server")


@dataclass(eq=False, kw_only=True)
class LiveCall(CallRecord):
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
    arg_bytes: int = 0              # binary arguments it holds (counted per user while it lives)


class CallsMixin(RunsMixin):
    """Receives calls (checks, duplicates, admission, acknowledgement), their
    cancels and pings; running and answering them is :class:`RunsMixin`'s."""
    def _reject(self, route: list, error: dict) -> None:
        """Refuse a message: count it and send ``error`` (an ERROR header) back."""
        self.stats["rejected"] += 1
        self.endpoint.send(route, error)

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
        user = _user_of(uid, h)         # as message_user(msg)
        if not self.lifecycle.owned_by(cid, who):
            return self._reject(route, not_owner_error(cid, self.name))
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
            return self._reject(route, m.error_header(cid, "too_large", f"call of {size} bytes exceeds this SeD's "
                                                      f"max_message_size of {self.max_message_size} bytes"))
        if size and self._arg_bytes.get(user, 0) + size > self.max_arg_bytes_per_user:
            return self._reject(route, m.error_header(
                cid, "refused", f"SeD {self.name}: user {user!r} has {self._arg_bytes.get(user, 0)} bytes of "
                f"arguments in calls queued or running here; {size} more would pass the limit "
                f"max_arg_bytes_per_user={self.max_arg_bytes_per_user}"))
        r = call_replica(h, self.replicas)
        if r is None:
            return self._reject(route, m.error_header(cid, "no_server", f"no SeD named {h.get('sed')!r} here "
                                                      f"(this process serves {', '.join(self.replicas)})"))
        svc = self.services.get(h["service"])
        if svc is None:
            return self._reject(route, m.error_header(cid, "service_not_found",
                                                      f"SeD {r.name} does not offer {h['service']!r}"))
        refusal = self.access.check(svc.name, user, self._in_flight)
        if refusal is not None:
            return self._reject(route, m.error_header(cid, "refused", f"SeD {r.name}: {refusal}"))
        if h.get("start_now") is True and not self._can_start_now(r):
            # the client's view saw this server free and has other candidates: never queue here
            self.stats["busy"] += 1
            return self.endpoint.send(route, busy_error(
                cid, r.name, svc.name, self.execution.estimate(r, svc, user, time.time()).get("est_wait", 0.0)))
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
            return self._reject(route, m.error_header(cid, wire_kind(exc), str(exc), type_=type(exc).__name__))
        now = time.time()
        call = LiveCall(id=cid, sed=r.name, service=svc.name, user=user, owner=who,
                        optional=bool(h.get("optional", False)), received=now, route=route, replica=r, svc=svc,
                        args=args, kwargs=kwargs, options=options, workdir=workdir, last_contact=now,
                        arg_bytes=size)
        self.stats["calls"] += 1
        r.last_solve = now
        log.debug("SeD %s: call %s %s from %s%s", r.name, cid, svc.name, call.user,
                  " (optional)" if call.optional else "")
        try:
            if self.data.on_call(call, h):          # kept result; references fetched first, then admitted
                return
        except GridRPCError as exc:
            ex.remove_workdir(workdir)
            return self._reject(route, m.error_header(cid, "data", str(exc), type_=type(exc).__name__))
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

    def admit(self, call: LiveCall, now: float | None = None) -> None:
        """Queue a call (also used by back-ends: calls recovered after a restart)."""
        now = time.time() if now is None else now
        self._event(EventKind.CALL_QUEUED, call, now)
        tally(self._in_flight, call.user, 1)
        tally(self._by_owner, call.owner, 1)
        if call.arg_bytes:
            tally(self._arg_bytes, call.user, call.arg_bytes)
        self._apply(call.replica, self.lifecycle.submit(call, now))

    def _accepted(self, call: LiveCall, duplicate: bool = False) -> dict:
        h = accepted_header(call.id, call.replica.name, running=call.state is CallState.RUNNING,
                            idempotent=call.svc.idempotent, duplicate=duplicate)
        h.update(self.execution.ack_fields(call))
        return h

    def _hold_ack(self, call: LiveCall, delay: float) -> None:
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
        return gone_error(cid, self.name, self.lifecycle.cache.max_bytes)

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
            return self._reject(msg.route, m.error_header(cid, "refused", f"call {cid} belongs to another client: "
                                                          "only its owner may cancel it"))
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


def _who(msg: Incoming) -> object:
    """Who is asking: the authenticated key under security, else the connection."""
    return msg.user or msg.peer


def message_user(msg: Incoming) -> str:
    """The user a call is accounted to (fair queue, limits, events): the
    key's user under security, never the header's; an element key (a cloud
    SeD relaying a call) speaks for the user it names. Without security the
    header says (unauthenticated)."""
    return _user_of(msg.user, msg.header)


def _user_of(uid: str | None, header: dict) -> str:
    """:func:`message_user` from the message's authenticated identity and header."""
    if uid is not None and uid.startswith("user:"):
        return uid[5:]
    return str(header.get("user") or "anonymous")
