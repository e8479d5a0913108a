"""WorkerPool.send_ahead: the next call waits in the pipe of the worker
running the current one and starts as soon as that one has answered —
before the server has read the answer (a worker kept hot). The server then
starts it (start_now: nothing sent again) or withdraws it (kill). Real
worker processes."""
from __future__ import annotations

import asyncio
import time

import numpy as np

from gridrpc.sed.workers import WorkerGone, WorkerPool

from tests.worker_services import BASE, mark, ran, stubborn


def _size(a):
    return int(np.asarray(a).size)


SERVICES = {**BASE, "mark": mark, "size": _size, "stubborn": stubborn}


def _cb(got: list, name: str):
    return lambda v, e: got.append((name, v, e))


async def _until(pred, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.002)



def _running_with_one_behind(pool, path, seconds: float) -> list:
    """Call "a" (marks 0 after ``seconds``) running, "b" (marks 1) sent ahead behind it: what ends, as it ends."""
    got: list = []
    assert pool.start_now("a", "mark", [path, 0, seconds], {}, _cb(got, "a"))
    assert pool.send_ahead("b", "mark", [path, 1, 0.0], {}, after="a")
    return got


async def _start_or_run(pool, call_id: str, service: str, args: list, got: list) -> None:
    """As the SeD starts a call: on an idle worker, else (none idle) waiting in run() for one."""
    if not pool.start_now(call_id, service, args, {}, _cb(got, call_id)):
        got.append((call_id, await pool.run(call_id, service, args, {}), None))


def _run(coro_fn, services: dict = SERVICES, size: int = 1, **pool_kw):
    async def go():
        pool = WorkerPool(services, size=size, prestart=1, **pool_kw)
        pool.start()
        try:
            return await coro_fn(pool)
        finally:
            await pool.aclose()
    return asyncio.run(go())


def test_the_call_sent_ahead_runs_when_the_first_ends_and_is_not_sent_again(tmp_path):
    path = str(tmp_path / "ran")

    async def body(pool):
        got = _running_with_one_behind(pool, path, 0.3)
        served = pool.workers[0].served
        await _until(lambda: len(ran(path)) == 2)     # b ran with nobody starting it
        await _until(lambda: got)
        assert got == [("a", (True, 0), None)]
        assert pool.start_now("b", "mark", [path, 1, 0.0], {}, _cb(got, "b"))   # its answer was kept
        await _until(lambda: len(got) == 2)
        return got, served, pool.workers[0].served, dict(pool.by_call), dict(pool.ahead), len(pool.idle)

    got, served, served_after, by_call, ahead, idle = _run(body)
    assert got[1] == ("b", (True, 1), None)
    assert served == served_after == 2               # two calls through the pipe, b once
    assert by_call == {} and ahead == {} and idle == 1
    assert ran(path) == [0, 1]


def test_started_before_it_ends_its_answer_goes_to_the_starter(tmp_path):
    async def body(pool):
        got: list = []
        assert pool.start_now("a", "sleep", [0.05], {}, _cb(got, "a"))
        assert pool.send_ahead("b", "sleep", [0.3], {}, after="a")
        await _until(lambda: got)
        assert pool.start_now("b", "sleep", [0.3], {}, _cb(got, "b"))   # b is running: confirmed only
        await _until(lambda: len(got) == 2)
        return got, pool.workers[0].served

    got, served = _run(body)
    assert got == [("a", (True, "slept"), None), ("b", (True, "slept"), None)] and served == 2


def test_a_call_withdrawn_before_it_starts_never_runs_and_the_first_is_untouched(tmp_path):
    path = str(tmp_path / "ran")

    async def body(pool):
        got = _running_with_one_behind(pool, path, 0.4)
        await asyncio.sleep(0.1)
        assert pool.kill("b")                       # withdrawn while a runs
        await _until(lambda: got)
        await _until(lambda: len(pool.idle) == 1)   # b's "interrupted" answer read and thrown away
        after = []
        assert pool.start_now("c", "add", [2, 2], {}, _cb(after, "c"))
        await _until(lambda: after)
        await asyncio.sleep(0.1)
        return got, after, pool.spawned, pool.killed

    got, after, spawned, killed = _run(body, interrupt_grace=2.0)
    assert got == [("a", (True, 0), None)]
    assert after == [("c", (True, 4), None)]
    assert spawned == 1 and killed == 0             # the same worker, never killed
    assert ran(path) == [0]      # b never ran


def test_killing_the_running_call_leaves_the_one_sent_ahead_to_run(tmp_path):
    path = str(tmp_path / "ran")

    async def body(pool):
        got: list = []
        assert pool.start_now("a", "sleep", [5], {}, _cb(got, "a"))
        assert pool.send_ahead("b", "mark", [path, 1, 0.0], {}, after="a")
        await asyncio.sleep(0.1)
        assert pool.kill("a")
        await _until(lambda: ran(path))              # b ran after a was interrupted
        assert pool.start_now("b", "mark", [path, 1, 0.0], {}, _cb(got, "b"))
        await _until(lambda: len(got) == 2)
        return got, pool.spawned

    got, spawned = _run(body, interrupt_grace=2.0)
    assert got[0][0] == "a" and got[0][1] is None and isinstance(got[0][2], WorkerGone) and got[0][2].killed
    assert got[1] == ("b", (True, 1), None) and spawned == 1


def test_a_worker_that_dies_forgets_the_call_sent_ahead_which_runs_when_started(tmp_path):
    async def body(pool):
        got: list = []
        assert pool.start_now("a", "exit", [], {}, _cb(got, "a"))
        assert pool.send_ahead("b", "add", [1, 2], {}, after="a")
        await _until(lambda: got)
        assert "b" not in pool.by_call and pool.ahead == {}
        # no idle worker to start it on: as the SeD does then, run() waits for a fresh one
        assert not pool.start_now("b", "add", [1, 2], {}, _cb(got, "b"))
        got.append(("b", await pool.run("b", "add", [1, 2], {}), None))
        return got, pool.spawned, pool.died

    got, spawned, died = _run(body)
    assert got[0][0] == "a" and isinstance(got[0][2], WorkerGone) and not got[0][2].killed
    assert got[1] == ("b", (True, 3), None)
    assert spawned == 2 and died == 1


def test_what_is_not_sent_ahead():
    async def body(pool):
        got: list = []
        out = {"idle worker": pool.send_ahead("x", "add", [1, 2], {}, after="nobody")}
        assert pool.start_now("a", "sleep", [0.3], {}, _cb(got, "a"))
        out["an array (out-of-band buffer)"] = pool.send_ahead("b", "size", [np.zeros(10)], {}, after="a")
        out["too large for the pipe"] = pool.send_ahead("b", "add", ["x" * 20000, ""], {}, after="a")
        out["unpicklable"] = pool.send_ahead("b", "add", [lambda: 1, 1], {}, after="a")
        out["a small call"] = pool.send_ahead("b", "add", [1, 2], {}, after="a")
        out["a second one"] = pool.send_ahead("c", "add", [1, 2], {}, after="a")
        out["after the one sent ahead"] = pool.send_ahead("c", "add", [1, 2], {}, after="b")
        await _until(lambda: got)
        assert pool.start_now("b", "add", [1, 2], {}, _cb(got, "b"))
        await _until(lambda: len(got) == 2)
        return out, got

    out, got = _run(body)
    assert out == {"idle worker": False, "an array (out-of-band buffer)": False, "too large for the pipe": False,
                   "unpicklable": False, "a small call": True, "a second one": False,
                   "after the one sent ahead": False}
    assert got[1] == ("b", (True, 3), None)


def test_no_call_is_sent_ahead_without_interrupts():
    """Withdrawing one would need killing the worker, and the call before it with it."""
    async def body(pool):
        got: list = []
        assert pool.start_now("a", "sleep", [0.1], {}, _cb(got, "a"))
        sent = pool.send_ahead("b", "add", [1, 2], {}, after="a")
        await _until(lambda: got)
        return sent

    assert _run(body, interrupt_grace=0) is False


def test_withdrawing_the_call_behind_a_long_one_does_not_cut_the_long_one(tmp_path):
    """The grace to stop a withdrawn call counts from when the worker reaches it."""
    path = str(tmp_path / "ran")

    async def body(pool):
        got = _running_with_one_behind(pool, path, 1.0)   # 1 s > the 0.2 s grace
        await asyncio.sleep(0.05)
        assert pool.kill("b")
        await _until(lambda: got)
        await _until(lambda: len(pool.idle) == 1)
        await asyncio.sleep(0.3)
        return got, pool.spawned, pool.killed

    got, spawned, killed = _run(body, interrupt_grace=0.2)
    assert got == [("a", (True, 0), None)]
    assert spawned == 1 and killed == 0
    assert ran(path) == [0]


def test_withdrawing_the_call_behind_then_killing_the_running_one(tmp_path):
    """Two words (stop, skip) name both: the running call is interrupted, the one behind never runs,
    the worker serves on (a cancelled queued call, then the running one: tests/test_tree_calls.py)."""
    path = str(tmp_path / "ran")

    async def body(pool):
        got = _running_with_one_behind(pool, path, 5.0)
        await asyncio.sleep(0.05)
        assert pool.kill("b") and pool.kill("a")
        after: list = []
        await _start_or_run(pool, "c", "add", [1, 1], after)
        await _until(lambda: after)
        await asyncio.sleep(0.2)
        return got, after, dict(pool.by_call), pool.killed

    got, after, by_call, killed = _run(body, interrupt_grace=2.0)
    assert len(got) == 1 and got[0][0] == "a" and isinstance(got[0][2], WorkerGone) and got[0][2].killed
    assert after == [("c", (True, 2), None)] and by_call == {} and killed == 0
    assert ran(path) == []


def test_killing_the_running_call_then_withdrawing_the_one_behind(tmp_path):
    path = str(tmp_path / "ran")

    async def body(pool):
        got = _running_with_one_behind(pool, path, 5.0)
        await asyncio.sleep(0.05)
        assert pool.kill("a") and pool.kill("b")
        await _until(lambda: len(pool.idle) == 1)
        after: list = []
        assert pool.start_now("c", "add", [1, 1], {}, _cb(after, "c"))
        await _until(lambda: after)
        await asyncio.sleep(0.2)
        return got, after, dict(pool.by_call), pool.killed, pool.spawned

    got, after, by_call, killed, spawned = _run(body, interrupt_grace=2.0)
    assert [(name, v, type(e), e.killed) for name, v, e in got] == [("a", None, WorkerGone, True)]   # b: nothing
    assert after == [("c", (True, 2), None)] and by_call == {} and killed == 0 and spawned == 1
    assert ran(path) == []


def _v1():
    return 1


def _v2():
    return 2


def test_a_call_sent_ahead_runs_the_service_as_it_is_when_it_starts(tmp_path):
    """New services while a call waits in the old worker's pipe: it is withdrawn, and sent again to a
    worker forked with the new ones when it starts."""
    services = dict(SERVICES, v=_v1)

    async def body(pool):
        got: list = []
        assert pool.start_now("a", "sleep", [0.3], {}, _cb(got, "a"))
        assert pool.send_ahead("b", "v", [], {}, after="a")
        services["v"] = _v2
        pool.services_changed()
        await _until(lambda: got)
        await _start_or_run(pool, "b", "v", [], got)
        await _until(lambda: len(got) == 2)
        return got

    got = _run(body, services, size=2, interrupt_grace=2.0)
    assert got == [("a", (True, "slept"), None), ("b", (True, 2), None)]


def test_a_call_started_behind_a_cancelled_one_goes_to_another_worker():
    """The SeD cancels the running call, then starts the one sent ahead, before the first has answered
    its interrupt: if that worker is killed (the interrupt not honoured in time), the second, which never
    began, must not die with it (found in review: it failed as worker_died)."""
    async def body(pool):
        got: list = []
        assert pool.start_now("a", "stubborn", [2.0], {}, _cb(got, "a"))
        assert pool.send_ahead("b", "add", [1, 2], {}, after="a")
        await asyncio.sleep(0.1)
        assert pool.kill("a")
        await _start_or_run(pool, "b", "add", [1, 2], got)
        await _until(lambda: len(got) == 2)
        return got, dict(pool.by_call), pool.killed

    got, by_call, killed = _run(body, size=2, interrupt_grace=0.3)
    assert got[0][0] == "a" and isinstance(got[0][2], WorkerGone) and got[0][2].killed
    assert got[1] == ("b", (True, 3), None)
    assert by_call == {}


def test_withdrawing_a_call_whose_answer_came_early_leaves_no_record():
    async def body(pool):
        assert pool.start_now("a", "sleep", [0.05], {}, _cb([], "a"))
        assert pool.send_ahead("b", "add", [1, 2], {}, after="a")
        await _until(lambda: "b" in pool.ahead)
        assert pool.kill("b")
        await asyncio.sleep(0.05)
        return dict(pool.by_call), dict(pool.ahead)

    assert _run(body) == ({}, {})
