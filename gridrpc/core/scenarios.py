"""The five optional-computation scenarios of Klein-Halmaghi (2012, ch. 7).

Pure generation of client arrival times and task times from a seeded
``random.Random``. Times are in the paper's compressed units (8 h of a working
night = 100 s) multiplied by ``time_scale``: ``time_scale=0.1`` turns the
100-s experiments into 10-s ones (arrivals, deadlines and task times all
shrink together, so the number of requests that fit is unchanged).

========================  =====================================================
``night-simultaneous``    all ``t0 = 0``
``night-consecutive``     ``t0_i = 0.1 i``
``day-regular``           ``t0_i = 10 i``
``day-diurnal``           each second ``t`` in ``[0, 100)``, a client arrives
                          at ``t`` with probability ``P(t/100 - 0.5) / 40``
                          (Calzarossa & Serazzi 1985; ~9.9 clients expected)
``day-diurnal-random``    as ``day-diurnal``, each client's ``T`` uniform in
                          ``[0.125, 8]``
========================  =====================================================

Defaults follow the paper: 10 users, ``T = 1``, deadline 100 s after arrival,
``n_min = 3``, ``n_max = 1000``. For the diurnal scenarios ``n_users`` is
ignored (the number of clients is random and may even be 0).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["ClientPlan", "SCENARIOS", "generate", "arrival_polynomial"]

SCENARIOS = ("night-simultaneous", "night-consecutive", "day-regular",
             "day-diurnal", "day-diurnal-random")

_DAY = 100.0                       # length of the diurnal window, paper units
_P_COEFFS = (3.1, -8.5, 24.7, 130.8, 107.7, -804.2, -2038.5, 1856.8, 4618.6)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientPlan:
    user: str
    t0: float                      # arrival time
    deadline: float                # absolute: t0 + relative deadline
    n_min: int
    n_max: int
    task_time: float               # T, the duration of each of its requests


def arrival_polynomial(x: float) -> float:
    """Calzarossa & Serazzi's arrival-rate polynomial P(x), x in [-0.5, 0.5]."""
    return sum(c * x ** k for k, c in enumerate(_P_COEFFS))


DEFAULT_INTERVAL = {"night-consecutive": 0.1, "day-regular": 10.0}


def _arrivals(name: str, rng: random.Random, n_users: int,
              interval: float | None = None) -> list[float]:
    if name == "night-simultaneous":
        return [0.0] * n_users
    if name in DEFAULT_INTERVAL:
        step = DEFAULT_INTERVAL[name] if interval is None else interval
        return [step * i for i in range(n_users)]
    # diurnal: one Bernoulli draw per whole second
    out = []
    for t in range(int(_DAY)):
        p = arrival_polynomial(t / _DAY - 0.5) / 40.0
        if rng.random() < min(1.0, max(0.0, p)):
            out.append(float(t))
    return out


def generate(name: str, rng: random.Random, *, n_users: int = 10,
             task_time: float = 1.0, relative_deadline: float = 100.0,
             n_min: int = 3, n_max: int = 1000, time_scale: float = 1.0,
             task_range: tuple[float, float] = (0.125, 8.0),
             arrival_interval: float | None = None) -> list[ClientPlan]:
    """Client plans of scenario ``name`` (one of :data:`SCENARIOS`), sorted by
    arrival. ``task_range`` is the uniform range of ``T`` for
    ``day-diurnal-random``; ``arrival_interval`` replaces the paper's 0.1 s
    (night-consecutive) or 10 s (day-regular) between arrivals (paper units,
    scaled like the rest). Users are named ``u0``, ``u1``, … in arrival order."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    if time_scale <= 0:
        raise ValueError("time_scale must be positive")
    if not 0 <= n_min <= n_max:
        raise ValueError("need 0 <= n_min <= n_max")
    if n_users < 0:
        raise ValueError("n_users must be >= 0")
    if arrival_interval is not None and arrival_interval < 0:
        raise ValueError("arrival_interval must be >= 0")
    plans = []
    for i, t0 in enumerate(_arrivals(name, rng, n_users, arrival_interval)):
        if name == "day-diurnal-random":
            T = rng.uniform(*task_range)
        else:
            T = task_time
        t0s = t0 * time_scale
        plans.append(ClientPlan(user=f"u{i}", t0=t0s,
                                deadline=t0s + relative_deadline * time_scale,
                                n_min=n_min, n_max=n_max, task_time=T * time_scale))
    return plans
