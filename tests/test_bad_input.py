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
    # an unreachable MA is transient (it may be restarting): retried within
    # retry_timeout, then a clear error
    with gridrpc.Client(f"tcp://127.0.0.1:{free_port()}", discovery_timeout=0.5, retry_timeout=1.0) as c:
        t = time.monotonic()
        with pytest.raises(gridrpc.CommunicationError, match="did not answer"):
            c.call("add", 1, 2)
        assert time.monotonic() - t < 3


def test_dead_bound_server_gives_communication_error():
    from tests.proc_tree import free_port
    with gridrpc.Client(None, ack_timeout=0.5) as c:
        with pytest.raises(gridrpc.CommunicationError):
            c.call("add", 1, 2, server=f"tcp://127.0.0.1:{free_port()}#ghost")


# -- every field checked at the boundary: a bad one gets a protocol error naming it -----------
def _discover(id_, **fields):
    return m.make(m.MsgType.DISCOVER, id_, **{"service": "add", "k": 2, **fields})


AGENT_BAD_FIELDS = [
    (_discover("b1", budget_ms="x"), "budget_ms"),
    (_discover("b2", budget_ms="nan"), "budget_ms"),
    (_discover("b3", budget_ms=-5), "budget_ms"),
    (_discover("b4", k=-1), "k"),
    (_discover("b5", k=10 ** 9), "k"),
    (_discover("b6", names=[1, 2]), "names"),
    (_discover("b7", names="sed-1"), "names"),
    (_discover("b8", aggregator=[1]), "aggregator"),
    (_discover("b9", aggregator={"name": "priority", "params": [1]}), "aggregator"),
    (_discover("b10", user=5), "user"),
    (_discover("b11", optional=1), "optional"),
    (_discover("b12", args={"a": 1}), "args"),
    (m.make(m.MsgType.PING, "b13", ids=[5]), "ids"),
    (m.make(m.MsgType.SERVICES, "b14", tree="yes"), "tree"),
    (m.make(m.MsgType.REGISTER, "b15", name="two words", kind="sed", services=[]), "name"),
    (m.make(m.MsgType.REGISTER, "b16", name="x", kind="sed", services=[], pid="1"), "pid"),
    (m.make(m.MsgType.HEARTBEAT, "b17", name="x", elements=[{"name": "y", "services": 5}]), "elements"),
    (m.make(m.MsgType.SERVERS, "b18", servers=[{"name": ["x"]}]), "servers"),
]


@pytest.mark.parametrize("header, field", AGENT_BAD_FIELDS, ids=[h["id"] for h, _ in AGENT_BAD_FIELDS])
def test_agent_answers_every_bad_field(tree, header, field):
    s = _dealer(tree.ma_address)
    try:
        t = time.monotonic()
        r = _ask(s, [m.dumps(header)])
        assert time.monotonic() - t < 1.0
        assert r["type"] == "error" and r["id"] == header["id"], r        # the asker can match it
        assert r["error"]["kind"] == "protocol" and f"'{field}'" in r["error"]["message"], r
    finally:
        s.close()


SED_BAD_FIELDS = [
    (m.make(m.MsgType.CALL, "s1", service="add", args=[1, 2], kwargs={}, user=5), "user"),
    (m.make(m.MsgType.CALL, "s2", service="add", args=[1, 2], kwargs={}, optional="yes"), "optional"),
    (m.make(m.MsgType.CALL, "s3", service="add", args=[1, 2], kwargs={}, sed=["x"]), "sed"),
    (m.make(m.MsgType.CANCEL, "s4", sed=5), "sed"),
    (m.make(m.MsgType.PING, "s5", ids="s1"), "ids"),
    (m.make(m.MsgType.PING, "s6", ids=[".."]), "ids"),
]


@pytest.mark.parametrize("header, field", SED_BAD_FIELDS, ids=[h["id"] for h, _ in SED_BAD_FIELDS])
def test_sed_answers_every_bad_field(tree, header, field):
    s = _dealer(tree.seds[0].address)
    try:
        r = _ask(s, [m.dumps(header)])
        assert r["type"] == "error" and r["error"]["kind"] == "protocol", r
        assert f"'{field}'" in r["error"]["message"], r
    finally:
        s.close()


def test_client_gets_the_error_at_once_not_its_timeout(tree):
    with gridrpc.Client(tree.ma_address, discovery_timeout=10) as c:
        t = time.monotonic()
        with pytest.raises(gridrpc.errors.ProtocolError, match="'k'"):
            c.discover("add", max_servers=-1)
        assert time.monotonic() - t < 2
        assert c.call("add", 1, 2) == 3


def _silent_child_at(address, name="silent-1"):
    """A raw child offering ``add`` that heartbeats but never answers a discovery."""
    s = _dealer(address)
    r = _ask(s, [m.dumps(m.make(m.MsgType.REGISTER, "reg", name=name, kind="sed", address="tcp://127.0.0.1:9",
                                pid=1, services=["add"]))])
    assert r["type"] == "registered"
    return s


def _heartbeat(s, name, i):
    s.send_multipart([m.dumps(m.make(m.MsgType.HEARTBEAT, f"hb{i}", name=name))])


def test_nan_budget_with_a_silent_child_answered_and_the_ma_stays_idle(proc_tree):
    """With budget_ms "nan" and one silent child the MA never expired its
    pending discoveries and spun at 98 % CPU."""
    import psutil
    ma = proc_tree.start("ma", "MA")
    child = _silent_child_at(ma.address)
    client = _dealer(ma.address)
    bad = ("nan", "x", "inf", -1, [1])
    try:
        for i, value in enumerate(bad):
            client.send_multipart([m.dumps(_discover(f"bad-{i}", budget_ms=value))])
        proc = psutil.Process(ma.pid)
        proc.cpu_percent(None)
        for i in range(10):                      # 1 s, the silent child kept alive
            _heartbeat(child, "silent-1", i)
            time.sleep(0.1)
        cpu = proc.cpu_percent(None)
        replies = {}
        while client.poll(200):
            r = m.parse_header(client.recv_multipart()[0])[1]
            replies[r["id"]] = r
        assert cpu < 30, f"the MA used {cpu:.0f} % CPU while idle"
        for i in range(len(bad)):
            r = replies.get(f"bad-{i}")
            assert r is not None, f"no answer to budget_ms={bad[i]!r}"
            assert r["error"]["kind"] == "protocol" and "'budget_ms'" in r["error"]["message"], r
        # a good request to the silent child: answered at its deadline (pending discoveries expire)
        t = time.monotonic()
        r = _ask(client, [m.dumps(_discover("good", budget_ms=150))])
        assert r["id"] == "good" and r["error"]["kind"] == "no_server" and "silent-1" in r["error"]["message"]
        assert time.monotonic() - t < 1.0
        with gridrpc.Client(ma.address) as c:    # the tree still sees its child
            assert "silent-1" in {e["name"] for e in c.tree()}
    finally:
        client.close()
        child.close()
