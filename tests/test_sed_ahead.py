"""A SeD keeps its worker hot (docs/architecture.md, "A call, step by step"):
with one call running in an FCFS queue, the next queued call of an
idempotent service waits in the worker's pipe. Seen from a client nothing
changes: results, order, cancellation of queued calls (a call sent ahead
and cancelled never runs). Real SeD, worker processes and client."""
from __future__ import annotations

import time

import pytest

import gridrpc
from gridrpc.testing import LoopThread, example_sed, wait_for

from tests.worker_services import mark, ran, stubborn

pytestmark = pytest.mark.timeout(120)





class _SeD:
    def __init__(self, **kw):
        self.lt = LoopThread()
        self.sed = example_sed("s1", None, services=("add",), **kw)
        self.lt.run(self.sed.start())

    def add(self, name, fn, **kw):
        self.lt.call(lambda: self.sed.add_service(name, fn, **kw))

    @property
    def address(self):
        return f"{self.sed.address}#s1"

    def sent_ahead(self) -> int:
        return self.lt.call(lambda: self.sed.execution.statistics().get("sent_ahead", 0))

    def close(self):
        self.lt.run(self.sed.aclose())
        self.lt.close()


@pytest.fixture
def sed():
    s = _SeD()
    yield s
    s.close()


def test_many_calls_in_flight_keep_the_worker_hot_and_answer_right(sed):
    with gridrpc.Client(None) as c:
        calls = [c.submit("add", i, 1, server=sed.address) for i in range(400)]
        assert [x.result(timeout=60) for x in calls] == [i + 1 for i in range(400)]
    assert sed.sent_ahead() > 100          # most calls waited in the worker's pipe


def test_calls_run_once_each_in_arrival_order(sed, tmp_path):
    path = str(tmp_path / "ran")
    sed.add("mark", mark)
    with gridrpc.Client(None) as c:
        calls = [c.submit("mark", path, i, 0.01, server=sed.address) for i in range(30)]
        assert [x.result(timeout=60) for x in calls] == list(range(30))
    assert ran(path) == list(range(30))
    assert sed.sent_ahead() >= 20


def test_a_queued_call_sent_ahead_and_cancelled_never_runs(sed, tmp_path):
    path = str(tmp_path / "ran")
    sed.add("mark", mark)
    with gridrpc.Client(None) as c:
        first = c.submit("mark", path, 0, 0.6, server=sed.address)
        wait_for(lambda: ran(path) == [] and sed.lt.call(lambda: sed.sed.stats.get("received", 1) >= 0), 5, "")
        time.sleep(0.1)
        second = c.submit("mark", path, 1, 0.0, server=sed.address)
        wait_for(lambda: sed.sent_ahead() == 1, 5, "the second call sent ahead")
        second.cancel()
        with pytest.raises(Exception):
            second.result(timeout=10)
        assert first.result(timeout=10) == 0
        third = c.submit("add", 2, 2, server=sed.address)      # the same worker serves on
        assert third.result(timeout=10) == 4
    time.sleep(0.2)
    assert ran(path) == [0]


def test_a_non_idempotent_service_is_never_sent_ahead(sed, tmp_path):
    path = str(tmp_path / "ran")
    sed.add("mark", mark, idempotent=False)
    with gridrpc.Client(None) as c:
        calls = [c.submit("mark", path, i, 0.02, server=sed.address) for i in range(10)]
        assert [x.result(timeout=60) for x in calls] == list(range(10))
    assert sed.sent_ahead() == 0 and ran(path) == list(range(10))


def test_an_ethic_queue_decides_at_the_end_and_sends_nothing_ahead(tmp_path):
    s = _SeD(queue="ethic")
    try:
        with gridrpc.Client(None) as c:
            calls = [c.submit("add", i, 1, server=s.address) for i in range(100)]
            assert [x.result(timeout=60) for x in calls] == [i + 1 for i in range(100)]
        assert s.sent_ahead() == 0
    finally:
        s.close()


def test_the_call_queued_behind_a_cancelled_stubborn_one_still_runs(sed):
    """The running call ignores its interrupt past the grace (its worker is killed): the queued call,
    sent ahead to that worker, runs on another one (found in review: it failed as WorkerDied)."""
    sed.add("stubborn", stubborn)
    with gridrpc.Client(None) as c:
        first = c.submit("stubborn", 3.0, server=sed.address)
        time.sleep(0.3)
        second = c.submit("add", 2, 2, server=sed.address)
        wait_for(lambda: sed.sent_ahead() == 1, 5, "the second call sent ahead")
        first.cancel()
        assert second.result(timeout=20) == 4
