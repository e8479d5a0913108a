"""The blocking Client runs a call's event loop on the caller's thread when
no other thread runs it (gridrpc.client.sync): no hand-off to its background
thread and back. Pinned here: the loop really runs on the caller's thread;
the background thread takes over what is handed to it and parks when nothing
is in progress; several threads calling at once; timeouts; Ctrl-C."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import gridrpc
from gridrpc.testing import LocalTree, wait_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def tree():
    with LocalTree(las=0, seds_under_ma=1, http=False, sed_options={"max_concurrent": 8}) as t:
        yield t


def parked(c: gridrpc.Client) -> bool:
    """No thread runs the client's loop."""
    return not c._baton.locked()


def loop_threads(c: gridrpc.Client, fn) -> set[str]:
    """The names of the threads that waited on the client's loop while ``fn`` ran."""
    seen: set[str] = set()
    sel = c._loop.selector
    plain = type(sel).select

    def select(timeout=None):
        seen.add(threading.current_thread().name)
        return plain(sel, timeout)
    sel.select = select
    try:
        fn()
    finally:
        del sel.select
    return seen


def test_a_call_runs_the_loop_on_the_callers_thread(tree):
    with gridrpc.Client(tree.ma_address) as c:
        wait_for(lambda: parked(c), 10, "the background thread parked after start")
        results: list = []
        seen = loop_threads(c, lambda: results.extend(c.call("add", i, 1) for i in range(20)))
        assert results == [i + 1 for i in range(20)]
        assert seen == {threading.current_thread().name}, seen
        h = c.handle("add", server=c.discover("add", 1)[0].name)     # discover: on the background thread
        wait_for(lambda: parked(c), 10, "the background thread parked after discover")
        seen = loop_threads(c, lambda: results.extend(h(i, 2) for i in range(20)))
        assert results[20:] == [i + 2 for i in range(20)]
        assert seen == {threading.current_thread().name}, seen
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler      # put back after each call


def test_submitted_calls_progress_on_the_background_thread_then_it_parks(tree):
    with gridrpc.Client(tree.ma_address) as c:
        calls = [c.submit("sleep", 0.2) for _ in range(4)]
        done, pending = gridrpc.wait(calls, timeout=20)                # nobody runs the loop but its thread
        assert not pending and [x.result() for x in calls] == [0.2] * 4
        wait_for(lambda: parked(c), 10, "the background thread parked once the calls ended")
        # a blocking call while a submitted one runs: handed to the background thread, both end
        slow = c.submit("sleep", 0.5)
        wait_for(lambda: not parked(c) or slow.done(), 5, "the background thread running the submitted call")
        assert c.call("add", 2, 3) == 5 and slow.result(timeout=20) == 0.5


def test_several_threads_call_at_once(tree):
    with gridrpc.Client(tree.ma_address) as c:
        out: dict[int, list] = {}
        errors: list = []

        def worker(k: int) -> None:
            try:
                out[k] = [c.call("add", k, i) for i in range(30)]
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                errors.append(exc)
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors and not any(t.is_alive() for t in threads)
        assert out == {k: [k + i for i in range(30)] for k in range(4)}
        wait_for(lambda: parked(c), 10, "the background thread parked after the threads' calls")
        assert c.call("add", 1, 1) == 2


def test_timeout_of_a_call_on_the_callers_thread(tree):
    with gridrpc.Client(tree.ma_address, timeout=0.5) as c:
        wait_for(lambda: parked(c), 10, "the background thread parked after start")
        t0 = time.monotonic()
        with pytest.raises(gridrpc.Timeout):
            c.call("sleep", 10)
        assert time.monotonic() - t0 < 5
        assert c.call("add", 1, 2) == 3


def test_ctrl_c_during_a_call_on_the_callers_thread(tree):
    sed = tree.seds[0]
    with gridrpc.Client(tree.ma_address) as c:
        wait_for(lambda: parked(c), 10, "the background thread parked after start")
        before = tree.lt.call(lambda: sed.stats["cancelled"])
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))      # a real Ctrl-C
        timer.start()
        t0 = time.monotonic()
        try:
            with pytest.raises(KeyboardInterrupt):
                c.call("sleep", 30)
        finally:
            timer.cancel()
        assert time.monotonic() - t0 < 5
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        wait_for(lambda: tree.lt.call(lambda: sed.stats["cancelled"]) > before, 10, "the call cancelled on the SeD")
        assert c.call("add", 1, 2) == 3
