"""Fuzz a real SeD's handlers (in-process, real sockets) with hypothesis:
random headers of every type it may receive and random extra frames. No
exception escapes a handler, every request gets an answer, and the SeD keeps
serving."""
import orjson
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gridrpc.core import messages as m
from gridrpc.core.messages import MsgType
from gridrpc.testing import LoopThread, example_sed

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats(allow_nan=False)
                    | st.text(max_size=20) | st.sampled_from(["fz", "add", "echo", "fail", "r-1", "alice"]),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                    max_leaves=12)
TYPES = [t.value for t in MsgType] + ["nope"]
FIELDS = ["sed", "service", "args", "kwargs", "user", "optional", "ids", "keep", "ref", "name", "mode",
          "wait", "transfer", "call", "value", "source", "events", "k", "budget_ms"]


@pytest.fixture(scope="module")
def sed():
    lt = LoopThread()
    s = lt.run(example_sed("fz", None, isolation="inline").start())
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(s.address)
    yield s, sock, lt
    sock.close()
    lt.run(s.aclose())
    lt.close()


def _answers(sock, frames, want_id):
    sock.send_multipart(frames)
    got = []
    while sock.poll(3000):
        h = orjson.loads(sock.recv_multipart()[0])
        got.append(h)
        if h.get("type") in ("error", "result", "cancelled", "pong", "data") and h.get("id") in (want_id, ""):
            return got
        if h.get("type") == "accepted":
            continue
    return got


#: valid-looking bodies per type, so that the fuzz gets past the boundary and into the handlers
TEMPLATES = {
    "call": st.fixed_dictionaries({"service": st.sampled_from(["add", "echo", "fail", "nope"]),
                                   "args": st.lists(JSON, max_size=3), "kwargs": st.dictionaries(
                                       st.sampled_from(["x", "y", "value", "_batch"]), JSON, max_size=2)},
                                  optional={"sed": st.sampled_from(["fz", "other"]), "user": st.text(max_size=8),
                                            "optional": st.booleans(), "keep": JSON}),
    "ping": st.fixed_dictionaries({"ids": st.lists(st.text(max_size=10), max_size=5)}),
    "cancel": st.fixed_dictionaries({}, optional={"sed": st.just("fz")}),
    "data_put": st.fixed_dictionaries({"ref": st.sampled_from(["r-1", "r-2", ".."]), "value": JSON},
                                      optional={"mode": st.sampled_from(["sticky", "volatile", "x"])}),
    "data_get": st.fixed_dictionaries({"ref": st.sampled_from(["r-1", "r-9"])},
                                      optional={"wait": st.floats(0, 0.1), "transfer": st.booleans()}),
    "data_free": st.fixed_dictionaries({"ref": st.sampled_from(["r-1", "r-2"])}),
}


@st.composite
def requests(draw):
    type_ = draw(st.one_of(st.sampled_from(list(TEMPLATES)), st.sampled_from(TYPES)))   # half: SeD requests
    body = draw(TEMPLATES[type_]) if type_ in TEMPLATES and draw(st.integers(0, 4)) else {}
    if draw(st.booleans()):
        body.update(draw(st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=2)))   # then mutate
    id_ = draw(st.one_of(st.text(alphabet="abc-1.", min_size=1, max_size=12), st.text(max_size=12),
                         st.integers(), st.none()))
    return type_, id_, body


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(req=requests(), extra=st.lists(st.binary(max_size=64), max_size=3))
def _one_request(sed, req, extra):
    s, sock, lt = sed
    type_, id_, fields = req
    if type_ == "call" and fields.get("service") in ("sleep", "exit"):
        fields["service"] = "add"            # keep the fuzz fast: no sleeps, no worker exits (inline SeD)
    header = {"v": 1, "type": type_, "id": id_, **fields}
    try:
        raw = orjson.dumps(header)
    except TypeError:
        return
    rid = id_ if isinstance(id_, str) and m.valid_id(id_) else ""
    got = _answers(sock, [raw, *extra], rid)
    assert got, f"no answer to {header!r}"
    assert all(isinstance(h, dict) and "type" in h for h in got)
    assert lt.call(lambda: s.endpoint.stats.handler_errors) == 0, "a handler raised"


def test_every_request_is_answered_and_the_sed_keeps_serving(sed):
    """The fuzz, then (in the same test, whatever order a runner gives the
    module's tests) the checks that it reached the handlers and that the
    SeD still serves an ordinary call."""
    s, sock, lt = sed
    _one_request(sed)
    assert lt.call(lambda: s.endpoint.stats.by_type.get("call", 0)) > 0     # handlers were reached
    got = _answers(sock, [m.dumps(m.make(MsgType.CALL, "after-1", service="add", args=[2, 3], kwargs={}))],
                   "after-1")
    assert got[-1]["type"] == "result"
