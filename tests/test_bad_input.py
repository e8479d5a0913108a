"""Malformed input sent to real sockets: a clear error back, daemons keep running."""
import time

import orjson
import pytest
import zmq

import gridrpc
from gridrpc.core import messages as m


def _dealer(address):
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(address)
    return s


def _ask(sock, frames, timeout=3.0):
    sock.send_multipart(frames)
    assert sock.poll(int(timeout * 1000)), "no reply"
    reply = sock.recv_multipart()
    return m.parse_header(reply[0])[1]


BAD_FRAMES = [
    [b"not json at all"],
    [b"[1, 2, 3]"],
    [orjson.dumps({"v": 99, "type": "discover", "id": "x", "service": "add", "k": 1})],
    [orjson.dumps({"v": 1, "type": "no_such_type", "id": "x"})],
    [orjson.dumps({"v": 1, "type": "discover", "id": "x"})],                       # no service
    [orjson.dumps({"v": 1, "type": "discover", "id": "x", "service": "add", "k": "3"})],  # k not int
    [orjson.dumps({"v": 1, "type": "call", "id": 5, "service": "add", "args": [], "kwargs": {}})],
]


@pytest.mark.parametrize("frames", BAD_FRAMES, ids=range(len(BAD_FRAMES)))
def test_agent_rejects_malformed(tree, frames):
    s = _dealer(tree.ma_address)
    try:
        r = _ask(s, frames)
        assert r["type"] == "error" and r["error"]["kind"] == "protocol"
        assert r["error"]["message"]
    finally:
        s.close()
    with gridrpc.Client(tree.ma_address) as c:
        assert c.call("add", 1, 2) == 3


def test_agent_unknown_aggregator_and_unhandled_type(tree):
    s = _dealer(tree.ma_address)
    try:
        r = _ask(s, [m.dumps(m.make(m.MsgType.DISCOVER, "a1", service="add", k=2, aggregator="nope"))])
        assert r["error"]["kind"] == "invalid_argument" and "unknown aggregator" in r["error"]["message"]
        r = _ask(s, [m.dumps(m.make(m.MsgType.CALL, "a2", service="add", args=[1, 2], kwargs={}))])
        assert r["type"] == "error" and "does not handle" in r["error"]["message"]
        s.send_multipart([b""])            # an empty header frame
        r = _ask(s, [m.dumps(m.make(m.MsgType.PING, "p"))])
        assert r["type"] in ("error", "pong")
    finally:
        s.close()


@pytest.mark.parametrize("frames,kind", [
    ([b"\xff\xfe"], "protocol"),
    ([m.dumps(m.make(m.MsgType.CALL, "c1", service="add", args=[{"__t": "zz"}], kwargs={}))], "protocol"),
    ([m.dumps(m.make(m.MsgType.CALL, "c2", service="add", args=[{"__t": "nd", "i": 7, "dtype": "<f8",
                                                                "shape": [2]}], kwargs={}))], "protocol"),
    ([m.dumps(m.make(m.MsgType.CALL, "c3", service="add", args=[1, 2], kwargs=[]))], "protocol"),
    ([m.dumps(m.make(m.MsgType.CALL, "c4", service="nope", args=[], kwargs={}))], "service_not_found"),
    ([m.dumps(m.make(m.MsgType.CALL, "c5", service="add", args=["a", 1], kwargs={}))], "invalid_argument"),
    ([m.dumps(m.make(m.MsgType.CALL, "c6", service="add", args=[1, 2], kwargs={}, sed="ghost"))], "no_server"),
    ([m.dumps(m.make(m.MsgType.DISCOVER, "c7", service="add", k=1))], "protocol"),
], ids=["bytes", "bad-tag", "missing-buffer", "kwargs-list", "unknown-service", "wrong-type", "wrong-sed",
        "unhandled"])
def test_sed_rejects_malformed(tree, frames, kind):
    sed = tree.seds[0]
    s = _dealer(sed.address)
    try:
        r = _ask(s, frames)
        assert r["type"] == "error" and r["error"]["kind"] == kind, r
    finally:
        s.close()
    with gridrpc.Client(tree.ma_address) as c:
        assert c.call("add", 2, 2, server=next(iter(sed.replicas))) == 4


def test_dead_ma_gives_communication_error():
    from tests.proc_tree import free_port
    with gridrpc.Client(f"tcp://127.0.0.1:{free_port()}", discovery_timeout=0.5) as c:
        t = time.monotonic()
        with pytest.raises(gridrpc.CommunicationError, match="did not answer"):
            c.call("add", 1, 2)
        assert time.monotonic() - t < 3


def test_dead_bound_server_gives_communication_error():
    from tests.proc_tree import free_port
    with gridrpc.Client(None, ack_timeout=0.5) as c:
        with pytest.raises(gridrpc.CommunicationError):
            c.call("add", 1, 2, server=f"tcp://127.0.0.1:{free_port()}#ghost")
