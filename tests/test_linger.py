"""Lingering (gridrpc.core.messages.linger): a client with many calls in
flight at one server sends its CALLs in batches, and the SeD answers such a
client in batches, instead of a message each way per call; with few calls in
flight nothing waits. Order to a peer is kept and nothing waiting is lost."""
from __future__ import annotations

import asyncio
import collections
import time

import pytest
import zmq

import gridrpc
from gridrpc.core import messages as m
from gridrpc.core.messages import MsgType
from gridrpc.testing import LocalTree
from gridrpc.transport import channel as channel_mod
from gridrpc.transport.endpoint import Endpoint


def test_the_rule_waits_only_for_a_peer_with_many_calls_in_flight():
    assert m.linger(0) == 0 and m.linger(1) == 0 and m.linger(m.LINGER_CALLS - 1) == 0
    assert m.linger(m.LINGER_CALLS) == m.LINGER_S > 0
    # one call of N in flight waits at most LINGER_S: the peer's rate cannot fall below N / LINGER_S
    assert m.LINGER_CALLS / m.LINGER_S >= 20000


@pytest.fixture(scope="module")
def tree():
    with LocalTree(las=0, seds_per_la=0, seds_under_ma=1, sed_options={"max_concurrent": 1}) as t:
        yield t


@pytest.fixture
def sends(monkeypatch):
    """zmq messages sent per channel name, in this process (the client and the LocalTree's SeD)."""
    counts: collections.Counter = collections.Counter()
    orig = channel_mod.Channel.send

    def send(self, frames, *a, **k):
        counts[self.name] += 1
        return orig(self, frames, *a, **k)
    monkeypatch.setattr(channel_mod.Channel, "send", send)
    return counts


def _window(tree, n: int, window: int) -> tuple[list, dict, dict]:
    server = tree.sed_names()[0]

    async def go():
        async with gridrpc.AsyncClient(tree.ma_address, user="linger") as c:
            h = c.handle("add", server=server)
            sem = asyncio.Semaphore(window)

            async def one(i):
                async with sem:
                    return await h(i, 1)
            out = await asyncio.gather(*(one(i) for i in range(n)))
            return out, dict(c._driver.at_address)
    out, at_address = tree.lt.run(go(), timeout=120)
    by_owner = tree.lt.call(lambda: dict(tree.seds[0]._by_owner))
    return out, at_address, by_owner


def _to_sed(sends) -> int:
    return sum(v for k, v in sends.items() if k.startswith("client->"))


def _from_sed(sends) -> int:
    return sum(v for k, v in sends.items() if k.startswith("sed-") and k.endswith(".router"))


def test_many_calls_in_flight_travel_and_come_back_in_batches(tree, sends, monkeypatch):
    # 20 ms instead of 1: on a loaded host a call may take over 1 ms here (in-process tree), and a
    # 1 ms wait would then rarely find a second answer; what is checked is that waiting batches
    monkeypatch.setattr(m, "LINGER_S", 0.02)
    n = 1500
    out, at_address, by_owner = _window(tree, n, window=4 * m.LINGER_CALLS)
    assert out == [i + 1 for i in range(n)]
    # without lingering: one CALL per answer received, one answer per call (~n each way)
    assert _to_sed(sends) <= n // 3, dict(sends)
    assert _from_sed(sends) <= n // 3, dict(sends)
    assert at_address == {} and by_owner == {}         # the counts go back to zero: nothing leaks


def test_a_sequential_caller_never_waits(tree, sends):
    out, at_address, by_owner = _window(tree, 200, window=1)
    assert out == [i + 1 for i in range(200)]
    assert _to_sed(sends) >= 200 and _from_sed(sends) >= 200     # every message at once
    assert at_address == {} and by_owner == {}


def test_counts_follow_cancelled_and_failed_calls(tree):
    server = tree.sed_names()[0]

    async def go():
        async with gridrpc.AsyncClient(tree.ma_address, user="linger") as c:
            info = await c.resolve(server)
            calls = [c.submit_nowait("sleep", 30, server=info) for _ in range(m.LINGER_CALLS + 8)]
            await asyncio.sleep(0.2)
            mid = dict(c._driver.at_address)
            await c.cancel_calls(calls)
            fails = await asyncio.gather(*(c.call("fail", "boom", server=server) for _ in range(5)),
                                         return_exceptions=True)
            return mid, dict(c._driver.at_address), fails
    mid, after, fails = tree.lt.run(go(), timeout=60)
    assert sum(mid.values()) == m.LINGER_CALLS + 8
    assert after == {}
    assert all(isinstance(f, gridrpc.GridRPCError) for f in fails)
    assert tree.lt.call(lambda: dict(tree.seds[0]._by_owner)) == {}


# -- the endpoint's part, on a real socket -------------------------------------------------------
def _endpoint_and_peer(handler_of):
    """An Endpoint on a thread's loop whose PING handler is ``handler_of(ep)``, and a raw DEALER."""
    import threading
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box = {}

    def run():
        asyncio.set_event_loop(loop)

        async def start():
            ep = Endpoint("lingerer", "tcp://127.0.0.1:0", {})
            ep.handlers[MsgType.PING] = handler_of(ep)
            ep.start()
            box["ep"] = ep
            ready.set()
        loop.run_until_complete(start())
        loop.run_forever()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(10)
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(box["ep"].address)

    def stop():
        s.close()
        loop.call_soon_threadsafe(lambda: (box["ep"].close(), loop.stop()))
        t.join(10)
    return s, stop


def _pong(msg) -> list:
    return [m.dumps(m.make(MsgType.PONG, msg.id, name="x"))]


def _ping(s, pid: str) -> None:
    s.send_multipart([m.dumps(m.make(MsgType.PING, pid, ids=[]))])


def _lingering(delay: float):
    """A PING handler answering each PING by a PONG lingering ``delay`` s."""
    return lambda ep: (lambda msg: ep.linger(msg.route, _pong(msg), delay))


def _batch_hello(s) -> None:
    """The raw peer sends a batch first (a peer that never batches never gets one) and reads its answer."""
    s.send_multipart(m.batch([[m.dumps(m.make(MsgType.PING, f"h{i}", ids=[]))] for i in range(2)]))
    assert s.poll(5000)
    assert _ids(s.recv_multipart()) == ["h0", "h1"]


def _ids(msg: list) -> list[str]:
    mt, h = m.parse_header(msg[0])
    if mt is MsgType.BATCH:
        return [m.parse_header(p[0])[1]["id"] for p in m.unbatch(h, msg[1:])]
    return [h["id"]]


def test_lingering_answers_leave_together_and_before_anything_else_to_that_peer():
    def handler_of(ep):
        def on_ping(msg):
            if msg.id == "now":          # something sent at once: what lingered for this peer goes first
                ep.send(msg.route, m.make(MsgType.PONG, "now", name="x"))
                return
            ep.linger(msg.route, _pong(msg), 30.0)
        return on_ping
    s, stop = _endpoint_and_peer(handler_of)
    try:
        _batch_hello(s)
        for i in range(3):
            _ping(s, f"a{i}")
        time.sleep(0.3)
        assert not s.poll(200), "an answer lingering for 30 s left early"
        _ping(s, "now")
        got = []
        while s.poll(5000):
            got.append(_ids(s.recv_multipart()))
            if got[-1][-1] == "now":
                break
        assert got == [["a0", "a1", "a2"], ["now"]]     # one envelope for the three, then the new one
    finally:
        stop()


def test_a_lingering_answer_leaves_after_its_delay():
    s, stop = _endpoint_and_peer(_lingering(0.05))
    try:
        _batch_hello(s)
        t0 = time.monotonic()
        _ping(s, "p")
        assert s.poll(5000)
        assert _ids(s.recv_multipart()) == ["p"]
        assert time.monotonic() - t0 >= 0.04
    finally:
        stop()


def test_an_answer_lingering_at_close_is_sent_not_lost():
    sent = []

    def handler_of(ep):

        def on_ping(msg):
            ep.linger(msg.route, _pong(msg), 60.0)
            if msg.id != "last":
                return
            real = ep.channel.send

            def spy(frames):
                sent.append(frames)
                return real(frames)
            ep.channel.send = spy
            ep.close()
        return on_ping
    s, stop = _endpoint_and_peer(handler_of)
    try:
        _batch_hello(s)
        _ping(s, "last")
        deadline = time.monotonic() + 5
        while not sent and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sent and _ids(sent[0][1:]) == ["last"]
    finally:
        stop()


def test_a_peer_that_never_batched_gets_every_answer_at_once():
    s, stop = _endpoint_and_peer(_lingering(30.0))
    try:
        for i in range(3):
            _ping(s, f"p{i}")
        got = []
        while len(got) < 3 and s.poll(5000):
            got.append(_ids(s.recv_multipart()))
        assert got == [["p0"], ["p1"], ["p2"]]         # each alone, none held for 30 s
    finally:
        stop()


def test_a_call_alone_at_its_server_leaves_at_once_others_wait_for_the_iteration_end():
    """A sequential caller's CALL is sent from the step that makes it (waiting for the loop
    iteration's end cost it an iteration: nothing could join it); a call made while another
    is in flight at the same server goes in the outbox, and the outbox leaves as one batch."""
    from gridrpc.client.futures import ServerInfo

    async def go():
        async with gridrpc.AsyncClient(None) as c:
            sent: list = []
            c._driver.send = lambda address, frames: sent.append((address, frames))
            info = ServerInfo("s", "tcp://127.0.0.1:9")
            first = c.submit_nowait("add", 1, 2, server=info)
            alone = len(sent)                   # a submitted call with its server has no task: sent here
            more = [c.submit_nowait("add", i, 2, server=info) for i in range(2)]
            queued = len(sent)
            for _ in range(3):
                await asyncio.sleep(0)          # the iteration's end: the outbox leaves
            after = list(sent)
            for call in [first, *more]:
                call._task.cancel()             # the client closes: nothing is answered here
            return alone, queued, after
    alone, queued, after = asyncio.run(go())
    assert alone == 1                            # sent from the step that made it
    assert queued == 1                           # the two others wait for the iteration's end...
    assert len(after) == 2                       # ... and leave together
    mt, h = m.parse_header(after[1][1][0])
    assert mt is MsgType.BATCH and len(h["n"]) == 2


def test_tally_keeps_only_what_is_counted():
    from gridrpc.core.tally import tally
    counts: dict = {}
    tally(counts, "a", 1)
    tally(counts, "a", 1)
    tally(counts, "b", 1)
    assert counts == {"a": 2, "b": 1}
    tally(counts, "a", -1)
    tally(counts, "b", -1)
    assert counts == {"a": 1}                  # b fell to 0: gone
    tally(counts, "c", -1)                     # a late decrement never leaves a negative count
    assert counts == {"a": 1}
