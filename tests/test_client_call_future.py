"""A submitted Call's thread-side future is made only when a thread asks for it
(a burst of submits made one concurrent.futures.Future, lock and condition per
call that loop code never looked at); the thread API behaves as before."""
from __future__ import annotations

import threading

import pytest

import gridrpc
from gridrpc.client.aio import AsyncClient
from gridrpc.client.futures import ServerInfo
from gridrpc.testing import LoopThread, example_sed

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["address", "info"])
def sed_and_loop(request):
    """Each test twice: the server given by address (the call runs in a task) and as the
    ServerInfo a discovery gives (no task: gridrpc.client.submit)."""
    lt = LoopThread()
    sed = example_sed("cf", None, ["add", "sleep"], max_concurrent=4)
    lt.run(sed.start())
    client = AsyncClient(None)
    lt.run(client.start())
    try:
        yield lt, sed, client, (sed.address if request.param == "address" else ServerInfo("cf", sed.address))
    finally:
        lt.run(client.aclose())
        lt.run(sed.aclose())
        lt.close()


def test_no_thread_future_until_a_thread_asks(sed_and_loop):
    lt, sed, c, where = sed_and_loop
    calls = lt.call(lambda: [c.submit_nowait("add", i, 1, server=where) for i in range(20)])
    assert all(x._cf is None for x in calls)
    async def gather():
        return [await x for x in calls]
    assert lt.run(gather()) == [i + 1 for i in range(20)]
    assert all(x._cf is None for x in calls)            # loop code never made one
    assert all(x.done() for x in calls)
    assert calls[3].result(timeout=5) == 4 and calls[3]._cf is None    # read from the finished task
    assert calls[5].add_done_callback(lambda _c: None) is None and calls[5]._cf is not None
    assert calls[4].exception(timeout=5) is None and not calls[4].cancelled()
    done, pending = gridrpc.wait(calls, timeout=5)
    assert len(done) == 20 and not pending


def test_thread_api_on_a_pending_call(sed_and_loop):
    lt, sed, c, where = sed_and_loop
    call = lt.call(lambda: c.submit_nowait("sleep", 0.4, server=where))
    seen = threading.Event()
    call.add_done_callback(lambda cl: seen.set() if cl is call else None)
    with pytest.raises(gridrpc.Timeout):
        call.result(timeout=0.05)
    assert not call.done() and not seen.is_set()
    assert call.result(timeout=10) == 0.4          # sleep returns its argument
    assert seen.wait(5) and call.done()


def test_failed_and_cancelled_calls_seen_from_a_thread(sed_and_loop):
    lt, sed, c, where = sed_and_loop
    bad = lt.call(lambda: c.submit_nowait("add", "x", [1], server=where))
    with pytest.raises(gridrpc.GridRPCError):
        bad.result(timeout=10)
    assert isinstance(bad.exception(timeout=1), gridrpc.GridRPCError)
    slow = lt.call(lambda: c.submit_nowait("sleep", 30, server=where))
    assert lt.run(_wait_sent(slow))
    assert slow.cancel(timeout=10) is True
    assert slow.cancelled() and slow.done()
    with pytest.raises(gridrpc.CallCancelled):
        slow.result(timeout=1)


async def _wait_sent(call):
    import asyncio
    for _ in range(500):
        if call.server is not None or getattr(call, "_flight", None) is not None:
            return True
        await asyncio.sleep(0.01)
    return False


def test_cancel_calls_stops_many_at_once(sed_and_loop):
    lt, sed, c, where = sed_and_loop
    finished = lt.call(lambda: c.submit_nowait("add", 1, 1, server=where))
    assert finished.result(timeout=10) == 2
    calls = lt.call(lambda: [c.submit_nowait("sleep", 30, server=where) for _ in range(30)])
    assert lt.run(_wait_all_sent(calls))
    n = lt.run(c.cancel_calls(calls + [finished], timeout=10))
    assert n == 30                                  # the finished one is not counted
    assert all(x.done() and x.cancelled() for x in calls)
    assert finished.result(timeout=1) == 2
    assert sed.stats["cancelled"] >= 30             # each reached the SeD (4 running, 26 queued)
    assert lt.run(c.cancel_calls(calls)) == 0       # nothing left to cancel
    other = AsyncClient(None)
    lt.run(other.start())
    try:
        with pytest.raises(ValueError, match="another client"):
            lt.run(other.cancel_calls(calls))
    finally:
        lt.run(other.aclose())
    # the SeD still serves
    assert lt.call(lambda: c.submit_nowait("add", 2, 3, server=where)).result(timeout=10) == 5


async def _wait_all_sent(calls):
    import asyncio
    for _ in range(500):
        if all(getattr(x, "_flight", None) is not None for x in calls):
            return True
        await asyncio.sleep(0.01)
    return False


def test_failures_nobody_looked_at_are_not_logged_by_asyncio(sed_and_loop):
    """A submitted call that fails and is never awaited is the user's business (its Call
    reports it when asked); asyncio must not print 'Task exception was never retrieved'."""
    import gc
    lt, sed, c, where = sed_and_loop
    seen: list = []
    lt.call(lambda: lt.loop.set_exception_handler(lambda _l, ctx: seen.append(ctx.get("message"))))
    calls = lt.call(lambda: [c.submit_nowait("add", "x", [1], server=where) for _ in range(5)])
    async def settle():
        import asyncio
        for _ in range(500):
            if all(x.done() for x in calls):
                return
            await asyncio.sleep(0.01)
    lt.run(settle())
    assert all(x.done() for x in calls)
    del calls
    gc.collect()
    lt.run(settle_loop())
    assert not [s for s in seen if s and "never retrieved" in s], seen


async def settle_loop():
    import asyncio
    await asyncio.sleep(0.05)



def test_cancel_calls_keeps_an_answer_already_received_and_checks_ownership_first(sed_and_loop):
    lt, sed, c, where = sed_and_loop
    call = lt.call(lambda: c.submit_nowait("sleep", 30, server=where))
    other = AsyncClient(None)
    lt.run(other.start())
    try:
        foreign = lt.call(lambda: other.submit_nowait("sleep", 30, server=where))
        lt.run(_wait_all_sent([call, foreign]))
        with pytest.raises(ValueError, match="nothing was cancelled"):
            lt.run(c.cancel_calls([call, foreign]))
        assert not call.done() and not foreign.done()
        lt.run(other.cancel_calls([foreign], timeout=10))

        async def answered_then_cancelled():
            # the RESULT was read (the machine is done) but the call's task has not resumed yet
            flight = call._flight
            c._driver.feed(flight, _result_event(flight))
            return await c.cancel_calls([call], timeout=5)
        lt.run(answered_then_cancelled())
        assert call.result(timeout=5) == 42.0
    finally:
        lt.run(other.aclose())


def _result_event(flight):
    from gridrpc.core.client_call.vocabulary import Result
    return Result(flight.machine.id, 42.0, {}, None)


def test_callbacks_run_on_the_loop_not_in_the_asking_thread(sed_and_loop):
    lt, sed, c, where = sed_and_loop
    call = lt.call(lambda: c.submit_nowait("add", 1, 2, server=where))
    ran_in: list = []
    call.add_done_callback(lambda _c: ran_in.append(threading.current_thread().name))
    assert call.result(timeout=10) == 3
    for _ in range(200):
        if ran_in:
            break
        import time
        time.sleep(0.01)
    assert ran_in and ran_in != [threading.current_thread().name]
