"""The ethic queue's ``accounting`` option (rule 4): cumulative (the paper)
versus virtual (start-time fair queuing)."""
from __future__ import annotations

import random

import pytest

from gridrpc.core.queue import Request, SedScheduler, Start, make_policy
from gridrpc.core.queue_ethic import EthicPolicy


def _opt(rid, user, t=0.0):
    return Request(id=rid, user=user, service="sleep", optional=True, submitted=t)


def test_bad_options():
    with pytest.raises(ValueError):
        EthicPolicy(accounting="lifo")
    with pytest.raises(ValueError):
        EthicPolicy(forget_after=0)
    assert make_policy("ethic", accounting="virtual").accounting == "virtual"
    assert EthicPolicy().accounting == "cumulative"


def _served_alone(policy, seconds=10.0):
    """u0 alone on a SeD for ``seconds``, then u0 and newcomer u1 both have a
    waiting optional request when the slot frees. Returns the scheduler."""
    s = SedScheduler(policy=policy, rng=random.Random(1))
    assert s.submit(_opt("a", "u0"), 0.0) == [Start("a")]
    s.submit(_opt("b", "u0", 1.0), 1.0)
    s.submit(_opt("c", "u1", seconds), seconds)
    return s


def test_cumulative_newcomer_takes_every_slot_until_caught_up():
    s = _served_alone(EthicPolicy())
    # the slot frees: u1 (0 s) before u0 (10 s), and again and again
    assert s.finished("a", 10.0) == [Start("c")]
    assert s.policy.effective_allocation(list(s.requests.values()), s.user_allocation(10.0), 10.0) \
        == {"u0": 10.0, "u1": 0.0}


def test_virtual_newcomer_starts_level_with_present_users():
    pol = EthicPolicy(accounting="virtual")
    s = _served_alone(pol)
    eff = pol.effective_allocation(list(s.requests.values()), s.user_allocation(10.0), 10.0)
    assert eff["u1"] == pytest.approx(eff["u0"]) == pytest.approx(10.0)
    # with equal keys the random tie-break decides: both users get slots
    firsts = set()
    for seed in range(20):
        pol2 = EthicPolicy(accounting="virtual")
        s2 = _served_alone(pol2)
        s2.rng = random.Random(seed)
        firsts |= {a.request_id for a in s2.finished("a", 10.0)}
    assert firsts == {"b", "c"}


def test_virtual_no_credit_for_absence():
    pol = EthicPolicy(accounting="virtual")
    reqs = [_opt("x", "u0"), _opt("y", "u1")]
    pol.effective_allocation(reqs, {"u0": 0.0, "u1": 0.0}, 0.0)
    # u1 leaves for a while; u0 keeps being served up to 50 s
    pol.effective_allocation(reqs[:1], {"u0": 20.0, "u1": 5.0}, 20.0)
    pol.effective_allocation(reqs[:1], {"u0": 50.0, "u1": 5.0}, 50.0)
    eff = pol.effective_allocation(reqs, {"u0": 50.0, "u1": 5.0}, 51.0)
    # u1 comes back level with u0, not 45 s behind (which would starve u0)
    assert eff["u1"] == pytest.approx(eff["u0"])


def test_virtual_keeps_a_heavy_users_debt_across_a_short_gap():
    pol = EthicPolicy(accounting="virtual")
    reqs = [_opt("x", "u0"), _opt("y", "u1")]
    pol.effective_allocation(reqs, {"u0": 0.0, "u1": 0.0}, 0.0)
    pol.effective_allocation(reqs, {"u0": 30.0, "u1": 10.0}, 30.0)
    pol.effective_allocation(reqs[1:], {"u0": 30.0, "u1": 10.0}, 30.5)     # u0's next request not yet in
    eff = pol.effective_allocation(reqs, {"u0": 30.0, "u1": 10.0}, 30.6)
    assert eff["u0"] - eff["u1"] == pytest.approx(20.0)                     # still served more


def _light_user_returns(pol):
    reqs = [_opt("x", "u0"), _opt("y", "u1")]
    pol.effective_allocation(reqs, {"u0": 0.0, "u1": 0.0}, 0.0)
    pol.effective_allocation(reqs, {"u0": 30.0, "u1": 10.0}, 30.0)          # u1 served less so far
    pol.effective_allocation(reqs[:1], {"u0": 30.0, "u1": 10.0}, 30.5)     # u1's next request not yet in
    return pol.effective_allocation(reqs, {"u0": 30.0, "u1": 10.0}, 30.6)


def test_virtual_keeps_a_light_users_deficit_across_a_short_gap():
    # each user is absent for a round trip after each of its requests (the client sends
    # the next one when the previous ends): the least served must stay first in line
    eff = _light_user_returns(EthicPolicy(accounting="virtual"))
    assert eff["u0"] - eff["u1"] == pytest.approx(20.0)
    # the earlier rule (rejoin_grace=0): levelled at every return, its deficit lost
    eff0 = _light_user_returns(EthicPolicy(accounting="virtual", rejoin_grace=0.0))
    assert eff0["u1"] == pytest.approx(eff0["u0"])


def test_rejoin_grace_is_checked():
    for bad in (-1.0, float("nan"), 7200.0):
        with pytest.raises(ValueError):
            EthicPolicy(accounting="virtual", rejoin_grace=bad)
    assert make_policy("ethic", accounting="virtual", rejoin_grace=0.5).rejoin_grace == 0.5
