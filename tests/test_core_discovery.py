"""Pure tests of the pending-discovery table (gridrpc.core.discovery)."""
import random

import pytest
from hypothesis import given, settings, strategies as st

from gridrpc.core.aggregators import DefaultAggregator, PriorityAggregator, make_aggregator
from gridrpc.core.discovery import DiscoveryTable, Done

BY_EFT = PriorityAggregator(order=["-eft"])


def srv(name, **est):
    return {"name": name, "address": f"tcp://{name}:1", "estimation": est}


def names(servers):
    return [s["name"] for s in servers]


def table(**kw):
    return DiscoveryTable(random.Random(0), **kw)


def test_no_children_finishes_at_once_with_nothing():
    t = table()
    done = t.start("d1", "asker", [], 3, DefaultAggregator(), deadline=10.0, now=0.0)
    assert done == Done(id="d1", reply_to="asker", servers=[], answered=0, timed_out=[])
    assert t.pending == {} and t.next_deadline() is None


def test_all_answers_then_ranked_and_truncated_to_k():
    t = table()
    assert t.start("d1", ("route", "orig"), ["la1", "la2", "sed9"], 2, BY_EFT,
                   deadline=5.0, now=0.0) is None
    assert t.next_deadline() == 5.0
    assert t.answer("d1", "la1", [srv("a", eft=3), srv("b", eft=1)], now=0.1) is None
    assert t.answer("d1", "sed9", [srv("c", eft=2)], now=0.2) is None
    done = t.answer("d1", "la2", [srv("d", eft=0.5), srv("e", eft=9)], now=0.3)
    assert isinstance(done, Done)
    assert done.id == "d1" and done.reply_to == ("route", "orig")
    assert names(done.servers) == ["d", "b"]                   # best 2 of 5
    assert done.answered == 3 and done.timed_out == []
    assert t.pending == {} and t.next_deadline() is None


@pytest.mark.parametrize("k, expect", [(1, ["a"]), (3, ["a", "b", "c"]), (10, ["a", "b", "c"])])
def test_k_truncation(k, expect):
    t = table()
    t.start("d", None, ["x"], k, BY_EFT, deadline=1.0)
    done = t.answer("d", "x", [srv("c", eft=3), srv("a", eft=1), srv("b", eft=2)])
    assert names(done.servers) == expect


def test_late_and_duplicate_and_stranger_answers_are_ignored():
    t = table()
    t.start("d", None, ["x", "y"], 5, BY_EFT, deadline=1.0)
    assert t.answer("d", "x", [srv("a", eft=1)]) is None
    assert t.answer("d", "x", [srv("dup", eft=0)]) is None         # duplicate from x
    assert t.answer("d", "stranger", [srv("z", eft=0)]) is None    # never asked
    assert t.answer("unknown-id", "x", [srv("q", eft=0)]) is None
    done = t.answer("d", "y", [srv("b", eft=2)])
    assert names(done.servers) == ["a", "b"] and done.answered == 2
    assert t.answer("d", "y", [srv("late", eft=0)]) is None       # after the end
    assert t.pending == {}


def test_malformed_server_entries_are_dropped():
    t = table()
    t.start("d", None, ["x"], 5, BY_EFT, deadline=1.0)
    done = t.answer("d", "x", [srv("ok", eft=1), {"address": "no name"}, "junk", 3, None])
    assert names(done.servers) == ["ok"]


def test_expire_returns_partial_answer_with_timed_out_names():
    t = table()
    t.start("d1", "r1", ["b", "a", "c"], 5, BY_EFT, deadline=2.0, now=0.0)
    t.start("d2", "r2", ["a"], 5, BY_EFT, deadline=4.0, now=0.0)
    t.answer("d1", "a", [srv("s1", eft=1)], now=0.5)
    assert t.next_deadline() == 2.0
    assert t.expire(1.9) == []
    (done,) = t.expire(2.0)                       # deadline reached (<=)
    assert done.id == "d1" and done.reply_to == "r1"
    assert names(done.servers) == ["s1"] and done.answered == 1
    assert done.timed_out == ["b", "c"]           # sorted names of the silent children
    assert list(t.pending) == ["d2"] and t.next_deadline() == 4.0
    (done2,) = t.expire(100.0)
    assert done2.servers == [] and done2.timed_out == ["a"] and done2.answered == 0
    assert t.next_deadline() is None and t.expire(200.0) == []


def test_answer_after_expiry_is_ignored():
    t = table()
    t.start("d", None, ["x"], 5, BY_EFT, deadline=1.0)
    t.expire(1.0)
    assert t.answer("d", "x", [srv("a", eft=1)], now=1.5) is None


def test_child_lost_finishes_discoveries_waiting_only_on_it():
    t = table()
    t.start("d1", None, ["x", "y"], 5, BY_EFT, deadline=9.0)
    t.start("d2", None, ["x"], 5, BY_EFT, deadline=9.0)
    t.start("d3", None, ["y"], 5, BY_EFT, deadline=9.0)
    t.answer("d1", "y", [srv("a", eft=1)])
    finished = t.child_lost("x")
    assert sorted(d.id for d in finished) == ["d1", "d2"]
    d1 = next(d for d in finished if d.id == "d1")
    assert names(d1.servers) == ["a"] and d1.answered == 1
    assert list(t.pending) == ["d3"]
    assert t.child_lost("x") == [] and t.child_lost("nobody") == []
    assert t.answer("d3", "y", []).servers == []


def test_child_lost_before_others_answered_keeps_waiting():
    t = table()
    t.start("d", None, ["x", "y"], 5, BY_EFT, deadline=9.0)
    assert t.child_lost("x") == []
    done = t.answer("d", "y", [srv("a", eft=1)])
    assert names(done.servers) == ["a"]
    assert t.answer("d", "x", [srv("ghost", eft=0)]) is None


def test_next_deadline_is_the_earliest():
    t = table()
    for i, dl in enumerate([7.0, 3.0, 5.0]):
        t.start(f"d{i}", None, ["x"], 1, BY_EFT, deadline=dl)
    assert t.next_deadline() == 3.0
    t.answer("d1", "x", [])
    assert t.next_deadline() == 5.0


def test_same_seed_same_tie_break():
    answers = [srv(n, time_since_last_solve=1.0) for n in "abcdefg"]

    def run(seed):
        t = DiscoveryTable(random.Random(seed))
        t.start("d", None, ["x"], 7, DefaultAggregator(), deadline=1.0)
        return names(t.answer("d", "x", answers).servers)

    assert run(1) == run(1)
    assert len({tuple(run(s)) for s in range(10)}) > 1


# -- the recent-choice memory (root agent) -------------------------------------
def discover_once(t, i, now, answers, k=3, children=("la",)):
    t.start(f"d{i}", None, list(children), k, DefaultAggregator(), deadline=now + 1, now=now)
    return t.answer(f"d{i}", children[0], [dict(s) for s in answers], now=now)


def test_without_memory_concurrent_discoveries_all_pick_the_same_server():
    answers = [srv("a", time_since_last_solve=100), srv("b", time_since_last_solve=50),
               srv("c", time_since_last_solve=10)]
    t = table()
    firsts = [discover_once(t, i, 10.0, answers).servers[0]["name"] for i in range(3)]
    assert firsts == ["a", "a", "a"]


def test_remember_spreads_concurrent_first_choices():
    # the SeDs have not seen a call yet, so each answers the same stale vector
    answers = [srv("a", time_since_last_solve=100), srv("b", time_since_last_solve=50),
               srv("c", time_since_last_solve=10)]
    t = table(remember=True, memory=1.0)
    firsts = [discover_once(t, i, 10.0 + i * 0.01, answers).servers[0]["name"] for i in range(3)]
    assert firsts == ["a", "b", "c"]
    assert set(t.recent) == {"a", "b", "c"}


def test_remember_adjusts_the_vector_shown_not_the_answer_objects():
    answers = [srv("a", time_since_last_solve=100, num_waiting=2), srv("b", time_since_last_solve=50)]
    t = table(remember=True)
    first = discover_once(t, 0, 10.0, answers)
    assert names(first.servers) == ["a", "b"]
    second = discover_once(t, 1, 10.25, answers)
    a2 = next(s for s in second.servers if s["name"] == "a")
    assert a2["estimation"]["time_since_last_solve"] == pytest.approx(0.25)
    assert a2["estimation"]["num_waiting"] == 3                # 2 reported + 1 recent choice
    assert answers[0]["estimation"] == {"time_since_last_solve": 100, "num_waiting": 2}
    assert names(second.servers)[0] == "b"


def test_remember_forgets_after_memory():
    answers = [srv("a", time_since_last_solve=100), srv("b", time_since_last_solve=50)]
    t = table(remember=True, memory=1.0)
    assert discover_once(t, 0, 10.0, answers).servers[0]["name"] == "a"
    assert discover_once(t, 1, 10.5, answers).servers[0]["name"] == "b"
    # 1.1 s after a was chosen, 0.6 s after b: a is forgotten, b still remembered
    assert discover_once(t, 2, 11.1, answers).servers[0]["name"] == "a"
    assert discover_once(t, 3, 13.0, answers).servers[0]["name"] == "a"   # both forgotten


def test_remember_missing_estimation_gets_one():
    t = table(remember=True)
    discover_once(t, 0, 1.0, [{"name": "a"}])
    done = discover_once(t, 1, 1.5, [{"name": "a", "estimation": None}])
    assert done.servers[0]["estimation"] == {"time_since_last_solve": 0.5, "num_waiting": 1}


@pytest.mark.parametrize("bad", [[1], "abc", 5])
def test_remember_with_malformed_estimation_does_not_crash(bad):
    t = table(remember=True)
    discover_once(t, 0, 1.0, [srv("a", time_since_last_solve=3)])
    done = discover_once(t, 1, 1.5, [{"name": "a", "estimation": bad}, srv("b")])
    assert sorted(names(done.servers)) == ["a", "b"]


def test_remember_with_non_numeric_num_waiting_does_not_crash():
    t = table(remember=True)
    discover_once(t, 0, 1.0, [srv("a", time_since_last_solve=3, num_waiting="x")])
    done = discover_once(t, 1, 1.5, [srv("a", time_since_last_solve=3, num_waiting="x")])
    assert done.servers[0]["estimation"]["num_waiting"] == 1


def test_remember_memory_stays_bounded_under_constant_load():
    answers = [srv("a", time_since_last_solve=100)]
    t = table(remember=True, memory=1.0)
    for i in range(2000):                              # one discovery every 10 ms for 20 s
        discover_once(t, i, i * 0.01, answers)
    assert len(t.recent["a"]) <= 101                   # about memory / interval, not 2000


def test_remember_off_keeps_no_memory():
    t = table()
    discover_once(t, 0, 1.0, [srv("a", time_since_last_solve=1)])
    assert t.recent == {}


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["answer", "lost", "expire"]),
                          st.integers(0, 3), st.integers(0, 3)), max_size=30))
def test_property_every_discovery_finishes_exactly_once(events):
    t = table(remember=True)
    children = ["c0", "c1", "c2", "c3"]
    finished: list[str] = []
    for i in range(4):
        d = t.start(f"d{i}", None, children[: i + 1], 2, make_aggregator("default"),
                    deadline=float(i + 1), now=0.0)
        assert d is None
    now = 0.0
    for kind, d, c in events:
        if kind == "answer":
            r = t.answer(f"d{d}", children[c], [srv(f"s{c}", time_since_last_solve=c)], now)
            finished += [r.id] if r else []
        elif kind == "lost":
            finished += [r.id for r in t.child_lost(children[c], now)]
        else:
            now += 0.5
            finished += [r.id for r in t.expire(now)]
    finished += [r.id for r in t.expire(1e9)]
    assert sorted(finished) == ["d0", "d1", "d2", "d3"]
    assert t.pending == {}
