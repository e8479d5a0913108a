"""run_optional on a real in-process tree (ethic SeDs): results come back,
cleanup leaves no call on any SeD, failures and cancellation."""
from __future__ import annotations

import asyncio
import itertools
import time

import pytest

import gridrpc
from gridrpc.client.optional import _as_args, _classify, run_optional
from gridrpc.core.metrics import metrics_from_events
from gridrpc.testing import LocalTree, wait_for

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def tree():
    with LocalTree(las=1, seds_per_la=3, http=False, sed_options={"queue": "ethic"}) as t:
        yield t


def _no_calls_left(tree) -> bool:
    for sed in tree.seds:
        if sed.calls:
            return False
        for r in sed.replicas.values():
            if r.scheduler.requests or r.scheduler.running:
                return False
    return True


def test_results_returned_and_nothing_left(tree):
    with gridrpc.Client(tree.ma_address, user="alice") as c:
        t0 = time.monotonic()
        out = c.run_optional("sleep", mandatory=[0.05, 0.06, 0.07], optional=itertools.repeat(0.05),
                             deadline=0.6)
        elapsed = time.monotonic() - t0
    assert out.mandatory == [0.05, 0.06, 0.07]          # in the order given
    assert out.ok and not out.errors
    assert out.optional and all(args == 0.05 and value == 0.05 for args, value in out.optional)
    assert len(out) == 3 + len(out.optional)
    assert 0.55 <= elapsed < 10
    # the user stayed until the deadline, then cancelled what was still running
    assert out.statistics["phase"] == "finished" and out.statistics["outstanding"] == 0
    wait_for(lambda: _no_calls_left(tree), 5, "every SeD queue empty")
    m = metrics_from_events(out.events, 3)
    assert m.unhappy_users == 0
    assert m.completed == 3 + len(out.optional)


def test_finite_optional_ends_early(tree):
    with gridrpc.Client(tree.ma_address, user="bob") as c:
        t0 = time.monotonic()
        out = c.run_optional("add", mandatory=[(1, 2)], optional=[(i, i) for i in range(5)], deadline=30)
        assert time.monotonic() - t0 < 10                # nothing left to do: no wait for the deadline
    assert out.mandatory == [3]
    assert sorted(v for _, v in out.optional) == [0, 2, 4, 6, 8]


def test_mandatory_failure_strict_and_not(tree):
    with gridrpc.Client(tree.ma_address, user="carol") as c:
        with pytest.raises(gridrpc.RemoteError) as info:
            c.run_optional("fail", mandatory=["boom"], optional=[], deadline=0.2)
        assert not info.value.partial.ok
        out = c.run_optional("fail", mandatory=["boom"], optional=[], deadline=0.2, strict=False)
    assert out.mandatory == [None] and isinstance(out.errors[0], gridrpc.RemoteError)
    assert not out.ok


def _running_optional(tree) -> set[str]:
    """Ids of the optional calls running on the SeDs right now."""
    return {cid for sed in tree.seds for cid, call in list(sed.calls.items())
            if call.optional and call.state == "running"}


def _counter(tree, key: str) -> int:
    return sum(sed.stats[key] for sed in tree.seds)


def _completed(tree) -> int:
    return sum(r.completed for sed in tree.seds for r in sed.replicas.values())


def test_cancelled_task_cancels_every_call(tree):
    long = 30.0                # far longer than the test may take: only a cancellation ends them
    seen: dict = {}

    async def main():
        async with gridrpc.AsyncClient(tree.ma_address, user="dave") as c:
            task = asyncio.ensure_future(c.run_optional("sleep", mandatory=[0.05],
                                                        optional=itertools.repeat(long), deadline=60))
            # wait until the long optional calls run on all three SeDs (their own state)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while len(_running_optional(tree)) < len(tree.seds):
                assert not task.done(), task
                assert loop.time() < deadline, f"long optional calls never ran: {_running_optional(tree)}"
                await asyncio.sleep(0.02)
            seen["running"] = _running_optional(tree)
            seen["cancelled"], seen["completed"] = _counter(tree, "cancelled"), _completed(tree)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    t0 = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - t0 < 10                   # did not wait for the long calls
    wait_for(lambda: _no_calls_left(tree), 5, "every SeD queue empty after cancellation")
    # emptied by cancel requests reaching the SeDs, not by the calls ending
    assert _counter(tree, "cancelled") - seen["cancelled"] >= len(seen["running"]) == len(tree.seds)
    assert _completed(tree) == seen["completed"]
    assert not seen["running"] & {cid for sed in tree.seds for cid in sed.calls}


def test_legacy_client_via_n_submit(tree):
    async def main():
        async with gridrpc.AsyncClient(tree.ma_address, user="erin") as c:
            return await c.run_optional("sleep", mandatory=[0.01] * 2, optional=itertools.repeat(0.01),
                                        deadline=20, n_submit=6)
    t0 = time.monotonic()
    out = asyncio.run(main())
    assert time.monotonic() - t0 < 15        # all 6 done: leaves before the deadline
    assert out.mandatory == [0.01, 0.01] and len(out.optional) == 4
    wait_for(lambda: _no_calls_left(tree), 5, "every SeD queue empty")


def test_bad_arguments(tree):
    with gridrpc.Client(tree.ma_address) as c:
        with pytest.raises(ValueError):
            c.run_optional("sleep", mandatory=[0.1], deadline=-1)
        with pytest.raises(gridrpc.GridRPCError):
            c.run_optional("no-such-service", mandatory=[1], deadline=1)


def test_helpers():
    assert _as_args((1, 2)) == (1, 2) and _as_args(3) == (3,) and _as_args([1]) == ([1],)
    assert _classify(gridrpc.CallPreempted("x")) == ("killed", True)
    assert _classify(gridrpc.CallCancelled("x")) == ("cancelled", True)
    assert _classify(gridrpc.CommunicationError("x")) == ("failed", True)
    assert _classify(gridrpc.RemoteError("x")) == ("failed", False)
    with pytest.raises(ValueError):
        asyncio.run(run_optional(None, "s", [1], [], deadline=-0.5))


class _Done:
    """A finished call as :func:`_result` reads it (value or error)."""

    def __init__(self, value=None, exc=None):
        self._value, self._exc = value, exc
        self.id, self.server, self.optional = "c", "s", True
        self.timing = {"started": 1.0, "ended": 2.0}

    def done(self):
        return True

    def exception(self, _timeout):
        return self._exc

    def result(self, _timeout):
        return self._value


def test_result_that_won_the_race_with_the_cancel_is_kept():
    """At the deadline the run cancels what is outstanding; a call that had
    already finished on its server still brings its result: the user gets it,
    and the count agrees with the servers' events."""
    from gridrpc.client.optional import _result
    from gridrpc.core.dispatcher import Cancel, OptionalDispatcher, Submit

    disp = OptionalDispatcher([1], itertools.repeat(2), 10.0, ["s1", "s2"])
    subs = [a for a in disp.start(0.0) if isinstance(a, Submit)]
    mand = next(a for a in subs if not a.optional)
    disp.on_done(mand.key, True, 1.0)
    cancels = [a for a in disp.on_tick(11.0) if isinstance(a, Cancel)]
    assert cancels                                           # optional calls were outstanding
    calls = {s.key: _Done(value=s.args) for s in subs}
    lost = cancels[0].key
    calls[lost] = _Done(exc=gridrpc.CallCancelled("cancelled"))   # this one really was cancelled
    out = _result(None, disp, calls, 1, strict=True)
    assert out.mandatory == [1]
    assert len(out.optional) == len(cancels) - 1 and all(v == 2 for _, v in out.optional)
