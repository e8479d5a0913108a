"""Wire messages: types, required fields, validation at the boundary.

A message on the wire is ``[routing ids..., header, *buffers]``. The header is
a JSON object (orjson) with ``v`` (protocol version), ``type``, ``id`` and the
fields of its type; binary parts of encoded values are the extra frames.

The table :data:`SCHEMA` says, for each type, the fields it must carry and
their JSON types; :func:`parse_header` checks a received header against it and
raises :class:`~gridrpc.errors.ProtocolError` with a clear message otherwise.
Headers stay plain dicts after validation: they are built and read on the hot
path, and a dict lookup is the cheapest typed access Python has.
"""
from __future__ import annotations

import enum
import re
from typing import Any

import orjson

from ..errors import ProtocolError

PROTOCOL_VERSION = 1


class MsgType(str, enum.Enum):
    # tree maintenance (child -> parent, parent -> child)
    REGISTER = "register"            # name, kind, element info, services, elements (subtree)
    REGISTERED = "registered"        # ack of register
    UNREGISTER = "unregister"        # clean leave
    HEARTBEAT = "heartbeat"          # name, load [, elements]
    HEARTBEAT_ACK = "heartbeat_ack"  # known: bool (false -> child registers again)
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


_STR, _INT, _NUM, _BOOL, _LIST, _DICT, _ANY = str, int, (int, float), bool, list, dict, object

SCHEMA: dict[MsgType, dict[str, Any]] = {
    MsgType.REGISTER: {"name": _STR, "kind": _STR, "services": _LIST},
    MsgType.REGISTERED: {},
    MsgType.UNREGISTER: {"name": _STR},
    MsgType.HEARTBEAT: {"name": _STR},
    MsgType.HEARTBEAT_ACK: {"known": _BOOL},
    MsgType.DISCOVER: {"service": _STR, "k": _INT},
    MsgType.SERVERS: {"servers": _LIST},
    MsgType.SERVICES: {},
    MsgType.CATALOGUE: {"services": _DICT},
    MsgType.CALL: {"service": _STR, "args": _LIST, "kwargs": _DICT},
    MsgType.ACCEPTED: {},
    MsgType.RESULT: {},
    MsgType.CANCEL: {},
    MsgType.CANCELLED: {},
    MsgType.PING: {},
    MsgType.PONG: {},
    MsgType.ERROR: {"error": _DICT},
}
_BY_VALUE = {m.value: m for m in MsgType}

#: request ids: printable, no path separators, bounded. Ids are never turned
#: into paths, but they end up in logs, events and HTML.
ID_RE = re.compile(r"[A-Za-z0-9_.:#@+=-]{0,128}")
#: element names (they end up in HTML, Prometheus labels and file names)
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def valid_id(id_: object) -> bool:
    return type(id_) is str and ID_RE.fullmatch(id_) is not None and id_ not in (".", "..")


def valid_name(name: object) -> bool:
    return type(name) is str and NAME_RE.fullmatch(name) is not None


def make(type_: MsgType, id_: str, **fields: Any) -> dict:
    h = {"v": PROTOCOL_VERSION, "type": type_.value, "id": id_}
    h.update(fields)
    return h


def dumps(header: dict) -> bytes:
    try:
        return orjson.dumps(header)
    except TypeError as exc:
        raise ProtocolError(f"header cannot be serialised: {exc}") from exc


def parse_header(raw: bytes | memoryview) -> tuple[MsgType, dict]:
    """Decode and validate a header frame. Raises ProtocolError with a reason."""
    try:
        h = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"header is not valid JSON: {exc}") from exc
    if type(h) is not dict:
        raise ProtocolError("header must be a JSON object")
    v = h.get("v")
    if type(v) is not int or v != PROTOCOL_VERSION:       # true == 1 in Python, not on the wire
        raise ProtocolError(f"unsupported protocol version {v!r} (this peer speaks {PROTOCOL_VERSION})")
    t = h.get("type")
    mt = _BY_VALUE.get(t) if type(t) is str else None     # a list or object is unhashable
    if mt is None:
        raise ProtocolError(f"unknown message type {h.get('type')!r}")
    if type(h.get("id")) is not str:
        raise ProtocolError(f"{mt.value}: field 'id' must be a string")
    if not valid_id(h["id"]):
        raise ProtocolError(f"{mt.value}: field 'id' must be at most 128 characters of "
                            "letters, digits and _.:#@+=- (and not '.' or '..')")
    for field, ftype in SCHEMA[mt].items():
        val = h.get(field)
        if ftype is _ANY:
            continue
        if val is None or not isinstance(val, ftype) or (ftype is _INT and isinstance(val, bool)):
            raise ProtocolError(f"{mt.value}: field {field!r} missing or not of type "
                                f"{getattr(ftype, '__name__', ftype)}")
    return mt, h


def parse_routed(frames: list) -> tuple[list, MsgType, dict, list]:
    """A message received on a ROUTER: ``(route, type, header, buffers)``.
    Raises ProtocolError (the caller answers it) when malformed."""
    if len(frames) < 2:
        raise ProtocolError("empty message: a header frame is required")
    mt, h = parse_header(frames[1].bytes if hasattr(frames[1], "bytes") else frames[1])
    return frames[:1], mt, h, frames[2:]


def error_header(id_: str, kind: str, message: str, *, type_: str = "", traceback: str = "",
                 **extra: Any) -> dict:
    return make(MsgType.ERROR, id_, error={"kind": kind, "type": type_ or kind,
                                           "message": message, "traceback": traceback}, **extra)
