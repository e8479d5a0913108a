"""The five optional-computation scenarios: pure, seeded generation."""
from __future__ import annotations

import random
import statistics

import pytest

from gridrpc.core.scenarios import SCENARIOS, ClientPlan, arrival_polynomial, generate


def test_night_simultaneous():
    plans = generate("night-simultaneous", random.Random(0))
    assert len(plans) == 10
    assert all(p.t0 == 0.0 and p.deadline == 100.0 for p in plans)
    assert plans[0] == ClientPlan(user="u0", t0=0.0, deadline=100.0, n_min=3, n_max=1000,
                                  task_time=1.0)
    assert len({p.user for p in plans}) == 10


def test_night_consecutive():
    plans = generate("night-consecutive", random.Random(0))
    assert [p.t0 for p in plans] == pytest.approx([0.1 * i for i in range(10)])
    assert all(p.deadline == pytest.approx(p.t0 + 100.0) for p in plans)


def test_day_regular():
    plans = generate("day-regular", random.Random(0), n_users=4)
    assert [p.t0 for p in plans] == [0.0, 10.0, 20.0, 30.0]
    assert [p.deadline for p in plans] == [100.0, 110.0, 120.0, 130.0]


def test_time_scale_scales_everything():
    base = generate("day-regular", random.Random(0))
    fast = generate("day-regular", random.Random(0), time_scale=0.1)
    for b, f in zip(base, fast):
        assert f.t0 == pytest.approx(b.t0 * 0.1)
        assert f.deadline == pytest.approx(b.deadline * 0.1)
        assert f.task_time == pytest.approx(0.1)
        assert (f.n_min, f.n_max) == (b.n_min, b.n_max)


def test_polynomial_is_a_probability_source():
    vals = [arrival_polynomial(t / 100 - 0.5) for t in range(100)]
    assert all(0 < v / 40 < 1 for v in vals)
    assert sum(vals) / 40 == pytest.approx(9.86, abs=0.01)   # ≈ 10 clients expected
    assert arrival_polynomial(0.0) == 3.1


def test_diurnal_is_seeded_and_averages_ten_clients():
    a = generate("day-diurnal", random.Random(42))
    b = generate("day-diurnal", random.Random(42))
    assert a == b
    counts = [len(generate("day-diurnal", random.Random(s))) for s in range(400)]
    assert statistics.mean(counts) == pytest.approx(9.86, abs=0.5)
    for p in a:
        assert 0 <= p.t0 < 100 and p.t0 == int(p.t0)
        assert p.task_time == 1.0
    assert [p.t0 for p in a] == sorted(p.t0 for p in a)
    assert len({p.t0 for p in a}) == len(a)          # at most one client per second


def test_diurnal_random_task_times():
    plans = [p for s in range(30) for p in generate("day-diurnal-random", random.Random(s))]
    ts = [p.task_time for p in plans]
    assert all(0.125 <= t <= 8.0 for t in ts)
    assert len(set(ts)) == len(ts)
    assert 3.0 < statistics.mean(ts) < 5.1            # uniform mean 4.06
    scaled = generate("day-diurnal-random", random.Random(1), time_scale=0.5)
    plain = generate("day-diurnal-random", random.Random(1))
    assert [p.task_time for p in scaled] == pytest.approx([p.task_time / 2 for p in plain])


def test_parameters_and_errors():
    plans = generate("night-simultaneous", random.Random(0), n_users=100, n_min=3,
                     n_max=10000, relative_deadline=100.0)
    assert len(plans) == 100 and plans[-1].n_max == 10000
    with pytest.raises(ValueError):
        generate("morning", random.Random(0))
    with pytest.raises(ValueError):
        generate("day-regular", random.Random(0), time_scale=0)
    with pytest.raises(ValueError):
        generate("day-regular", random.Random(0), n_min=5, n_max=3)
    assert set(SCENARIOS) == {"night-simultaneous", "night-consecutive", "day-regular",
                              "day-diurnal", "day-diurnal-random"}
