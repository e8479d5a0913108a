"""A SeD's record of the calls it has seen, on real daemons: one record per
request id (a repeated id is never acknowledged and then forgotten), and one
result cache bounded in bytes (a SeD's memory does not grow with the size of
the results it returned; a duplicate of a call whose result was dropped gets
an answer saying so, never a second run)."""
from __future__ import annotations

import time

import psutil
import pytest
import zmq

import gridrpc
from gridrpc.core import codec
from gridrpc.core import messages as m
from gridrpc.core.messages import MsgType
from gridrpc.testing import LoopThread, example_sed

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def lt():
    t = LoopThread()
    yield t
    t.close()


def _sed(lt, **kw):
    kw.setdefault("isolation", "inline")
    sed = example_sed("rec-sed", None, **kw)
    lt.run(sed.start())
    return sed


def _dealer(address):
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(address)
    return s


def _call(cid, service, *args):
    buffers: list = []
    tree = codec.encode(list(args), buffers)
    return [m.dumps(m.make(MsgType.CALL, cid, service=service, args=tree, kwargs={}, sed="rec-sed")), *buffers]


def _replies(sock, until, timeout=5.0):
    """Messages received until ``until(list)`` holds or the time is up."""
    out = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not until(out):
        if sock.poll(50):
            frames = sock.recv_multipart(copy=False)
            mt, h = m.parse_header(frames[0].bytes)
            out.append((mt, h, [f.buffer for f in frames[1:]]))
    return out


def _final(replies):
    return [r for r in replies if r[0] in (MsgType.RESULT, MsgType.ERROR)]


def test_a_repeated_id_after_many_calls_is_answered_not_acknowledged_and_forgotten(lt):
    """Before: the queue remembered 200,000 ids and the result cache 512
    results. The id of the 1st of 600 calls was in the first but not in the
    second: the SeD acknowledged the repeat and never ran nor answered it."""
    sed = _sed(lt)
    s = _dealer(sed.address)
    try:
        n = 600
        for i in range(n):
            s.send_multipart(_call(f"c{i}", "add", i, 1))
        got = _replies(s, lambda out: len(_final(out)) == n, timeout=60)
        assert len(_final(got)) == n
        calls_before = lt.call(lambda: sed.stats["calls"])
        s.send_multipart(_call("c0", "add", 0, 1))
        again = _replies(s, lambda out: bool(_final(out)), timeout=3)
        assert _final(again), f"the repeated id got {[(r[0].value) for r in again]} and no answer"
        mt, h, bufs = _final(again)[0]
        assert mt is MsgType.RESULT and codec.decode(h["value"], bufs) == 1
        assert lt.call(lambda: sed.stats["calls"]) == calls_before       # not run again
        assert lt.call(lambda: len(sed.calls)) == 0                       # and nothing left hanging
    finally:
        s.close()
        lt.run(sed.aclose())


def test_a_duplicate_of_a_large_result_gets_the_whole_value(lt):
    """Before: results of 1 MiB and more were cached as their header alone, so
    a duplicate got a RESULT whose binary frames were missing."""
    sed = _sed(lt)
    s = _dealer(sed.address)
    value = bytes(range(256)) * (6 * 1024)          # 1.5 MiB
    try:
        for _ in range(2):
            s.send_multipart(_call("big-1", "echo", value))
            got = _final(_replies(s, lambda out: bool(_final(out))))
            assert got, "no answer"
            mt, h, bufs = got[0]
            assert mt is MsgType.RESULT and codec.decode(h["value"], bufs) == value
        assert lt.call(lambda: sed.stats["calls"]) == 1
    finally:
        s.close()
        lt.run(sed.aclose())


def test_a_result_dropped_from_the_cache_is_said_gone_not_run_again(lt):
    sed = _sed(lt, result_cache_bytes=20_000)
    s = _dealer(sed.address)
    try:
        s.send_multipart(_call("r-big", "echo", b"x" * 50_000))        # does not fit
        assert _final(_replies(s, lambda out: bool(_final(out))))[0][0] is MsgType.RESULT
        for i in range(3):                                              # push r-small out
            s.send_multipart(_call(f"r-small-{i}", "echo", b"y" * 9_000))
            assert _final(_replies(s, lambda out: bool(_final(out))))[0][0] is MsgType.RESULT
        for cid in ("r-big", "r-small-0"):
            s.send_multipart(_call(cid, "echo", b"z"))
            mt, h, _ = _final(_replies(s, lambda out: bool(_final(out))))[0]
            assert mt is MsgType.ERROR and h["error"]["kind"] == "result_gone", h
            assert cid in h["error"]["message"] and "not run again" in h["error"]["message"]
        s.send_multipart(_call("r-small-2", "echo", b"z"))           # still cached
        mt, h, bufs = _final(_replies(s, lambda out: bool(_final(out))))[0]
        assert mt is MsgType.RESULT and codec.decode(h["value"], bufs) == b"y" * 9_000
        assert lt.call(lambda: sed.stats["calls"]) == 4
        st = lt.call(sed.statistics)["results"]
        assert st["bytes"] <= 20_000 and st["dropped"] >= 2
        # a client still waiting for such a call (its ping) is told as well
        s.send_multipart([m.dumps(m.make(MsgType.PING, "p1", ids=["r-big", "r-small-2", "nope"]))])
        got = _replies(s, lambda out: any(r[0] is MsgType.PONG for r in out) and bool(_final(out)))
        pong = next(h for mt, h, _ in got if mt is MsgType.PONG)
        assert pong["calls"] == {"r-big": "done", "r-small-2": "done", "nope": "unknown"}
        assert [h["error"]["kind"] for mt, h, _ in _final(got)] == ["result_gone"]
    finally:
        s.close()
        lt.run(sed.aclose())


def test_echo_of_600_one_megabyte_values_keeps_the_sed_memory_bounded(proc_tree):
    """Before: the cache kept 512 results under 1 MiB each: 600 echo calls
    of 1 MB left the SeD process at 540 MB RSS."""
    sed = proc_tree.sed("mem-sed", None)
    proc = psutil.Process(sed.pid)
    payload = b"m" * 1_000_000
    with gridrpc.Client(None, timeout=30) as c:
        h = c.handle("echo", server=f"{sed.address}#mem-sed")
        assert h(b"warm") == b"warm"
        base = proc.memory_info().rss
        peak = base
        for i in range(600):
            assert len(h(payload)) == len(payload)
            if i % 50 == 0:
                peak = max(peak, proc.memory_info().rss)
        peak = max(peak, proc.memory_info().rss)
    grown = (peak - base) / 2**20
    # default result cache: 64 MiB; allow for allocator slack and the call in flight
    assert grown < 160, f"SeD RSS grew by {grown:.0f} MiB over 600 x 1 MB echo calls"
