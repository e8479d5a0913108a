"""Wire messages: types, fields, validation at the boundary.

A message on the wire is ``[routing ids..., header, *buffers]``. The header is
a JSON object (orjson) with ``v`` (protocol version), ``type``, ``id`` and the
fields of its type; binary parts of encoded values are the extra frames.

:data:`FIELDS` (built in :mod:`gridrpc.core.fields`) says, for each type,
every field it may carry: whether it is required, its JSON type and its
bounds (finite numbers, ranges, list and string lengths, element names, ids).
:func:`parse_header` checks a received header against it and raises
:class:`~gridrpc.errors.ProtocolError` naming the field otherwise, so that a
handler only ever sees well-formed values and every bad request is answered
with a ``protocol`` error. ``null`` stands for an absent optional field.
Fields the table does not list are kept unchecked (newer peers may add
some); nothing reads them.

Headers stay plain dicts after validation: they are built and read on the hot
path, and a dict lookup is the cheapest typed access Python has.
"""
from __future__ import annotations

import enum
from typing import Any

import orjson

from ..errors import ProtocolError
from . import fields as _fields
from .fields import ID_RE, NAME_RE, valid_id, valid_name  # noqa: F401  (part of this module's API)

PROTOCOL_VERSION = 1
MAX_BATCH = _fields.MAX_BATCH
#: Lingering. A peer with at least LINGER_CALLS calls in flight at one server
#: is in a throughput regime: its server queues them, so a CALL to it (client
#: side) or an answer to it (SeD side) may wait up to LINGER_S for others to
#: the same peer and leave with them as one batch. One call of N in flight
#: waits at most LINGER_S more, so the peer's rate can only fall below
#: N / LINGER_S (32,000 calls/s): far above what one server does, while a
#: message per call each way (a wake-up of both processes per call) gives way
#: to one per batch. Fewer calls in flight: everything leaves at once.
LINGER_CALLS = 32
LINGER_S = 0.001


def linger(in_flight: int) -> float:
    """How long a message to a peer with ``in_flight`` calls at one server
    may wait for others (0: it leaves at once)."""
    return LINGER_S if in_flight >= LINGER_CALLS else 0.0


class MsgType(str, enum.Enum):
    # tree maintenance (child -> parent, parent -> child)
    REGISTER = "register"            # name, kind, element info, services, elements (subtree)
    REGISTERED = "registered"        # ack of register
    UNREGISTER = "unregister"        # clean leave
    HEARTBEAT = "heartbeat"          # name, load [, elements]
    HEARTBEAT_ACK = "heartbeat_ack"  # known: bool (false -> child registers again); view_missing: [SeD names] to push again
    # discovery (client -> MA, agent -> child, and the answers)
    DISCOVER = "discover"            # service, k, aggregator, budget_ms, user, optional, args
    SERVERS = "servers"              # servers: [{name, address, estimation}], found: bool
    SERVICES = "services"            # ask the catalogue
    CATALOGUE = "catalogue"          # services: {name: {doc, params, servers}}
    # calls (client <-> SeD)
    CALL = "call"                    # sed, service, args, kwargs, user, optional
    ACCEPTED = "accepted"            # the SeD queued the call
    RESULT = "result"                # value, server, timing
    CANCEL = "cancel"                # sed; cancel a queued or running call
    CANCELLED = "cancelled"          # ack: state it was in
    PING = "ping"
    PONG = "pong"                    # calls: {id: state} for ids asked in ping
    ERROR = "error"                  # error: {kind, type, message, traceback}
    # lifecycle events (child -> parent; the MA serves them at /api/events)
    EVENTS = "events"                # name, events: [event dicts], dropped
    # pushed state (child -> parent): snapshots of SeDs' request-independent estimations
    VIEW = "view"                    # name, entries: [{name, services: {service: vector}, age_ms}], gone
    # data held on SeDs (client/SeD -> SeD; gridrpc.sed.data.store)
    DATA_PUT = "data_put"            # ref, user, mode, value (+frames) | source {name, address}
    DATA_GET = "data_get"            # ref, user, call, wait, transfer
    DATA_FREE = "data_free"          # ref, user
    DATA = "data"                    # answer: ref, holder, size, mode [, value (+frames)]
    # several messages to or from one peer at once (a burst of calls, cancels, their answers)
    BATCH = "batch"                  # n: [frames of each message]; the messages' frames follow
    # the bulk data path of a secure tree (client <-> SeD over CURVE; gridrpc.transport.bulk)
    BULK_OPEN = "bulk_open"          # route: routing id (hex) of the client's bulk socket
    BULK_OPENED = "bulk_opened"      # session, key, token (hex), port of the bulk socket


_BY_VALUE = {m.value: m for m in MsgType}

#: every field of every type: ``(name, required, check, what)`` (see gridrpc.core.fields)
FIELDS: dict[MsgType, tuple] = {mt: _fields.BY_TYPE[mt.value] for mt in MsgType}
_CHECKS = {mt: tuple((f, check, required) for f, required, check, _ in specs) for mt, specs in FIELDS.items()}
_WHAT = {(mt, f): what for mt, specs in FIELDS.items() for f, _, _, what in specs}
if set(_fields.BY_TYPE) != set(_BY_VALUE):           # pragma: no cover - caught by any import
    raise ImportError("a message type without its field table")


#: each type's wire name (an enum's ``.value`` is a property: slower than a dict on the hot path)
VALUE: dict[MsgType, str] = {mt: mt.value for mt in MsgType}


def make(type_: MsgType, id_: str, **fields: Any) -> dict:
    h = {"v": PROTOCOL_VERSION, "type": VALUE[type_], "id": id_}
    h.update(fields)
    return h


def dumps(header: dict) -> bytes:
    """The header frame, in a bytes object of its own size: orjson's output
    keeps the buffer it wrote into (4 KiB for a 200-byte header, 8 MiB for a
    1 MB one), and headers outlive their send (a SeD keeps every answer for
    duplicates, up to 200,000 of them: measured 4.6 KB retained per call, a
    SeD at 610 MB after 120,000 calls, and ~8 % of its CPU zeroing fresh pages).
    The copy costs ~0.2 µs."""
    try:
        return bytes(memoryview(orjson.dumps(header)))
    except TypeError as exc:
        raise ProtocolError(f"header cannot be serialised: {exc}") from exc


#: deepest nesting of lists and objects a header may have
MAX_DEPTH = 255


def _brackets_over(raw, limit: int) -> bool:
    """Whether ``raw`` holds more than ``limit`` of ``[`` and ``{`` together. Found by ``find``
    (memchr), stopping at ``limit + 1``: ``bytes.count`` walks the bytes one by one (0.6 ms for a
    1 MB string, more than decoding it)."""
    b = raw if isinstance(raw, bytes) else bytes(raw)
    n = 0
    for ch in (b"[", b"{"):
        i = b.find(ch)
        while i >= 0:
            n += 1
            if n > limit:
                return True
            i = b.find(ch, i + 1)
    return False


def _depth_over(value, limit: int) -> bool:
    """Whether ``value`` nests lists/objects deeper than ``limit``: walked level by level (no
    recursion), one list comprehension per container (3x faster than a stack of (value,
    depth) pairs on a 900-deep chain, 1.6x on a wide value)."""
    level, depth = [value], 1
    while level:
        if depth > limit:
            return True
        below: list = []
        for v in level:
            t = type(v)
            if t is list:
                below += [x for x in v if type(x) is list or type(x) is dict]
            elif t is dict:
                below += [x for x in v.values() if type(x) is list or type(x) is dict]
        level, depth = below, depth + 1
    return False


def parse_header(raw: bytes | memoryview) -> tuple[MsgType, dict]:
    """Decode and validate a header frame. Raises ProtocolError with a reason
    (naming the field at fault); never anything else."""
    try:
        h = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _refused(f"header is not valid JSON: {exc}", None) from exc
    if type(h) is not dict:
        raise _refused("header must be a JSON object", None)
    try:
        return _checked(raw, h)
    except ProtocolError as exc:
        raise _refused(str(exc), h) from None


def _refused(reason: str, h: dict | None) -> ProtocolError:
    """A ProtocolError for a header refused at the boundary, with the header's id when it has a
    valid one (``header_id``, '' otherwise): the error answer names it without decoding the frame
    again (a second decode of a 1 MB header costs as much as the first)."""
    exc = ProtocolError(reason)
    i = h.get("id") if h is not None else None
    exc.header_id = i if type(i) is str and valid_id(i) else ""
    return exc


def _checked(raw: bytes | memoryview, h: dict) -> tuple[MsgType, dict]:
    if len(raw) > MAX_DEPTH and _brackets_over(raw, MAX_DEPTH) and _depth_over(h, MAX_DEPTH):
        # refused before any handler walks it (a recursive walk of 900 levels cost a SeD 5 ms and a
        # RecursionError per message); no value a peer can encode is deeper (orjson writes 254 levels)
        raise ProtocolError(f"header nested deeper than {MAX_DEPTH} levels")
    v = h.get("v")
    if type(v) is not int or v != PROTOCOL_VERSION:       # true == 1 in Python, not on the wire
        raise ProtocolError(f"unsupported protocol version {v!r:.40} (this peer speaks {PROTOCOL_VERSION})")
    t = h.get("type")
    mt = _BY_VALUE.get(t) if type(t) is str else None     # a list or object is unhashable
    if mt is None:
        raise ProtocolError(f"unknown message type {t!r:.60}")
    if type(h.get("id")) is not str:
        raise ProtocolError(f"{mt.value}: field 'id' must be a string")
    if not valid_id(h["id"]):
        raise ProtocolError(f"{mt.value}: field 'id' must be at most 128 characters of "
                            "letters, digits and _.:#@+=- (and not '.' or '..')")
    get = h.get
    for field, check, required in _CHECKS[mt]:
        val = get(field)
        if val is None:
            if required:
                raise ProtocolError(f"{mt.value}: field {field!r} is required ({_WHAT[mt, field]})")
        elif not check(val):
            raise ProtocolError(f"{mt.value}: field {field!r} must be {_WHAT[mt, field]}")
    return mt, h


def parse_routed(frames: list) -> tuple[list, MsgType, dict, list]:
    """A message received on a ROUTER: ``(route, type, header, buffers)``.
    Raises ProtocolError (the caller answers it) when malformed."""
    if len(frames) < 2:
        raise ProtocolError("empty message: a header frame is required")
    f = frames[1]
    mt, h = parse_header(f.bytes if hasattr(f, "bytes") else f)
    return frames[:1], mt, h, frames[2:]


def error_header(id_: str, kind: str, message: str, *, type_: str = "", traceback: str = "",
                 **extra: Any) -> dict:
    return make(MsgType.ERROR, id_, error={"kind": kind, "type": type_ or kind,
                                           "message": message, "traceback": traceback}, **extra)


def batch(messages: list[list]) -> list:
    """One envelope for several messages to the same peer: a BATCH header
    saying how many frames each message has, then every message's frames
    (its header, then its buffers). At most ``MAX_BATCH`` messages.

    When every header is ``bytes`` they travel *packed*: one frame holding
    them end to end, their lengths in the envelope's ``sizes``, then the
    messages' buffers in order (one frame per message would cost a zmq send and
    a receive each)."""
    if not 1 < len(messages) <= _fields.MAX_BATCH:
        raise ValueError(f"a batch holds 2 to {_fields.MAX_BATCH} messages, not {len(messages)}")
    heads = [msg[0] for msg in messages]
    if all(type(h) is bytes for h in heads):
        frames: list = [dumps(make(MsgType.BATCH, "b", n=[len(msg) for msg in messages],
                                   sizes=[len(h) for h in heads])), b"".join(heads)]
        for msg in messages:
            if len(msg) > 1:
                frames += msg[1:]
        return frames
    frames = [dumps(make(MsgType.BATCH, "b", n=[len(msg) for msg in messages]))]
    for msg in messages:
        frames += msg
    return frames


def packed(messages: list[list]) -> list:
    """The frames that carry ``messages`` (1 to ``MAX_BATCH``) to one peer:
    a single message as itself, several as one BATCH envelope."""
    return messages[0] if len(messages) == 1 else batch(messages)


def unbatch(header: dict, frames: list) -> list[list]:
    """The messages of a BATCH envelope (``frames``: every frame after its
    header), each ``[header frame, *buffers]``. Raises ProtocolError when
    the counts do not add up; a batch inside a batch is refused by whoever
    parses the inner headers (they must not be BATCH)."""
    n = header["n"]
    sizes = header.get("sizes")
    if sizes is None:
        if sum(n) != len(frames):
            raise ProtocolError(f"batch: the counts say {sum(n)} frames, the message has {len(frames)}")
        out, i = [], 0
        for k in n:
            out.append(frames[i:i + k])
            i += k
        return out
    # packed: frames[0] holds every header end to end, then each message's buffers
    if len(sizes) != len(n):
        raise ProtocolError(f"batch: {len(sizes)} header sizes for {len(n)} messages")
    if sum(n) - len(n) + 1 != len(frames):
        raise ProtocolError(f"batch: the counts say {sum(n) - len(n) + 1} frames, the message has {len(frames)}")
    pack = frames[0]
    pack = pack.bytes if hasattr(pack, "bytes") else bytes(pack)
    if sum(sizes) != len(pack):
        raise ProtocolError(f"batch: the header sizes add up to {sum(sizes)} bytes, the frame has {len(pack)}")
    out, at, i = [], 0, 1
    for k, size in zip(n, sizes):
        out.append([pack[at:at + size], *frames[i:i + k - 1]])
        at += size
        i += k - 1
    return out
