"""Every field of every wire message, with its type and bounds (pure).

:data:`BY_TYPE` maps a message type (its wire string) to a tuple of
``(field, required, check, what)``: ``check(value) -> bool`` is only called
on a value that is not ``null`` (``null`` means absent for an optional field);
``what`` says in words what the field must be, for the error reply. Checks
are plain functions over the decoded JSON (no classes, no allocation) because
:func:`gridrpc.core.messages.parse_header` runs them on every message.

Bounds are generous (they catch garbage and hostile values, not unusual
use): see the constants below. Fields not listed here are kept unchecked;
nothing reads them.
"""
from __future__ import annotations

import re
from typing import Callable

#: request ids: printable, no path separators, bounded. Ids are never turned
#: into paths, but they end up in logs, events and HTML.
ID_RE = re.compile(r"[A-Za-z0-9_.:#@+=-]{0,128}")
#: element names (they end up in HTML, Prometheus labels and file names)
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

MAX_K = 100_000                 # servers asked for in one discovery
MAX_BUDGET_MS = 86_400_000.0    # a day; agents clamp to their own limits anyway
MAX_ITEMS = 100_000             # servers, elements, services, ids in one message
MAX_KEYS = 256                  # load, timing, back-end and error objects
MAX_BATCH = 512                 # messages in one batch envelope
MAX_VIEW_MISSING = 1024         # SeD names a parent asks one child for in a heartbeat_ack
MAX_BATCH_PART = 1024           # frames of one message inside a batch
SHORT = 256                     # service names, users, kinds, states, aggregator names
ADDRESS = 1024                  # tcp://host:port addresses
LONG = 1 << 20                  # error messages, service docs
HUGE = 1 << 24                  # remote tracebacks

Check = Callable[[object], bool]
Field = tuple  # (name, required, check, what)


_id_match = ID_RE.fullmatch
_name_match = NAME_RE.fullmatch


def valid_id(id_: object) -> bool:
    return type(id_) is str and _id_match(id_) is not None and id_ != "." and id_ != ".."


def valid_name(name: object) -> bool:
    return type(name) is str and _name_match(name) is not None


# -- building blocks: (check, what) -------------------------------------------
def string(max_len: int) -> tuple[Check, str]:
    return (lambda v: type(v) is str and len(v) <= max_len), f"a string of at most {max_len} characters"


def integer(lo: int, hi: int) -> tuple[Check, str]:
    return (lambda v: type(v) is int and lo <= v <= hi), f"an integer in {lo}..{hi}"


def _fmt(x: float) -> str:
    return str(int(x)) if x == int(x) and abs(x) < 1e15 else f"{x:g}"


def number(lo: float, hi: float) -> tuple[Check, str]:
    # NaN fails both comparisons; orjson never yields infinities but a direct caller might
    return ((lambda v: (type(v) is float or type(v) is int) and lo <= v <= hi),
            f"a finite number in {_fmt(lo)}..{_fmt(hi)}")


def one_of(*values: str) -> tuple[Check, str]:
    allowed = frozenset(values)
    return (lambda v: type(v) is str and v in allowed), "one of " + ", ".join(repr(x) for x in values)


def list_of(item: tuple[Check, str], max_len: int) -> tuple[Check, str]:
    check, what = item
    if item is ANY:
        return (lambda v: type(v) is list and len(v) <= max_len), f"a list of at most {max_len} items"
    return ((lambda v: type(v) is list and len(v) <= max_len and all(map(check, v))),
            f"a list of at most {max_len} items, each {what}")


def obj(max_keys: int) -> tuple[Check, str]:
    return (lambda v: type(v) is dict and len(v) <= max_keys), f"an object of at most {max_keys} keys"


def mapping(key: tuple[Check, str], value: tuple[Check, str], max_keys: int) -> tuple[Check, str]:
    kc, kw = key
    vc, vw = value
    return ((lambda v: type(v) is dict and len(v) <= max_keys and all(map(kc, v))
             and all(x is None or vc(x) for x in v.values())),
            f"an object of at most {max_keys} keys ({kw}) to {vw} or null")


BOOL: tuple[Check, str] = ((lambda v: type(v) is bool), "true or false")
ANY: tuple[Check, str] = ((lambda v: True), "any JSON value")
LIST: tuple[Check, str] = ((lambda v: type(v) is list), "a list")
DICT: tuple[Check, str] = ((lambda v: type(v) is dict), "an object")
NAME: tuple[Check, str] = (valid_name, "an element name (a letter or digit, then up to 63 of "
                                       "letters, digits, '_', '.', '-')")
ID: tuple[Check, str] = (valid_id, "a request id (at most 128 of letters, digits and _.:#@+=-)")
TEXT_SHORT = string(SHORT)
_HEX_RE = re.compile(r"[0-9a-f]*")


def hex_bytes(n: int) -> tuple[Check, str]:
    """Exactly ``n`` bytes written as ``2n`` lower-case hex digits."""
    return ((lambda v: type(v) is str and len(v) == 2 * n and _HEX_RE.fullmatch(v) is not None),
            f"{n} bytes as {2 * n} lower-case hex digits")


#: a DEALER's routing id set by a peer: 1 to 255 bytes, never starting with a zero byte (libzmq
#: reserves those for the ids it makes up)
HEX_ROUTE: tuple[Check, str] = ((lambda v: type(v) is str and 2 <= len(v) <= 510 and len(v) % 2 == 0
                                 and _HEX_RE.fullmatch(v) is not None and not v.startswith("00")),
                                "a routing id: 1 to 255 bytes as lower-case hex digits, not starting with 00")
SERVICE = TEXT_SHORT


# -- composite values (written out: they run once per list item) --------------
def _aggregator(v: object) -> bool:
    if type(v) is str:
        return len(v) <= SHORT
    if type(v) is not dict:
        return False
    name, params = v.get("name"), v.get("params")
    return type(name) is str and len(name) <= SHORT and (params is None or type(params) is dict)


AGGREGATOR = (_aggregator, "an aggregator: a name (at most 256 characters) or "
                           "{\"name\": ..., \"params\": {...}}")


def _server(v: object) -> bool:
    if type(v) is not dict:
        return False
    name, address, est = v.get("name"), v.get("address"), v.get("estimation")
    return (type(name) is str and _name_match(name) is not None
            and (address is None or (type(address) is str and len(address) <= ADDRESS))
            and (est is None or type(est) is dict))


SERVER = (_server, "a server {\"name\": element name, \"address\": string, \"estimation\": object}")


def _service_entry(v: object) -> bool:
    if type(v) is str:
        return len(v) <= SHORT
    if type(v) is not dict:
        return False
    name, doc, params, agg = v.get("name"), v.get("doc"), v.get("params"), v.get("aggregator")
    return (type(name) is str and len(name) <= SHORT and (doc is None or (type(doc) is str and len(doc) <= LONG))
            and (params is None or type(params) is list) and (agg is None or _aggregator(agg)))


SERVICE_ENTRY = (_service_entry, "a service name or {\"name\", \"doc\", \"params\", \"aggregator\"}")


def _short_str(x: object) -> bool:
    return type(x) is str and len(x) <= SHORT


def _element(v: object) -> bool:
    if type(v) is not dict:
        return False
    name, parent, kind, services, load = (v.get("name"), v.get("parent"), v.get("kind"), v.get("services"),
                                          v.get("load"))
    return (type(name) is str and _name_match(name) is not None
            and (parent is None or (type(parent) is str and len(parent) <= ADDRESS))
            and (kind is None or (type(kind) is str and len(kind) <= SHORT))
            and (services is None or (type(services) is list and len(services) <= MAX_ITEMS
                                      and all(map(_short_str, services))))
            and (load is None or type(load) is dict))


ELEMENT = (_element, "an element {\"name\": element name, \"kind\", \"parent\", \"services\": [names], ...}")


def _scalar(x: object, max_str: int = SHORT) -> bool:
    t = type(x)
    return (x is None or t is bool or ((t is float or t is int) and -1e300 <= x <= 1e300)
            or (t is str and len(x) <= max_str))


#: arguments a discovery may describe, and characters of text in all their descriptions together
MAX_LIGHT_ARGS = 256
MAX_LIGHT_TEXT = 64 * 1024


def _light_args(v: object) -> bool:
    """The arguments as a discovery describes them (:func:`gridrpc.core.codec.light_description`):
    scalars and short strings, or small objects of those and of short lists of them, with at most
    :data:`MAX_LIGHT_TEXT` characters of text in all. A discovery is copied to every server of the
    service: it never carries the values themselves."""
    if type(v) is not list or len(v) > MAX_LIGHT_ARGS:
        return False
    budget = MAX_LIGHT_TEXT

    def ok(x: object) -> bool:
        nonlocal budget
        if not _scalar(x):
            return False
        if type(x) is str:
            budget -= len(x)
        return budget >= 0

    for a in v:
        if ok(a):
            continue
        if type(a) is not dict or len(a) > 8:
            return False
        for k, x in a.items():
            budget -= len(k)
            if ok(x) or (type(x) is list and len(x) <= 128 and all(map(ok, x))):
                continue
            return False
    return True


LIGHT_ARGS = (_light_args, f"at most {MAX_LIGHT_ARGS} argument descriptions (scalars, or small objects of "
                           f"scalars), {MAX_LIGHT_TEXT} characters of text in all")


def _timing(v: object) -> bool:
    if type(v) is not dict or len(v) > MAX_KEYS:
        return False
    for x in v.values():
        if _scalar(x):
            continue
        if type(x) is dict and len(x) <= MAX_KEYS and all(map(_scalar, x.values())):
            continue                        # one nested level (a relaying SeD's inner timing)
        return False
    return True


TIMING = (_timing, "an object of numbers, short strings or null (one level of nesting)")

#: execution back-ends that may describe one reply (a relay adds its own to the one it relays)
MAX_BACKENDS = 8


def _detail_scalar(x: object) -> bool:
    return _scalar(x, LONG)         # a scheduler's reason may be long


def _detail_value(x: object) -> bool:
    return _detail_scalar(x) or (type(x) is list and len(x) <= MAX_ITEMS and all(map(_detail_scalar, x)))


def _backend(v: object) -> bool:
    if type(v) is not dict or len(v) > MAX_BACKENDS:
        return False
    for name, detail in v.items():
        if type(name) is not str or len(name) > SHORT or type(detail) is not dict or len(detail) > MAX_KEYS:
            return False
        for k, x in detail.items():
            if type(k) is not str or len(k) > SHORT or not _detail_value(x):
                return False
    return True


#: what the execution back-ends that ran a call say about it, under their own names (e.g.
#: ``{"batch": {"job_id": "12", "nodes": ["n1"]}}``): the names and keys are the back-ends', the
#: bounds are these
BACKEND = (_backend, f"an object of at most {MAX_BACKENDS} back-end names to objects of numbers, "
                     "strings, null or lists of those")


def _error(v: object) -> bool:
    if type(v) is not dict:
        return False
    kind, type_, message, tb = v.get("kind"), v.get("type"), v.get("message"), v.get("traceback")
    return (type(kind) is str and len(kind) <= SHORT and (type_ is None or (type(type_) is str and len(type_) <= SHORT))
            and (message is None or (type(message) is str and len(message) <= LONG))
            and (tb is None or (type(tb) is str and len(tb) <= HUGE)))


ERROR = (_error, "an object {\"kind\": string, \"type\": string, \"message\": string, \"traceback\": string}")

def _keep(v: object) -> bool:
    return (type(v) is dict and len(v) <= 4 and valid_id(v.get("ref"))
            and v.get("mode") in ("volatile", "persistent", "persistent_return", "sticky"))


KEEP = (_keep, "{\"ref\": a reference id, \"mode\": volatile|persistent|persistent_return|sticky}")
DATA_MODE = one_of("volatile", "persistent", "persistent_return", "sticky")


def _source(v: object) -> bool:
    size = v.get("size", 0) if type(v) is dict else None
    return (type(v) is dict and len(v) <= 4 and valid_name(v.get("name"))
            and type(v.get("address")) is str and len(v["address"]) <= ADDRESS
            and type(size) is int and 0 <= size <= 2**62)


SOURCE = (_source, "{\"name\": element name, \"address\": string, \"size\": bytes (optional)}")

ELEMENT_INFO = [("address", False, *string(ADDRESS)), ("host", False, *string(255)),
                ("pid", False, *integer(0, 2**32)), ("started", False, *number(0, 1e12)),
                ("load", False, *obj(MAX_KEYS)), ("elements", False, *list_of(ELEMENT, MAX_ITEMS))]


def _view_entry(v: object) -> bool:
    if type(v) is not dict:
        return False
    name, services, age = v.get("name"), v.get("services"), v.get("age_ms")
    return (type(name) is str and _name_match(name) is not None
            and type(services) is dict and len(services) <= MAX_KEYS
            and all(type(s) is str and len(s) <= SHORT and type(e) is dict and len(e) <= MAX_KEYS
                    for s, e in services.items())
            and (age is None or ((type(age) is float or type(age) is int) and 0 <= age <= 1e9))
            and _opt_age(v.get("seen_ms"))
            and (v.get("common") is None or (type(v["common"]) is dict and len(v["common"]) <= MAX_KEYS)))


def _opt_age(x: object) -> bool:
    return x is None or ((type(x) is float or type(x) is int) and 0 <= x <= 1e9)


VIEW_ENTRY = (_view_entry, "a snapshot {\"name\": element name, \"services\": {service: estimation}, "
                           "\"age_ms\": number, \"seen_ms\": number (since last confirmed)}")


_counts, _counts_what = list_of(integer(1, MAX_BATCH_PART), MAX_BATCH)
BATCH_COUNTS = ((lambda v: _counts(v) and len(v) >= 1), f"{_counts_what} (at least one)")
MAX_PACKED_HEADER = 1 << 20     # bytes of one header packed in a batch's first frame
_sizes, _sizes_what = list_of(integer(2, MAX_PACKED_HEADER), MAX_BATCH)
BATCH_SIZES = ((lambda v: _sizes(v) and len(v) >= 1), f"{_sizes_what} (bytes of each packed header)")


def _fields(*specs) -> tuple:
    return tuple((name, required, check, what) for name, required, check, what in specs)


BY_TYPE: dict[str, tuple] = {
    "register": _fields(("name", True, *NAME), ("kind", True, *one_of("sed", "la", "ma")),
                        ("services", True, *list_of(SERVICE_ENTRY, MAX_ITEMS)), *ELEMENT_INFO),
    "registered": _fields(),
    "unregister": _fields(("name", True, *NAME)),
    "heartbeat": _fields(("name", True, *NAME), ("load", False, *obj(MAX_KEYS)),
                         ("elements", False, *list_of(ELEMENT, MAX_ITEMS))),
    "heartbeat_ack": _fields(("known", True, *BOOL), ("view_missing", False, *list_of(NAME, MAX_VIEW_MISSING))),
    "discover": _fields(("service", True, *SERVICE), ("k", True, *integer(0, MAX_K)),
                        ("aggregator", False, *AGGREGATOR), ("budget_ms", False, *number(0, MAX_BUDGET_MS)),
                        ("user", False, *TEXT_SHORT), ("optional", False, *BOOL),
                        ("args", False, *LIGHT_ARGS),
                        ("names", False, *list_of(NAME, MAX_ITEMS)),
                        ("max_age_ms", False, *number(0, MAX_BUDGET_MS)),
                        ("hops", False, *integer(0, 4)), ("via", False, *list_of(NAME, 4))),
    "servers": _fields(("servers", True, *list_of(SERVER, MAX_ITEMS)), ("name", False, *NAME),
                       ("names", False, *list_of(NAME, MAX_ITEMS)), ("answered", False, *integer(0, 2**31)),
                       ("timed_out", False, *list_of(NAME, MAX_ITEMS)), ("found", False, *BOOL),
                       ("view", False, *BOOL)),
    "services": _fields(("tree", False, *BOOL)),
    "catalogue": _fields(("services", True, *mapping(TEXT_SHORT, DICT, MAX_ITEMS)),
                         ("servers", False, *mapping(NAME, string(ADDRESS), MAX_ITEMS)),
                         ("elements", False, *list_of(ELEMENT, MAX_ITEMS))),
    "call": _fields(("service", True, *SERVICE), ("args", True, *LIST), ("kwargs", True, *DICT),
                    ("sed", False, *NAME), ("user", False, *TEXT_SHORT), ("optional", False, *BOOL),
                    ("keep", False, *KEEP), ("start_now", False, *BOOL),
                    ("ack_ms", False, *number(0, MAX_BUDGET_MS))),
    "accepted": _fields(("sed", False, *NAME), ("duplicate", False, *BOOL),
                        ("patience", False, *number(0, 1e9)), ("state", False, *TEXT_SHORT),
                        ("idempotent", False, *BOOL)),
    "result": _fields(("value", False, *ANY), ("server", False, *NAME), ("timing", False, *TIMING),
                      ("backend", False, *BACKEND)),
    "cancel": _fields(("sed", False, *NAME)),
    "cancelled": _fields(("state", False, *TEXT_SHORT), ("server", False, *NAME), ("timing", False, *TIMING)),
    "ping": _fields(("ids", False, *list_of(ID, MAX_ITEMS))),
    "pong": _fields(("name", False, *NAME), ("calls", False, *mapping(ID, TEXT_SHORT, MAX_ITEMS))),
    # lifecycle events going up the tree (child -> parent), each validated by the MA (core/events/)
    "events": _fields(("name", True, *NAME), ("events", True, *list_of(obj(16), 1000)),
                      ("dropped", False, *integer(0, 1 << 40))),
    "view": _fields(("name", True, *NAME), ("entries", False, *list_of(VIEW_ENTRY, MAX_ITEMS)),
                    ("gone", False, *list_of(NAME, MAX_ITEMS)), ("fresh", False, *list_of(NAME, MAX_ITEMS))),
    "data_put": _fields(("ref", True, *ID), ("sed", False, *NAME), ("user", False, *TEXT_SHORT),
                        ("mode", False, *DATA_MODE), ("value", False, *ANY), ("source", False, *SOURCE)),
    "data_get": _fields(("ref", True, *ID), ("user", False, *TEXT_SHORT), ("call", False, *BOOL),
                        ("wait", False, *number(0, 86_400)), ("transfer", False, *BOOL),
                        ("sed", False, *NAME)),
    # several messages to/from one peer in one zmq message: n[i] frames (header + buffers) each
    "batch": _fields(("n", True, *BATCH_COUNTS), ("sizes", False, *BATCH_SIZES)),
    "data_free": _fields(("ref", True, *ID), ("user", False, *TEXT_SHORT)),
    "data": _fields(("ref", True, *ID), ("holder", False, *NAME), ("size", False, *integer(0, 2**62)),
                    ("mode", False, *DATA_MODE), ("value", False, *ANY)),
    # secrets of a bulk session travel only inside CURVE messages (gridrpc.transport.bulk)
    "bulk_open": _fields(("route", True, *HEX_ROUTE)),
    "bulk_opened": _fields(("session", True, *hex_bytes(16)), ("key", True, *hex_bytes(32)),
                           ("token", True, *hex_bytes(32)), ("port", True, *integer(1, 65535))),
    "error": _fields(("error", True, *ERROR), ("server", False, *NAME), ("name", False, *NAME),
                     ("timing", False, *TIMING), ("backend", False, *BACKEND)),
}
