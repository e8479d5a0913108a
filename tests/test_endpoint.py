"""The endpoint every daemon receives through: boundary parsing, error
replies, dispatch, handler failures, statistics, rate-limited logging."""
import asyncio
import logging

import orjson
import zmq
import zmq.asyncio

from gridrpc.core import messages as m
from gridrpc.core.messages import MsgType
from gridrpc.transport.endpoint import Endpoint, RateLimitedLog



async def ask_each(ep, sends, decode) -> list:
    """Send each message of ``sends`` to ``ep`` from one DEALER, one at a time, and decode each
    answer's header; ``ep`` is closed at the end."""
    s = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(ep.address)
    out = []
    try:
        for frames in sends:
            await s.send_multipart(frames)
            assert await s.poll(3000), f"no reply to {frames[0][:60]!r}"
            out.append(decode((await s.recv_multipart())[0]))
    finally:
        s.close()
        ep.close()
    return out

def test_rate_limited_log_counts_and_summarises(caplog):
    t = [0.0]
    rl = RateLimitedLog(logging.getLogger("t.rl"), burst=3, interval=10.0, clock=lambda: t[0])
    with caplog.at_level(logging.INFO, logger="t.rl"):
        shown = [rl(logging.INFO, "bad %d", i) for i in range(100)]
        assert shown.count(True) == 3 and rl.suppressed == 97
        t[0] = 10.5
        rl(logging.INFO, "bad again")
    lines = [r.getMessage() for r in caplog.records]
    assert lines[:3] == ["bad 0", "bad 1", "bad 2"]
    assert "97 similar lines suppressed" in lines[3] and lines[4] == "bad again"


def test_dispatch_errors_and_statistics():
    seen = []
    holder = {}
    rejected = []

    def on_ping(msg):
        seen.append((msg.id, msg.user, len(msg.peer) > 0))
        holder["ep"].reply(msg, m.make(MsgType.PONG, msg.id))

    def on_discover(msg):
        float(msg.header.get("free_field", "x"))     # a field outside the schema, malformed: ValueError

    def on_services(msg):
        raise RuntimeError("bug")

    handlers = {MsgType.PING: on_ping, MsgType.DISCOVER: on_discover, MsgType.SERVICES: on_services}
    sends = [
        [m.dumps(m.make(MsgType.PING, "p1"))],
        [b"garbage"],
        [orjson.dumps({"v": 1, "type": "ping", "id": ".."})],
        [m.dumps(m.make(MsgType.CALL, "c1", service="x", args=[], kwargs={}))],
        [m.dumps(m.make(MsgType.DISCOVER, "d1", service="x", k=1, free_field="x"))],
        [m.dumps(m.make(MsgType.SERVICES, "s1"))],
    ]

    async def run():
        ep = Endpoint("T", "tcp://127.0.0.1:0", handlers, what="test daemon",
                      on_rejected=lambda exc: rejected.append(str(exc))).start()
        holder["ep"] = ep
        return ep, await ask_each(ep, sends, orjson.loads)

    ep, out = asyncio.run(run())
    assert out[0]["type"] == "pong" and out[0]["id"] == "p1"
    assert seen == [("p1", None, True)]
    assert out[1]["error"]["kind"] == "protocol" and "JSON" in out[1]["error"]["message"]
    assert out[2]["error"]["kind"] == "protocol" and "'id'" in out[2]["error"]["message"]
    assert out[3]["error"]["kind"] == "protocol" and "test daemon does not handle 'call'" in out[3]["error"]["message"]
    assert out[4]["id"] == "d1" and out[4]["error"]["kind"] == "protocol"
    assert out[5]["id"] == "s1" and out[5]["error"]["kind"] == "internal" and "RuntimeError" in out[5]["error"]["message"]
    st = ep.stats.snapshot()
    assert st["received"] == 6 and st["bad_messages"] == 3 and st["handler_errors"] == 1
    assert st["unhandled_types"] == 1 and st["by_type"]["ping"] == 1
    assert len(rejected) == 2 and "JSON" in rejected[0] and "'id'" in rejected[1]   # the owner is told


def test_a_handler_can_end_the_drain_after_its_message():
    """Channel.end_drain: the rest of what the socket holds is read at the next loop iteration,
    after what became ready meanwhile (a SeD's started calls reach their workers in a burst)."""
    import asyncio
    import zmq
    from gridrpc.transport.channel import Channel
    from gridrpc.transport.channel import context

    async def run():
        ctx = context()
        a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
        a.bind("inproc://end-drain-test")
        b.connect("inproc://end-drain-test")
        order: list = []
        ch = None

        def on_message(frames):
            order.append(bytes(frames[0].bytes))
            if order == [b"1"]:
                ch.end_drain = True
                asyncio.get_running_loop().call_soon(order.append, "between")
        for x in (b"1", b"2", b"3"):
            a.send(x)
        await asyncio.sleep(0.05)
        ch = Channel(b, on_message, name="test")
        for _ in range(100):
            if len(order) >= 4:
                break
            await asyncio.sleep(0.01)
        ch.close()
        a.close(0)
        return order
    assert asyncio.run(run()) == [b"1", "between", b"2", b"3"]


def test_a_wake_up_of_a_socket_handles_costly_messages_for_a_bounded_time():
    """A backlog of costly messages (1 ms each here) is read DRAIN_SECONDS at a time: between two
    reads the loop runs what became ready (a worker's result, the calls a SeD admitted), not after
    256 of them."""
    import asyncio
    import time
    import zmq
    from gridrpc.transport import channel as channel_mod
    from gridrpc.transport.channel import Channel, context

    async def run():
        ctx = context()
        a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
        a.bind("inproc://drain-time-test")
        b.connect("inproc://drain-time-test")
        order: list = []
        ready = asyncio.Event()

        def on_message(frames):
            if not order:
                asyncio.get_running_loop().call_soon(order.append, "between")
            order.append(int(frames[0].bytes))
            time.sleep(0.001)
            if order[-1] == 39:
                ready.set()
        for i in range(40):
            a.send(str(i).encode())
        await asyncio.sleep(0.05)
        ch = Channel(b, on_message, name="test")
        await asyncio.wait_for(ready.wait(), 10)
        ch.close()
        a.close(0)
        return order
    order = asyncio.run(run())
    assert channel_mod.DRAIN_SECONDS <= 0.005
    first = order.index("between")
    assert 1 <= first <= 1 + int(channel_mod.DRAIN_SECONDS / 0.001) + 1, order
    assert [x for x in order if x != "between"] == list(range(40))      # nothing lost, order kept


def test_a_header_refused_at_the_boundary_is_decoded_once_and_its_answer_names_its_id(monkeypatch):
    """A header refused after decoding (nested too deep, a 1 MB discovery's args, an unknown type)
    is answered with its own id, without decoding the frame a second time: under a flood of 1 MB
    headers the second decode doubled what each cost the daemon."""
    import gridrpc.core.messages as messages
    decodes = []
    real = orjson.loads

    def counting(raw):
        decodes.append(len(raw))
        return real(raw)

    deep = "[" * 900 + "]" * 900
    sends = [
        [f'{{"v":1,"type":"ping","id":"deep-1","ids":[{deep}]}}'.encode()],
        [m.dumps(m.make(MsgType.DISCOVER, "big-1", service="add", k=1, args=["x" * 1_000_000]))],
        [orjson.dumps({"v": 1, "type": "no_such_type", "id": "odd-1"})],
        [orjson.dumps({"v": 1, "type": "ping", "id": "../x"})],      # an id that is not valid: not echoed
    ]

    async def run():
        ep = Endpoint("T", "tcp://127.0.0.1:0", {MsgType.PING: lambda msg: None}).start()
        return await ask_each(ep, sends, real)

    monkeypatch.setattr(messages.orjson, "loads", counting)
    out = asyncio.run(run())
    assert [o["id"] for o in out] == ["deep-1", "big-1", "odd-1", ""]
    assert all(o["error"]["kind"] == "protocol" for o in out)
    assert "nested deeper than 255" in out[0]["error"]["message"]
    assert "'args'" in out[1]["error"]["message"]
    big = [n for n in decodes if n > 1_000_000]
    assert len(big) == 1, f"the 1 MB header was decoded {len(big)} times"
    assert sum(1 for n in decodes if 1800 < n < 2000) == 1      # the deep one, once


def test_a_2d_array_frame_counts_its_bytes_not_its_rows():
    """A 2-D array is big by its bytes (``len`` of its memoryview is its row count): it is sent
    zero-copy and alone, not copied into a batch."""
    import numpy as np
    from gridrpc.transport.channel import ZERO_COPY_THRESHOLD, frame_size, has_big
    rows = memoryview(np.zeros((1000, 100)))          # 800 KB in 1,000 rows
    assert len(rows) == 1000 and frame_size(rows) == 800_000
    assert has_big([b"head", rows])
    assert not has_big([memoryview(np.zeros((10, 10)))])
    assert not has_big([b"x" * (ZERO_COPY_THRESHOLD - 1)]) and has_big([b"x" * ZERO_COPY_THRESHOLD])


def test_deeply_nested_headers_bring_no_full_collection():
    """Each deeply nested header decodes into 900 lists, refused just after: handled with the
    cyclic GC paused, they are freed without any collection. With the GC running, collections
    started mid-decode promoted them, and full collections of the whole heap followed every few
    thousand messages (each a pause of the daemon's loop)."""
    import gc
    deep = "[" * 900 + "]" * 900
    sends = [[f'{{"v":1,"type":"ping","id":"deep-{i}","ids":[{deep}]}}'.encode()] for i in range(2000)]
    full = []

    def count(phase, info):
        if phase == "start" and info["generation"] == 2:
            full.append(1)

    async def run():
        ep = Endpoint("T", "tcp://127.0.0.1:0", {MsgType.PING: lambda msg: None}).start()
        return await ask_each(ep, sends, orjson.loads)

    gc.collect()
    gc.callbacks.append(count)
    try:
        out = asyncio.run(run())
    finally:
        gc.callbacks.remove(count)
    assert len(out) == 2000 and all(o["error"]["kind"] == "protocol" for o in out)
    assert not full, f"{len(full)} full collections while 2,000 nested headers were refused"
