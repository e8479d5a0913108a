"""Pure tests of the aggregators (gridrpc.core.aggregators): ranking rules,
deterministic random tie-breaks, and building them by name, spec or path."""
import math
import random
from typing import ClassVar

import pytest
from hypothesis import given, settings, strategies as st

from gridrpc.core import aggregators as agg
from gridrpc.core.aggregators import (AGGREGATORS, DefaultAggregator, LeastCostAggregator,
                                      LeastSlowdownAggregator, LeastWaitTimeAggregator,
                                      PriorityAggregator, make_aggregator)


class MyAgg:
    """A user aggregator, registered as an operator plugin in the tests below."""
    name: ClassVar[str] = "my_agg"

    def __init__(self, reverse: bool = False) -> None:
        self.reverse = reverse

    def rank(self, servers, rng):
        return sorted(servers, key=lambda s: s["name"], reverse=self.reverse)


def srv(name, **est):
    return {"name": name, "address": f"tcp://{name}:1", "estimation": est}


def names(servers):
    return [s["name"] for s in servers]


def rank(a, servers, seed=0):
    return names(a.rank(list(servers), random.Random(seed)))


# -- default --------------------------------------------------------------
def test_default_least_recently_used_first():
    servers = [srv("a", time_since_last_solve=5), srv("b", time_since_last_solve=50),
               srv("c", time_since_last_solve=0.5), srv("d", time_since_last_solve=1e9)]
    assert rank(DefaultAggregator(), servers) == ["d", "b", "a", "c"]


def test_default_servers_without_the_tag_rank_last_but_are_kept():
    servers = [srv("none"), srv("a", time_since_last_solve=1), {"name": "noest"},
               srv("nan", time_since_last_solve=math.nan), srv("str", time_since_last_solve="9"),
               srv("bool", time_since_last_solve=True), srv("b", time_since_last_solve=2)]
    for seed in range(20):
        out = rank(DefaultAggregator(), servers, seed)
        assert out[:2] == ["b", "a"]
        assert sorted(out[2:]) == sorted(["none", "noest", "nan", "str", "bool"])


def test_default_ties_broken_at_random_but_deterministically():
    servers = [srv(n, time_since_last_solve=10) for n in "abcdefgh"]
    first = rank(DefaultAggregator(), servers, seed=42)
    assert rank(DefaultAggregator(), servers, seed=42) == first        # same seed, same order
    orders = {tuple(rank(DefaultAggregator(), servers, seed)) for seed in range(20)}
    assert len(orders) > 5                                               # really random
    firsts = {rank(DefaultAggregator(), servers, seed)[0] for seed in range(100)}
    assert firsts == set("abcdefgh")                                     # anyone can win a tie


def test_default_does_not_mutate_input():
    servers = [srv("a", time_since_last_solve=1), srv("b", time_since_last_solve=2)]
    before = [dict(s) for s in servers]
    DefaultAggregator().rank(servers, random.Random(0))
    assert servers == before and names(servers) == ["a", "b"]


def test_empty_list():
    for cls in AGGREGATORS.values():
        assert cls().rank([], random.Random(0)) == []


# -- priority -------------------------------------------------------------
def test_priority_min_and_max():
    servers = [srv("a", eft=10, free_cpu=0.1), srv("b", eft=5, free_cpu=0.5),
               srv("c", eft=7, free_cpu=0.9)]
    assert rank(PriorityAggregator(order=[["eft", "min"]]), servers) == ["b", "c", "a"]
    assert rank(PriorityAggregator(order=[["eft", "max"]]), servers) == ["a", "c", "b"]
    assert rank(PriorityAggregator(order=[["free_cpu", "max"]]), servers) == ["c", "b", "a"]


def test_priority_is_lexicographic():
    servers = [srv("a", eft=5, free_cpu=0.1), srv("b", eft=5, free_cpu=0.8),
               srv("c", eft=4, free_cpu=0.0), srv("d", eft=6, free_cpu=1.0)]
    a = PriorityAggregator(order=[["eft", "min"], ["free_cpu", "max"]])
    for seed in range(10):
        assert rank(a, servers, seed) == ["c", "b", "a", "d"]


def test_priority_missing_value_loses_in_both_directions():
    servers = [srv("missing"), srv("low", x=1), srv("high", x=100), srv("nan", x=math.nan)]
    for direction, expect in (("min", ["low", "high"]), ("max", ["high", "low"])):
        for seed in range(10):
            out = rank(PriorityAggregator(order=[["x", direction]]), servers, seed)
            assert out[:2] == expect and set(out[2:]) == {"missing", "nan"}


def test_priority_missing_first_key_loses_even_with_best_second_key():
    servers = [srv("a", free_cpu=1.0), srv("b", eft=99, free_cpu=0.0)]
    assert rank(PriorityAggregator(order=["-eft", "+free_cpu"]), servers) == ["b", "a"]


def test_priority_string_form():
    a = PriorityAggregator(order=["-eft", "free_cpu", "+nb_cpu"])
    assert a.order == [("eft", "min"), ("free_cpu", "max"), ("nb_cpu", "max")]
    servers = [srv("a", eft=3), srv("b", eft=1), srv("c", eft=2)]
    assert rank(a, servers) == ["b", "c", "a"]


def test_priority_ties_random_and_seeded():
    servers = [srv(n, eft=1) for n in "abcdef"]
    a = PriorityAggregator(order=["-eft"])
    assert rank(a, servers, 3) == rank(a, servers, 3)
    assert len({tuple(rank(a, servers, s)) for s in range(20)}) > 3


def test_priority_without_order_is_random():
    servers = [srv(n) for n in "abcd"]
    assert sorted(rank(PriorityAggregator(), servers)) == list("abcd")


# -- least wait time / slowdown / cost -------------------------------------
def test_least_wait_time_uses_est_wait_then_queue_times_tcomp():
    servers = [srv("busy", est_wait=30.0, eft=1.0),
               srv("idle", est_wait=0.0, eft=9.0),
               # no est_wait: 2 waiting * 4 s = 8 s
               srv("queued", num_waiting=2, num_running=0, tcomp=4.0, eft=5.0)]
    assert rank(LeastWaitTimeAggregator(), servers) == ["idle", "queued", "busy"]


def test_least_wait_time_ties_broken_by_eft():
    servers = [srv("late", est_wait=2.0, eft=100.0), srv("early", est_wait=2.0, eft=50.0),
               srv("other", est_wait=3.0, eft=1.0)]
    for seed in range(10):
        assert rank(LeastWaitTimeAggregator(), servers, seed) == ["early", "late", "other"]


def test_least_slowdown():
    servers = [
        srv("explicit", slowdown=1.5),
        srv("computed", est_wait=10.0, tcomp=5.0),        # (10 + 5) / 5 = 3
        srv("idle", est_wait=0.0, tcomp=5.0),             # (0 + 5) / 5 = 1
        srv("short", est_wait=10.0, tcomp=1.0),           # (10 + 1) / 1 = 11
        srv("unknown_run", est_wait=1.0),                 # no tcomp: 1 + wait = 2
    ]
    assert rank(LeastSlowdownAggregator(), servers) == \
        ["idle", "explicit", "unknown_run", "computed", "short"]


def test_least_cost_cheapest_first_local_servers_free():
    servers = [srv("vm-big", price=0.5), srv("local"), srv("vm-small", price=0.1)]
    assert rank(LeastCostAggregator(), servers) == ["local", "vm-small", "vm-big"]


def test_least_cost_max_cost_filters():
    servers = [srv("vm-big", price=0.5), srv("local"), srv("vm-small", price=0.1),
               srv("vm-edge", price=0.2)]
    assert rank(LeastCostAggregator(max_cost=0.2), servers) == ["local", "vm-small", "vm-edge"]
    assert rank(LeastCostAggregator(max_cost=0), servers) == ["local"]
    assert rank(make_aggregator({"name": "least_cost", "params": {"max_cost": 0.05}}),
                [srv("vm", price=0.1)]) == []


def test_least_cost_ties_broken_by_slowdown():
    servers = [srv("slow", price=0.1, est_wait=20.0, tcomp=2.0),   # 11
               srv("fast", price=0.1, est_wait=0.0, tcomp=2.0),    # 1
               srv("mid", price=0.1, slowdown=4.0)]
    for seed in range(10):
        assert rank(LeastCostAggregator(), servers, seed) == ["fast", "mid", "slow"]


@pytest.mark.parametrize("cls", list(AGGREGATORS.values()))
def test_estimation_not_a_dict_does_not_crash(cls):
    servers = [{"name": "a", "estimation": None}, {"name": "b", "estimation": [1]},
               {"name": "c"}, srv("d", time_since_last_solve=1, eft=1)]
    assert sorted(rank(cls(), servers)) == ["a", "b", "c", "d"]


# -- make_aggregator --------------------------------------------------------
def test_make_by_name_and_default():
    assert isinstance(make_aggregator(None), DefaultAggregator)
    assert isinstance(make_aggregator("default"), DefaultAggregator)
    for name, cls in AGGREGATORS.items():
        assert type(make_aggregator(name)) is cls and cls.name == name
    assert set(AGGREGATORS) >= {"default", "priority", "least_wait_time", "least_slowdown",
                                "least_cost"}


def test_make_by_dict_spec_with_params():
    a = make_aggregator({"name": "priority", "params": {"order": [["eft", "min"], "-tcomp"]}})
    assert isinstance(a, PriorityAggregator) and a.order == [("eft", "min"), ("tcomp", "min")]
    c = make_aggregator({"name": "least_cost", "params": {"max_cost": 1.5}})
    assert c.max_cost == 1.5
    assert isinstance(make_aggregator({"name": "least_cost"}), LeastCostAggregator)
    assert isinstance(make_aggregator({"name": "default", "params": None}), DefaultAggregator)


def test_an_import_path_is_never_imported(monkeypatch):
    """A name is looked up, never imported: 'pkg.mod:Class' is a bad name, even
    for a class that exists, and no module is imported for it."""
    import sys
    monkeypatch.delitem(sys.modules, "json.tool", raising=False)
    for spec in ("tests.test_core_aggregators:MyAgg", {"name": "os:system", "params": {"command": "true"}},
                 "json.tool", {"name": "json.tool"}):
        with pytest.raises(ValueError, match="aggregator"):
            make_aggregator(spec)
    assert "json.tool" not in sys.modules


def test_plugins_registered_by_the_operator(monkeypatch):
    """The operator's configuration (``--plugin``, deployment ``plugins``)
    registers classes at start; requests may then name them."""
    from gridrpc.errors import ConfigError
    from gridrpc.plugins import load_aggregator_plugins
    monkeypatch.setattr(agg, "AGGREGATORS", dict(AGGREGATORS))
    import gridrpc.plugins as plugins
    monkeypatch.setattr(plugins, "AGGREGATORS", agg.AGGREGATORS)
    assert load_aggregator_plugins(["tests.test_core_aggregators:MyAgg"], entry_points_too=False) == ["my_agg"]
    a = make_aggregator({"name": "my_agg", "params": {"reverse": True}})
    assert rank(a, [srv("a"), srv("b")]) == ["b", "a"]
    with pytest.raises(ValueError, match="bad parameters"):
        make_aggregator({"name": "my_agg", "params": {"bogus": 1}})
    assert rank(a, [srv("a"), srv("b")]) == ["b", "a"]
    with pytest.raises(ConfigError, match="cannot load plugin"):
        load_aggregator_plugins(["tests.test_core_aggregators:NoSuchClass"], entry_points_too=False)
    with pytest.raises(ConfigError, match="package.module:Class"):
        load_aggregator_plugins(["no_colon"], entry_points_too=False)


def test_a_registry_limits_the_names():
    assert type(make_aggregator("default", {"default": DefaultAggregator})) is DefaultAggregator
    with pytest.raises(ValueError, match="unknown aggregator 'priority'"):
        make_aggregator("priority", {"default": DefaultAggregator})


def test_register_aggregator():
    class Reg(MyAgg):
        name: ClassVar[str] = "test_registered_agg"
    try:
        assert agg.register_aggregator(Reg) is Reg
        assert type(make_aggregator("test_registered_agg")) is Reg
    finally:
        AGGREGATORS.pop("test_registered_agg", None)


@pytest.mark.parametrize("spec, message", [
    ("nope", "unknown aggregator 'nope'"),
    ({"name": "nope"}, "unknown aggregator"),
    ("no_such_module_xyz:Cls", "bad aggregator name"),
    ("tests.test_core_aggregators:NoSuchClass", "bad aggregator name"),
    (42, "bad aggregator spec"),
    ({"params": {}}, "bad aggregator spec"),
    ({"name": 5}, "bad aggregator spec"),
    (["default"], "bad aggregator spec"),
    ({"name": "least_cost", "params": [1]}, "params must be an object"),
    ({"name": "priority", "params": {"order": [["eft", "up"]]}}, "direction must be"),
    ({"name": "priority", "params": {"order": [5]}}, "priority"),
    ({"name": "priority", "params": {"order": [["eft"]]}}, "priority"),
    ({"name": "priority", "params": {"order": [["eft", "min", "x"]]}}, "priority"),
    ({"name": "priority", "params": {"order": "-eft"}}, "priority"),
    ({"name": "priority", "params": {"order": [[1, "min"]]}}, "priority"),
    ({"name": "least_cost", "params": {"max_cost": "cheap"}}, "max_cost"),
    ({"name": "least_cost", "params": {"max_cost": True}}, "max_cost"),
])
def test_make_errors_are_value_errors_with_a_clear_message(spec, message):
    with pytest.raises(ValueError, match=message):
        make_aggregator(spec)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError) as info:
        make_aggregator("fastest")
    for name in ("default", "priority", "least_cost"):
        assert name in str(info.value)


# -- invariant --------------------------------------------------------------
tag_values = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True),
                       st.integers(-10, 10), st.booleans(), st.text(max_size=2))
estimations = st.dictionaries(
    st.sampled_from(["time_since_last_solve", "eft", "free_cpu", "est_wait", "tcomp",
                     "num_waiting", "num_running", "slowdown", "price"]),
    tag_values, max_size=6)


@settings(max_examples=30, deadline=None)
@given(st.lists(estimations, max_size=8), st.integers(0, 2**32))
def test_property_rank_is_a_permutation_and_deterministic(ests, seed):
    servers = [srv(f"s{i}", **e) for i, e in enumerate(ests)]
    for a in (DefaultAggregator(), PriorityAggregator(order=["-eft", "+free_cpu"]),
              LeastWaitTimeAggregator(), LeastSlowdownAggregator()):
        out = rank(a, servers, seed)
        assert sorted(out) == sorted(names(servers))
        assert out == rank(a, servers, seed)
    kept = rank(LeastCostAggregator(max_cost=0.5), servers, seed)
    assert len(set(kept)) == len(kept) and set(kept) <= set(names(servers))
