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


def test_an_arrival_to_an_idle_fcfs_queue_starts_during_a_pause():
    """What resume would start is that request: an arrival-ordered queue that nothing else
    touched during the pause starts it at once (its call reaches the worker before the end of
    the read); a second arrival with no free slot waits, as does any arrival once something else
    changed the queue in the pause, and a policy that may reorder (ethic) always waits."""
    q = _fcfs(2)
    q.pause()
    assert q.submit(_req("a", t=0), 0) == [Start("a")]
    assert q.submit(_req("b", t=1), 1) == [Start("b")]          # a slot for each: same as resume
    assert q.submit(_req("c", t=2), 2) == []                    # no slot: waits
    assert q.running == {"a": 0, "b": 1}
    assert q.resume(3) == []                                    # nothing left to start
    q.pause()
    assert q.cancel("a", 4) == [Kill("a", "cancelled")]         # the queue changed in this pause
    assert q.submit(_req("d", t=5), 5) == []                    # so every start waits for resume
    assert q.resume(6) == [Start("c")]
    q3 = _fcfs(2)                                               # a slot freed by a cancel in this read:
    q3.submit(_req("x", t=0), 0)
    q3.submit(_req("y", t=0), 0)
    q3.pause()
    assert q3.cancel("x", 1) == [Kill("x", "cancelled")]
    assert q3.submit(_req("z", t=1), 1) == []                   # z waits for resume (the SeD's cancel grace)
    assert q3.resume(2) == [Start("z")]
    q2 = _fcfs(1)
    q2.pause()
    assert q2.cancel("zz", 0) == []                             # unknown id: nothing changed
    assert q2.submit(_req("e", t=1), 1) == [Start("e")]
    ethic = SedScheduler(policy=EthicPolicy(), max_concurrent=1)
    ethic.pause()
    assert ethic.submit(_req("m", user="a"), 0.0) == []         # ethic ranks the whole batch at resume
    assert ethic.resume(0.0) == [Start("m")]


def test_early_starts_give_the_order_resume_would_give():
    """Random batches of arrivals and cancels: a FCFS queue that starts early gives the same
    starts, in the same order, as the same policy ranked whole at each resume (the full sort,
    no early start), apart from a request cancelled in the batch it arrived in (it may have
    started early, then been killed)."""
    import random
    from gridrpc.core.queue import FCFSPolicy

    class Sorted(FCFSPolicy):
        arrival_order = False           # the full sort at resume: no early start

    rng = random.Random(7)
    for trial in range(300):
        n = rng.randint(1, 3)
        early, whole = _fcfs(n), SedScheduler(policy=Sorted(), max_concurrent=n)
        starts: dict = {"early": [], "whole": []}
        t, pending = 0.0, []
        for batch in range(rng.randint(1, 6)):
            ops = []
            for k in range(rng.randint(1, 6)):
                t += 1
                if pending and rng.random() < 0.3:
                    ops.append(("cancel", pending.pop(rng.randrange(len(pending))), t))
                else:
                    pending.append(f"r{batch}-{k}")
                    ops.append(("submit", pending[-1], t))
            for name, q in (("early", early), ("whole", whole)):
                q.pause()
                for op, rid, when in ops:
                    out = q.submit(_req(rid, t=when), when) if op == "submit" else q.cancel(rid, when)
                    starts[name] += [a.request_id for a in out if isinstance(a, Start)]
                starts[name] += [a.request_id for a in q.resume(t) if isinstance(a, Start)]
        assert early.running.keys() == whole.running.keys()
        assert [r for r in starts["early"] if r in set(starts["whole"])] == starts["whole"]
