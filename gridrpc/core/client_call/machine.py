"""The client side of one call to a SeD, as a sans-IO state machine.

Three drivers run it: the asyncio client (:mod:`gridrpc.client.aio`), the
gevent load-test client (:mod:`gridrpc.loadtest.green`) and a SeD relaying
a call to a SeD on a VM or a pilot (:mod:`gridrpc.sed.backends.relay`). They own
sockets, timers and futures; every protocol rule is here, in the style of
h11: ``machine.handle(event, now) -> list[action]`` and
``machine.next_wakeup()``. No asyncio, no zmq, no clock: ``now`` is an
argument (any monotonic clock, in seconds).

Phases and what moves them (``*`` = CANCEL sent to the server left)::

    NEW ──Start──▶ WAITING ──Accepted──▶ RUNNING ──Result──▶ DONE
                     │  ack timeout*, send failed,   │  silence > max(ping_timeout, patience)*,
                     │  ERROR no_server|service_     │  PONG "unknown", ERROR communication,
                     │  not_found|communication,     │  malformed reply*
                     │  malformed reply*             │
                     └──────────┬────────────────────┘
                                ▼
                next candidate (failover allowed) ─▶ WAITING, else FAILED
    WAITING/RUNNING ──deadline*──▶ FAILED (timeout)   ──ERROR (other kinds)──▶ FAILED
    WAITING/RUNNING ──Cancel*──▶ CANCELLING ──CANCELLED ack, ERROR, ack_timeout──▶ FAILED
                                            ──Result──▶ DONE
    any live phase ──Abort*──▶ FAILED (the driver stops: client closed, VM gone)

Rules worth knowing:

- ``ack_timeout``: a server has that long to answer the CALL (ACCEPTED,
  RESULT or ERROR); then it is cancelled and the next candidate tried.
- Pings: while RUNNING, on the grid of ``ping_interval`` (``k *
  ping_interval`` on the driver's clock, so a driver wakes once for all its
  calls and may batch the pings per address), a PING when the server has been
  silent for 0.9 ``ping_interval``. Silence longer than ``max(ping_timeout,
  patience)`` gives the server up (``patience``: what ACCEPTED announced, e.g.
  a batch SeD that may restart; at most ``policy.max_patience``).
- A PONG saying ``done`` while no RESULT came (the answer was lost) sends the
  CALL again under the same id: a SeD answers a known id from its cache and
  never runs a call twice.
- Failover only when ``policy.failover``; otherwise only the first candidate.
- Late binding: when the first candidate is free (a free slot, nothing
  waiting) by the discovery answer's estimation, or by the caller's own
  count when it gives one (``Discovered.first_free``), and there are
  others, each candidate in turn is sent the CALL with ``start_now``; a
  server that cannot start the call at once answers ERROR ``busy`` (with
  its ``est_wait``) without queueing it (the pushed state was stale), and
  the next candidate is tried. When every candidate was busy, the call is
  queued (no ``start_now``) on the one that announced the shortest wait. A
  ``busy`` to a CALL that was not a probe is an ordinary failover.
- Every server given up on while it may still hold the call receives a
  CANCEL (not after its RESULT, ERROR or a PONG ``unknown``, nor when the
  CALL could not be sent).
- Exactly one :class:`Done` or :class:`Fail` per machine; after it every
  event is ignored.

Discovery and retries (a machine built with ``discover=True`` and no
candidates)::

    NEW ──Start──▶ DISCOVERING ──Discovered──▶ WAITING ...
                     │ DiscoveryFailed, transient (rebuilding, communication,
                     │ no_server, timeout) ─▶ BACKOFF ──tick at retry_at──▶ DISCOVERING
                     │ DiscoveryFailed, permanent (service_not_found, invalid_argument,
                     │ unauthorized, protocol, ...) ─▶ FAILED
    every candidate failed, the call safe to move ─▶ BACKOFF ─▶ DISCOVERING (failed servers excluded)

- Transient conditions are retried with exponential backoff
  (``policy.backoff_initial`` doubling to ``policy.backoff_max``) until the
  call's deadline, or ``policy.retry_timeout`` after the start when the call
  has none; then the last error (or a timeout naming it) ends the call.
- Execution semantics: a server says whether the service is idempotent (in
  the discovery answer and in ACCEPTED, ``idempotent: false``) and whether
  the call is ``queued`` or ``running`` (ACCEPTED ``state``, PONGs, and a PONG
  ``running`` it sends unasked when a non-idempotent call starts). A call
  that never started is always moved. A non-idempotent call whose server is
  lost while the call may have started (running, or state unknown: the CALL
  went out and nothing came back) is not re-run: it fails with kind
  ``server_lost`` (:class:`gridrpc.ServerLost`) naming the server and call id.
  An ERROR of kind ``unavailable`` (the server cannot run the call at all,
  and it never started there: a cloud SeD whose image does not exist) moves
  the call to the next candidate, idempotent or not; with none left the call
  fails with that error (:class:`gridrpc.NoServerAvailable`), without a new
  discovery.

Errors are data (:class:`CallError`: a wire error kind and a message); the
drivers turn them into :mod:`gridrpc.errors` exceptions with
``error_from_wire(err.to_wire(), server=err.server)``.

Layout: the events, actions, :class:`CallPolicy` and :class:`CallError` are in
:mod:`gridrpc.core.client_call.vocabulary`, the discovery and retry transitions in
:mod:`gridrpc.core.client_call.rediscovery`; every name is importable from here.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from .rediscovery import TRANSIENT_KINDS, Rediscovery
from .vocabulary import (Abort, Accepted, CallError, CallPolicy, CallSent, Cancel, CancelAck, Discover, Discovered,
                         DiscoveryFailed, Done, Error, Fail, FailOver, Malformed, Phase, Pong, Result, SendCall,
                         SendCancel, SendFailed, SendPing, Start, Target, Tick)

__all__ = [
    "Phase", "CallPolicy", "CallError", "CallMachine", "Target",
    # events
    "Start", "CallSent", "SendFailed", "Accepted", "Pong", "Result", "Error", "Malformed", "CancelAck",
    "Tick", "Cancel", "Abort", "Discovered", "DiscoveryFailed",
    # actions
    "SendCall", "SendPing", "SendCancel", "FailOver", "Done", "Fail", "Discover",
    "TRANSIENT_KINDS",
]


_LIVE = (Phase.WAITING, Phase.RUNNING)
_FAILOVER_WHILE_WAITING = frozenset({"no_server", "service_not_found", "communication", "busy"})
# the server cannot run the call and says it never started (a cloud SeD that cannot create VMs):
# the other candidates are tried, then the call fails with that error (no new discovery)
_UNAVAILABLE = "unavailable"
_NOT_STARTED = frozenset({"queued"})
_NOTHING: frozenset = frozenset()


# -- the machine ------------------------------------------------------------------------------

class CallMachine(Rediscovery):
    """One call. ``candidates``: ranked servers (objects with ``name`` and
    ``address``); ``deadline``: absolute time on the driver's clock, or None;
    ``new_id()``: a fresh request id per attempt; ``noun``: what the servers
    are called in messages."""

    __slots__ = ("service", "candidates", "policy", "deadline", "new_id", "noun", "phase", "index", "id",
                 "server", "address", "attempts", "sent_at", "last_news", "last_ping", "patience",
                 "cancel_at", "failures", "now", "discover", "discoveries", "retry_at", "retry_until",
                 "excluded", "last_error", "idempotent", "server_state", "probing", "probed", "busy_waits",
                 "late_binding", "first_free")

    def __init__(self, service: str, candidates: Sequence[Target] = (), *, policy: CallPolicy,
                 deadline: float | None = None, new_id: Callable[[], str], noun: str = "server",
                 discover: bool = False, late_binding: bool = True) -> None:
        self.service = service
        self.candidates = tuple(candidates) if policy.failover else tuple(candidates)[:1]
        self.discover = discover            # candidates come from Discover actions (retries possible)
        self.discoveries = 0
        self.retry_at = math.inf
        self.retry_until = math.inf
        # servers given up on: not tried again by a rediscovery. It and ``failures`` start as shared empty
        # immutables, replaced when the first entry comes: most calls never fail, and a set and a list per
        # call were two more objects for the cyclic GC to walk in a client with 14,000 calls in flight
        self.excluded: frozenset[str] = _NOTHING
        self.last_error: CallError | None = None
        self.idempotent = True              # what the current server says of the service
        self.server_state: str | None = None  # the call's state on the current server, as last heard
        self.late_binding = late_binding    # False: a call on data references (where the data is decides)
        self.probing = False                # late binding: candidates are asked "start now or say busy"
        self.probed = False                 # the current attempt was such a probe
        self.busy_waits: dict[int, float] = {}  # candidate index -> the wait it announced when busy
        self.first_free: bool | None = None  # the caller's count of the first candidate (Discovered)
        self.policy = policy
        self.deadline = deadline
        self.new_id = new_id
        self.noun = noun
        self.phase = Phase.NEW
        self.index = -1
        self.id: str | None = None
        self.server = ""
        self.address = ""
        self.attempts: list[str] = []
        self.sent_at = self.last_news = self.last_ping = self.cancel_at = -math.inf
        self.patience = 0.0
        self.failures: tuple[str, ...] = ()     # "server: reason" of each server given up on
        self.now = -math.inf

    # -- public ----------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.phase is Phase.DONE or self.phase is Phase.FAILED

    def handle(self, event: Any, now: float) -> list:
        """Apply ``event`` at time ``now``; returns the actions to carry out, in order."""
        if self.phase is Phase.DONE or self.phase is Phase.FAILED:
            return []
        self.now = now
        return _HANDLERS[type(event)](self, event, now)

    def next_wakeup(self) -> float | None:
        """When the driver must call ``handle(Tick(), now)`` next (None: no timer)."""
        ph = self.phase
        if ph is Phase.WAITING:
            w = self.sent_at + self.policy.ack_timeout
        elif ph is Phase.RUNNING:
            pi = self.policy.ping_interval
            w = (math.floor(self.now / pi) + 1) * pi      # the ping grid: every call wakes together
            if w <= self.now:
                w += pi
        elif ph is Phase.CANCELLING:
            return self.cancel_at + self.policy.ack_timeout
        elif ph is Phase.BACKOFF:
            w = self.retry_at
        elif ph is Phase.DISCOVERING:
            w = self.deadline if self.deadline is not None else None
            return w
        else:
            return None
        d = self.deadline
        return w if d is None or w < d else d

    def statistics(self) -> dict:
        return {"service": self.service, "phase": self.phase.value, "server": self.server, "id": self.id,
                "attempts": list(self.attempts), "failures": list(self.failures), "patience": self.patience,
                "discoveries": self.discoveries}

    # -- transitions -----------------------------------------------------------------------
    def _start(self, ev: Start, now: float) -> list:
        if self.phase is not Phase.NEW:
            return []
        if self.discover and not self.candidates:
            if self.deadline is not None and now >= self.deadline:
                return self._fail(CallError(kind="timeout", message=f"call to {self.service} timed out "
                                                                    "before it was sent"))
            self.retry_until = self.deadline if self.deadline is not None else now + self.policy.retry_timeout
            return self._discover_now(now)
        if not self.candidates:
            return self._fail(CallError(kind="no_server", message=f"no server available for {self.service!r}"))
        if self.deadline is not None and now >= self.deadline:
            return self._fail(CallError(kind="timeout",
                                        message=f"call to {self.service} timed out before it was sent"))
        return self._send_to(0, now)

    def _call_sent(self, ev: CallSent, now: float) -> list:
        if self.phase is Phase.WAITING:
            self.sent_at = now
        return []

    def _send_failed(self, ev: SendFailed, now: float) -> list:
        if self.phase is not Phase.WAITING:
            return []
        return self._leave(now, ev.reason, cancel=False)

    def _accepted(self, ev: Accepted, now: float) -> list:
        if ev.id != self.id:
            return []
        if self.phase is Phase.WAITING:
            self.phase = Phase.RUNNING
        self.last_news = now
        if ev.idempotent is False:
            self.idempotent = False
        if type(ev.state) is str and (self.server_state is None or ev.state != "queued"):
            self.server_state = ev.state
        p = ev.patience
        if type(p) in (int, float) and p > 0:           # not bool, not NaN
            self.patience = min(float(p), self.policy.max_patience)
        return []

    def _pong(self, ev: Pong, now: float) -> list:
        if ev.id != self.id:
            return []
        if self.phase is Phase.RUNNING:
            if ev.state == "unknown":
                return self._leave(now, "lost the call (restarted?)", cancel=False, error=CallError(
                    kind="communication", message=f"{self.server} lost call {self.id} (restarted?)",
                    server=self.server))
            self.last_news = now
            if self.server_state != "running" or ev.state != "queued":   # never back to queued
                self.server_state = ev.state
            if ev.state == "done":           # answered, but the RESULT never came: ask again
                return [SendCall(self.id, self.server, self.address)]
            return []
        if self.phase is Phase.WAITING:
            self.last_news = now
            if ev.state in ("queued", "running") and self.server_state != "running":
                self.server_state = ev.state
        return []

    def _result(self, ev: Result, now: float) -> list:
        if ev.id != self.id:
            return []
        self.phase = Phase.DONE
        return [Done(ev.value, ev.server or self.server, ev.timing or {})]

    def _error(self, ev: Error, now: float) -> list:
        if ev.id != self.id:
            return []
        wire = ev.error
        kind = wire.get("kind")
        kind = kind if type(kind) is str else "remote"
        err = CallError(kind=kind, message=str(wire.get("message", "")), server=ev.server or self.server,
                        wire=wire, timing=ev.timing or {}, reply=ev.reply)
        if kind == "busy" and self.phase is Phase.WAITING and self.probed:
            return self._busy(wire, now)
        if self.phase is Phase.WAITING and kind in _FAILOVER_WHILE_WAITING:
            return self._leave(now, err.message, cancel=False, error=None if kind == "communication" else err)
        if kind == _UNAVAILABLE and self.phase in _LIVE:
            return self._leave(now, err.message, cancel=False, error=err)
        if self.phase is Phase.RUNNING and kind == "communication":
            return self._leave(now, err.message, cancel=False, error=err)
        return self._fail(err)

    def _malformed(self, ev: Malformed, now: float) -> list:
        if (ev.id is not None and ev.id != self.id) or self.phase is Phase.NEW:
            return []
        if self.phase is Phase.CANCELLING:
            return self._fail(self._cancelled())
        return self._leave(now, f"sent a malformed reply: {ev.reason}", cancel=True, error=CallError(
            kind="protocol", server=self.server,
            message=f"{self.noun} {self.server} ({self.address}) sent a malformed reply: {ev.reason}"))

    def _cancel_ack(self, ev: CancelAck, now: float) -> list:
        if ev.id != self.id or self.phase is not Phase.CANCELLING:
            return []
        err = self._cancelled()
        if ev.timing:
            err = CallError(kind=err.kind, message=err.message, server=err.server, timing=ev.timing)
        return self._fail(err)

    def _tick(self, ev: Tick, now: float) -> list:
        ph = self.phase
        pol = self.policy
        if ph is Phase.BACKOFF or ph is Phase.DISCOVERING:
            if self.deadline is not None and now >= self.deadline:
                return self._fail(self._retry_timeout_error())
            if ph is Phase.BACKOFF and now >= self.retry_at:
                return self._discover_now(now)
            return []
        if ph is Phase.CANCELLING:
            return self._fail(self._cancelled()) if now >= self.cancel_at + pol.ack_timeout else []
        if ph is not Phase.WAITING and ph is not Phase.RUNNING:
            return []
        if self.deadline is not None and now >= self.deadline:
            return self._timeout()
        if ph is Phase.WAITING:
            if now >= self.sent_at + pol.ack_timeout:
                return self._leave(now, f"no answer within {pol.ack_timeout}s", cancel=True)
            return []
        silence = now - self.last_news
        if silence > max(pol.ping_timeout, self.patience):
            return self._leave(now, f"silent for {silence:.1f}s", cancel=True, error=CallError(
                kind="communication", server=self.server,
                message=f"{self.noun} {self.server} ({self.address}) stopped answering for {silence:.1f}s"))
        nearly = 0.9 * pol.ping_interval
        if silence >= nearly and now - self.last_ping >= nearly:
            self.last_ping = now
            return [SendPing(self.id, self.server, self.address)]
        return []

    def _cancel(self, ev: Cancel, now: float) -> list:
        if self.phase in (Phase.NEW, Phase.DISCOVERING, Phase.BACKOFF):
            return self._fail(self._cancelled())
        if self.phase not in _LIVE:
            return []
        self.phase = Phase.CANCELLING
        self.cancel_at = now
        return [SendCancel(self.id, self.server, self.address)]

    def _abort(self, ev: Abort, now: float) -> list:
        out = [SendCancel(self.id, self.server, self.address)] if self.phase in _LIVE else []
        return out + self._fail(CallError(kind=ev.kind, message=ev.message, server=self.server or None))

    # -- helpers ---------------------------------------------------------------------------
    def _may_have_started(self) -> bool:
        """Whether the call may have started on the current server: known
        running, or the CALL went out and the state is unknown."""
        return self.server_state not in _NOT_STARTED

    def _busy(self, wire: dict, now: float) -> list:
        """A probed server cannot start the call now (nothing was queued
        there): the next candidate, probed too; when every one was busy,
        queue on the one that announced the shortest wait."""
        w = wire.get("est_wait")
        self.busy_waits[self.index] = (float(w) if type(w) in (int, float) and math.isfinite(w) and w >= 0
                                       else math.inf)
        self.failures += (f"{self.server}: busy",)
        if self.deadline is not None and now >= self.deadline:
            return self._fail(self._timeout_error())
        nxt = self.index + 1
        if nxt < len(self.candidates):
            return [FailOver(self.id, self.server, "busy", self.candidates[nxt].name, True)] + self._send_to(nxt, now)
        best = min(self.busy_waits, key=lambda i: (self.busy_waits[i], i))
        self.probing = False                # from here on an ordinary call: failover only moves forward
        return ([FailOver(self.id, self.server, "every candidate busy: queueing where the wait is shortest",
                          self.candidates[best].name, True)] + self._send_to(best, now, probe=False))

    def _send_to(self, i: int, now: float, probe: bool | None = None) -> list:
        c = self.candidates[i]
        self.index = i
        self.id = self.new_id()
        self.server, self.address = c.name, c.address
        self.attempts.append(self.id)
        self.phase = Phase.WAITING
        self.sent_at = self.last_news = now
        self.last_ping = -math.inf
        self.patience = 0.0
        self.server_state = None
        self.idempotent = getattr(c, "idempotent", True) is not False
        # late binding: when the best server is free by the caller's count (else by the discovery's
        # estimation), every candidate is asked to start the call at once or answer "busy" (the view
        # was stale); see _busy
        if i == 0 and probe is None:
            free = self.first_free
            self.probing = (self.late_binding and len(self.candidates) > 1
                            and (_seen_free(c) if free is None else free))
            self.busy_waits = {}
        self.probed = self.probing if probe is None else probe
        return [SendCall(self.id, self.server, self.address, self.probed)]

    def _leave(self, now: float, reason: str, *, cancel: bool, error: CallError | None = None) -> list:
        """Give the current server up: CANCEL it if it may hold the call, then
        the next candidate; with none left, fail with ``error`` (None: one
        CommunicationError listing every server's reason)."""
        out: list = [SendCancel(self.id, self.server, self.address)] if cancel else []
        self.failures += (f"{self.server}: {reason}",)
        if (not self.idempotent and self.policy.failover and self.phase in _LIVE and self.id is not None
                and self._may_have_started() and (cancel or error is not None and error.kind == "communication")):
            return out + self._fail(CallError(
                kind="server_lost", server=self.server, call_id=self.id,
                message=f"{self.noun} {self.server} ({self.address}) was lost while running call {self.id} "
                        f"of {self.service} ({reason}); {self.service} is not idempotent, so the call is not "
                        f"run again: it may or may not have completed (docs/reliability.md)"))
        self.excluded |= {self.server}
        nxt = self.index + 1
        if nxt < len(self.candidates):
            if self.deadline is not None and now >= self.deadline:
                return out + self._fail(self._timeout_error())
            out.append(FailOver(self.id, self.server, reason, self.candidates[nxt].name))
            return out + self._send_to(nxt, now)
        if error is None:
            error = CallError(kind="communication", server=self.server or None,
                              message=f"no candidate {self.noun} could run {self.service}: "
                                      + "; ".join(self.failures))
        if self.discover and self.policy.failover and error.kind in _FAILOVER_WHILE_WAITING:
            return out + self._retry_or_fail(now, error)
        return out + self._fail(error)

    def _timeout_error(self) -> CallError:
        if self.phase is Phase.WAITING:
            msg = f"call to {self.service} timed out before {self.server} accepted it"
        else:
            msg = f"call to {self.service} on {self.server} timed out"
        return CallError(kind="timeout", message=msg, server=self.server)

    def _timeout(self) -> list:
        err = self._timeout_error()
        return [SendCancel(self.id, self.server, self.address)] + self._fail(err)

    def _cancelled(self) -> CallError:
        return CallError(kind="cancelled", message=f"call to {self.service} cancelled", server=self.server or None)

    def _fail(self, error: CallError) -> list:
        self.phase = Phase.FAILED
        return [Fail(error)]


def _seen_free(c: Any) -> bool:
    """Whether the discovery answer showed server ``c`` with a free slot and
    nothing waiting (its estimation's ``num_running``/``max_concurrent``/``num_waiting``)."""
    est = getattr(c, "estimation", None)
    if type(est) is not dict:
        return False
    running, slots, waiting = est.get("num_running"), est.get("max_concurrent"), est.get("num_waiting", 0)
    return (type(running) is int and type(slots) is int and type(waiting) is int
            and waiting == 0 and running < slots)


_HANDLERS: dict[type, Callable[[CallMachine, Any, float], list]] = {
    Start: CallMachine._start, CallSent: CallMachine._call_sent, SendFailed: CallMachine._send_failed,
    Accepted: CallMachine._accepted, Pong: CallMachine._pong, Result: CallMachine._result,
    Error: CallMachine._error, Malformed: CallMachine._malformed, CancelAck: CallMachine._cancel_ack,
    Tick: CallMachine._tick, Cancel: CallMachine._cancel, Abort: CallMachine._abort,
    Discovered: CallMachine._discovered, DiscoveryFailed: CallMachine._discovery_failed,
}
