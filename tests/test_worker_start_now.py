"""WorkerPool.start_now: a call handed to an idle worker from the current
loop callback, its end reported by a plain callback (no task, no future) —
real worker processes. The SeD starts the next call of a queue from the
callback that read the previous call's answer (docs/architecture.md,
"A call, step by step")."""
from __future__ import annotations

import asyncio
import os
import time

from gridrpc.sed.workers import WorkerGone, WorkerPool

from tests.worker_services import BASE


SERVICES = BASE


async def _ended(pool: WorkerPool, call_id: str, service: str, *args, timeout: float = 10.0):
    got: list = []
    started = pool.start_now(call_id, service, list(args), {}, lambda v, e: got.append((v, e)))
    assert started
    deadline = time.monotonic() + timeout
    while not got and time.monotonic() < deadline:
        await asyncio.sleep(0.002)
    return got


def test_an_idle_worker_runs_the_call_and_the_callback_gets_its_result():
    async def go():
        pool = WorkerPool(SERVICES, size=1, prestart=1)
        pool.start()
        try:
            results = [await _ended(pool, f"c{i}", "add", i, 1) for i in range(20)]
            return results, dict(pool.by_call), len(pool.idle), pool.spawned
        finally:
            await pool.aclose()
    results, by_call, idle, spawned = asyncio.run(go())
    assert results == [[((True, i + 1), None)] for i in range(20)]       # once each, in order
    assert by_call == {} and idle == 1 and spawned == 1                  # one worker, kept, free again


def test_no_idle_worker_means_not_started_and_nothing_done():
    async def go():
        pool = WorkerPool(SERVICES, size=1, prestart=1)
        pool.start()
        try:
            busy = asyncio.ensure_future(pool.run("long", "sleep", [0.3], {}))
            await asyncio.sleep(0.05)
            got: list = []
            started = pool.start_now("c", "add", [1, 2], {}, lambda v, e: got.append((v, e)))
            waited = await busy
            return started, got, dict(pool.by_call), waited
        finally:
            await pool.aclose()
    started, got, by_call, waited = asyncio.run(go())
    assert started is False and got == [] and by_call == {}
    assert waited == (True, "slept")


def test_a_call_stopped_by_kill_reports_a_killed_worker_gone_once():
    async def go():
        pool = WorkerPool(SERVICES, size=1, prestart=1, interrupt_grace=2.0)
        pool.start()
        try:
            got: list = []
            assert pool.start_now("k", "sleep", [5], {}, lambda v, e: got.append((v, e)))
            await asyncio.sleep(0.1)
            assert pool.kill("k")
            assert not pool.kill("k")
            for _ in range(500):                   # interrupted: free again once it has answered
                if pool.idle:
                    break
                await asyncio.sleep(0.01)
            after = await _ended(pool, "next", "add", 2, 2)           # the same worker serves on
            return got, after, pool.spawned
        finally:
            await pool.aclose()
    got, after, spawned = asyncio.run(go())
    assert len(got) == 1 and got[0][0] is None
    assert isinstance(got[0][1], WorkerGone) and got[0][1].killed
    assert after == [((True, 4), None)] and spawned == 1


def test_a_worker_that_dies_reports_worker_gone_and_is_replaced():
    async def go():
        pool = WorkerPool(SERVICES, size=1, prestart=1)
        pool.start()
        try:
            died = await _ended(pool, "d", "exit")
            later = await pool.run("after", "add", [1, 1], {})
            return died, later, pool.died
        finally:
            await pool.aclose()
    died, later, n_died = asyncio.run(go())
    assert len(died) == 1 and died[0][0] is None
    exc = died[0][1]
    assert isinstance(exc, WorkerGone) and not exc.killed and exc.exitcode == 3
    assert later == (True, 2) and n_died == 1


def test_arguments_that_cannot_reach_the_worker_fail_the_call_at_once():
    async def go():
        pool = WorkerPool(SERVICES, size=1, prestart=1)
        pool.start()
        try:
            got: list = []
            started = pool.start_now("u", "add", [lambda: 1, 2], {}, lambda v, e: got.append((v, e)))
            ok = await _ended(pool, "v", "add", 1, 2)                 # the worker is free again
            return started, got, ok
        finally:
            await pool.aclose()
    started, got, ok = asyncio.run(go())
    assert started is True
    assert len(got) == 1 and got[0][1] is None
    assert got[0][0][0] is False and "cannot pass the arguments" in got[0][0][1][1]
    assert ok == [((True, 3), None)]


def test_a_bug_in_the_callback_is_logged_and_the_pool_serves_on(caplog):
    async def go():
        pool = WorkerPool(SERVICES, size=1, prestart=1)
        pool.start()
        try:
            def bad(v, e):
                raise RuntimeError("callback bug")
            assert pool.start_now("b", "add", [1, 1], {}, bad)
            await asyncio.sleep(0.3)
            return await _ended(pool, "c", "add", 5, 5)
        finally:
            await pool.aclose()
    assert asyncio.run(go()) == [((True, 10), None)]
    assert "handling the end of call b failed" in caplog.text


def test_close_ends_a_started_call_as_killed():
    async def go():
        pool = WorkerPool(SERVICES, size=1, prestart=1)
        pool.start()
        got: list = []
        assert pool.start_now("z", "sleep", [5], {}, lambda v, e: got.append((v, e)))
        await asyncio.sleep(0.05)
        pids = pool.pids()
        await pool.aclose()
        return got, pids
    got, pids = asyncio.run(go())
    assert len(got) == 1 and isinstance(got[0][1], WorkerGone) and got[0][1].killed
    for pid in pids:                       # no worker left behind
        try:
            os.kill(pid, 0)
            alive = os.waitpid(pid, os.WNOHANG) == (0, 0)
        except (ProcessLookupError, ChildProcessError):
            alive = False
        assert not alive, pid


def test_a_sed_hands_its_queued_calls_to_the_worker_without_a_task_each(monkeypatch):
    import gridrpc
    from gridrpc.sed.calls.receive import CallsMixin
    from gridrpc.testing import LocalTree
    tasks = []
    orig = CallsMixin._execute

    def counted(self, call):
        tasks.append(call.id)
        return orig(self, call)
    monkeypatch.setattr(CallsMixin, "_execute", counted)
    with LocalTree(las=0, seds_per_la=0, seds_under_ma=1, sed_options={"max_concurrent": 1}) as t:
        server = t.sed_names()[0]

        async def go():
            async with gridrpc.AsyncClient(t.ma_address, user="sn") as c:
                h = c.handle("add", server=server)
                return await asyncio.gather(*(h(i, 1) for i in range(100)))
        assert t.lt.run(go(), timeout=60) == [i + 1 for i in range(100)]
        assert t.lt.call(lambda: len(t.seds[0].calls)) == 0
    assert tasks == []          # every call reached the worker from a loop callback, none from a task


def test_an_end_the_pool_never_gives_is_still_an_answer_not_a_lost_call():
    """start_now's callback maps any exception to an outcome (the task path answers a back-end
    bug as "internal"): a call is never left running unanswered."""
    from gridrpc.sed.backends.local import ProcessBackend

    class _Pool:
        def start_now(self, call_id, service, args, kwargs, done):
            done(None, RuntimeError("not a WorkerGone"))
            return True

    class _Call:
        id, service, args, kwargs = "x", "add", [1], {}
    got = []
    be = ProcessBackend()
    be.pool = _Pool()
    assert be.start_now(_Call(), got.append)
    assert len(got) == 1 and got[0].ok is False and got[0].kind == "internal"
    assert got[0].error[0] == "RuntimeError"
