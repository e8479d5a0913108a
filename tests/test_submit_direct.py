"""Submitted calls without a task (gridrpc.client.submit): a call whose server
is a ServerInfo, or found by discovery, is launched from ``submit_nowait``
and its Call bound to a future the driver settles when the call ends (the
flight's ``on_end``: no waiter future, no done callback); the other calls
keep a task. Same results, errors and cancellation either way (the behaviour tests
of tests/test_client_call_future.py run both ways)."""
from __future__ import annotations

import asyncio

import pytest

import gridrpc
from gridrpc.client.aio import AsyncClient
from gridrpc.client.futures import ServerInfo
from gridrpc.testing import LoopThread, example_sed

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def sed_and_loop():
    lt = LoopThread()
    sed = example_sed("d1", None, ["add", "sleep", "echo"], max_concurrent=2)
    lt.run(sed.start())
    client = AsyncClient(None, max_message_size=10_000)
    lt.run(client.start())
    try:
        yield lt, sed, client, ServerInfo("d1", sed.address)
    finally:
        lt.run(client.aclose())
        lt.run(sed.aclose())
        lt.close()


async def _until(pred, timeout=10.0):
    end = asyncio.get_running_loop().time() + timeout
    while not pred():
        if asyncio.get_running_loop().time() > end:
            return False
        await asyncio.sleep(0.01)
    return True


def test_which_calls_run_in_a_task(sed_and_loop):
    lt, sed, c, info = sed_and_loop

    async def go():
        direct = c.submit_nowait("add", 1, 2, server=info)
        named = c.submit_nowait("add", 3, 4, server=sed.address)        # a name to resolve: a task
        kept = c.submit_nowait("add", 5, 6, server=info, keep_result=True)
        as_arg = c.submit_nowait("add", direct, 1, server=info)        # a pending call as argument
        kinds = [type(x._task) is asyncio.Task for x in (direct, named, kept, as_arg)]
        sent_at_once = direct._flight is not None and named._flight is None
        values = [await direct, await named, await as_arg]
        ref = await kept
        return kinds, sent_at_once, values, await ref.aget()
    kinds, sent_at_once, values, kept_value = lt.run(go())
    assert kinds == [False, True, True, True]
    assert sent_at_once                     # the direct call left from submit_nowait itself
    assert values == [3, 7, 4] and kept_value == 11


def test_discovery_calls_run_without_a_task(tree):
    async def go():
        async with gridrpc.AsyncClient(tree.ma_address) as c:
            calls = [c.submit_nowait("add", i, 1) for i in range(20)]
            tasks = [type(x._task) is asyncio.Task for x in calls]
            return tasks, [await x for x in calls], {x.server for x in calls}
    tasks, values, servers = asyncio.run(go())
    assert not any(tasks)
    assert values == [i + 1 for i in range(20)]
    assert servers and all(s in set(tree.sed_names()) for s in servers)


def test_errors_are_the_task_paths_and_carry_no_traceback(sed_and_loop):
    lt, sed, c, info = sed_and_loop

    async def go():
        out = []
        for where in (info, sed.address):
            call = c.submit_nowait("add", "x", [1], server=where)
            await _until(call.done)
            exc = call._task.exception()
            out.append((type(exc), exc.__traceback__ is None))
        return out
    (direct_type, direct_clean), (task_type, task_clean) = lt.run(go())
    assert direct_type is task_type and issubclass(direct_type, gridrpc.GridRPCError)
    assert direct_clean and not task_clean      # made, never raised: nothing for the cyclic GC to walk


def test_cancelling_the_future_cancels_on_the_server(sed_and_loop):
    lt, sed, c, info = sed_and_loop

    async def go():
        call = c.submit_nowait("sleep", 30, server=info)
        assert await _until(lambda: len(sed.calls) == 1)
        call._task.cancel()                     # as a task cancelled while it waits
        gone = await _until(lambda: not sed.calls)
        return gone, call.done(), call.cancelled(), c._driver.flights
    gone, done, cancelled, flights = lt.run(go())
    assert gone and done and cancelled
    assert not flights                          # forgotten by the driver
    assert sed.stats["cancelled"] == 1


def test_a_task_awaiting_a_direct_call_cancelled_cancels_it_on_the_server(sed_and_loop):
    lt, sed, c, info = sed_and_loop

    async def go():
        call = c.submit_nowait("sleep", 30, server=info)
        waiting = asyncio.ensure_future(_await(call._task))    # cancellation reaches the future itself
        assert await _until(lambda: len(sed.calls) == 1)
        waiting.cancel()
        gone = await _until(lambda: not sed.calls)
        return gone, call.cancelled(), dict(c._driver.flights), c._tasks
    gone, cancelled, flights, tasks = lt.run(go())
    assert gone and cancelled and not flights and not tasks
    assert sed.stats["cancelled"] == 1


async def _await(fut):
    return await fut


def test_a_direct_call_has_no_waiter_and_no_callback_of_its_own(sed_and_loop):
    """What the cyclic GC walks per call in flight: the driver settles the call's
    future itself (``on_end``), with no waiter future and no done callbacks (a
    partial, a bound method, a list and a tuple each)."""
    lt, sed, c, info = sed_and_loop

    async def go():
        call = c.submit_nowait("sleep", 30, server=info)
        flight = call._flight
        shape = (flight.waiter, flight.on_end is not None, len(call._task._callbacks or ()))
        await c.cancel_calls([call], timeout=10)
        kept = (flight.header, flight.buffers, flight.outcome)
        return shape, flight.on_end, call.cancelled(), c._tasks, kept, call.timing
    (waiter, has_end, callbacks), end_after, cancelled, tasks, kept, timing = lt.run(go())
    assert waiter is None and has_end and callbacks == 0
    assert end_after is None and cancelled and not tasks      # called once, then dropped
    # an ended call keeps neither its CALL header (arguments) nor its outcome; its timing stays
    assert kept == (None, (), None) and isinstance(timing.get("received"), float)


def test_cancel_calls_and_acancel_on_direct_calls(sed_and_loop):
    lt, sed, c, info = sed_and_loop

    async def go():
        calls = [c.submit_nowait("sleep", 30, server=info) for _ in range(6)]
        n = await c.cancel_calls(calls[:5], timeout=10)
        one = await calls[5].acancel()
        errors = [type(x._task.exception()) for x in calls]
        return n, one, errors, await c.call("add", 2, 2, server=info)
    n, one, errors, four = lt.run(go())
    assert n == 5 and one is True
    assert errors == [gridrpc.CallCancelled] * 6
    assert four == 4 and sed.stats["cancelled"] == 6


def test_arguments_too_large_fail_the_call_not_the_submit(sed_and_loop):
    lt, sed, c, info = sed_and_loop

    async def go():
        call = c.submit_nowait("echo", b"x" * 20_000, server=info)      # returns: the Call fails
        with pytest.raises(gridrpc.MessageTooLarge):
            await call
        return await c.call("echo", b"ok", server=info)
    assert lt.run(go()) == b"ok"


def test_closing_the_client_fails_direct_calls_in_flight(sed_and_loop):
    lt, sed, c, info = sed_and_loop

    async def go():
        calls = [c.submit_nowait("sleep", 30, server=info) for _ in range(3)]
        await _until(lambda: len(sed.calls) == 3)
        await c.aclose()
        return [type(x._task.exception()) for x in calls], await _until(lambda: not sed.calls)
    errors, gone = lt.run(go())
    assert errors == [gridrpc.CommunicationError] * 3
    assert gone                                 # their CANCELs left before the socket closed


def test_references_to_typed_services_are_checked_once_resolved(sed_and_loop):
    """A pending call or a DataRef given to a service with annotated parameters passes the type
    check on arrival (it is a reference) and is checked once the SeD has its value (it failed:
    "argument 'x' must be int, got RefTag")."""
    lt, sed, c, info = sed_and_loop

    async def go():
        first = c.submit_nowait("add", 1, 2, server=info)
        second = c.submit_nowait("add", first, 10, server=info)      # the value of a call still running
        text = await c.put("not a number", server=info)
        wrong = c.submit_nowait("add", text, 1, server=info)
        with pytest.raises(gridrpc.InvalidArgument, match="must be int"):
            await wrong
        return await second, await c.call("add", 5, 5, server=info)
    assert lt.run(go()) == (13, 10)


def test_a_pending_call_to_a_server_known_by_address_only_can_be_an_argument(sed_and_loop):
    """A call bound to ``tcp://host:port`` has no server name, so no reference can name its
    holder: its value is passed once it is done (it failed: "malformed data reference ... bad
    holder ''")."""
    lt, sed, c, info = sed_and_loop

    async def go():
        slow = c.submit_nowait("sleep", 0.2, server=sed.address)
        echoed = c.submit_nowait("echo", slow, server=sed.address)           # waits for slow's value
        summed = c.submit_nowait("add", c.submit_nowait("add", 1, 10, server=sed.address), 5,
                                 server=sed.address)
        return await echoed, await summed, slow.server
    echoed, summed, name = lt.run(go())
    assert echoed == 0.2 and summed == 16
    assert name == ""                       # address only: the name was never known


def test_a_finished_call_as_an_argument_gives_its_value_or_data_lost(sed_and_loop):
    """A pending call that has already finished when used as an argument: its value (read from
    its task; waiting on its thread-side future from the loop never returned), or DataLost
    naming the failure."""
    lt, sed, c, info = sed_and_loop

    async def go():
        out = []
        for where in (info, sed.address):
            good = c.submit_nowait("add", 2, 3, server=where)
            bad = c.submit_nowait("add", "x", [1], server=where)
            await _until(lambda: good.done() and bad.done())
            out.append(await c.call("echo", good, server=where))
            with pytest.raises(gridrpc.DataLost, match="InvalidArgument"):
                await c.call("echo", bad, server=where)
        return out
    assert asyncio.run_coroutine_threadsafe(go(), lt.loop).result(30) == [5, 5]


def test_cancel_calls_waits_for_every_call_however_it_ends(sed_and_loop):
    """cancel_calls counts its calls down (a direct call's future tells it, a task
    gets a callback): it returns once all are over, also when two waits share
    calls, a call is listed twice, or one was answered before it was cancelled."""
    lt, sed, c, info = sed_and_loop

    async def go():
        quick = c.submit_nowait("add", 1, 1, server=info)
        assert await _until(lambda: quick.done())
        direct = [c.submit_nowait("sleep", 30, server=info) for _ in range(4)]
        tasks = [c.submit_nowait("sleep", 30, server=sed.address) for _ in range(2)]     # a name: a task each
        everything = direct + tasks + [quick, direct[0]]
        first, second = await asyncio.gather(c.cancel_calls(everything, timeout=20),
                                             c.cancel_calls(direct[:2], timeout=20))
        return first, second, [x.done() for x in everything], [x.cancelled() for x in direct + tasks], \
            await quick
    first, second, done, cancelled, two = lt.run(go())
    assert first == 7 and second == 2          # quick was over; direct[0] is listed twice
    assert all(done) and all(cancelled) and two == 2


@pytest.mark.parametrize("how", ["cancel_calls", "acancel"])
def test_a_call_cancelled_before_its_discovery_starts_leaves_it_serving_the_others(tree, how):
    """A direct call cancelled in the loop iteration it was submitted ends at
    once (it was still discovering); the discovery task it started must still
    serve the call that joined it and the next call of the service (it read the
    ended call's flight and died, leaving them waiting for ever)."""
    async def go():
        errors = []
        asyncio.get_running_loop().set_exception_handler(lambda _l, ctx: errors.append(ctx.get("exception")))
        async with gridrpc.AsyncClient(tree.ma_address) as c:
            first = c.submit_nowait("add", 1, 2)
            joined = c.submit_nowait("add", 3, 4)        # the same service: it joins first's discovery
            if how == "acancel":
                await first.acancel()
            else:
                await c.cancel_calls([first])
            got = await asyncio.wait_for(asyncio.shield(joined._task), 10)
            after = await asyncio.wait_for(c.call("add", 5, 6), 10)
            return first.cancelled(), got, after, dict(c._joining), errors
    cancelled, got, after, joining, errors = asyncio.run(go())
    assert cancelled and got == 7 and after == 11
    assert joining == {} and errors == []
