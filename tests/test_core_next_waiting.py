"""SedScheduler.next_waiting: the request that starts when the running one
ends, named only when that is certain (what a SeD sends ahead to its worker)."""
from __future__ import annotations

import copy
import random

from gridrpc.core.queue import Request, SedScheduler, Start, make_policy


def _req(i: int, t: float, user: str = "u") -> Request:
    return Request(id=f"r{i}", user=user, service="s", submitted=t)


def test_random_arrivals_ends_and_cancels_start_what_was_named():
    rng = random.Random(7)
    named_checks = 0
    for trial in range(200):
        sch = SedScheduler(make_policy("fcfs"), max_concurrent=rng.choice([1, 1, 2]))
        now, n = 0.0, 0
        for step in range(40):
            now += rng.random() * 0.01
            op = rng.random()
            if op < 0.5:
                n += 1
                if rng.random() < 0.3:
                    sch.pause()
                sch.submit(_req(n, now), now)
                if sch._paused:
                    sch.resume(now)
            elif op < 0.8 and sch.running:
                sch.finished(rng.choice(sorted(sch.running)), now)
            elif sch.requests:
                sch.cancel(rng.choice(sorted(sch.requests)), now)
            named = sch.next_waiting()
            if named is None:
                assert len(sch.running) < sch.max_concurrent or len(sch.requests) == len(sch.running)
                continue
            assert named in sch.requests and named not in sch.running
            probe = copy.deepcopy(sch)           # what the next end would start
            starts = [a.request_id for a in probe.finished(next(iter(probe.running)), now) if isinstance(a, Start)]
            assert starts == [named]
            named_checks += 1
    assert named_checks > 500


def test_nothing_named_with_a_free_slot_or_an_empty_queue():
    sch = SedScheduler(make_policy("fcfs"), max_concurrent=2)
    assert sch.next_waiting() is None
    sch.submit(_req(1, 0.0), 0.0)
    assert sch.next_waiting() is None           # a slot is free: a new arrival starts at once
    sch.submit(_req(2, 0.0), 0.0)
    assert sch.next_waiting() is None           # both running, nobody waiting
    sch.submit(_req(3, 0.1), 0.1)
    sch.submit(_req(4, 0.2), 0.2)
    assert sch.next_waiting() == "r3"
    sch.cancel("r3", 0.3)
    assert sch.next_waiting() == "r4"


def test_out_of_submit_order_or_another_policy_names_nothing():
    sch = SedScheduler(make_policy("fcfs"), max_concurrent=1)
    sch.submit(_req(1, 5.0), 5.0)
    sch.submit(_req(2, 6.0), 6.0)
    assert sch.next_waiting() == "r2"
    sch.submit(_req(3, 1.0), 6.1)               # a clock step: the full sort decides at the end
    assert sch.next_waiting() is None
    eth = SedScheduler(make_policy("ethic"), max_concurrent=1)
    for i in range(3):
        eth.submit(_req(i, float(i), user=f"u{i}"), float(i))
    assert eth.running and eth.next_waiting() is None


def test_a_promised_request_starts_before_one_admitted_later_with_an_older_time():
    """A call whose data was fetched first is admitted late with its arrival time: without the
    promise FCFS would start it before the call already handed to the worker (found in review)."""
    sch = SedScheduler(make_policy("fcfs"), max_concurrent=1)
    sch.submit(Request(id="a", user="u", service="x", submitted=1.0), 1.0)
    sch.submit(Request(id="b", user="u", service="x", submitted=3.0), 3.0)
    assert sch.next_waiting() == "b"
    sch.promise_next("b")
    sch.submit(Request(id="c", user="u", service="x", submitted=2.0), 4.0)
    assert sch.next_waiting() is None                  # out of submit order: nothing more is named
    assert sch.finished("a", 5.0) == [Start("b")]
    assert sch.finished("b", 6.0) == [Start("c")]


def test_a_promise_of_a_cancelled_request_is_forgotten():
    sch = SedScheduler(make_policy("fcfs"), max_concurrent=1)
    for i, t in enumerate((1.0, 2.0, 3.0)):
        sch.submit(_req(i, t), t)
    sch.promise_next("r1")
    sch.cancel("r1", 3.5)
    assert sch.finished("r0", 4.0) == [Start("r2")]
    assert sch._promised is None


def test_with_several_users_the_named_request_is_the_fair_one_and_the_promise_holds():
    """With several users waiting, the request named is the one the fair
    rule picks now; promised, it is what the next end starts."""
    rng = random.Random(11)
    checks = 0
    for trial in range(200):
        sch = SedScheduler(make_policy("fcfs"), max_concurrent=rng.choice([1, 2]))
        now, n = 0.0, 0
        for step in range(40):
            now += rng.random() * 0.01
            if rng.random() < 0.6:
                n += 1
                sch.submit(_req(n, now, user=rng.choice("abc")), now)
            elif sch.running:
                sch.finished(rng.choice(sorted(sch.running)), now)
            named = sch.next_waiting()
            if named is None:
                continue
            probe = copy.deepcopy(sch)
            probe.promise_next(named)
            starts = [a.request_id for a in probe.finished(rng.choice(sorted(probe.running)), now) if isinstance(a, Start)]
            assert starts[:1] == [named]
            checks += 1
    assert checks > 300
