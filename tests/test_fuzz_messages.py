"""Fuzzing the boundary (hypothesis): whatever arrives, parse_header and
parse_routed either return a well-formed message or raise ProtocolError —
never anything else."""
import orjson
from hypothesis import HealthCheck, given, settings, strategies as st

from gridrpc.core import messages as m
from gridrpc.core.messages import MsgType
from gridrpc.errors import ProtocolError

WIRE_TYPES = [t.value for t in MsgType]
FIELD_NAMES = ["name", "kind", "services", "elements", "load", "address", "host", "pid", "started", "known",
               "service", "k", "aggregator", "budget_ms", "user", "optional", "args", "names", "servers",
               "answered", "timed_out", "found", "tree", "kwargs", "sed", "duplicate", "patience", "value",
               "server", "timing", "backend", "batch", "vm", "state", "ids", "calls", "error"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
                    st.sampled_from(["nan", "inf", "x", "", "..", "sed-1", "a b", "add", "default"]))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.text(max_size=8), st.sampled_from(FIELD_NAMES)),
                                                 inner, max_size=4)), max_leaves=12)


def check_parse(data) -> None:
    try:
        mt, h = m.parse_header(data)
    except ProtocolError:
        return
    assert isinstance(mt, MsgType) and type(h) is dict
    assert h["v"] == 1 and h["type"] == mt.value and m.valid_id(h["id"])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes(data):
    check_parse(data)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_random_json(value):
    check_parse(orjson.dumps(value))


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(WIRE_TYPES), st.one_of(st.just("i"), st.text(max_size=10)),
       st.dictionaries(st.sampled_from(FIELD_NAMES), json_values, max_size=6))
def test_random_headers_of_every_type(type_, id_, fields):
    check_parse(orjson.dumps({"v": 1, "type": type_, "id": id_, **fields}))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=40), json_values.map(orjson.dumps)), max_size=4))
def test_parse_routed_random_frames(frames):
    try:
        route, mt, h, buffers = m.parse_routed(frames)
    except ProtocolError:
        return
    assert route == frames[:1] and buffers == frames[2:] and isinstance(mt, MsgType)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=50))
def test_random_text_headers(text):
    check_parse(text.encode("utf-8", "surrogatepass"))
