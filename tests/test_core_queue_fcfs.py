"""Pure tests of the SeD queue with the FCFS policy (gridrpc.core.queue).
The ethic policy has its own tests in tests/test_queue_ethic.py."""
import random

import pytest
from hypothesis import given, settings, strategies as st

from gridrpc.core.queue import (POLICIES, FCFSPolicy, Kill, Request, SedScheduler, Start,
                                make_policy)


def req(id, user="alice", submitted=0.0, optional=False, seq=0):
    return Request(id=id, user=user, service="sleep", optional=optional,
                   submitted=submitted, seq=seq)


def fcfs(max_concurrent=1):
    return SedScheduler(policy=FCFSPolicy(), max_concurrent=max_concurrent)


def started(actions):
    return [a.request_id for a in actions if isinstance(a, Start)]


def test_registered_by_name():
    assert POLICIES["fcfs"] is FCFSPolicy
    assert isinstance(make_policy("fcfs"), FCFSPolicy)
    with pytest.raises(ValueError, match="unknown queue policy 'lifo'"):
        make_policy("lifo")


def test_first_request_starts_at_once_others_wait():
    s = fcfs()
    assert s.submit(req("r1"), now=0.0) == [Start("r1")]
    assert s.submit(req("r2"), now=1.0) == []
    assert s.submit(req("r3"), now=2.0) == []
    assert list(s.running) == ["r1"] and s.running["r1"] == 0.0
    assert [r.id for r in s.waiting()] == ["r2", "r3"]
    assert s.statistics()["num_running"] == 1 and s.statistics()["num_waiting"] == 2


def test_finished_starts_the_next_in_arrival_order():
    s = fcfs()
    for i, rid in enumerate(["r1", "r2", "r3"]):
        s.submit(req(rid), now=float(i))
    assert s.finished("r1", now=5.0) == [Start("r2")]
    assert s.running == {"r2": 5.0}
    assert s.finished("r2", now=6.0) == [Start("r3")]
    assert s.finished("r3", now=7.0) == []
    assert s.running == {} and s.requests == {}


def test_order_follows_submitted_time_then_arrival():
    s = fcfs()
    s.submit(req("blocker", submitted=0.0), 0.0)
    s.submit(req("late", submitted=5.0), 0.0)
    s.submit(req("early", submitted=1.0), 0.0)
    s.submit(req("early-too", submitted=1.0), 0.0)       # same time: arrival (seq) decides
    order = []
    current = "blocker"
    for t in range(1, 4):
        (a,) = s.finished(current, float(t))
        current = a.request_id
        order.append(current)
    assert order == ["early", "early-too", "late"]


def test_max_concurrent():
    s = fcfs(max_concurrent=3)
    acts = []
    for i in range(5):
        acts += s.submit(req(f"r{i}"), now=float(i))
    assert started(acts) == ["r0", "r1", "r2"]
    assert len(s.running) == 3 and [r.id for r in s.waiting()] == ["r3", "r4"]
    assert s.finished("r1", 10.0) == [Start("r3")]
    assert set(s.running) == {"r0", "r2", "r3"}


def test_fcfs_never_preempts_running_requests():
    s = fcfs(max_concurrent=2)
    s.submit(req("a", submitted=10.0), 10.0)
    s.submit(req("b", submitted=11.0), 11.0)
    # a request claiming an earlier submission time must not push out running ones
    acts = s.submit(req("c", submitted=0.0), 12.0)
    assert acts == [] and set(s.running) == {"a", "b"}
    assert not any(isinstance(a, Kill) for a in s.finished("a", 13.0))


def test_cancel_waiting_request_removes_it_without_kill():
    s = fcfs()
    s.submit(req("r1"), 0.0)
    s.submit(req("r2"), 1.0)
    s.submit(req("r3"), 2.0)
    assert s.cancel("r2", 3.0) == []
    assert [r.id for r in s.waiting()] == ["r3"]
    assert s.finished("r1", 4.0) == [Start("r3")]       # r2 never starts


def test_cancel_running_request_kills_it_and_starts_the_next():
    s = fcfs()
    s.submit(req("r1"), 0.0)
    s.submit(req("r2"), 1.0)
    assert s.cancel("r1", 2.0) == [Kill("r1", "cancelled"), Start("r2")]
    assert s.running == {"r2": 2.0}


def test_cancel_unknown_or_finished_is_a_no_op():
    s = fcfs()
    s.submit(req("r1"), 0.0)
    s.finished("r1", 1.0)
    assert s.cancel("r1", 2.0) == [] and s.cancel("nope", 2.0) == []


def test_duplicate_ids_of_queued_or_running_requests_are_ignored():
    # ids of requests that ended are refused by SedCalls, the one record of the
    # ids a SeD has seen (tests/test_core_sed_calls.py)
    s = fcfs()
    assert s.submit(req("r1"), 0.0) == [Start("r1")]
    assert s.submit(req("r1", user="mallory"), 0.5) == []        # while running
    assert s.requests["r1"].user == "alice"
    s.submit(req("r2"), 1.0)
    assert s.submit(req("r2"), 1.5) == []                        # while waiting
    assert [r.id for r in s.waiting()] == ["r2"]
    assert s.finished("r1", 2.0) == [Start("r2")]
    assert s.finished("r2", 3.0) == [] and s.requests == {}


def test_allocation_accounting_per_user():
    s = fcfs(max_concurrent=2)
    s.submit(req("a1", user="alice"), 0.0)
    s.submit(req("b1", user="bob"), 1.0)
    s.submit(req("a2", user="alice"), 2.0)
    # running: a1 since 0, b1 since 1
    assert s.user_allocation(4.0) == {"alice": 4.0, "bob": 3.0}
    assert s.allocated == {}                                     # nothing closed yet
    s.finished("a1", 5.0)                                        # alice +5, a2 starts at 5
    assert s.allocated == {"alice": 5.0}
    assert s.user_allocation(6.0) == {"alice": 6.0, "bob": 5.0}  # 5 closed + 1 running
    s.cancel("b1", 7.0)                                          # killed work counts: bob +6
    assert s.allocated == {"alice": 5.0, "bob": 6.0}
    s.finished("a2", 9.0)                                        # alice +4
    assert s.allocated == {"alice": 9.0, "bob": 6.0}
    assert s.statistics()["allocated"] == {"alice": 9.0, "bob": 6.0}


def test_cancelled_waiting_request_costs_nothing():
    s = fcfs()
    s.submit(req("a1", user="alice"), 0.0)
    s.submit(req("b1", user="bob"), 0.0)
    s.cancel("b1", 10.0)
    assert "bob" not in s.allocated and "bob" not in s.user_allocation(10.0)


def test_finished_for_unknown_id_changes_nothing():
    s = fcfs()
    s.submit(req("r1"), 0.0)
    assert s.finished("ghost", 1.0) == []
    assert s.running == {"r1": 0.0} and s.allocated == {}


def test_statistics_snapshot():
    s = fcfs(max_concurrent=2)
    st_ = s.statistics()
    assert st_ == {"policy": "fcfs", "max_concurrent": 2, "num_running": 0, "num_waiting": 0,
                   "allocated": {}}
    st_["allocated"]["x"] = 1.0
    assert s.allocated == {}                               # a copy


def test_explicit_seq_is_kept():
    s = fcfs()
    s.submit(req("r1"), 0.0)
    s.submit(req("r2", seq=99), 0.0)
    s.submit(req("r3"), 0.0)
    assert s.requests["r2"].seq == 99 and s.requests["r3"].seq == 3


def test_policy_order_alone():
    p = FCFSPolicy()
    reqs = [req("w2", submitted=2.0, seq=3), req("run-late", submitted=9.0, seq=2),
            req("w1", submitted=1.0, seq=4), req("run-early", submitted=0.0, seq=1)]
    order = p.order(reqs, {"run-late": 5.0, "run-early": 3.0}, {}, 10.0, random.Random(0))
    assert [r.id for r in order] == ["run-early", "run-late", "w1", "w2"]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3),
       st.lists(st.tuples(st.sampled_from(["submit", "finish", "cancel"]), st.integers(0, 7)),
                max_size=40))
def test_property_fcfs_invariants(max_concurrent, events):
    s = fcfs(max_concurrent)
    starts: list[str] = []
    seen: set[str] = set()
    now = 0.0
    for kind, i in events:
        now += 1.0
        rid = f"r{i}"
        queue = [r.id for r in sorted(s.waiting(), key=lambda r: (r.submitted, r.seq))
                 if not (kind == "cancel" and r.id == rid)]
        if kind == "submit" and rid in seen:
            continue        # ids that were here are SedCalls' to refuse (test_core_sed_calls.py)
        if kind == "submit":
            seen.add(rid)
            queue.append(rid)
            acts = s.submit(req(rid, submitted=now), now)
        elif kind == "finish":
            acts = s.finished(rid, now) if rid in s.running else []
        else:
            acts = s.cancel(rid, now)
        assert not any(isinstance(a, Kill) and a.reason == "preempted" for a in acts)
        starts += started(acts)
        assert started(acts) == queue[: len(started(acts))]     # the head of the queue starts
        assert len(s.running) <= max_concurrent
        # work-conserving: a free slot never stays empty while requests wait
        assert len(s.running) == min(max_concurrent, len(s.requests))
    assert len(starts) == len(set(starts))                  # never started twice
    assert sum(s.user_allocation(now).values()) <= now * max_concurrent + 1e-9


# -- fair between users -----------------------------------------------------------------------
def test_a_flooding_user_does_not_make_another_wait_behind_the_flood():
    s = fcfs(1)
    for i in range(50):
        s.submit(req(f"m{i}", user="mallory", submitted=i * 0.001), i * 0.001)
    s.submit(req("a0", user="alice", submitted=1.0), 1.0)
    assert started(s.finished("m0", 2.0)) == ["a0"]          # alice's only call is next, not m1
    assert started(s.finished("a0", 3.0)) == ["m1"]


def test_round_robin_between_users_in_arrival_order_within_each():
    s = fcfs(2)
    for i in range(4):
        s.submit(req(f"m{i}", user="mallory", submitted=i), i)
    for i in range(2):
        s.submit(req(f"a{i}", user="alice", submitted=10 + i), 10 + i)
    s.submit(req("b0", user="bob", submitted=20), 20)
    order = []
    for t in range(30, 37):
        rid = sorted(s.running, key=s.running.get)[0]
        order += started(s.finished(rid, t))
    # m0, m1 run first; then a free slot goes to the user with the fewest running, and on ties to
    # the one whose turn came longest ago: alice, bob, mallory, alice, mallory
    assert order == ["a0", "b0", "m2", "a1", "m3"]


def test_policy_order_interleaves_users_by_round():
    p = FCFSPolicy()
    reqs = [req("m1", "mallory", 1.0, seq=2), req("m2", "mallory", 2.0, seq=3), req("a1", "alice", 3.0, seq=4),
            req("m0", "mallory", 0.0, seq=1)]
    order = p.order(reqs, {"m0": 0.5}, {}, 5.0, random.Random(0))
    assert [r.id for r in order] == ["m0", "a1", "m1", "m2"]


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 3),
       st.lists(st.tuples(st.sampled_from(["submit", "finish", "cancel"]), st.integers(0, 9),
                          st.sampled_from(["u1", "u2", "u3"])), max_size=60))
def test_property_a_start_goes_to_a_user_with_the_fewest_running(max_concurrent, events):
    """Whatever arrives, ends or is cancelled, a request starts only if no
    other user with a request waiting has fewer running, and within a user in
    arrival order."""
    s = fcfs(max_concurrent)
    seen: set[str] = set()
    now = 0.0
    for kind, i, user in events:
        now += 1.0
        rid = f"r{i}"
        before_running = {u: sum(1 for r in s.running if s.requests[r].user == u) for u in ("u1", "u2", "u3")}
        before_waiting = {r.user: r for r in sorted(s.waiting(), key=lambda r: (r.submitted, r.seq))[::-1]}
        if kind == "submit":
            if rid in seen:
                continue
            seen.add(rid)
            acts = s.submit(req(rid, user=user, submitted=now), now)
            before_waiting.setdefault(user, s.requests[rid])
        elif kind == "finish":
            if rid not in s.running:
                continue
            done_user = s.requests[rid].user
            acts = s.finished(rid, now)
            before_running[done_user] -= 1
        else:
            acts = s.cancel(rid, now)
        for a in started(acts):
            u = s.requests[a].user
            assert before_waiting[u].id == a                       # the user's earliest waiting request
            others = [before_running[v] for v in before_waiting if v != u]
            assert all(before_running[u] <= n for n in others), (a, before_running)
            before_running[u] += 1
            del before_waiting[u]
        assert len(s.running) == min(max_concurrent, len(s.requests))
