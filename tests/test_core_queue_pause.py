"""Pausing a queue (core.queue.SedScheduler.pause/resume): the messages of
a batch are taken as one, nothing starts in between."""
from __future__ import annotations

from gridrpc.core.queue import Kill, Request, SedScheduler, Start, make_policy
from gridrpc.core.queue_ethic import EthicPolicy
from gridrpc.core.sed_calls import CallRecord, Run, SedCalls, Stop


def _fcfs(n: int = 1) -> SedScheduler:
    return SedScheduler(policy=make_policy("fcfs"), max_concurrent=n)


def _req(i: str, user: str = "u", optional: bool = False, t: float = 0.0) -> Request:
    return Request(id=i, user=user, service="s", optional=optional, submitted=t)


def test_without_a_pause_each_cancel_starts_the_next_request():
    q = _fcfs()
    for i, t in (("a", 0), ("b", 1), ("c", 2)):
        q.submit(_req(i, t=t), t)
    assert q.cancel("a", 3) == [Kill("a", "cancelled"), Start("b")]
    assert q.cancel("b", 3) == [Kill("b", "cancelled"), Start("c")]      # b started for nothing


def test_a_paused_queue_starts_only_what_is_left_at_resume():
    q = _fcfs()
    for i, t in (("a", 0), ("b", 1), ("c", 2)):
        q.submit(_req(i, t=t), t)
    q.pause()
    assert q.cancel("a", 3) == [Kill("a", "cancelled")]
    assert q.cancel("b", 3) == []
    assert q.submit(_req("d", t=3), 3) == []
    assert q.running == {}
    assert q.resume(4) == [Start("c")]
    assert q.running == {"c": 4}
    assert q.resume(5) == []                    # nothing changed since


def test_preemption_waits_for_the_end_of_the_pause():
    q = SedScheduler(policy=EthicPolicy(), max_concurrent=1)
    q.submit(_req("opt", user="a", optional=True), 0.0)
    assert q.running == {"opt": 0.0}
    q.pause()
    assert q.submit(_req("mand", user="b"), 1.0) == []          # would kill "opt" at once otherwise
    assert q.running == {"opt": 0.0}
    actions = q.resume(1.0)
    assert Kill("opt", "preempted") in actions and Start("mand") in actions


def test_sed_calls_resume_reports_per_sed():
    calls = SedCalls({"s1": _fcfs(), "s2": _fcfs()})
    recs = {i: CallRecord(id=i, sed=sed, service="s", user="u", owner="o", received=0.0)
            for i, sed in (("a", "s1"), ("b", "s1"), ("x", "s2"), ("y", "s2"))}
    for r in recs.values():
        calls.submit(r, 0.0)
    calls.pause()
    prev, actions = calls.cancel("a", 1.0)
    assert prev == "running" and [type(a) for a in actions] == [Stop]
    prev, actions = calls.cancel("x", 1.0)
    assert prev == "running"
    out = dict(calls.resume(2.0))
    assert [a.call.id for a in out["s1"] if isinstance(a, Run)] == ["b"]
    assert [a.call.id for a in out["s2"] if isinstance(a, Run)] == ["y"]
    assert calls.state("b") == "running" and calls.state("y") == "running"
