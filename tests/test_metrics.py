"""Hand-computed cases for the optional-computation fairness metrics."""
from __future__ import annotations

import json

import pytest

from gridrpc.core.metrics import (EthicMetrics, RequestRecord, UserRecord, compute_metrics,
                                  deserved_shares, metrics_from_events, records_from_events)


def test_deserved_two_users_one_server_overlapping():
    # A: [0, 10], B: [5, 15], n_R = 1.  S = 0, 5, 10, 15
    #   [0, 5):   U = {A}     -> A += 1*5/1   = 5
    #   [5, 10):  U = {A, B}  -> each 1*5/2   = 2.5
    #   [10, 15): U = {B}     -> B += 5
    # deserved A = 7.5, B = 7.5
    users = [UserRecord("A", 0, 10, 1), UserRecord("B", 5, 15, 1)]
    assert deserved_shares(users, 1) == {"A": 7.5, "B": 7.5}
    # with 4 servers everything scales by 4
    assert deserved_shares(users, 4) == {"A": 30.0, "B": 30.0}


def test_deserved_nested_and_three_users():
    # A: [0, 12], B: [2, 6], C: [4, 12], n_R = 2. S = 0, 2, 4, 6, 12
    #   [0,2):  {A}      A += 2*2/1 = 4
    #   [2,4):  {A,B}    each 2*2/2 = 2
    #   [4,6):  {A,B,C}  each 2*2/3 = 4/3
    #   [6,12): {A,C}    each 2*6/2 = 6
    # A = 4 + 2 + 4/3 + 6 = 13.333.., B = 2 + 4/3 = 3.333.., C = 4/3 + 6 = 7.333..
    users = [UserRecord("A", 0, 12, 3), UserRecord("B", 2, 6, 3), UserRecord("C", 4, 12, 3)]
    d = deserved_shares(users, 2)
    assert d["A"] == pytest.approx(40 / 3)
    assert d["B"] == pytest.approx(10 / 3)
    assert d["C"] == pytest.approx(22 / 3)
    # the servers are fully shared out over [0, 12]
    assert sum(d.values()) == pytest.approx(2 * 12)


def test_satisfaction_unfairness_killed_work_counts():
    users = [UserRecord("A", 0, 10, 1, mandatory_done_time=5.0),
             UserRecord("B", 5, 15, 1, mandatory_done_time=7.0)]
    reqs = [RequestRecord("A", 0, 5, completed=True),                  # 5 s
            RequestRecord("A", 5, 6, killed=True, optional=True),      # 1 s, killed: counts
            RequestRecord("B", 6, 7, completed=True),                  # 1 s
            RequestRecord("B", 7, 15, completed=True, optional=True)]  # 8 s
    m = compute_metrics(users, reqs, 1)
    # allocated A = 6, B = 9; deserved 7.5 each -> 0.8 and 1.2
    assert m.allocated == {"A": 6.0, "B": 9.0}
    assert m.satisfaction == pytest.approx({"A": 0.8, "B": 1.2})
    assert m.unfairness == pytest.approx(0.4)
    assert m.completed == 3
    assert (m.completed_mandatory, m.completed_optional) == (2, 1)
    assert m.killed == 1 and m.killed_seconds == 1.0
    assert m.unhappy_users == 0 and m.unhappy == ()


def test_user_without_allocation_has_zero_satisfaction():
    users = [UserRecord("A", 0, 10, 0, 0.0), UserRecord("B", 0, 10, 0, 0.0)]
    m = compute_metrics(users, [RequestRecord("A", 0, 10, completed=True)], 1)
    # deserved 5 each; A got 10 -> 2.0, B got 0 -> 0.0
    assert m.allocated["B"] == 0.0
    assert m.satisfaction == {"A": 2.0, "B": 0.0}
    assert m.unfairness == 2.0


def test_unhappy_detection():
    users = [UserRecord("late", 0, 10, 3, mandatory_done_time=10.5),
             UserRecord("never", 0, 10, 3, mandatory_done_time=None),
             UserRecord("exact", 0, 10, 3, mandatory_done_time=10.0),
             UserRecord("early", 0, 10, 3, mandatory_done_time=2.0)]
    m = compute_metrics(users, [], 2)
    assert m.unhappy_users == 2
    assert set(m.unhappy) == {"late", "never"}
    assert compute_metrics(users, [], 2, tolerance=1.0).unhappy == ("never",)


def test_zero_deserved_user_excluded_and_single_user_fair():
    users = [UserRecord("A", 0, 10, 1, 1.0), UserRecord("Z", 3, 3, 0, 3.0)]
    m = compute_metrics(users, [RequestRecord("A", 0, 1, completed=True)], 1)
    assert "Z" not in m.satisfaction and m.deserved["Z"] == 0.0
    assert m.unfairness == 0.0


def test_errors():
    with pytest.raises(ValueError):
        compute_metrics([UserRecord("A", 0, 1, 1)], [RequestRecord("B", 0, 1)], 1)
    with pytest.raises(ValueError):
        compute_metrics([UserRecord("A", 0, 1, 1)], [], 0)
    with pytest.raises(ValueError):
        compute_metrics([UserRecord("A", 0, 1, 1), UserRecord("A", 0, 1, 1)], [], 1)


def test_to_dict_is_json_serialisable():
    m = compute_metrics([UserRecord("A", 0, 10, 0, 0.0)], [RequestRecord("A", 0, 2, True)], 1)
    d = m.to_dict()
    assert isinstance(m, EthicMetrics)
    assert json.loads(json.dumps(d))["satisfaction"] == {"A": 0.2}
    assert d["unhappy_users"] == 0 and d["completed"] == 1


# -- event log -------------------------------------------------------------------
def log_two_users():
    return [
        {"type": "user_arrive", "t": 0.0, "user": "A", "deadline": 10.0, "n_min": 1},
        {"type": "call_start", "t": 0.0, "call": "A-m0", "user": "A", "optional": False,
         "server": "s0"},
        {"type": "user_arrive", "t": 5.0, "user": "B", "deadline": 15.0, "n_min": 1},
        {"type": "call_end", "t": 5.0, "call": "A-m0", "status": "completed"},
        {"type": "call_start", "t": 5.0, "call": "A-o0", "user": "A", "optional": True},
        {"type": "call_end", "t": 6.0, "call": "A-o0", "status": "killed"},
        {"type": "call_start", "t": 6.0, "call": "B-m0", "user": "B", "optional": False},
        {"type": "call_end", "t": 7.0, "call": "B-m0", "status": "completed"},
        {"type": "mandatory_done", "t": 7.0, "user": "B"},
        {"type": "call_submit", "t": 7.0, "call": "B-o0"},          # unknown: ignored
        {"type": "call_start", "t": 7.0, "call": "B-o0", "user": "B", "optional": True},
        {"type": "call_end", "t": 15.0, "call": "B-o0", "status": "completed"},
        {"type": "call_end", "t": 15.0, "call": "B-o9", "status": "cancelled"},  # never ran
        {"type": "user_leave", "t": 10.0, "user": "A"},
        {"type": "user_leave", "t": 15.0, "user": "B"},
    ]


def test_records_from_events():
    users, reqs = records_from_events(log_two_users())
    by_user = {u.user: u for u in users}
    # A has no explicit mandatory_done: derived from its 1st completed mandatory call
    assert by_user["A"] == UserRecord("A", 0.0, 10.0, 1, 5.0)
    assert by_user["B"] == UserRecord("B", 5.0, 15.0, 1, 7.0)
    assert len(reqs) == 4
    assert RequestRecord("A", 5.0, 6.0, completed=False, killed=True, optional=True) in reqs


def test_metrics_from_events_matches_hand_computation():
    events = log_two_users()
    m = metrics_from_events(list(reversed(events)), n_R=1)   # order does not matter
    assert m.satisfaction == pytest.approx({"A": 0.8, "B": 1.2})
    assert m.unfairness == pytest.approx(0.4)
    assert m.completed == 3 and m.unhappy_users == 0


def test_events_open_call_closed_at_leave_and_missing_mandatory():
    events = [
        {"type": "user_arrive", "t": 0.0, "user": "A", "deadline": 4.0, "n_min": 2},
        {"type": "call_start", "t": 1.0, "call": "c1", "user": "A", "optional": False},
        {"type": "call_end", "t": 2.0, "call": "c1", "status": "completed"},
        {"type": "call_start", "t": 2.0, "call": "c2", "user": "A", "optional": False},
        {"type": "user_leave", "t": 6.0, "user": "A"},
        {"type": "user_arrive", "t": 0.0, "user": "B", "deadline": 4.0, "n_min": 0},
    ]
    users, reqs = records_from_events(events)
    u = {x.user: x for x in users}
    assert u["A"].mandatory_done_time is None           # only 1 of 2 mandatory done
    assert u["B"].mandatory_done_time == 0.0            # n_min = 0: done on arrival
    open_call = [r for r in reqs if r.start == 2.0][0]
    assert open_call.end == 6.0 and not open_call.completed and not open_call.killed
    m = metrics_from_events(events, 1)
    assert m.unhappy == ("A",) and m.allocated["A"] == 5.0


@pytest.mark.parametrize("bad", [
    [{"type": "user_arrive", "t": 0.0, "user": "A", "n_min": 1}],                 # no deadline
    [{"type": "call_start", "t": 0.0, "call": "c", "user": "A"},
     {"type": "call_start", "t": 1.0, "call": "c", "user": "A"}],                # twice
    [{"type": "call_start", "t": 0.0, "call": "c", "user": "A"},
     {"type": "call_end", "t": 1.0, "call": "c", "status": "exploded"}],
    [{"type": "user_leave", "user": "A"}],                                        # no t
])
def test_bad_events_raise_value_error(bad):
    with pytest.raises(ValueError):
        records_from_events(bad)
