"""Pure tests of wire headers (gridrpc.core.messages): make/dumps/parse_header
and validation at the boundary.

The protocol is written out literally here (required fields, what every
peer sends, what must be refused): nothing is taken from the code's own
field table, so removing or loosening a field there fails a test.
"""
import orjson
import pytest

from gridrpc.core import messages as m
from gridrpc.core.messages import PROTOCOL_VERSION, MsgType, dumps, make, parse_header
from gridrpc.errors import ProtocolError

WIRE_TYPES = ["register", "registered", "unregister", "heartbeat", "heartbeat_ack", "discover",
              "servers", "services", "catalogue", "call", "accepted", "result", "cancel",
              "cancelled", "ping", "pong", "error", "events", "view", "data_put", "data_get", "data_free", "data",
              "batch", "bulk_open", "bulk_opened"]

#: the smallest valid header of each type (besides v, type, id)
REQUIRED = {
    "register": {"name": "sed-1", "kind": "sed", "services": []},
    "registered": {},
    "unregister": {"name": "sed-1"},
    "heartbeat": {"name": "sed-1"},
    "heartbeat_ack": {"known": True},
    "discover": {"service": "add", "k": 3},
    "servers": {"servers": []},
    "services": {},
    "catalogue": {"services": {}},
    "call": {"service": "add", "args": [], "kwargs": {}},
    "accepted": {},
    "result": {},
    "cancel": {},
    "cancelled": {},
    "ping": {},
    "pong": {},
    "error": {"error": {"kind": "remote", "type": "ValueError", "message": "m", "traceback": ""}},
    "events": {"name": "sed-1", "events": []},
    "view": {"name": "sed-1"},
    "data_put": {"ref": "r1"},
    "data_get": {"ref": "r1"},
    "data_free": {"ref": "r1"},
    "data": {"ref": "r1"},
    "batch": {"n": [1, 2]},
    "bulk_open": {"route": "67" * 16},
    "bulk_opened": {"session": "ab" * 16, "key": "01" * 32, "token": "fe" * 32, "port": 40000},
}

#: every field each peer sends today (SeD, agents, clients, batch and cloud SeDs)
FULL = {
    "register": {"name": "sed-1", "kind": "sed", "address": "tcp://127.0.0.1:5000", "host": "127.0.0.1",
                 "pid": 4242, "started": 1.7e9,
                 "services": [{"name": "add", "doc": "Return x + y", "params": [{"name": "x", "type": "int"}],
                               "aggregator": {"name": "priority", "params": {"order": [["eft", "min"]]}}},
                              "echo", {"name": "sleep", "doc": None, "params": None}],
                 "load": {"num_running": 0, "num_waiting": 0, "free_cpu": None, "completed": 3},
                 "elements": [{"name": "sed-a", "parent": "LA1", "kind": "sed", "services": ["add"],
                               "state": "alive", "last_heartbeat": 1.7e9, "load": {}, "address": "tcp://h:1",
                               "host": "h", "pid": 7, "started": 1.0}]},
    "registered": {},
    "unregister": {"name": "LA1"},
    "heartbeat": {"name": "LA1", "load": {"children": 2},
                  "elements": [{"name": "sed-a", "parent": "LA1", "kind": "sed", "services": ["add"]}]},
    "heartbeat_ack": {"known": False},
    "discover": {"service": "add", "k": 100000, "aggregator": {"name": "priority", "params": None},
                 "budget_ms": 1200.5, "user": "alice", "optional": True,
                 "args": [{"__t": "nd", "dtype": "<f8", "shape": [3]}, 1, "x"], "names": ["sed-01", "sed-02"]},
    "servers": {"name": "LA1", "servers": [{"name": "sed-1", "address": "tcp://h:1", "estimation": {"eft": 1.0}},
                                           {"name": "sed-2", "address": "tcp://h:2", "estimation": None}],
                "names": ["sed-1", "sed-2"], "answered": 2, "timed_out": ["sed-3"], "found": True,
                "view": True},
    "services": {"tree": True},
    "catalogue": {"services": {"add": {"doc": "", "params": [], "servers": ["sed-1"]}},
                  "servers": {"sed-1": "tcp://h:1", "sed-2": None},
                  "elements": [{"name": "MA", "parent": None, "kind": "ma", "services": []},
                               {"name": "LA1", "parent": "tcp://127.0.0.1:5555", "kind": "la"}]},
    "call": {"service": "add", "args": [1, 2], "kwargs": {"alpha": 1.0}, "sed": "sed-1", "user": "alice",
             "optional": False},
    "accepted": {"sed": "sed-1", "duplicate": True, "patience": 30},
    "result": {"value": {"__t": "nd", "i": 0}, "server": "sed-1",
               "timing": {"received": 1.0, "started": None, "ended": 3.0, "job_id": "12",
                          "vm": {"started": 2.0, "ended": None}},
               "backend": {"batch": {"job_id": "12", "state": "COMPLETED", "nodes": ["n1"], "signal": None,
                                     "reason": "r" * 4096},
                           "cloud": {"vm": "c-vm-1"}}},
    "cancel": {"sed": "sed-1"},
    "cancelled": {"state": "running"},
    "ping": {"ids": ["c-1", "ping-c-1.2", "a:b#c@d+e=f"]},
    "pong": {"name": "sed-1", "calls": {"c-1": "running", "c-2": "unknown"}},
    "error": {"error": {"kind": "remote", "type": "ValueError", "message": "boom", "traceback": "Tb\n"},
              "server": "sed-1", "name": "LA1", "timing": {"received": 1.0, "started": None},
              "backend": {"batch": {"job_id": "7"}, "pilot": {"pilot": "pilot-3"}}},
    "events": {"name": "LA1", "events": [{"kind": "call_finished", "time": 1.7e9, "element": "sed-1",
                                          "id": "c1", "user": "alice", "service": "add", "duration": 0.01}],
               "dropped": 3},
    "view": {"name": "LA1", "entries": [{"name": "sed-1", "services": {"add": {"eft": 1.0, "num_waiting": 0}},
                                         "age_ms": 1.5}], "gone": ["sed-2"]},
    "data_put": {"ref": "r-1", "sed": "sed-1", "user": "alice", "mode": "sticky", "value": {"__t": "nd", "i": 0},
                 "source": {"name": "sed-2", "address": "tcp://h:2", "size": 8 << 20}},
    "data_get": {"ref": "r-1", "user": "alice", "call": False, "wait": 10, "transfer": True, "sed": "sed-1"},
    "data_free": {"ref": "r-1", "user": "alice"},
    "data": {"ref": "r-1", "holder": "sed-1", "size": 800, "mode": "persistent_return", "value": [1]},
    "batch": {"n": [1, 3, 1]},
    "bulk_open": {"route": "67" + "0a" * 15},
    "bulk_opened": {"session": "0123456789abcdef" * 2, "key": "f0" * 32, "token": "0f" * 32, "port": 65535},
}


def raw(**h) -> bytes:
    return orjson.dumps(h)


def header(type_: str, **fields) -> bytes:
    return orjson.dumps({"v": 1, "type": type_, "id": "i", **fields})


def test_message_types_are_the_wire_strings():
    assert [t.value for t in MsgType] == WIRE_TYPES
    assert MsgType("discover") is MsgType.DISCOVER
    assert MsgType.CALL == "call"                      # str enum


@pytest.mark.parametrize("type_", WIRE_TYPES)
@pytest.mark.parametrize("example", [REQUIRED, FULL], ids=["required", "full"])
def test_valid_headers_round_trip(type_, example):
    h = make(MsgType(type_), "req-1", **example[type_], extra={"free": [1, 2.5, None]})
    assert h["v"] == PROTOCOL_VERSION and h["type"] == type_ and h["id"] == "req-1"
    data = dumps(h)
    assert isinstance(data, bytes)
    got_type, got = parse_header(data)
    assert got_type is MsgType(type_) and got == h
    assert parse_header(memoryview(data)) == (got_type, h)      # zmq frames give buffers


REQUIRED_FIELDS = [(t, f) for t, fields in REQUIRED.items() for f in fields]


def test_the_required_fields():
    assert REQUIRED_FIELDS == [
        ("register", "name"), ("register", "kind"), ("register", "services"), ("unregister", "name"),
        ("heartbeat", "name"), ("heartbeat_ack", "known"), ("discover", "service"), ("discover", "k"),
        ("servers", "servers"), ("catalogue", "services"), ("call", "service"), ("call", "args"),
        ("call", "kwargs"), ("error", "error"), ("events", "name"), ("events", "events"), ("view", "name"), ("data_put", "ref"), ("data_get", "ref"),
        ("data_free", "ref"), ("data", "ref"), ("batch", "n"), ("bulk_open", "route"), ("bulk_opened", "session"),
        ("bulk_opened", "key"), ("bulk_opened", "token"), ("bulk_opened", "port")]


@pytest.mark.parametrize("type_, field", REQUIRED_FIELDS)
@pytest.mark.parametrize("how", ["missing", "null"])
def test_required_field_missing_or_null_is_refused_naming_it(type_, field, how):
    fields = dict(REQUIRED[type_])
    if how == "missing":
        del fields[field]
    else:
        fields[field] = None
    with pytest.raises(ProtocolError, match=f"^{type_}: field '{field}' is required"):
        parse_header(header(type_, **fields))


BAD = [
    # data held on SeDs: reference ids are request ids, never paths
    ("data_put", "ref", "../etc/passwd"), ("data_put", "ref", ".."), ("data_put", "mode", "forever"),
    ("data_put", "source", {"name": "../x", "address": "tcp://h:1"}), ("data_get", "ref", "a/b"),
    ("data_put", "source", {"name": "sed-2", "address": "tcp://h:1", "size": -1}),
    ("data_put", "source", {"name": "sed-2", "address": "tcp://h:1", "size": "8 MB"}),
    ("data_get", "wait", -1), ("data_free", "ref", 5), ("data", "size", -1),
    ("batch", "n", []), ("batch", "n", [0]), ("batch", "n", [1] * 513), ("batch", "n", [1025]),
    ("batch", "n", [1.5]),
    ("call", "keep", {"ref": "a/b", "mode": "persistent"}), ("call", "keep", {"ref": "r", "mode": "x"}),
    # tree maintenance
    ("register", "name", 5), ("register", "name", ""), ("register", "name", "two words"),
    ("register", "name", "x" * 65), ("register", "name", "../x"), ("register", "name", "-lead"),
    ("register", "kind", "client"), ("register", "kind", 3),
    ("register", "services", {}), ("register", "services", "add"), ("register", "services", [5]),
    ("register", "services", [{"doc": "no name"}]), ("register", "services", [{"name": 3}]),
    ("register", "services", ["x" * 257]), ("register", "services", [{"name": "a", "params": {}}]),
    ("register", "services", [{"name": "a", "doc": 5}]), ("register", "services", [{"name": "a", "aggregator": 5}]),
    ("register", "address", 5), ("register", "address", "x" * 1025), ("register", "host", 5),
    ("register", "pid", -1), ("register", "pid", 1.5), ("register", "pid", "1"), ("register", "pid", True),
    ("register", "pid", 2**33), ("register", "started", "x"), ("register", "started", -1),
    ("register", "load", []), ("register", "load", "x"), ("register", "load", {str(i): i for i in range(257)}),
    ("register", "elements", {}), ("register", "elements", [5]), ("register", "elements", [{"name": "a b"}]),
    ("register", "elements", [{"kind": "sed"}]), ("register", "elements", [{"name": "a", "services": "add"}]),
    ("register", "elements", [{"name": "a", "services": [1]}]), ("register", "elements", [{"name": "a", "load": 1}]),
    ("register", "elements", [{"name": "a", "parent": 5}]), ("register", "elements", [{"name": "a", "kind": []}]),
    ("unregister", "name", 5), ("unregister", "name", "a b"),
    ("heartbeat", "name", ["x"]), ("heartbeat", "load", []), ("heartbeat", "elements", {}),
    ("heartbeat", "elements", [1, "x"]),
    ("heartbeat_ack", "known", 0), ("heartbeat_ack", "known", 1), ("heartbeat_ack", "known", "true"),
    # discovery
    ("discover", "service", 5), ("discover", "service", "x" * 257), ("discover", "service", ["add"]),
    ("discover", "k", -1), ("discover", "k", 100001), ("discover", "k", 2.0), ("discover", "k", "3"),
    ("discover", "k", True), ("discover", "k", False), ("discover", "k", 1e30), ("discover", "k", [2]),
    ("discover", "aggregator", 5), ("discover", "aggregator", []), ("discover", "aggregator", ["default"]),
    ("discover", "aggregator", {"params": {}}), ("discover", "aggregator", {"name": 5}),
    ("discover", "aggregator", {"name": "priority", "params": []}), ("discover", "aggregator", "x" * 257),
    ("discover", "budget_ms", "x"), ("discover", "budget_ms", "nan"), ("discover", "budget_ms", "inf"),
    ("discover", "budget_ms", -1), ("discover", "budget_ms", 1e12), ("discover", "budget_ms", True),
    ("discover", "budget_ms", [5]),
    ("discover", "user", 5), ("discover", "user", "x" * 257), ("discover", "user", {}),
    ("discover", "optional", 1), ("discover", "optional", "yes"),
    ("discover", "args", {}), ("discover", "args", "x"), ("discover", "args", [0] * 257),
    ("discover", "names", "sed-1"), ("discover", "names", [1]), ("discover", "names", ["a b"]),
    ("servers", "servers", {}), ("servers", "servers", [5]), ("servers", "servers", [{"address": "a"}]),
    ("servers", "servers", [{"name": "a b"}]), ("servers", "servers", [{"name": ["a"]}]),
    ("servers", "servers", [{"name": "a", "estimation": []}]), ("servers", "servers", [{"name": "a", "address": 5}]),
    ("servers", "name", 5), ("servers", "name", "a b"), ("servers", "names", [5]), ("servers", "names", "a"),
    ("servers", "answered", -1), ("servers", "answered", "1"), ("servers", "answered", 1.5),
    ("servers", "timed_out", ["a b"]), ("servers", "timed_out", "x"), ("servers", "found", 1),
    ("services", "tree", 1), ("services", "tree", "yes"),
    ("catalogue", "services", []), ("catalogue", "services", {"add": 5}), ("catalogue", "services", {"x" * 257: {}}),
    ("catalogue", "servers", []), ("catalogue", "servers", {"a b": "tcp://h:1"}), ("catalogue", "servers", {"a": 5}),
    ("catalogue", "elements", [5]), ("catalogue", "elements", {}),
    # calls
    ("call", "service", 5), ("call", "args", {}), ("call", "args", "x"), ("call", "kwargs", []),
    ("call", "kwargs", "x"), ("call", "sed", 5), ("call", "sed", "a b"), ("call", "sed", "../x"),
    ("call", "user", 5), ("call", "user", "x" * 257), ("call", "optional", "yes"), ("call", "optional", 0),
    ("accepted", "sed", 5), ("accepted", "duplicate", 1), ("accepted", "patience", -1),
    ("accepted", "patience", "x"), ("accepted", "patience", 1e10), ("accepted", "patience", True),
    ("result", "server", 5), ("result", "server", "a b"), ("result", "timing", []),
    ("result", "timing", {"started": {"a": {}}}), ("result", "timing", {"started": [None]}),
    ("result", "timing", {"a": {"b": {"c": 1}}}), ("result", "timing", {"a": [1]}),
    ("result", "timing", {"job_id": "x" * 257}), ("result", "timing", {"vm": {"a": [1]}}),
    ("result", "backend", []), ("result", "backend", 5), ("result", "backend", {"batch": 5}),
    ("result", "backend", {"batch": []}), ("result", "backend", {"batch": {"nodes": [["n1"]]}}),
    ("result", "backend", {"batch": {"state": {"a": 1}}}), ("result", "backend", {"batch": {"k": "x" * (1 << 20 | 1)}}),
    ("result", "backend", {"x" * 257: {}}), ("result", "backend", {"batch": {"x" * 257: 1}}),
    ("result", "backend", {f"b{i}": {} for i in range(9)}), ("result", "backend", {"batch": {"nodes": [0] * 100_001}}),
    ("result", "backend", {"batch": {str(i): i for i in range(257)}}),
    ("cancel", "sed", 5), ("cancel", "sed", "a b"),
    ("cancelled", "state", 5), ("cancelled", "state", "x" * 257),
    ("ping", "ids", "c-1"), ("ping", "ids", [5]), ("ping", "ids", [".."]), ("ping", "ids", ["a/b"]),
    ("ping", "ids", ["x" * 129]), ("ping", "ids", [None]),
    ("pong", "name", 5), ("pong", "calls", []), ("pong", "calls", {"c-1": 5}), ("pong", "calls", {"../x": "done"}),
    ("events", "name", "<b>"), ("events", "events", {"kind": "x"}), ("events", "events", [1]),
    ("events", "events", [{}] * 1001), ("events", "dropped", -1),
    ("view", "name", "../x"), ("view", "entries", [{"name": "sed-1"}]),
    ("view", "entries", [{"name": "sed-1", "services": {"add": 5}}]),
    ("view", "entries", [{"name": "sed-1", "services": {}, "age_ms": -1}]), ("view", "gone", ["a b"]),
    ("discover", "max_age_ms", -1),
    ("error", "error", []), ("error", "error", {}), ("error", "error", {"kind": 5}),
    ("error", "error", {"kind": "remote", "message": 5}), ("error", "error", {"kind": "remote", "traceback": 5}),
    ("error", "error", {"kind": "remote", "type": []}), ("error", "error", {"kind": "x" * 257}),
    ("error", "server", 5), ("error", "name", "a b"), ("error", "timing", []), ("error", "backend", 5),
    ("error", "backend", {"cloud": {"vm": {"name": "c-vm-1"}}}),
    # the bulk data path: routing ids and secrets as exact-length lower-case hex
    ("bulk_open", "route", ""), ("bulk_open", "route", "00" + "ab" * 15), ("bulk_open", "route", "abc"),
    ("bulk_open", "route", "AB" * 16), ("bulk_open", "route", "zz" * 16), ("bulk_open", "route", "ab" * 256),
    ("bulk_open", "route", 5),
    ("bulk_opened", "session", "ab" * 15), ("bulk_opened", "session", "AB" * 16), ("bulk_opened", "key", "01" * 31),
    ("bulk_opened", "key", 5), ("bulk_opened", "token", "0g" * 32), ("bulk_opened", "port", 0),
    ("bulk_opened", "port", 65536), ("bulk_opened", "port", "1"),
]


@pytest.mark.parametrize("type_, field, value", BAD, ids=[f"{t}.{f}={v!r:.20}" for t, f, v in BAD])
def test_bad_field_is_refused_naming_it(type_, field, value):
    fields = {**REQUIRED[type_], field: value}
    with pytest.raises(ProtocolError, match=f"^{type_}: field '{field}' must be "):
        parse_header(header(type_, **fields))


def test_every_type_has_bad_value_cases():
    assert {t for t, _, _ in BAD} == set(WIRE_TYPES) - {"registered"}      # "registered" has no fields


@pytest.mark.parametrize("type_, field, value", [
    ("discover", "k", 0), ("discover", "k", 100000), ("discover", "budget_ms", 0), ("discover", "budget_ms", 5),
    ("discover", "budget_ms", 86_400_000), ("discover", "aggregator", "least_wait_time"),
    ("discover", "aggregator", {"name": "default"}), ("discover", "args", [0] * 256),
    ("register", "pid", 0), ("register", "kind", "la"), ("register", "kind", "ma"),
    ("register", "name", "a" + "b" * 63), ("register", "name", "9.x_y-z"),
    ("accepted", "patience", 0), ("ping", "ids", []), ("servers", "answered", 0),
    ("result", "value", None), ("result", "value", [1, {"a": None}]), ("cancelled", "state", ""),
])
def test_edge_values_are_accepted(type_, field, value):
    fields = {**REQUIRED[type_], field: value}
    mt, h = parse_header(header(type_, **fields))
    assert mt.value == type_ and h[field] == value


def test_null_optional_fields_count_as_absent():
    nulls = {"aggregator": None, "budget_ms": None, "user": None, "optional": None, "args": None,
             "names": None}
    mt, h = parse_header(header("discover", service="add", k=1, **nulls))
    assert mt is MsgType.DISCOVER and h["budget_ms"] is None


@pytest.mark.parametrize("k", [True, False, 2.0, "2", None, [2]])
def test_bools_and_floats_are_not_ints(k):
    with pytest.raises(ProtocolError, match="'k'"):
        parse_header(raw(v=1, type="discover", id="i", service="add", k=k))
    mt, h = parse_header(raw(v=1, type="discover", id="i", service="add", k=2))
    assert mt is MsgType.DISCOVER and h["k"] == 2


def test_bool_field_wants_a_real_bool():
    assert parse_header(raw(v=1, type="heartbeat_ack", id="i", known=False))[1]["known"] is False
    for bad in (0, 1, "true", None):
        with pytest.raises(ProtocolError, match="known"):
            parse_header(raw(v=1, type="heartbeat_ack", id="i", known=bad))


@pytest.mark.parametrize("data, message", [
    (b"", "not valid JSON"),
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe", "not valid JSON"),
    (b'{"v": 1, "type": "ping", "id": "a"', "not valid JSON"),
    (b'{"v": 1, "type": "discover", "id": "a", "service": "add", "k": 1, "budget_ms": NaN}', "not valid JSON"),
    (b'{"v": 1, "type": "discover", "id": "a", "service": "add", "k": 1, "budget_ms": 1e400}', "not valid JSON"),
    (b"[1, 2]", "JSON object"),
    (b'"ping"', "JSON object"),
    (b"null", "JSON object"),
    (b"42", "JSON object"),
])
def test_not_a_json_object(data, message):
    with pytest.raises(ProtocolError, match=message):
        parse_header(data)


@pytest.mark.parametrize("v", [None, 0, 2, "1", 1.5, 1.0, [1]])
def test_wrong_or_missing_version(v):
    h = {"type": "ping", "id": "a"} if v is None else {"v": v, "type": "ping", "id": "a"}
    with pytest.raises(ProtocolError, match="protocol version"):
        parse_header(orjson.dumps(h))


def test_version_true_is_not_version_1():
    with pytest.raises(ProtocolError, match="protocol version"):
        parse_header(raw(v=True, type="ping", id="a"))


@pytest.mark.parametrize("t", ["PING", "nope", "", None, 3, True])
def test_unknown_message_type(t):
    with pytest.raises(ProtocolError, match="unknown message type"):
        parse_header(raw(v=1, type=t, id="a"))


@pytest.mark.parametrize("t", [["ping"], {"a": 1}])
def test_unhashable_message_type_is_a_protocol_error_not_a_crash(t):
    with pytest.raises(ProtocolError, match="unknown message type"):
        parse_header(raw(v=1, type=t, id="a"))


def test_missing_type():
    with pytest.raises(ProtocolError, match="unknown message type"):
        parse_header(raw(v=1, id="a"))


@pytest.mark.parametrize("id_", [None, 7, 1.0, True, ["a"], {"a": 1}])
def test_id_must_be_a_string(id_):
    h = {"v": 1, "type": "ping"}
    if id_ is not None:
        h["id"] = id_
    with pytest.raises(ProtocolError, match="ping: field 'id' must be a string"):
        parse_header(orjson.dumps(h))


@pytest.mark.parametrize("id_", ["..", ".", "a/b", "a\x00b", "x" * 129, "a b", "é"])
def test_id_must_be_safe(id_):
    with pytest.raises(ProtocolError, match="ping: field 'id' must be at most 128"):
        parse_header(raw(v=1, type="ping", id=id_))


def test_extra_fields_are_kept_unchecked():
    mt, h = parse_header(raw(v=1, type="call", id="c", service="add", args=[1, 2], kwargs={},
                             user="alice", optional=True, future_field={"x": [1, None]}))
    assert mt is MsgType.CALL and h["user"] == "alice" and h["optional"] is True
    assert h["future_field"] == {"x": [1, None]}


def test_parse_routed():
    frames = [b"route", header("ping"), b"buf1", b"buf2"]
    route, mt, h, buffers = m.parse_routed(frames)
    assert route == [b"route"] and mt is MsgType.PING and h["id"] == "i" and buffers == [b"buf1", b"buf2"]
    with pytest.raises(ProtocolError, match="empty message"):
        m.parse_routed([b"route"])
    with pytest.raises(ProtocolError, match="discover: field 'budget_ms'"):
        m.parse_routed([b"r", header("discover", service="add", k=1, budget_ms="nan")])


def test_dumps_refuses_unserialisable_headers():
    with pytest.raises(ProtocolError, match="cannot be serialised"):
        dumps(make(MsgType.PING, "a", bad={1, 2}))
    with pytest.raises(ProtocolError, match="cannot be serialised"):
        dumps(make(MsgType.PING, "a", big=2**70))      # values go through the codec first
    with pytest.raises(ProtocolError):
        dumps({1: "non-str key"})


def test_error_header_shape_and_validity():
    h = m.error_header("r1", "service_not_found", "no server offers 'x'", server="sed-1")
    assert h["type"] == "error" and h["id"] == "r1" and h["server"] == "sed-1"
    assert h["error"] == {"kind": "service_not_found", "type": "service_not_found",
                          "message": "no server offers 'x'", "traceback": ""}
    h2 = m.error_header("r2", "remote", "boom", type_="ValueError", traceback="tb")
    assert h2["error"]["type"] == "ValueError" and h2["error"]["traceback"] == "tb"
    assert parse_header(dumps(h2)) == (MsgType.ERROR, h2)


def test_valid_names_and_ids():
    assert m.valid_name("sed-1") and m.valid_name("LA1") and m.valid_name("a.b_c-d")
    assert not any(m.valid_name(x) for x in ("", "-a", ".a", "a b", "a/b", "x" * 65, 5, None))
    assert m.valid_id("") and m.valid_id("MA:17") and m.valid_id("x" * 128)
    assert not any(m.valid_id(x) for x in (".", "..", "a/b", "x" * 129, 5, None))


def test_nesting_is_refused_by_depth_whatever_the_brackets_count_and_cheaply_for_big_flat_headers():
    """More than 255 levels is refused (a list in an object counts); many brackets side by side,
    or inside a string, are not nesting; a flat header passes the screen (its cost is in
    python -m benchmarks.attack, not here)."""
    deep_objects = '{"a":' * 300 + "1" + "}" * 300
    with pytest.raises(ProtocolError, match="nested deeper than 255 levels"):
        parse_header(f'{{"v":1,"type":"ping","id":"d","x":{deep_objects}}}'.encode())
    with pytest.raises(ProtocolError, match="nested deeper than 255 levels") as info:
        parse_header(f'{{"v":1,"type":"ping","id":"d2","x":{"[" * 300 + "]" * 300}}}'.encode())
    assert info.value.header_id == "d2"                 # the answer names it without a second decode
    wide = make(MsgType.PING, "w", x=[[i] for i in range(2000)], s="[{" * 500)
    assert parse_header(dumps(wide)) == (MsgType.PING, wide)
    assert m._brackets_over(b"[" * 256, 255) and not m._brackets_over(b"[{" * 127 + b"[", 255)
    flat = dumps(make(MsgType.PING, "f", s="x" * 4_000_000))
    assert not m._brackets_over(flat, 255) and parse_header(flat)[1]["s"] == "x" * 4_000_000
    assert m._brackets_over(b"[" * 1_000_000, 255)    # stops at the 256th, whatever follows
