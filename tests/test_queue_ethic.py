"""Pure tests of the DIET-ethic queue policy, alone and through SedScheduler."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from gridrpc.core.queue import Kill, Request, SedScheduler, Start, make_policy, POLICIES
from gridrpc.core.queue_ethic import EthicPolicy


def req(id, user="a", optional=False, submitted=0.0, seq=0):
    return Request(id=id, user=user, service="sleep", optional=optional,
                   submitted=submitted, seq=seq)


def ids(order):
    return [r.id for r in order]


def reevaluate(sched: SedScheduler, now: float):
    """Re-run the scheduler without an event (what a runtime does at
    EthicPolicy.next_wakeup). Uses SedScheduler.tick if it exists."""
    tick = getattr(sched, "tick", None)
    return tick(now) if tick else sched._reschedule(now)


# -- registration ------------------------------------------------------------
def test_registered_and_made_by_name():
    p = make_policy("ethic")
    assert isinstance(p, EthicPolicy)
    assert POLICIES["ethic"] is EthicPolicy
    assert p.kill_grace == 0.0


def test_rejects_negative_grace():
    with pytest.raises(ValueError):
        EthicPolicy(kill_grace=-1)


# -- each rule on its own ----------------------------------------------------
def test_rule1_mandatory_before_optional():
    p = EthicPolicy()
    rs = [req("o", optional=True, submitted=0, seq=1), req("m", submitted=5, seq=2)]
    assert ids(p.order(rs, {}, {}, 10.0, random.Random(0))) == ["m", "o"]


def test_rule2_started_before_waiting_within_class():
    p = EthicPolicy()
    # optional: the running one first although its user got more
    rs = [req("o1", "rich", True, 0, 1), req("o2", "poor", True, 1, 2)]
    order = p.order(rs, {"o1": 0.0}, {"rich": 50.0, "poor": 0.0}, 10.0, random.Random(0))
    assert ids(order) == ["o1", "o2"]
    # mandatory: the running one first although submitted later
    rs = [req("m1", submitted=0, seq=1), req("m2", submitted=1, seq=2)]
    assert ids(p.order(rs, {"m2": 1.0}, {}, 10.0, random.Random(0))) == ["m2", "m1"]


def test_rule1_beats_rule2_waiting_mandatory_before_running_optional():
    p = EthicPolicy()
    rs = [req("o", optional=True, seq=1), req("m", submitted=3, seq=2)]
    assert ids(p.order(rs, {"o": 0.0}, {"a": 3.0}, 3.0, random.Random(0))) == ["m", "o"]


def test_rule3_mandatory_fcfs_then_seq_ignoring_allocation():
    p = EthicPolicy()
    rs = [req("late", "poor", submitted=2, seq=1), req("early", "rich", submitted=1, seq=3),
          req("early2", "poor", submitted=1, seq=4)]
    order = p.order(rs, {}, {"rich": 100.0, "poor": 0.0}, 5.0, random.Random(0))
    assert ids(order) == ["early", "early2", "late"]


def test_rule4_least_allocated_user_first_for_optional():
    p = EthicPolicy()
    rs = [req("x", "rich", True, 0, 1), req("y", "mid", True, 1, 2), req("z", "poor", True, 2, 3)]
    alloc = {"rich": 10.0, "mid": 5.0}          # poor: nothing yet
    for seed in range(20):
        assert ids(p.order(rs, {}, alloc, 3.0, random.Random(seed))) == ["z", "y", "x"]


def test_rule5_random_ties_depend_on_rng():
    p = EthicPolicy()
    rs = [req(f"o{i}", f"u{i}", True, 0, i + 1) for i in range(6)]
    firsts = {p.order(rs, {}, {}, 0.0, random.Random(seed))[0].id for seed in range(50)}
    assert len(firsts) > 1                        # different SeDs favour different users
    a = ids(p.order(rs, {}, {}, 0.0, random.Random(7)))
    b = ids(p.order(rs, {}, {}, 0.0, random.Random(7)))
    assert a == b                                 # but deterministic for a seed


def test_order_is_a_permutation():
    p = EthicPolicy()
    rs = [req("m", seq=1), req("o", "b", True, seq=2), req("m2", "b", seq=3)]
    out = p.order(rs, {"o": 0.0}, {}, 1.0, random.Random(0))
    assert sorted(ids(out)) == sorted(ids(rs))


# -- through SedScheduler ------------------------------------------------------
def sched(n=1, grace=0.0, seed=0):
    return SedScheduler(policy=EthicPolicy(kill_grace=grace), max_concurrent=n,
                        rng=random.Random(seed))


def test_new_mandatory_kills_running_optional():
    s = sched()
    assert s.submit(req("o1", "a", True, 0.0), 0.0) == [Start("o1")]
    actions = s.submit(req("m1", "b", False, 2.0), 2.0)
    assert actions == [Kill("o1", "preempted"), Start("m1")]
    assert s.running == {"m1": 2.0}
    assert "o1" not in s.requests                 # killed requests leave the queue
    assert s.allocated["a"] == 2.0                # killed work counts as allocated


def test_mandatory_never_preempts_mandatory():
    s = sched()
    s.submit(req("m1", "a", False, 0.0), 0.0)
    assert s.submit(req("m2", "b", False, 1.0), 1.0) == []
    assert s.finished("m1", 3.0) == [Start("m2")]


def test_waiting_optional_never_preempts_running_optional():
    s = sched()
    s.submit(req("o1", "a", True, 0.0), 0.0)
    s.allocated["a"] = 1000.0                     # user a is far ahead
    assert s.submit(req("o2", "b", True, 1.0), 1.0) == []
    assert list(s.running) == ["o1"]


def test_least_served_user_goes_first_when_slot_frees():
    s = sched()
    s.submit(req("m", "busy", False, 0.0), 0.0)
    s.submit(req("a1", "alice", True, 0.1), 0.1)
    s.submit(req("b1", "bob", True, 0.2), 0.2)
    s.finished("m", 1.0)                          # busy: 1 s; alice/bob: 0 -> random tie
    first = next(iter(s.running))
    assert first in ("a1", "b1")
    winner = "alice" if first == "a1" else "bob"
    loser_req = "b1" if first == "a1" else "a1"
    # the winner submits again; the loser (less served now) must go next
    s.submit(req(f"{winner}2", winner, True, 1.5), 1.5)
    assert s.finished(first, 2.0) == [Start(loser_req)]


def test_multiple_slots_mandatory_kills_most_served_optional():
    s = sched(n=2)
    s.submit(req("oa", "a", True, 0.0), 0.0)
    s.allocated["a"] = 10.0
    s.submit(req("ob", "b", True, 0.0), 0.0)
    assert set(s.running) == {"oa", "ob"}
    actions = s.submit(req("m", "c", False, 1.0), 1.0)
    assert actions == [Kill("oa", "preempted"), Start("m")]


def test_cancel_running_and_waiting():
    s = sched()
    s.submit(req("o1", "a", True, 0.0), 0.0)
    s.submit(req("o2", "b", True, 0.0), 0.0)
    assert s.cancel("o2", 0.5) == []
    assert s.cancel("o1", 1.0) == [Kill("o1", "cancelled")]
    assert not s.requests


def test_paper_scenario_two_users_share_optional_slots_fairly():
    """Each freed slot goes to the user who has received less (ties random)."""
    s = sched(seed=3)
    now = 0.0
    for i in range(6):
        s.submit(req(f"a{i}", "a", True, now), now)
        s.submit(req(f"b{i}", "b", True, now), now)
    counts = {"a": 0, "b": 0}
    for _ in range(8):
        rid = next(iter(s.running))
        user = s.requests[rid].user
        other = "b" if user == "a" else "a"
        assert counts[user] <= counts[other]        # never the better-served user
        counts[user] += 1
        now += 1.0
        s.finished(rid, now)
    assert counts == {"a": 4, "b": 4}


# -- kill_grace ------------------------------------------------------------------
def test_grace_delays_preemption_then_kills():
    s = sched(grace=2.0)
    s.submit(req("o1", "a", True, 0.0), 0.0)
    assert s.submit(req("m1", "b", False, 1.0), 1.0) == []       # within grace
    assert s.policy.next_wakeup(list(s.requests.values()), s.running, 1.0) == 3.0
    assert reevaluate(s, 2.5) == []
    assert reevaluate(s, 3.0) == [Kill("o1", "preempted"), Start("m1")]
    assert s.policy.next_wakeup(list(s.requests.values()), s.running, 3.0) is None


def test_grace_mandatory_takes_naturally_freed_slot_before_optionals():
    s = sched(grace=5.0)
    s.submit(req("o1", "a", True, 0.0), 0.0)
    s.submit(req("o2", "c", True, 0.0), 0.0)     # user c got nothing: would be next
    s.submit(req("m1", "b", False, 1.0), 1.0)
    assert s.finished("o1", 2.0) == [Start("m1")]


def test_grace_zero_is_paper_behaviour():
    p = EthicPolicy()
    assert p.next_wakeup([req("m", submitted=1.0)], {}, 1.0) is None


def test_next_wakeup_none_without_running_optional():
    p = EthicPolicy(kill_grace=2.0)
    rs = [req("m", submitted=1.0, seq=1), req("o", "b", True, seq=2)]
    assert p.next_wakeup(rs, {}, 1.0) is None
    assert p.next_wakeup(rs, {"o": 0.0}, 1.0) == 3.0


# -- invariants (hypothesis) -------------------------------------------------------
op = st.one_of(
    st.tuples(st.just("submit"), st.sampled_from("abc"), st.booleans()),
    st.tuples(st.just("finish"), st.integers(0, 10)),
    st.tuples(st.just("cancel"), st.integers(0, 40)),
    st.tuples(st.just("advance"), st.floats(0.0, 3.0)),
)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(op, max_size=60), n=st.integers(1, 3), seed=st.integers(0, 2**16),
       grace=st.sampled_from([0.0, 0.0, 1.5]))
def test_invariants(ops, n, seed, grace):
    s = sched(n=n, grace=grace, seed=seed)
    now, counter = 0.0, 0
    all_reqs = {}
    for o in ops:
        before_running = set(s.running)
        if o[0] == "submit":
            counter += 1
            r = all_reqs[f"r{counter}"] = req(f"r{counter}", o[1], o[2], now)
            actions = s.submit(r, now)
        elif o[0] == "finish":
            if not s.running:
                continue
            rid = sorted(s.running)[o[1] % len(s.running)]
            before_running.discard(rid)
            actions = s.finished(rid, now)
        elif o[0] == "cancel":
            rid = f"r{o[1]}"
            was_running = rid in s.running
            actions = s.cancel(rid, now)
            if was_running:
                assert actions[0] == Kill(rid, "cancelled")
                before_running.discard(rid)
                actions = actions[1:]
        else:
            now += o[1]
            actions = reevaluate(s, now)
        # actions are consistent with the state change
        for a in actions:
            if isinstance(a, Start):
                assert a.request_id in s.running and a.request_id not in before_running
            else:
                assert a.request_id in before_running and a.request_id not in s.requests
        # invariants
        assert len(s.running) <= n
        assert set(s.running) <= set(s.requests)          # running ones are in the queue...
        waiting = s.waiting()
        assert not {r.id for r in waiting} & set(s.running)  # ...and never also waiting
        if waiting:
            assert len(s.running) == n                   # work-conserving
        running_reqs = [s.requests[rid] for rid in s.running]
        # the policy only ever kills optional requests
        for a in actions:
            if isinstance(a, Kill) and a.reason == "preempted":
                assert all_reqs[a.request_id].optional
        if grace == 0.0:
            if any(not r.optional for r in waiting):
                assert all(not r.optional for r in running_reqs)
        else:
            for m in waiting:
                if not m.optional and now - m.submitted >= grace:
                    assert all(not r.optional for r in running_reqs)


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from("abc"), st.booleans(), st.booleans()),
                    max_size=50), seed=st.integers(0, 2**16), n=st.integers(1, 3))
def test_only_optional_requests_are_preempted(ops, seed, n):
    s = sched(n=n, seed=seed)
    now, all_reqs = 0.0, {}
    for i, (user, optional, finish) in enumerate(ops):
        now += 0.5
        if finish and s.running:
            actions = s.finished(sorted(s.running)[0], now)
        else:
            r = all_reqs[f"r{i}"] = req(f"r{i}", user, optional, now)
            actions = s.submit(r, now)
        for a in actions:
            if isinstance(a, Kill):
                assert all_reqs[a.request_id].optional
                assert a.request_id not in s.requests


# -- gather: an idle SeD ranks a burst whole ------------------------------------
def test_without_gather_the_first_read_user_is_started_then_preempted():
    s = SedScheduler(EthicPolicy(), rng=random.Random(0))
    assert s.submit(req("a1", "a", True, 0.000), 0.000) == [Start("a1")]
    assert s.submit(req("b1", "b", True, 0.004), 0.004) == []
    assert s.submit(req("m", "c", False, 0.008), 0.008) == [Kill("a1", "preempted"), Start("m")]


def test_gather_holds_an_idle_sed_while_optional_requests_keep_coming():
    s = SedScheduler(EthicPolicy(gather=0.02), rng=random.Random(0))
    assert s.submit(req("a1", "a", True, 0.000), 0.000) == []
    assert s.next_wakeup(0.000) == pytest.approx(0.020)
    assert s.submit(req("b1", "b", True, 0.010), 0.010) == []
    assert s.next_wakeup(0.010) == pytest.approx(0.030)          # the quiet period restarts
    assert reevaluate(s, 0.020) == []                             # an early tick starts nothing
    assert s.submit(req("m", "c", False, 0.025), 0.025) == [Start("m")]   # mandatory: never held, no kill
    out = s.finished("m", 1.0)
    assert len(out) == 1 and type(out[0]) is Start and out[0].request_id in {"a1", "b1"}
    assert s.allocated == {"c": pytest.approx(0.975)}             # nobody was killed


def test_gather_ends_after_the_quiet_period_and_ranks_the_burst_whole():
    s = SedScheduler(EthicPolicy(gather=0.02), rng=random.Random(0))
    s.allocated["a"] = 5.0                      # a was served before: b, least served, goes first
    s.submit(req("a1", "a", True, 0.000), 0.000)
    s.submit(req("b1", "b", True, 0.001), 0.001)
    assert reevaluate(s, 0.0205) == []          # 19.5 ms after b1: still gathering
    assert reevaluate(s, 0.0215) == [Start("b1")]
    assert s.next_wakeup(0.0215) is None


def test_gather_max_bounds_the_hold_and_a_busy_sed_never_holds():
    s = SedScheduler(EthicPolicy(gather=0.02, gather_max=0.05), rng=random.Random(0))
    t = 0.0
    for i in range(10):                         # arrivals 10 ms apart, forever "still coming"
        out = s.submit(req(f"o{i}", f"u{i}", True, t), t)
        if out:
            break
        t += 0.01
    assert out and len(out) == 1 and t == pytest.approx(0.05)     # started at first + gather_max
    assert s.submit(req("late", "z", True, t + 0.001), t + 0.001) == []   # busy SeD: queued, no hold timer
    assert s.next_wakeup(t + 0.001) is None


def test_gather_zero_is_the_papers_sed_and_bad_values_are_refused():
    assert EthicPolicy().hold_until([req("a", "a", True, 0.0)], {}, 0.0) is None
    for kw in ({"gather": -1}, {"gather": float("nan")}, {"gather": 61}, {"gather": 0.2, "gather_max": 0.1},
               {"gather_max": 601}):
        with pytest.raises(ValueError, match="gather"):
            EthicPolicy(**kw)
    with pytest.raises(ValueError):
        make_policy("fcfs", gather=0.1)


def test_gather_does_not_hold_requests_that_waited_through_a_busy_period():
    s = SedScheduler(EthicPolicy(gather=0.2), rng=random.Random(0))
    assert s.submit(req("m", "a", False, 0.0), 0.0) == [Start("m")]
    s.submit(req("b1", "b", True, 0.90), 0.90)
    s.submit(req("c1", "c", True, 0.95), 0.95)
    out = s.finished("m", 1.0)                   # both were here before the SeD went idle: no hold
    assert len(out) == 1 and out[0].request_id in {"b1", "c1"}


def test_gather_max_follows_a_long_gather():
    assert EthicPolicy(gather=1.0).gather_max == 1.0
    assert EthicPolicy(gather=0.02).gather_max == 0.5
    with pytest.raises(ValueError, match="gather is 1.0"):
        EthicPolicy(gather=1.0, gather_max=0.5)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcde"), st.booleans(), st.floats(0, 10)), min_size=1, max_size=12),
       st.integers(1, 3), st.integers(0, 2**16))
def test_the_settled_shortcut_skips_only_orders_that_decide_nothing(items, slots, seed):
    """Whenever every slot runs and EthicPolicy.settled says so, the full order's first
    ``slots`` requests are exactly the running ones (nothing would start or be killed),
    whatever the random tie-break draws."""
    class NoShortcut(EthicPolicy):
        settled = None
    s = SedScheduler(NoShortcut(), max_concurrent=slots, rng=random.Random(seed))
    t, checked = 0.0, 0
    for i, (user, optional, dt) in enumerate(items):
        t += dt
        s.submit(req(f"r{i}", user, optional, t), t)
        if i % 3 == 2 and s.running:
            s.finished(sorted(s.running)[0], t + 0.5)
        if len(s.running) >= slots and EthicPolicy().settled(s.requests, s.running):
            for draw in range(3):
                order = EthicPolicy().order(list(s.requests.values()), s.running, s.user_allocation(t), t,
                                            random.Random(draw))
                assert {r.id for r in order[:slots]} == set(s.running)
            checked += 1
    waiting_mandatory = any(not r.optional and r.id not in s.running for r in s.requests.values())
    assert EthicPolicy().settled(s.requests, s.running) is (not waiting_mandatory)
    assert EthicPolicy(accounting="virtual").settled(s.requests, s.running) is False


# -- the front without the order (EthicPolicy.front) ---------------------------
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.integers(0, 20), st.sampled_from("abcd")),
                min_size=0, max_size=30),
       st.sampled_from([0.0, 2.0, 50.0]), st.integers(1, 4), st.integers(0, 30))
def test_front_is_the_orders_first_slots_whenever_it_answers(spec, grace, k, now):
    p = EthicPolicy(kill_grace=grace)
    rs = [req(f"r{i}", user, optional, float(sub), i) for i, (optional, _, sub, user) in enumerate(spec)]
    running = {r.id: float(r.submitted) for r, (_, run, _, _) in zip(rs, spec) if run}
    front = p.front(rs, running, float(now), k)
    if front is None:
        # it declines only when ranks 0-1 (running mandatory, waiting mandatory out of grace) are fewer than k
        top = [r for r in rs if not r.optional and (r.id in running or not p._in_grace(r, float(now)))]
        assert len(top) < k
        return
    allocated = {u: float(ord(u)) for u in "abcd"}
    assert ids(front) == ids(p.order(rs, running, allocated, float(now), random.Random(1))[:k])


def test_front_declines_for_virtual_accounting():
    p = EthicPolicy(accounting="virtual")
    assert p.front([req("m1"), req("m2", seq=1)], {}, 0.0, 1) is None


def test_a_busy_queue_with_mandatory_calls_waiting_is_not_sorted_at_each_event():
    """100 optional requests and 3 mandatory ones, one slot: the scheduler knows
    what runs from the mandatory requests alone (the scale experiment's three
    SeDs that get every user's mandatory calls sorted ~200 requests per read)."""
    sched = SedScheduler(EthicPolicy(), max_concurrent=1, rng=random.Random(0))
    sorted_ = []
    order = sched.policy.order
    sched.policy.order = lambda *a: sorted_.append(1) or order(*a)
    started = []
    for i in range(3):
        started += [a.request_id for a in sched.submit(req(f"m{i}", f"u{i}", False, float(i), i), float(i))
                    if isinstance(a, Start)]
    for i in range(100):
        sched.submit(req(f"o{i}", f"u{i}", True, 3.0 + i, 3 + i), 3.0 + i)
    assert started == ["m0"] and sorted_ == []
    acts = sched.finished("m0", 200.0)
    assert [a.request_id for a in acts if isinstance(a, Start)] == ["m1"] and sorted_ == []
