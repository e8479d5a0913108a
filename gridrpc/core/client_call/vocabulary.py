"""The vocabulary of the call machine (:mod:`gridrpc.core.client_call.machine`): its phases,
its policy, the error it fails with, the events a driver feeds it and the
actions it returns. Frozen value objects; no behaviour beyond
:meth:`CallError.to_wire`.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

__all__ = [
    "Phase", "CallPolicy", "CallError", "Target",
    # events
    "Start", "CallSent", "SendFailed", "Accepted", "Pong", "Result", "Error", "Malformed", "CancelAck",
    "Tick", "Cancel", "Abort", "Discovered", "DiscoveryFailed",
    # actions
    "SendCall", "SendPing", "SendCancel", "FailOver", "Done", "Fail", "Discover",
]


class Phase(str, enum.Enum):
    NEW = "new"
    WAITING = "waiting"          # CALL sent, no ACCEPTED yet
    RUNNING = "running"          # accepted: pings until the answer
    CANCELLING = "cancelling"    # CANCEL sent for the user: waiting for the server's word
    DISCOVERING = "discovering"  # asking the agents for candidates
    BACKOFF = "backoff"          # a transient failure: waiting to discover again
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True, slots=True, kw_only=True)
class CallPolicy:
    """The protocol's knobs (seconds). ``failover``: try the next candidate
    when a server fails; ``max_patience`` bounds the ``patience`` a server may
    ask for."""
    ack_timeout: float = 5.0
    ping_interval: float = 1.0
    ping_timeout: float = 4.0
    failover: bool = True
    max_patience: float = 3600.0
    retry_timeout: float = 10.0      # retry window of transient failures when the call has no deadline
    backoff_initial: float = 0.05
    backoff_max: float = 1.0
    backoff_jitter: float = 0.5      # each backoff shortened by up to this fraction, at random:
    #                                  clients that failed together do not retry together

    @property
    def ack_ms(self) -> int:
        """``ack_timeout`` in ms, sent with each CALL: a SeD may hold the
        ACCEPTED of a queued call for a small share of it (``core.sed_calls.ack_delay``)."""
        return int(self.ack_timeout * 1000)


class Target(Protocol):
    """A candidate server (``gridrpc.ServerInfo`` is one)."""
    name: str
    address: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CallError:
    """Why a call failed. ``kind`` is a wire error kind (``gridrpc.errors.
    ERROR_KINDS``); ``wire`` is the server's own error dict when the server
    answered ERROR (then ``reply`` is that answer as the driver received it);
    ``timing`` the server's timing of the call, if it sent one."""
    kind: str
    message: str
    server: str | None = None
    wire: dict | None = None
    timing: dict = field(default_factory=dict)
    reply: Any = None
    call_id: str | None = None

    @property
    def from_server(self) -> bool:
        return self.wire is not None

    def to_wire(self) -> dict:
        if self.wire is not None:
            return self.wire
        w = {"kind": self.kind, "message": self.message}
        if self.call_id is not None:
            w["call_id"] = self.call_id
        return w


# -- events (in) ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Start:
    """Begin: the CALL goes to the first candidate."""


@dataclass(frozen=True, slots=True)
class CallSent:
    """Optional: the CALL actually left now (drivers whose sends are queued);
    the ack timeout counts from here."""


@dataclass(frozen=True, slots=True)
class SendFailed:
    """The CALL could not be sent to the current server."""
    reason: str


@dataclass(frozen=True, slots=True)
class Accepted:
    id: str
    patience: Any = None         # as received: validated here
    idempotent: Any = None       # as received: False only for a service declared non-idempotent
    state: Any = None            # as received: "queued" | "running" (None: not said)


@dataclass(frozen=True, slots=True)
class Discovered:
    """The agents answered: ranked candidates (objects with ``name``,
    ``address`` and optionally ``idempotent``). ``first_free``: whether the
    caller counts a free slot on the first candidate (its own calls there,
    which the answer's estimation may not show yet, or may show after they
    ended; :mod:`gridrpc.client.reuse`): True, the call is a late-binding
    probe; False, it is queued there (a probe would find every candidate
    full of the caller's own calls, and the calls of a burst would then all
    queue on the one that announced the shortest wait); None, the answer's
    estimation decides."""
    servers: Sequence[Any]
    first_free: bool | None = None


@dataclass(frozen=True, slots=True)
class DiscoveryFailed:
    """The discovery failed: ``kind`` a wire error kind (``communication``
    when no master agent answered)."""
    kind: str
    message: str


@dataclass(frozen=True, slots=True)
class Pong:
    id: str
    state: str                   # queued | running | done | unknown | ...


@dataclass(frozen=True, slots=True)
class Result:
    id: str
    value: Any                   # decoded by the driver (or the raw reply, for a relay)
    timing: dict | None = None
    server: str | None = None


@dataclass(frozen=True, slots=True)
class Error:
    id: str
    error: dict                  # the wire error {kind, type, message, traceback}
    timing: dict | None = None
    server: str | None = None
    reply: Any = None            # the answer as received (relays forward it)


@dataclass(frozen=True, slots=True)
class Malformed:
    """The current server sent something unusable (a header that does not
    parse, a result that does not decode). ``id`` None: unattributable, it
    concerns every call waiting on that server."""
    reason: str
    id: str | None = None


@dataclass(frozen=True, slots=True)
class CancelAck:
    id: str
    state: str | None = None
    timing: dict | None = None      # the server's timing of the call (started, ended: the killed work)


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed (drivers tick at :meth:`CallMachine.next_wakeup`)."""


@dataclass(frozen=True, slots=True)
class Cancel:
    """The user cancels the call."""


@dataclass(frozen=True, slots=True)
class Abort:
    """The driver stops (client closed, VM gone): fail with this error."""
    kind: str
    message: str


# -- actions (out) ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Discover:
    """Ask the agents for candidates (``attempt`` counts from 1); answer
    with :class:`Discovered` or :class:`DiscoveryFailed`. ``timeout``: what
    is left of the call's time, s (None: no bound)."""
    attempt: int
    timeout: float | None = None

@dataclass(frozen=True, slots=True)
class SendCall:
    id: str
    server: str
    address: str
    start_now: bool = False     # "run it now or answer busy": a probe of a server the view saw free


@dataclass(frozen=True, slots=True)
class SendPing:
    id: str
    server: str
    address: str


@dataclass(frozen=True, slots=True)
class SendCancel:
    id: str
    server: str
    address: str


@dataclass(frozen=True, slots=True)
class FailOver:
    """The current attempt ``id`` is given up; a :class:`SendCall` to
    ``next_server`` follows."""
    id: str
    server: str
    reason: str
    next_server: str
    routine: bool = False       # late binding moving on from a busy server: not worth a warning


@dataclass(frozen=True, slots=True)
class Done:
    value: Any
    server: str
    timing: dict


@dataclass(frozen=True, slots=True)
class Fail:
    error: CallError

