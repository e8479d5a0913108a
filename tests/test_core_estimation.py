"""Pure tests of the estimation part of a SeD (gridrpc.core.estimation):
run-time predictor and queue tags with eft simulated by hand."""
import pytest
from hypothesis import given, settings, strategies as st

from gridrpc.core.estimation import STANDARD_TAGS, RunTimePredictor, queue_tags


def predictor(**means):
    p = RunTimePredictor()
    for svc, m in means.items():
        p.observe(svc, m)
    return p


def tags(p, service="a", now=100.0, max_concurrent=1, running=(), waiting=(), last_solve=None):
    running = list(running)
    waiting = list(waiting)
    return queue_tags(service=service, predictor=p, now=now, num_waiting=len(waiting),
                      num_running=len(running), max_concurrent=max_concurrent,
                      last_solve=last_solve, running=running, waiting_services=waiting)


# -- RunTimePredictor -----------------------------------------------------------
def test_predictor_default_before_any_observation():
    assert RunTimePredictor().predict("x") == 0.0
    assert RunTimePredictor(default=2.5).predict("x") == 2.5


def test_predictor_ewma_by_hand():
    p = RunTimePredictor(alpha=0.25)
    p.observe("s", 8.0)                 # first: the value itself
    assert p.predict("s") == 8.0
    p.observe("s", 4.0)                 # 0.75 * 8 + 0.25 * 4 = 7
    assert p.predict("s") == pytest.approx(7.0)
    p.observe("s", 15.0)                # 0.75 * 7 + 0.25 * 15 = 9
    assert p.predict("s") == pytest.approx(9.0)
    assert p.counts["s"] == 3


def test_predictor_keeps_services_apart():
    p = RunTimePredictor(alpha=0.5, default=1.0)
    p.observe("a", 10.0)
    p.observe("b", 2.0)
    p.observe("a", 20.0)                # 0.5 * 10 + 0.5 * 20 = 15
    assert p.predict("a") == pytest.approx(15.0)
    assert p.predict("b") == 2.0 and p.predict("c") == 1.0
    assert p.counts == {"a": 2, "b": 1}


def test_predictor_alpha_one_follows_last_value():
    p = RunTimePredictor(alpha=1.0)
    for v in (3.0, 9.0, 1.0):
        p.observe("s", v)
    assert p.predict("s") == 1.0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=20), st.floats(0.01, 1.0))
def test_property_prediction_stays_within_observed_range(values, alpha):
    p = RunTimePredictor(alpha=alpha)
    for v in values:
        p.observe("s", v)
    assert min(values) - 1e-6 <= p.predict("s") <= max(values) + 1e-6


# -- queue_tags ---------------------------------------------------------------
def test_idle_server():
    t = tags(predictor(a=4.0), now=100.0)
    # nothing running or waiting: starts now, ends now + tcomp = 104
    assert t["eft"] == pytest.approx(104.0)
    assert t["est_wait"] == 0.0
    assert t["tcomp"] == 4.0
    assert t["num_waiting"] == 0 and t["num_running"] == 0 and t["max_concurrent"] == 1
    assert t["time_since_last_solve"] == 1e9          # never solved: least recently used


def test_time_since_last_solve():
    assert tags(predictor(a=1.0), now=100.0, last_solve=92.5)["time_since_last_solve"] == 7.5


def test_busy_single_slot():
    # a (10 s) started at 95 -> predicted end 105; then our a: 105 + 10 = 115
    t = tags(predictor(a=10.0), now=100.0, running=[(95.0, "a")])
    assert t["eft"] == pytest.approx(115.0)
    assert t["est_wait"] == pytest.approx(5.0)
    assert t["num_running"] == 1


def test_overdue_running_call_counts_as_ending_now():
    # started at 50, predicted 10 s, still running at 100: end max(100, 60) = 100
    t = tags(predictor(a=10.0), now=100.0, running=[(50.0, "a")])
    assert t["eft"] == pytest.approx(110.0) and t["est_wait"] == 0.0


def test_busy_single_slot_with_queue():
    # running b (2 s) from 99 -> ends 101; waiting a (10) then b (2):
    # slot 101 -> 111 -> 113; our a: 113 + 10 = 123
    t = tags(predictor(a=10.0, b=2.0), now=100.0, running=[(99.0, "b")], waiting=["a", "b"])
    assert t["eft"] == pytest.approx(123.0)
    assert t["est_wait"] == pytest.approx(13.0)
    assert t["num_waiting"] == 2


def test_multi_slot_with_a_free_slot():
    # max_concurrent 3, one call running: two slots free now -> eft = now + tcomp
    t = tags(predictor(a=10.0), now=100.0, max_concurrent=3, running=[(99.0, "a")])
    assert t["eft"] == pytest.approx(110.0) and t["est_wait"] == 0.0


def test_multi_slot_busy_and_queued():
    # max_concurrent 2; running a (10 s) from 95 -> 105, b (4 s) from 99 -> 103
    # slots [103, 105]; waiting a: 103 + 10 = 113 -> [105, 113];
    #                   waiting b: 105 + 4 = 109  -> [109, 113]
    # new b: earliest slot 109 + 4 = 113, wait 9
    t = tags(predictor(a=10.0, b=4.0), service="b", now=100.0, max_concurrent=2,
             running=[(95.0, "a"), (99.0, "b")], waiting=["a", "b"])
    assert t["eft"] == pytest.approx(113.0)
    assert t["est_wait"] == pytest.approx(9.0)
    assert t["tcomp"] == 4.0
    # the same for a new a: 109 + 10 = 119
    assert tags(predictor(a=10.0, b=4.0), service="a", now=100.0, max_concurrent=2,
                running=[(95.0, "a"), (99.0, "b")], waiting=["a", "b"])["eft"] == pytest.approx(119.0)


def test_multi_slot_queue_fills_idle_slots_first():
    # max_concurrent 3, running a (6 s) from 100 -> 106, two idle slots at 100
    # waiting b (5), b (5): 100 -> 105 and 100 -> 105; slots [105, 105, 106]
    # new a (6): 105 + 6 = 111
    t = tags(predictor(a=6.0, b=5.0), now=100.0, max_concurrent=3,
             running=[(100.0, "a")], waiting=["b", "b"])
    assert t["eft"] == pytest.approx(111.0) and t["est_wait"] == pytest.approx(5.0)


def test_unknown_service_uses_the_default():
    p = RunTimePredictor(default=3.0)
    t = tags(p, service="new", now=10.0, running=[(9.0, "other")])
    # other: default 3 -> ends 12; new: 12 + 3 = 15
    assert t["eft"] == pytest.approx(15.0) and t["tcomp"] == 3.0


def test_tags_are_standard_names():
    t = tags(predictor(a=1.0))
    assert {"tcomp", "eft", "num_waiting", "num_running", "max_concurrent",
            "time_since_last_solve"} <= set(t) <= set(STANDARD_TAGS) | {"est_wait"}


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4),
       st.lists(st.tuples(st.floats(0, 100), st.sampled_from("ab")), max_size=4),
       st.lists(st.sampled_from("ab"), max_size=6),
       st.floats(0.0, 20.0), st.floats(0.0, 20.0))
def test_property_eft_bounds(max_concurrent, running, waiting, ta, tb):
    p = predictor(a=ta, b=tb)
    running = running[:max_concurrent]
    t = tags(p, now=100.0, max_concurrent=max_concurrent, running=running, waiting=waiting)
    assert t["est_wait"] >= 0.0
    assert t["eft"] == pytest.approx(100.0 + t["est_wait"] + ta)
    more = tags(p, now=100.0, max_concurrent=max_concurrent, running=running,
                waiting=waiting + ["a"])
    assert more["eft"] >= t["eft"] - 1e-9                   # a longer queue never finishes earlier
    # upper bound: everything run one after the other
    serial = sum(max(0.0, s + p.predict(v) - 100.0) for s, v in running) + \
        sum(p.predict(v) for v in waiting)
    assert t["est_wait"] <= serial + 1e-6
