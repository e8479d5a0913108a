"""Batches: the calls and cancels a client makes in one loop iteration reach a
SeD as one BATCH envelope, and the SeD's answers come back as one; the
envelope is checked at the boundary like any message."""
from __future__ import annotations

import asyncio

import pytest
import zmq

import gridrpc
from gridrpc.core import messages as m
from gridrpc.core.messages import MsgType
from gridrpc.testing import LocalTree


@pytest.fixture(scope="module")
def tree():
    with LocalTree(las=0, seds_per_la=0, seds_under_ma=1, sed_options={"max_concurrent": 2}) as t:
        yield t


def _sed(tree):
    return tree.seds[0]


def _stats(tree) -> dict:
    return tree.lt.call(lambda: _sed(tree).endpoint.stats.snapshot())


def test_a_burst_of_calls_travels_as_batches_and_every_call_answers(tree):
    server = tree.sed_names()[0]
    before = _stats(tree)

    async def go():
        async with gridrpc.AsyncClient(tree.ma_address, user="bob") as c:
            info = await c.resolve(server)
            calls = [c.submit_nowait("add", i, 1, server=info) for i in range(300)]
            return [await call for call in calls]

    assert tree.lt.run(go(), timeout=60) == [i + 1 for i in range(300)]
    after = _stats(tree)
    got = after["by_type"].get("call", 0) - before["by_type"].get("call", 0)
    assert got == 300                                   # each call handled as a message of its own
    assert after["batches"] - before["batches"] >= 1     # ... but they came in envelopes
    assert after["batches"] - before["batches"] <= 10


def test_a_cancel_in_the_same_batch_as_its_call_is_not_overtaken(tree):
    server = tree.sed_names()[0]

    async def go():
        async with gridrpc.AsyncClient(tree.ma_address, user="bob") as c:
            info = await c.resolve(server)
            calls = [c.submit_nowait("sleep", 30, server=info) for _ in range(20)]
            await asyncio.sleep(0)           # the tasks send their CALLs into the outbox
            await asyncio.sleep(0)
            out = await asyncio.gather(*(call.acancel() for call in calls), return_exceptions=True)
            errors = []
            for call in calls:
                try:
                    await call
                    errors.append(None)
                except gridrpc.CallCancelled as exc:
                    errors.append(type(exc).__name__)
            return out, errors

    out, errors = tree.lt.run(go(), timeout=60)
    assert errors == ["CallCancelled"] * 20
    assert tree.lt.call(lambda: len(_sed(tree).calls)) == 0        # nothing left running or queued


def _raw_exchange(address: str, frames: list, expect: int = 1, timeout_ms: int = 5000) -> list[list]:
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(address)
    try:
        s.send_multipart(frames)
        out = []
        for _ in range(expect):
            if not s.poll(timeout_ms):
                break
            out.append(s.recv_multipart())
        return out
    finally:
        s.close()


def _sed_address(tree) -> str:
    return tree.lt.call(lambda: _sed(tree).endpoint.address)


def test_raw_batch_gets_batched_answers_in_order(tree):
    pings = [[m.dumps(m.make(MsgType.PING, f"p{i}", ids=[]))] for i in range(5)]
    (reply,) = _raw_exchange(_sed_address(tree), m.batch(pings))
    mt, h = m.parse_header(reply[0])
    assert mt is MsgType.BATCH
    parts = m.unbatch(h, reply[1:])
    assert [m.parse_header(p[0])[1]["id"] for p in parts] == [f"p{i}" for i in range(5)]


@pytest.mark.parametrize("frames, reason", [
    ([m.dumps(m.make(MsgType.BATCH, "b", n=[1, 1])), m.dumps(m.make(MsgType.PING, "x"))], "counts say 2"),
    ([m.dumps(m.make(MsgType.BATCH, "b", n=[])), ], "at least one"),
    ([m.dumps(m.make(MsgType.BATCH, "b", n=[1] * 600))] + [b"{}"] * 600, "at most 512"),
    ([m.dumps(m.make(MsgType.BATCH, "b", n=[1, 2])), m.dumps(m.make(MsgType.PING, "x")),
      m.dumps(m.make(MsgType.BATCH, "b2", n=[1])), m.dumps(m.make(MsgType.PING, "y"))], "batch cannot hold a batch"),
    # packed headers (one frame holding every header; "sizes" their lengths)
    ([m.dumps(m.make(MsgType.BATCH, "b", n=[1, 1], sizes=[60, 60])), b"{}" * 30], "add up to 120 bytes"),
    ([m.dumps(m.make(MsgType.BATCH, "b", n=[1, 1], sizes=[10])), b"x" * 10], "1 header sizes for 2"),
    ([m.dumps(m.make(MsgType.BATCH, "b", n=[1, 2], sizes=[2, 2])), b"{}{}"], "counts say 2 frames"),
    ([m.dumps(m.make(MsgType.BATCH, "b", n=[1, 1], sizes=[-2, 4])), b"{}{}"], "sizes"),
    ([m.dumps(m.make(MsgType.BATCH, "b", n=[1, 1], sizes=[2, 1 << 30])), b"{}{}"], "sizes"),
    ([m.dumps(m.make(MsgType.BATCH, "b", n=[1, 1], sizes="22")), b"{}{}"], "sizes"),
])
def test_bad_batches_are_refused_and_the_sed_keeps_serving(tree, frames, reason):
    replies = _raw_exchange(_sed_address(tree), frames)
    assert replies, "a bad batch must be answered"
    texts = b" ".join(f for r in replies for f in r).decode(errors="replace")
    assert "protocol" in texts and reason in texts
    with gridrpc.Client(tree.ma_address, user="carol") as c:
        assert c.call("add", 2, 2, server=tree.sed_names()[0]) == 4


def test_packed_batch_with_buffers_round_trips():
    """Headers packed in one frame, each message's buffers after it in order."""
    msgs = [[m.dumps(m.make(MsgType.PING, "a", ids=[]))],
            [m.dumps(m.make(MsgType.PING, "b", ids=[])), b"buf-b1", b"buf-b2"],
            [m.dumps(m.make(MsgType.PING, "c", ids=[])), b"buf-c"]]
    frames = m.batch(msgs)
    assert len(frames) == 2 + 3                                  # envelope, pack, three buffers
    mt, h = m.parse_header(frames[0])
    assert mt is MsgType.BATCH and h["n"] == [1, 3, 2] and len(h["sizes"]) == 3
    assert m.unbatch(h, frames[1:]) == msgs
    # a header that is not bytes (a zmq frame, a memoryview) keeps the frame-per-message form
    mixed = [[memoryview(msgs[0][0])], msgs[1]]
    frames = m.batch(mixed)
    mt, h = m.parse_header(frames[0])
    assert "sizes" not in h and [list(map(bytes, p)) for p in m.unbatch(h, frames[1:])] == \
        [[msgs[0][0]], msgs[1]]


def test_a_bad_message_inside_a_batch_fails_alone(tree):
    frames = m.batch([[m.dumps(m.make(MsgType.PING, "ok1", ids=[]))], [b"not json"],
                      [m.dumps(m.make(MsgType.PING, "ok2", ids=[]))]])
    (reply,) = _raw_exchange(_sed_address(tree), frames)
    mt, h = m.parse_header(reply[0])
    parts = [m.parse_header(p[0]) for p in m.unbatch(h, reply[1:])]
    assert [t for t, _ in parts] == [MsgType.PONG, MsgType.ERROR, MsgType.PONG]
    assert parts[1][1]["error"]["kind"] == "protocol"


def test_batches_over_curve_keep_the_senders_identity(tmp_path):
    """Under CURVE each message of a batch is the sender's (the key's user):
    calls run as that user, and the SeD's ownership checks still apply."""
    keys = str(tmp_path / "k")
    with LocalTree(las=0, seds_under_ma=1, keys=keys, users=["alice"], http=False) as t:
        sed = t.seds[0]

        async def go():
            async with gridrpc.AsyncClient(t.ma_address, keys=keys, user="alice") as c:
                info = await c.resolve(t.sed_names()[0])
                calls = [c.submit_nowait("add", i, i, server=info) for i in range(40)]
                return [await call for call in calls]

        assert t.lt.run(go(), timeout=60) == [2 * i for i in range(40)]
        assert t.lt.call(lambda: sed.endpoint.stats.snapshot())["batches"] >= 1

        async def forged():
            async with gridrpc.AsyncClient(t.ma_address, keys=keys, user="alice") as c:
                info = await c.resolve(t.sed_names()[0])
                c.user = "mallory"                  # the header lies; the key decides
                calls = [c.submit_nowait("sleep", 30, server=info) for _ in range(5)]
                for _ in range(200):
                    if len(sed.calls) == 5:
                        break
                    await asyncio.sleep(0.01)
                users = sorted(call.user for call in sed.calls.values())
                await asyncio.gather(*(call.acancel() for call in calls), return_exceptions=True)
                return users

        assert t.lt.run(forged(), timeout=60) == ["alice"] * 5


def _discovers(tree) -> int:
    return tree.lt.call(lambda: tree.ma.endpoint.stats.snapshot())["by_type"].get("discover", 0)


@pytest.fixture(scope="module")
def tree5():
    with LocalTree(las=0, seds_per_la=0, seds_under_ma=5, http=False) as t:
        yield t


@pytest.mark.parametrize("share, expected", [(True, 1), (False, 20)])
def test_users_arriving_together_share_one_discovery(tree5, share, expected):
    tree = tree5
    before = _discovers(tree)

    async def go():
        clients = [gridrpc.AsyncClient(tree.ma_address, user=f"u{i}", share_discovery=share) for i in range(20)]
        for c in clients:
            await c.start()
        try:
            answers = await asyncio.gather(*(c.discover("add", 5) for c in clients))
            assert len(answers[0]) == 5
            # every client can call what it was given (it learnt the addresses itself)
            assert await clients[-1].call("add", 1, 2, server=answers[-1][0]) == 3
            return [[s.name for s in a] for a in answers]
        finally:
            for c in clients:
                await c.aclose()

    answers = tree.lt.run(go(), timeout=60)
    assert _discovers(tree) - before == expected
    if share:
        # one answer, rotated one place further for each joiner: first calls spread over the servers
        assert all(sorted(a) == sorted(answers[0]) for a in answers)
        assert len({a[0] for a in answers}) == len(answers[0])
    else:
        assert all(answers)


def test_a_shared_discovery_that_fails_fails_for_everyone(tree):
    async def go():
        clients = [gridrpc.AsyncClient(tree.ma_address, user=f"u{i}", share_discovery=True) for i in range(5)]
        for c in clients:
            await c.start()
        try:
            return await asyncio.gather(*(c.discover("no_such_service", 5) for c in clients),
                                        return_exceptions=True)
        finally:
            for c in clients:
                await c.aclose()

    out = tree.lt.run(go(), timeout=60)
    assert len(out) == 5 and all(isinstance(e, gridrpc.GridRPCError) for e in out)


def test_cancels_arriving_together_do_not_start_and_kill_the_next_calls(tree):
    """The SeD pauses its queues while it handles what one wake-up of its
    socket brought (several clients' batches): five users cancelling all
    their calls at once stop the two running ones, and no queued call starts
    in between (issue #12: 13,800 cancellations at the users' deadline)."""
    from gridrpc.core.sed_calls import Run
    server = tree.sed_names()[0]
    sed = _sed(tree)
    started: list[str] = []
    original = sed._apply

    def counting(r, actions):
        started.extend(a.call.id for a in actions if isinstance(a, Run))
        return original(r, actions)

    async def go():
        clients = [gridrpc.AsyncClient(tree.ma_address, user=f"v{i}") for i in range(5)]
        for c in clients:
            await c.start()
        try:
            info = await clients[0].resolve(server)
            calls = [c.submit_nowait("sleep", 30, server=info) for c in clients for _ in range(2)]
            for _ in range(500):
                # every call in and acknowledged (the held ACCEPTEDs sent): a send by the SeD
                # schedules a read of its socket, which could split the users' cancels
                if (len(sed.calls) == 10 and sum(1 for x in sed.calls.values() if x.state.value == "running") == 2
                        and not sed._acks):
                    break
                await asyncio.sleep(0.01)
            sed._apply = counting
            try:
                await asyncio.gather(*(call.acancel() for call in calls), return_exceptions=True)
            finally:
                del sed._apply
            return len(sed.calls)
        finally:
            for c in clients:
                await c.aclose()

    assert tree.lt.run(go(), timeout=60) == 0
    assert started == []            # without the pause: each user's batch started the next user's calls


# -- held ACCEPTEDs: a CALL carries the client's ack_timeout (ack_ms); a SeD that
#    answers within a share of it sends no ACCEPTED, and the late ones go out together

def _calls(n: int, seconds: float, ack_ms: int | None, tag: str) -> list:
    out = []
    for i in range(n):
        h = m.make(MsgType.CALL, f"{tag}{i}", service="sleep", args=[seconds], kwargs={}, user="dave")
        if ack_ms is not None:
            h["ack_ms"] = ack_ms
        out.append([m.dumps(h)])
    return m.batch(out)


def _types(replies: list[list]) -> list[tuple[str, dict]]:
    """Every message of the replies (batches opened), in order, with the index of its zmq message."""
    out = []
    for k, r in enumerate(replies):
        mt, h = m.parse_header(r[0])
        parts = m.unbatch(h, r[1:]) if mt is MsgType.BATCH else [r]
        for p in parts:
            pt, ph = m.parse_header(p[0])
            out.append((pt.value, ph, k))
    return out


def test_quick_queue_sends_no_accepted_when_the_client_says_how_long_it_waits(tree):
    # 4 calls of 50 ms on 2 slots: all answered in ~0.1 s, under 5 % of the client's 5 s
    got = _types(_raw_exchange(_sed_address(tree), _calls(4, 0.05, 5000, "q"), expect=4))
    assert sorted(t for t, _, _ in got) == ["result"] * 4


def test_without_ack_ms_every_call_is_acknowledged(tree):
    # an older client (no ack_ms): the queued calls are acknowledged at once, as before
    got = _types(_raw_exchange(_sed_address(tree), _calls(4, 0.05, None, "o"), expect=8))
    kinds = [t for t, _, _ in got]
    assert kinds.count("result") == 4 and kinds.count("accepted") >= 2
    assert [h["state"] for t, h, _ in got if t == "accepted"].count("queued") == 2


def test_late_accepteds_come_together_after_the_held_delay(tree):
    import time
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(_sed_address(tree))
    try:
        t0 = time.monotonic()
        s.send_multipart(_calls(6, 0.6, 5000, "l"))
        replies, first = [], None
        while sum(1 for t, _, _ in _types(replies) if t == "accepted") < 6 and s.poll(3000):
            replies.append(s.recv_multipart())
            first = first or time.monotonic() - t0
    finally:
        s.close()
    # nothing before the held delay (0.25 s = min(5 % of 5 s, 0.25 s)); then the six together
    # (one batch; two when the calls straddled the edge of a 5 ms slot)
    assert first is not None and 0.2 <= first < 0.55, first
    got = _types(replies)
    assert [t for t, _, _ in got] == ["accepted"] * 6
    assert len(replies) <= 2
    states = sorted(h["state"] for _, h, _ in got)
    assert states == ["queued"] * 4 + ["running"] * 2
    # the six calls still run and are answered (the SeD finishes them: wait for its queue to empty)
    deadline = time.monotonic() + 10
    while tree.lt.call(lambda: len(_sed(tree).calls)) and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize("bad", ["5000", -1, 1e12, True, [1]])
def test_a_bad_ack_ms_is_refused_at_the_boundary(tree, bad):
    h = m.make(MsgType.CALL, "badack", service="add", args=[1, 2], kwargs={}, user="dave")
    h["ack_ms"] = bad
    (reply,) = _raw_exchange(_sed_address(tree), [m.dumps(h)])
    mt, rh = m.parse_header(reply[0])
    assert mt is MsgType.ERROR and rh["error"]["kind"] == "protocol" and "ack_ms" in rh["error"]["message"]


@pytest.mark.parametrize("n, most", [(12, 3), (m.MAX_BATCH, 4)])
def test_a_batch_of_cancels_is_answered_in_batches(tree, n, most):
    """Each cancelled call gets its CANCELLED and its own ERROR answer; for a batch of CANCELs
    both go back in batches (one zmq message each was 2 sends and 2 receives per call: 28,200
    messages for the burst's 14,100 cancels). A full batch of CANCELs has twice as many answers
    as an envelope holds: they go back in two (the first version lost them all)."""
    import time
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(_sed_address(tree))
    ids = [f"x{n}-{i}" for i in range(n)]
    try:
        s.send_multipart(m.batch([[m.dumps(m.make(MsgType.CALL, cid, service="sleep", args=[30], kwargs={},
                                                   user="dave", ack_ms=120000))] for cid in ids]))
        time.sleep(0.3)                     # every call is in (2 running, the others queued)
        s.send_multipart(m.batch([[m.dumps(m.make(MsgType.CANCEL, cid, user="dave"))] for cid in ids]))
        replies = []
        while sum(1 for t, _, _ in _types(replies) if t in ("cancelled", "error")) < 2 * n and s.poll(5000):
            replies.append(s.recv_multipart())
    finally:
        s.close()
    got = [(t, h) for t, h, _ in _types(replies) if t in ("cancelled", "error")]
    assert sorted(h["id"] for t, h in got if t == "cancelled") == sorted(ids)
    assert sorted(h["id"] for t, h in got if t == "error") == sorted(ids)
    assert all(h["error"]["kind"] == "cancelled" for t, h in got if t == "error"), got
    answers = [r for r in replies if any(t in ("cancelled", "error") for t, _, _ in _types([r]))]
    assert len(answers) <= most, f"{len(answers)} zmq messages for {2 * n} answers"
    deadline = time.monotonic() + 10
    while tree.lt.call(lambda: len(_sed(tree).calls)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tree.lt.call(lambda: len(_sed(tree).calls)) == 0
