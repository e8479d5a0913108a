"""Pure tests of a SeD's call lifecycle (gridrpc.core.sed_calls) and its
byte-bounded result cache (gridrpc.core.result_cache)."""
import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gridrpc.core.queue import FCFSPolicy, SedScheduler, make_policy
from gridrpc.core.result_cache import ResultCache, frames_nbytes
from gridrpc.core.sed_calls import (CallRecord, CallState, Drop, Expired, Fetch, Reacknowledge, Resend,
                                    Run, SedCalls, Stop)


def calls(max_concurrent=1, policy=None, **kw) -> SedCalls:
    sch = SedScheduler(policy=policy or FCFSPolicy(), max_concurrent=max_concurrent, rng=random.Random(0))
    return SedCalls({"s": sch}, **kw)


def rec(id, user="alice", optional=False, received=0.0) -> CallRecord:
    return CallRecord(id=id, sed="s", service="sleep", user=user, optional=optional, received=received)


def runs(actions):
    return [a.call.id for a in actions if isinstance(a, Run)]


def answer(n=10):
    return [b"h" * 10, b"x" * (n - 10)] if n > 10 else [b"h" * n]


# --------------------------------------------------------------------------- lifecycle

def test_a_call_goes_queued_running_finished():
    c = calls()
    a, b = rec("a"), rec("b", received=1.0)
    assert runs(c.submit(a, 0.0)) == ["a"] and a.state is CallState.RUNNING and a.started == 0.0
    assert c.submit(b, 1.0) == [] and b.state is CallState.QUEUED
    assert c.state("a") == "running" and c.state("b") == "queued" and c.state("x") == "unknown"
    acts = c.complete("a", answer(), ok=True, now=2.0)
    assert runs(acts) == ["b"] and a.state is CallState.FINISHED and a.ended == 2.0
    assert "a" not in c.live and c.state("a") == "done"
    c.complete("b", answer(), ok=False, now=3.0)
    assert b.state is CallState.FAILED
    st = c.statistics()
    assert st["finished"] == 1 and st["failed"] == 1 and st["live"] == 0 and st["submitted"] == 2


def test_duplicates_are_answered_from_the_one_record_and_never_run_twice():
    c = calls()
    a, b = rec("a"), rec("b")
    c.submit(a, 0.0)
    c.submit(b, 0.5)
    assert c.duplicate("a") == Reacknowledge(a)                          # running
    assert c.duplicate("b") == Reacknowledge(b)                          # queued
    assert c.submit(rec("a", user="mallory"), 0.6) == [] and c.live["a"] is a
    frames = answer()
    assert runs(c.complete("a", frames, ok=True, now=1.0)) == ["b"]
    assert c.duplicate("a") == Resend("a", frames)                       # after it finished
    assert c.submit(rec("a"), 2.0) == []                                 # never queued again
    prev, acts = c.cancel("b", 3.0)                                      # cancelled while running
    assert prev == "running" and acts == [Stop(b, "cancelled")] and b.state is CallState.CANCELLED
    c.complete("b", answer(), ok=False, now=3.0)
    assert isinstance(c.duplicate("b"), Resend) and c.submit(rec("b"), 4.0) == []
    assert c.schedulers["s"].requests == {} and c.duplicate("new") is None


def test_cancel_queued_running_finished_and_unknown():
    c = calls()
    a, b, d = rec("a"), rec("b"), rec("d")
    for r in (a, b, d):
        c.submit(r, 0.0)
    prev, acts = c.cancel("b", 1.0)                       # queued: answered here, never started
    assert prev == "queued" and acts == [Drop(b)] and b.state is CallState.CANCELLED
    assert c.complete("b", answer(), ok=False, now=1.0) == []
    prev, acts = c.cancel("a", 2.0)                       # running: killed, the next one starts
    assert prev == "running" and acts == [Stop(a, "cancelled"), Run(d)]
    assert c.complete("a", answer(), ok=False, now=2.0) == []
    assert c.cancel("a", 3.0) == ("done", []) and c.cancel("zz", 3.0) == ("unknown", [])
    assert c.statistics()["cancelled"] == 2


def test_a_queued_call_answered_early_leaves_the_queue():
    c = calls()
    a, b = rec("a"), rec("b")
    c.submit(a, 0.0)
    c.submit(b, 0.0)
    assert c.complete("b", answer(), ok=False, now=1.0) == []     # e.g. shutting down
    assert c.schedulers["s"].requests.keys() == {"a"} and c.complete("a", None, ok=True, now=2.0) == []


def test_preemption_kills_the_optional_call():
    c = calls(policy=make_policy("ethic"))
    o = rec("o", user="u1", optional=True)
    assert runs(c.submit(o, 0.0)) == ["o"]
    acts = c.submit(rec("m", user="u2"), 1.0)
    assert acts[0] == Stop(o, "preempted") and o.state is CallState.KILLED and runs(acts) == ["m"]
    c.complete("o", answer(), ok=False, now=1.0)
    assert c.statistics()["killed"] == 1 and isinstance(c.duplicate("o"), Resend)


def test_a_live_call_is_never_run_twice_even_when_the_id_memory_overflows():
    c = calls(remember_ids=1)
    a = rec("a")
    assert runs(c.submit(a, 0.0)) == ["a"]
    for i in range(5):                                    # the finished ids overflow the memory
        c.submit(rec(f"x{i}"), 1.0)
    assert c.duplicate("a") == Reacknowledge(a) and c.submit(rec("a"), 2.0) == []
    assert runs(c.complete("a", answer(), ok=True, now=3.0)) == ["x0"]


def test_held_answers_are_fetched_then_cached():
    c = calls()
    c.submit(rec("a"), 0.0)
    c.complete("a", None, ok=True, now=1.0)              # answered to nobody
    c.hold("a")
    assert c.duplicate("a") == Fetch("a", None) and c.state("a") == "done"
    frames = answer()
    c.delivered("a", frames)
    assert c.duplicate("a") == Resend("a", frames)
    c.hold("b")                                           # recovered after a restart
    c.release("b")                                        # never fetched: dropped
    assert c.duplicate("b") == Expired("b")
    c.remember("k")
    assert c.duplicate("k") == Expired("k") and c.submit(rec("k"), 2.0) == []


# --------------------------------------------------------------------------- the cache

def test_result_cache_is_bounded_in_bytes_and_says_what_it_dropped():
    cache = ResultCache(max_bytes=1000, max_ids=100)
    for i in range(5):
        cache.put(f"r{i}", answer(300))
    assert cache.bytes == 900 and [i for i in range(5) if cache.answer(f"r{i}")] == [2, 3, 4]
    assert all(f"r{i}" in cache for i in range(5)) and cache.statistics().dropped == 2
    cache.put("huge", answer(5000))                        # larger than the cache: id only
    assert "huge" in cache and cache.answer("huge") is None and cache.bytes == 900
    cache.put("r2", answer(100))                          # replacing an answer updates the size
    assert cache.bytes == 700


def test_result_cache_forgets_the_oldest_ids_but_not_held_ones():
    cache = ResultCache(max_bytes=10_000, max_ids=3)
    cache.hold("kept")
    for i in range(6):
        cache.put(f"r{i}", answer(100))
    assert "kept" in cache and cache.held("kept")
    assert [i for i in range(6) if f"r{i}" in cache] == [4, 5] and cache.bytes == 200
    cache.release("kept")
    for i in range(6, 9):                  # once released, it ages like any other id
        cache.put(f"r{i}", answer(100))
    assert "kept" not in cache and [i for i in range(9) if f"r{i}" in cache] == [6, 7, 8]


def test_frames_nbytes_counts_every_kind_of_buffer():
    arr = np.zeros(10, dtype="<f8")
    assert frames_nbytes([b"abc", memoryview(b"12345"), arr, memoryview(arr).cast("B"), bytearray(2)]) == \
        3 + 5 + 80 + 80 + 2


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 3), st.integers(0, 2000), st.integers(2, 12),
       st.lists(st.tuples(st.sampled_from(["submit", "finish", "cancel", "dup"]), st.integers(0, 9),
                          st.integers(0, 900)), max_size=60))
def test_property_one_record_per_id(max_concurrent, max_bytes, remember_ids, events):
    """Whatever happens: no id ever runs twice while remembered; every known
    id gets an answer to a duplicate (never silence); the cache respects its
    byte bound; live calls are exactly the scheduler's requests."""
    c = calls(max_concurrent, result_cache_bytes=max_bytes, remember_ids=remember_ids)
    started: list[str] = []
    now = 0.0
    for kind, i, size in events:
        now += 1.0
        rid = f"r{i}"
        if kind == "submit":
            if c.duplicate(rid) is None:
                started += runs(c.submit(rec(rid, received=now), now))
            continue
        if kind == "finish" and rid in c.live and c.live[rid].state is CallState.RUNNING:
            started += runs(c.complete(rid, answer(size), ok=True, now=now))
        elif kind == "cancel":
            _, acts = c.cancel(rid, now)
            started += runs(acts)
            for a in acts:
                if isinstance(a, (Drop, Stop)):
                    started += runs(c.complete(a.call.id, answer(size), ok=False, now=now))
        elif kind == "dup":
            d = c.duplicate(rid)
            assert (d is None) == (rid not in c.live and rid not in c.cache)
            if isinstance(d, Resend):
                assert frames_nbytes(d.frames) <= max_bytes
        assert c.cache.bytes <= max_bytes
        assert set(c.live) == set(c.schedulers["s"].requests)
        assert not (set(c.live) & set(c.cache._ids))
        assert len(c.schedulers["s"].running) == min(max_concurrent, len(c.live))
    if remember_ids >= 10:          # every id fits the memory: none ever ran twice
        assert len(started) == len(set(started))


def test_property_never_twice_with_enough_memory():
    rng = random.Random(3)
    c = calls(2, result_cache_bytes=500)
    started = []
    for step in range(2000):
        rid = f"r{rng.randrange(50)}"
        op = rng.random()
        if op < 0.5 and c.duplicate(rid) is None:
            started += runs(c.submit(rec(rid, received=step), step))
        elif op < 0.8:
            running = [k for k, v in c.live.items() if v.state is CallState.RUNNING]
            if running:
                started += runs(c.complete(rng.choice(running), answer(rng.randrange(1, 300)),
                                           ok=True, now=step))
        else:
            _, acts = c.cancel(rid, step)
            started += runs(acts)
            for a in acts:
                if isinstance(a, (Drop, Stop)):
                    started += runs(c.complete(a.call.id, answer(50), ok=False, now=step))
    assert len(started) == len(set(started)) and len(set(started)) <= 50


def test_submit_rejects_bad_cache_settings():
    with pytest.raises(ValueError):
        ResultCache(max_bytes=-1)


def test_ack_delay_rule():
    from gridrpc.core.sed_calls import ACK_DELAY_MAX, ack_delay
    assert ack_delay(0.0, True, True, 5000) == 0.0            # back-ends that answer late: at once
    assert ack_delay(0.02, True, False, 5000) == 0.0          # a non-idempotent service: at once
    assert ack_delay(0.02, False, True, None) == 0.0          # queued, client silent on its patience
    assert ack_delay(0.02, True, True, None) == 0.02          # starts at once: the back-end's own delay
    assert ack_delay(0.02, False, True, 5000) == ACK_DELAY_MAX == 0.25
    assert ack_delay(0.02, False, True, 300) == pytest.approx(0.015)     # 5 % of a 0.3 s patience
    assert ack_delay(0.02, True, True, 300) == 0.02           # never less than the back-end's delay
    assert ack_delay(0.02, False, True, 0) == 0.0
