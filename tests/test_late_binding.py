"""Late binding on a real in-process tree: a discovery answered from a
view that has not yet seen a server become busy (bound calls bypass the
agents) must not park a call behind a long one while a server is idle."""
from __future__ import annotations

import time

import pytest

import gridrpc
from gridrpc.testing import LocalTree, wait_for

pytestmark = pytest.mark.timeout(120)

LONG = 60.0       # a call that outlives the test: only a cancellation ends it


@pytest.fixture(scope="module")
def tree():
    with LocalTree(las=1, seds_per_la=3, http=False) as t:
        yield t


def _busy(tree) -> int:
    return sum(s.stats["busy"] for s in tree.seds)


def _slow_pushes(tree, delay: float) -> None:
    """Make every SeD push its load changes only after ``delay``: the MA's
    view is then surely stale for that long (in production the delay is 2 ms,
    and a discovery sent within it meets the same staleness by chance).
    Between rounds the test pushes by hand (_view_caught_up)."""
    def set_() -> None:
        for s in tree.seds:
            for r in s.replicas.values():
                r.push.fast = r.push.slow = delay
    tree.lt.call(set_)


def _view_caught_up(tree) -> None:
    """Every SeD pushes its state now (the last round's calls were
    cancelled) and the MA's view shows every one idle again."""
    def push_now() -> None:
        for s in tree.seds:
            for r in s.replicas.values():
                s._push_view(r)
    tree.lt.call(push_now)

    def idle() -> bool:
        seds = tree.ma.state.view.seds
        return len(seds) == len(tree.seds) and all(
            (s.vector("add") or {}).get("num_running") == 0 for s in seds.values())
    wait_for(lambda: tree.lt.call(idle), 10, "the MA's view shows every server idle")


def test_a_call_after_bound_calls_goes_to_the_idle_server(tree):
    """Two of three servers are made busy by bound calls (which bypass the
    agents), then a discovered call is sent while the MA's view still shows
    them free: it runs on the idle one in milliseconds, never queued behind
    a 60 s call, after the busy servers answered ``busy``."""
    names = sorted(tree.sed_names())
    _slow_pushes(tree, 60.0)
    with gridrpc.Client(tree.ma_address, user="lb", timeout=30) as c:
        busy_start = _busy(tree)
        view_answers = tree.lt.call(lambda: tree.ma.state.counters.view_answers)
        for rnd in range(20):     # (a loaded machine may make the MA fan out some rounds instead)
            if rnd >= 3 and _busy(tree) > busy_start:
                break
            idle = names[rnd % 3]
            # the idle server solved last: the default aggregator (least recently used first) ranks it
            # last, so the stale view puts a busy server first unless power-of-two picks it (1 in 9)
            assert c.call("add", 0, 0, server=idle) == 0
            _view_caught_up(tree)                     # the MA's view shows every server idle again
            longs = [c.submit("sleep", LONG, server=n) for n in names if n != idle]
            t0 = time.monotonic()
            call = c.submit("add", rnd, 1)
            assert call.result(timeout=20) == rnd + 1
            assert time.monotonic() - t0 < 10, "queued behind a long call"
            assert call.server == idle
            for lc in longs:
                lc.cancel()
            wait_for(lambda: all(not s.calls for s in tree.seds), 10, "every long call cancelled")
    # the stale view sent the call to a busy server first at least once (the
    # power-of-two choice may still put the idle one first: 1 round in 9)
    answered = tree.lt.call(lambda: tree.ma.state.counters.view_answers) - view_answers
    assert _busy(tree) > busy_start, f"no busy answer in 20 rounds ({answered} discoveries answered from the view)"
    _slow_pushes(tree, 0.002)


def test_start_now_on_a_busy_server_is_answered_busy_and_not_queued(tree):
    """The SeD side alone: a CALL with ``start_now`` to a server without a
    free slot gets ERROR ``busy`` and leaves nothing behind."""
    import zmq
    from gridrpc.core import messages as m

    name = sorted(tree.sed_names())[0]
    with gridrpc.Client(tree.ma_address, user="lb2", timeout=30) as c:
        address = c.resolve(name).address
        long = c.submit("sleep", LONG, server=name)
        sed = next(s for s in tree.seds if name in s.replicas)
        wait_for(lambda: any(x.state.value == "running" for x in list(sed.calls.values())), 10, "long call running")
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        try:
            sock.connect(address)
            before = sed.stats["busy"]
            sock.send_multipart([m.dumps(m.make(m.MsgType.CALL, "probe-1", sed=name, service="add", args=[1, 2],
                                                kwargs={}, user="lb2", start_now=True))])
            assert sock.poll(5000), "no answer"
            frames = sock.recv_multipart()
            h = m.parse_header(frames[0])[1]
            assert h["type"] == "error" and h["error"]["kind"] == "busy", h
            assert sed.stats["busy"] == before + 1
            assert "probe-1" not in sed.calls                   # not queued
            # without start_now the same call queues as before
            sock.send_multipart([m.dumps(m.make(m.MsgType.CALL, "probe-2", sed=name, service="add", args=[1, 2],
                                                kwargs={}, user="lb2"))])
            assert sock.poll(5000)
            h = m.parse_header(sock.recv_multipart()[0])[1]
            assert h["type"] == "accepted" and h.get("state") == "queued", h
            sock.send_multipart([m.dumps(m.make(m.MsgType.CANCEL, "probe-2", sed=name))])
            assert sock.poll(5000)
            sock.recv_multipart()
        finally:
            sock.close()
            long.cancel()
        wait_for(lambda: not sed.calls, 10, "nothing left on the SeD")
