"""Pure tests of wire headers (gridrpc.core.messages): make/dumps/parse_header
and validation at the boundary against SCHEMA."""
import orjson
import pytest

from gridrpc.core import messages as m
from gridrpc.core.messages import PROTOCOL_VERSION, SCHEMA, MsgType, dumps, make, parse_header
from gridrpc.errors import ProtocolError

GOOD = {str: "x", int: 3, bool: True, list: [], dict: {}}
BAD = {str: [1, 2, 3], int: "3", bool: 1, list: {}, dict: []}   # JSON values of another type


def valid_fields(mt: MsgType) -> dict:
    return {f: GOOD[t] for f, t in SCHEMA[mt].items()}


def raw(**h) -> bytes:
    return orjson.dumps(h)


def test_every_message_type_has_a_schema_entry():
    assert set(SCHEMA) == set(MsgType)
    assert all(t in GOOD for fields in SCHEMA.values() for t in fields.values())


@pytest.mark.parametrize("mt", list(MsgType))
def test_make_dumps_parse_round_trip(mt):
    h = make(mt, "req-1", **valid_fields(mt), extra={"free": [1, 2.5, None]})
    assert h["v"] == PROTOCOL_VERSION and h["type"] == mt.value and h["id"] == "req-1"
    data = dumps(h)
    assert isinstance(data, bytes)
    got_type, got = parse_header(data)
    assert got_type is mt
    assert got == h
    assert parse_header(memoryview(data)) == (mt, h)      # zmq frames give buffers


@pytest.mark.parametrize("mt, field", [(mt, f) for mt in MsgType for f in SCHEMA[mt]])
def test_missing_required_field_is_refused_naming_it(mt, field):
    fields = valid_fields(mt)
    del fields[field]
    with pytest.raises(ProtocolError, match=f"{mt.value}: field '{field}'"):
        parse_header(dumps(make(mt, "i", **fields)))


@pytest.mark.parametrize("mt, field", [(mt, f) for mt in MsgType for f in SCHEMA[mt]])
def test_required_field_of_wrong_type_is_refused(mt, field):
    fields = valid_fields(mt)
    fields[field] = BAD[SCHEMA[mt][field]]
    with pytest.raises(ProtocolError, match=f"'{field}' missing or not of type"):
        parse_header(dumps(make(mt, "i", **fields)))


@pytest.mark.parametrize("mt, field", [(mt, f) for mt in MsgType for f in SCHEMA[mt]])
def test_required_field_null_is_refused(mt, field):
    fields = valid_fields(mt)
    fields[field] = None
    with pytest.raises(ProtocolError, match=field):
        parse_header(dumps(make(mt, "i", **fields)))


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


def test_extra_fields_are_kept():
    mt, h = parse_header(raw(v=1, type="call", id="c", service="add", args=[1, 2], kwargs={},
                             user="alice", optional=True))
    assert mt is MsgType.CALL and h["user"] == "alice" and h["optional"] is True


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


def test_msgtype_values_are_the_wire_strings():
    assert MsgType("discover") is MsgType.DISCOVER
    assert MsgType.CALL == "call"                      # str enum
    assert len({t.value for t in MsgType}) == len(MsgType)
