"""The lifecycle event (:mod:`gridrpc.core.events`): its kinds, the value
itself, and its validation.

Constructing an :class:`Event` does no validation (it is the hot path of
trusted in-process emitters; use :func:`make_event`, which bounds and
sanitises names and detail cheaply). Anything that crossed the network goes
through :meth:`Event.from_dict` / :meth:`Event.from_json` /
:func:`decode_events`, which check every field.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson

__all__ = ["EventKind", "Event", "make_event", "decode_events", "TERMINAL", "OUTCOME", "ERROR_KINDS",
           "LATENCY_BOUNDS", "InvalidEvent"]


class EventKind(str, Enum):
    """What happened. ``element`` is the element the event is about; the
    other fields used by each kind are listed after it."""
    REGISTERED = "registered"                  # a child joined (element: the child; detail: "KIND under PARENT")
    LEFT = "left"                              # a child unregistered itself (element: the child)
    DROPPED = "dropped"                        # a child missed its heartbeats (element: the child; detail)
    DISCOVERY_ASKED = "discovery_asked"        # agent got a discovery (id, user, service)
    DISCOVERY_ANSWERED = "discovery_answered"  # id, user, service, server (chosen), duration (s)
    DISCOVERY_FAILED = "discovery_failed"      # id, user, service, duration, detail (why)
    CALL_QUEUED = "call_queued"                # SeD accepted a call (id, user, service, server, optional)
    CALL_STARTED = "call_started"              # ... left the queue; duration = time waited (s)
    CALL_FINISHED = "call_finished"            # ... result sent; duration = run time (s)
    CALL_FAILED = "call_failed"                # ... the service raised or its worker died; duration, detail
    CALL_CANCELLED = "call_cancelled"          # ... cancelled by its owner; duration if it had started
    CALL_KILLED = "call_killed"                # ... killed by the SeD (shutdown, limit); duration, detail
    CALL_PREEMPTED = "call_preempted"          # optional call killed for a mandatory one; duration
    WORKER_DIED = "worker_died"                # a worker process died (id of its call if any, detail)
    JOB_STATE = "job_state"                    # batch SeD: the call's job changed state (id, detail: state)
    VM_STARTED = "vm_started"                  # cloud SeD started a VM (detail: VM id), duration = boot time
    VM_STOPPED = "vm_stopped"                  # cloud SeD stopped a VM (detail)
    PILOT_STARTED = "pilot_started"            # pilot batch SeD: a pilot's SeD registered (detail: pilot, job)
    PILOT_DRAINING = "pilot_draining"          # ... a pilot near its walltime takes no more calls (detail)
    PILOT_STOPPED = "pilot_stopped"            # ... a pilot left: idle, drained, lost (detail: why)
    PILOTS_PAUSED = "pilots_paused"            # ... submissions paused after failures in a row (detail: last error)
    PILOTS_RESUMED = "pilots_resumed"          # ... submissions resumed after a pause


_KINDS = {k.value: k for k in EventKind}

#: terminal call events and the outcome label each counts as
OUTCOME: dict[EventKind, str] = {
    EventKind.CALL_FINISHED: "finished", EventKind.CALL_FAILED: "failed",
    EventKind.CALL_CANCELLED: "cancelled", EventKind.CALL_KILLED: "killed",
    EventKind.CALL_PREEMPTED: "preempted"}
TERMINAL = frozenset(OUTCOME)
#: kinds kept in the "latest errors" list
ERROR_KINDS = frozenset({EventKind.CALL_FAILED, EventKind.CALL_KILLED, EventKind.WORKER_DIED,
                         EventKind.DROPPED, EventKind.DISCOVERY_FAILED})
CALL_KINDS = frozenset({EventKind.CALL_QUEUED, EventKind.CALL_STARTED}) | TERMINAL

#: upper bounds (s) of the latency histograms (Prometheus ``le``), +Inf implied
LATENCY_BOUNDS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                     1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)

# Same charsets as gridrpc.core.messages (ids and element names), kept here so
# this module stays independent: they end up in HTML, Prometheus labels, logs.
ID_RE = re.compile(r"[A-Za-z0-9_.:#@+=-]{1,128}")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,63}")
SERVICE_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}")
MAX_DETAIL = 400
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_BAD_USER_CHARS = re.compile(r"[^A-Za-z0-9_.@+-]")
_BAD_SERVICE_CHARS = re.compile(r"[^A-Za-z0-9_.:-]")
_BAD_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.-]")
MAX_TIME = 1e11                      # year 5138: anything beyond is garbage
MAX_DURATION = 1e7                   # 115 days


class InvalidEvent(ValueError):
    """An event from outside failed validation (the message says which field)."""


@dataclass(frozen=True, slots=True)
class Event:
    kind: EventKind
    time: float                      # emitter's clock, unix seconds
    element: str                     # the element the event is about
    id: str | None = None            # request id
    user: str | None = None
    service: str | None = None
    server: str | None = None        # SeD chosen / running the call
    duration: float | None = None    # seconds; meaning per kind (see EventKind)
    optional: bool = False           # an optional computation (DIET-ethic)
    detail: str | None = None        # short free text (error message, job state, VM id)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind.value, "time": self.time, "element": self.element}
        for f in ("id", "user", "service", "server", "duration", "detail"):
            v = getattr(self, f)
            if v is not None:
                d[f] = v
        if self.optional:
            d["optional"] = True
        return d

    def to_json(self) -> str:
        return orjson.dumps(self.to_dict()).decode()

    @classmethod
    def from_json(cls, text: str | bytes) -> "Event":
        if len(text) > 4096:
            raise InvalidEvent("event too large")
        try:
            d = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise InvalidEvent(f"not JSON: {exc}") from None
        return cls.from_dict(d)

    @classmethod
    def from_dict(cls, d: Any) -> "Event":
        """Validate every field of an event that came from elsewhere. Unknown
        keys are ignored (a newer peer may send more); ``seq`` is ignored.

        The MA runs this for every event of the tree: the names seen before
        (element, user, service, server) are checked by one set lookup each
        (:data:`_VALID`, filled by :func:`_check` after a regex match; any
        other value goes through :func:`_check`), and the event is built by
        :func:`_new_event`, not the slower ``__init__``."""
        if type(d) is not dict:
            raise InvalidEvent("an event is a JSON object")
        if len(d) > 32:
            raise InvalidEvent("too many keys")
        get = d.get
        kind = get("kind")
        kind = _KINDS.get(kind) if type(kind) is str else None
        if kind is None:
            raise InvalidEvent(f"unknown kind {_clip(d.get('kind'))}")
        t = get("time")
        if type(t) not in (int, float) or not (0 <= t < MAX_TIME):       # NaN fails too
            raise InvalidEvent("time must be a finite unix time")
        element = get("element")
        if type(element) is not str or element not in _VALID_NAMES:
            element = _check(d, "element", NAME_RE, required=True)
        dur = get("duration")
        if dur is not None and (type(dur) not in (int, float) or not (0 <= dur <= MAX_DURATION)):
            raise InvalidEvent("duration must be a finite number of seconds >= 0")
        opt = get("optional", False)
        if type(opt) is not bool:
            raise InvalidEvent("optional must be a boolean")
        detail = get("detail")
        if detail is not None and (type(detail) is not str or len(detail) > MAX_DETAIL
                                   or _CONTROL_RE.search(detail)):
            raise InvalidEvent(f"detail must be printable text of at most {MAX_DETAIL} characters")
        rid = get("id")
        if rid is not None and (type(rid) is not str or _match_id(rid) is None):
            rid = _check(d, "id", ID_RE)     # raises InvalidEvent (ids are not cached: they do not repeat)
        user = get("user")
        if user is not None and (type(user) is not str or user not in _VALID_USERS):
            user = _check(d, "user", USER_RE)
        service = get("service")
        if service is not None and (type(service) is not str or service not in _VALID_SERVICES):
            service = _check(d, "service", SERVICE_RE)
        server = get("server")
        if server is not None and (type(server) is not str or server not in _VALID_NAMES):
            server = _check(d, "server", NAME_RE)
        t, dur = float(t), None if dur is None else float(dur)
        if cls is not Event:                 # a subclass: its own constructor
            return cls(kind=kind, time=t, element=element, id=rid, user=user, service=service,
                       server=server, duration=dur, optional=opt, detail=detail)
        return _new_event(kind, t, element, rid, user, service, server, dur, opt, detail)


class _EventSlots:
    """:class:`Event`'s slots without the frozen dataclass around them: see
    :func:`_new_event`."""
    __slots__ = Event.__slots__


_new_object = object.__new__


def _new_event(kind: EventKind, time: float, element: str, id: str | None, user: str | None,
               service: str | None, server: str | None, duration: float | None, optional: bool,
               detail: str | None) -> Event:
    """``Event(kind, time, ...)``, several times faster: the frozen dataclass
    ``__init__`` stores each field with ``object.__setattr__`` (~1 us per
    event, the largest cost of :meth:`Event.from_dict`). This fills an
    unfrozen twin with the same slots, then makes it an :class:`Event` by
    setting its ``__class__`` (Python allows it between classes with the same
    slots). The result is an ordinary Event: same type, equality, hash, repr,
    pickling, and frozen like any other (tests/test_events_core.py checks)."""
    e = _new_object(_EventSlots)
    e.kind = kind
    e.time = time
    e.element = element
    e.id = id
    e.user = user
    e.service = service
    e.server = server
    e.duration = duration
    e.optional = optional
    e.detail = detail
    e.__class__ = Event
    return e


def _clip(v: Any) -> str:
    return repr(v)[:40]


#: strings already found valid, per pattern: names repeat in every event, the
#: regex runs once per distinct name (bounded: cleared when full)
_VALID: dict[re.Pattern, set[str]] = {ID_RE: set(), NAME_RE: set(), USER_RE: set(), SERVICE_RE: set()}
_VALID_MAX = 4096
_VALID_NAMES, _VALID_USERS, _VALID_SERVICES = _VALID[NAME_RE], _VALID[USER_RE], _VALID[SERVICE_RE]
_match_id = ID_RE.fullmatch


def _check(d: dict, key: str, rx: re.Pattern, required: bool = False) -> str | None:
    v = d.get(key)
    if v is None and not required:
        return None
    if type(v) is not str:
        raise InvalidEvent(f"{key} {_clip(v)} is not a valid name")
    known = _VALID[rx]
    if v in known:
        return v
    if rx.fullmatch(v) is None:
        raise InvalidEvent(f"{key} {_clip(v)} is not a valid name")
    if rx is not ID_RE:                   # ids do not repeat: not worth remembering
        if len(known) >= _VALID_MAX:
            known.clear()
        known.add(v)
    return v


def _sanitise(v: Any, rx: re.Pattern, bad: re.Pattern, limit: int, lead: str = "_") -> str | None:
    if v is None:
        return None
    v = v if type(v) is str else str(v)
    known = _VALID[rx]
    if v in known:                      # the same few names in every event: one regex each
        return v
    if rx.fullmatch(v):
        if len(known) >= _VALID_MAX:
            known.clear()
        known.add(v)
        return v
    v = bad.sub("_", v)[:limit]
    return v if v and rx.fullmatch(v) else lead + v[:limit - 1]


def make_event(kind: EventKind, time: float, element: str, *, id: str | None = None,
               user: str | None = None, service: str | None = None, server: str | None = None,
               duration: float | None = None, optional: bool = False,
               detail: str | None = None) -> Event:
    """An event built in-process, made valid cheaply: names outside their
    charset get their bad characters replaced by ``_``, an id outside its
    charset is dropped, detail is cut to :data:`MAX_DETAIL` printable chars,
    a negative or non-finite duration becomes ``None``."""
    if id is not None and (type(id) is not str or ID_RE.fullmatch(id) is None):
        id = None
    if detail is not None:
        detail = str(detail)
        if len(detail) > MAX_DETAIL or _CONTROL_RE.search(detail):
            detail = _CONTROL_RE.sub(" ", detail[:MAX_DETAIL * 2])[:MAX_DETAIL]
    if duration is not None and not (0 <= duration <= MAX_DURATION):
        duration = None
    return _new_event(kind, time, _sanitise(element, NAME_RE, _BAD_NAME_CHARS, 64, "x"), id,
                      _sanitise(user, USER_RE, _BAD_USER_CHARS, 64),
                      _sanitise(service, SERVICE_RE, _BAD_SERVICE_CHARS, 128),
                      _sanitise(server, NAME_RE, _BAD_NAME_CHARS, 64, "x"),
                      None if duration is None else float(duration), bool(optional), detail)


def decode_events(items: Any, *, max_events: int = 1000) -> tuple[list[Event], int]:
    """Validate a batch of events received from a child: ``(valid, rejected)``.
    A batch that is not a list, or the part beyond ``max_events``, is rejected."""
    if type(items) is not list:
        return [], 1
    out, bad = [], max(0, len(items) - max_events)
    from_dict, keep = Event.from_dict, out.append
    for d in items[:max_events]:
        try:
            keep(from_dict(d))
        except InvalidEvent:
            bad += 1
    return out, bad
