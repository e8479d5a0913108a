"""The client-side optional-computation dispatchers, driven by a fake clock."""
from __future__ import annotations

import itertools

import pytest

from gridrpc.core.dispatcher import (Cancel, Finish, LegacyDispatcher, OptionalDispatcher,
                                     Phase, Submit)

SERVERS = ["s0", "s1", "s2"]


def submits(actions):
    return [a for a in actions if isinstance(a, Submit)]


def opt_dispatcher(n_min=3, n_opt=None, deadline=100.0, servers=SERVERS, **kw):
    optional = itertools.count(100) if n_opt is None else range(100, 100 + n_opt)
    return OptionalDispatcher([f"m{i}" for i in range(n_min)], optional, deadline, servers, **kw)


# -- setup -----------------------------------------------------------------------
def test_setup_mandatory_round_robin_then_one_optional_per_server():
    d = opt_dispatcher(n_min=4)
    acts = d.start(0.0)
    assert acts == [Submit("m0", "s0", "m0", False), Submit("m1", "s1", "m1", False),
                    Submit("m2", "s2", "m2", False), Submit("m3", "s0", "m3", False),
                    Submit("o0", "s0", 100, True), Submit("o1", "s1", 101, True),
                    Submit("o2", "s2", 102, True)]
    assert d.phase is Phase.MONITORING and not d.finished
    assert d.next_deadline == 100.0
    assert set(d.outstanding) == {"m0", "m1", "m2", "m3", "o0", "o1", "o2"}


def test_setup_with_few_optional():
    d = opt_dispatcher(n_min=1, n_opt=1)
    assert [a.key for a in d.start(0.0)] == ["m0", "o0"]


def test_start_twice_and_no_servers_rejected():
    d = opt_dispatcher()
    d.start(0.0)
    with pytest.raises(RuntimeError):
        d.start(1.0)
    with pytest.raises(ValueError):
        opt_dispatcher(servers=[])


# -- monitoring --------------------------------------------------------------------
def test_completed_optional_sends_next_to_same_server():
    d = opt_dispatcher()
    d.start(0.0)
    assert d.on_done("o1", True, 1.0) == [Submit("o3", "s1", 103, True)]
    assert d.on_done("o3", True, 2.0) == [Submit("o4", "s1", 104, True)]
    assert d.count(optional=True) == 2


def test_killed_optional_is_resubmitted_same_args_same_server_new_key():
    d = opt_dispatcher()
    d.start(0.0)
    acts = d.on_done("o2", False, 1.5)
    assert acts == [Submit("o2.1", "s2", 102, True)]
    assert d.on_done("o2.1", False, 2.0) == [Submit("o2.2", "s2", 102, True)]
    killed = [r for r in d.records if r.status == "killed"]
    assert [r.key for r in killed] == ["o2", "o2.1"]
    assert all(r.slot == "o2" for r in killed)


def test_non_retryable_optional_failure_moves_on():
    d = opt_dispatcher()
    d.start(0.0)
    assert d.on_done("o0", False, 1.0, retry=False) == [Submit("o3", "s0", 103, True)]


def test_max_attempts_bounds_resubmission():
    d = opt_dispatcher(max_attempts=2)
    d.start(0.0)
    assert d.on_done("o0", False, 1.0) == [Submit("o0.1", "s0", 100, True)]
    assert d.on_done("o0.1", False, 2.0) == [Submit("o3", "s0", 103, True)]


def test_mandatory_retry_goes_to_next_server():
    d = opt_dispatcher()
    d.start(0.0)
    assert d.on_done("m2", False, 1.0) == [Submit("m2.1", "s0", "m2", False)]


def test_unknown_and_duplicate_replies_ignored():
    d = opt_dispatcher()
    d.start(0.0)
    assert d.on_done("nope", True, 1.0) == []
    d.on_done("o0", True, 1.0)
    assert d.on_done("o0", True, 1.1) == []


def test_stays_after_mandatory_done_until_deadline():
    d = opt_dispatcher(deadline=10.0)
    d.start(0.0)
    for k in ("m0", "m1", "m2"):
        assert d.on_done(k, True, 1.0) == []
    assert d.mandatory_done_at == 1.0
    assert d.on_tick(5.0) == []                       # before the deadline
    assert not d.finished


def test_waits_for_mandatory_after_deadline_optional_keep_flowing():
    d = opt_dispatcher(deadline=10.0)
    d.start(0.0)
    d.on_done("m0", True, 1.0)
    d.on_done("m1", True, 2.0)
    assert d.on_tick(10.0) == []                      # m2 still missing
    assert d.next_deadline is None                    # no timer needed any more
    assert d.on_done("o0", True, 11.0) == [Submit("o3", "s0", 103, True)]
    acts = d.on_done("m2", True, 12.0)                # last mandatory: clean up at once
    assert set(acts[:-1]) == {Cancel("o1"), Cancel("o2"), Cancel("o3")}
    assert acts[-1] == Finish()
    assert d.finished and d.finished_at == 12.0 and d.mandatory_done_at == 12.0


# -- cleanup -----------------------------------------------------------------------
def test_deadline_tick_cancels_everything_still_submitted():
    d = opt_dispatcher(deadline=10.0)
    d.start(0.0)
    for k in ("m0", "m1", "m2"):
        d.on_done(k, True, 1.0)
    d.on_done("o0", True, 3.0)                        # -> o3 on s0
    acts = d.on_tick(10.0)
    assert acts == [Cancel("o1"), Cancel("o2"), Cancel("o3"), Finish()]
    assert d.finished and d.next_deadline is None
    assert {r.key: r.status for r in d.records if r.optional} == {
        "o0": "completed", "o1": "cancelled", "o2": "cancelled", "o3": "cancelled"}
    # late replies and ticks after Finish are ignored
    assert d.on_done("o1", True, 10.5) == [] and d.on_tick(11.0) == []


def test_optional_completing_after_deadline_does_not_start_new_work():
    d = opt_dispatcher(deadline=10.0)
    d.start(0.0)
    for k in ("m0", "m1", "m2"):
        d.on_done(k, True, 1.0)
    acts = d.on_done("o0", True, 10.2)                # tick not yet delivered
    assert acts == [Cancel("o1"), Cancel("o2"), Finish()]


def test_finishes_early_when_nothing_left():
    d = opt_dispatcher(n_min=1, n_opt=1, deadline=100.0)
    d.start(0.0)
    assert d.on_done("m0", True, 1.0) == []
    assert d.on_done("o0", True, 2.0) == [Finish()]
    assert d.finished_at == 2.0


def test_no_work_at_all_finishes_at_start():
    d = opt_dispatcher(n_min=0, n_opt=0)
    assert d.start(0.0) == [Finish()]


def test_mandatory_failure_makes_user_unhappy_but_leaves_at_deadline():
    d = opt_dispatcher(n_min=1, deadline=10.0)
    d.start(0.0)
    assert d.on_done("m0", False, 1.0, retry=False) == []
    assert d.mandatory_failed == 1 and d.mandatory_done_at is None
    assert d.on_tick(10.0)[-1] == Finish()


def test_started_time_recorded_and_user_events():
    d = opt_dispatcher(n_min=1, n_opt=0, deadline=5.0)
    d.start(1.0)
    d.on_done("m0", True, 3.0, started=2.5)
    rec = [r for r in d.records if r.key == "m0"][0]
    assert (rec.submitted, rec.started, rec.ended, rec.status) == (1.0, 2.5, 3.0, "completed")
    assert d.finished                                  # nothing left: early finish
    assert d.events("alice") == [
        {"type": "user_arrive", "t": 1.0, "user": "alice", "deadline": 5.0, "n_min": 1},
        {"type": "mandatory_done", "t": 3.0, "user": "alice"},
        {"type": "user_leave", "t": 3.0, "user": "alice"}]


def test_statistics_snapshot():
    d = opt_dispatcher()
    d.start(0.0)
    d.on_done("o0", False, 1.0)
    st = d.statistics()
    assert st["phase"] == "monitoring" and st["killed"] == 1 and st["outstanding"] == 6


# -- legacy baseline ---------------------------------------------------------------
def legacy(n_submit, n_min=3, deadline=10.0):
    return LegacyDispatcher(n_submit, [f"m{i}" for i in range(n_min)], itertools.count(100),
                            deadline, SERVERS)


def test_legacy_submits_everything_at_once_round_robin():
    d = legacy(7)
    acts = d.start(0.0)
    assert [(a.key, a.server, a.optional) for a in acts] == [
        ("m0", "s0", False), ("m1", "s1", False), ("m2", "s2", False),
        ("o0", "s0", True), ("o1", "s1", True), ("o2", "s2", True), ("o3", "s0", True)]


def test_legacy_does_not_replace_or_resubmit_optional():
    d = legacy(5)
    d.start(0.0)
    assert d.on_done("o0", True, 1.0) == []
    assert d.on_done("o1", False, 1.5) == []


def test_legacy_waits_for_mandatory_and_deadline_then_cancels():
    d = legacy(6)
    d.start(0.0)
    d.on_done("o0", True, 1.0)
    for k in ("m0", "m1", "m2"):
        assert d.on_done(k, True, 2.0) == []
    assert d.on_tick(9.9) == []
    assert d.on_tick(10.0) == [Cancel("o1"), Cancel("o2"), Finish()]


def test_legacy_late_mandatory():
    d = legacy(3)
    d.start(0.0)
    d.on_done("m0", True, 1.0)
    assert d.on_tick(10.0) == []
    d.on_done("m1", True, 11.0)
    assert d.on_done("m2", True, 12.0) == [Finish()]
    assert d.mandatory_done_at == 12.0


def test_legacy_all_done_early_finishes():
    d = legacy(4)
    d.start(0.0)
    for k in ("m0", "m1", "m2"):
        d.on_done(k, True, 1.0)
    assert d.on_done("o0", True, 2.0) == [Finish()]


def test_legacy_rejects_n_submit_below_n_min():
    with pytest.raises(ValueError):
        legacy(2)
