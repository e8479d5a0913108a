"""gridrpc.sim: the simulator drives the real core; determinism; a small
validation against the stored measurements; the plan on one 2-core host."""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import pytest

from gridrpc.core.agent import machine as core_agent
from gridrpc.core.aggregators import make_aggregator
from gridrpc.core.estimation import RunTimePredictor, queue_tags, scheduler_tags
from gridrpc.core.queue import Request, SedScheduler, make_policy
from gridrpc.sim import Costs, World, closed_loop, discovery_series, elements_for
from gridrpc.sim.elements import AgentNode, SedNode

ROOT = Path(__file__).resolve().parent.parent


def test_the_simulator_runs_the_real_core_objects():
    w = World(seed=3).build(elements_for("L2-2", 10))
    w.wait_registered()
    assert all(type(a.state) is core_agent.AgentState for a in w.agents.values())
    assert type(w.agents["MA"].state.role).__name__ == "MasterRole"
    sed = next(iter(w.seds.values()))
    assert type(sed.calls).__name__ == "SedCalls"
    assert all(type(r.scheduler) is SedScheduler for r in sed.replicas.values())
    assert len(w.agents["MA"].state.registry.children) == 2


def test_scheduler_tags_is_queue_tags_of_the_scheduler():
    sch = SedScheduler(make_policy("fcfs"), max_concurrent=1)
    pred = RunTimePredictor()
    pred.observe("s", 2.0)
    sch.submit(Request(id="a", user="u", service="s", submitted=0.0), 0.0)
    sch.submit(Request(id="b", user="u", service="s", submitted=0.1), 0.1)
    got = scheduler_tags(scheduler=sch, service="s", predictor=pred, now=1.0, last_solve=None)
    want = queue_tags(service="s", predictor=pred, now=1.0, num_waiting=1, num_running=1, max_concurrent=1,
                      last_solve=None, running=[(0.0, "s")], waiting_services=["s"])
    assert got == want and got["eft"] == pytest.approx(6.0)


def test_discovery_in_the_sim_ranks_as_the_core_aggregator_does():
    """The same estimates through the simulated tree and straight through
    the core aggregator give the same ranking (LRU: distinct last solves)."""
    w = World(seed=5).build(elements_for("flat", 6))
    w.wait_registered()
    now = w.sim.now
    reps = [r for s in w.seds.values() for r in s.replicas.values()]
    for i, r in enumerate(reps):
        r.last_solve = now - 10.0 * (i + 1)           # older solve = ranked first by "default"
    c = w.client()
    got = {}
    from gridrpc.sim.elements import User
    u = User(c, "u", service="noop", k=6, call=False, calls=1, think=None, user="u",
             on_done=lambda user, _: got.setdefault("done", True))
    orig = w.record_discovery

    def rec(user, latency, h, ok):
        got["servers"] = [s["name"] for s in h["servers"]]
        got["est"] = [s["estimation"] for s in h["servers"]]
        orig(user, latency, h, ok)
    w.record_discovery = rec
    u.begin()
    w.sim.run(until=w.sim.now + 1.0)
    assert got["servers"] == [r.name for r in reversed(reps)]
    servers = [{"name": n, "address": "x", "estimation": e} for n, e in zip(got["servers"], got["est"])]
    random.Random(0).shuffle(servers)
    ranked = make_aggregator("default").rank(servers, random.Random(1))
    assert [s["name"] for s in ranked] == got["servers"]


def _summary(seed):
    w = World(seed=seed).build(elements_for("L2-2", 20))
    w.wait_registered()
    return closed_loop(w, 4, seconds=0.3)


def test_determinism_with_a_seed():
    a, b = _summary(7), _summary(7)
    assert a == b
    assert a["calls"] > 50 and a["call_failures"] == 0


def test_ethic_policy_runs_in_the_sim():
    from gridrpc.sim.model import ServiceModel
    w = World(seed=2).build(elements_for("flat", 2), services={"sleep": ServiceModel(mean=0.05, cpu_bound=False)},
                            policy="ethic")
    w.wait_registered()
    r = closed_loop(w, 6, seconds=1.0, service="sleep", k=2)
    assert r["calls"] >= 20 and r["call_failures"] == 0


def test_small_validation_against_the_stored_study():
    """Predictions of two stored runs with the built-in calibration: within
    30 % on the discovery median (docs/simulation.md has the full table)."""
    study = json.loads((ROOT / "benchmarks/scalability/results/latest.json").read_text())
    runs = {(r["n"], r["shape"]): r for r in study["runs"]}
    for key in ((1, "flat"), (50, "flat"), (500, "flat")):
        run = runs[key]
        w = World(seed=1).build(elements_for(key[1], key[0]))
        w.wait_registered()
        pred = discovery_series(w, rounds=100)["discovery_median_ms"]
        assert pred == pytest.approx(run["discovery"]["median_ms"], rel=0.3), (key, pred)


def test_plan_on_one_two_core_host_chooses_flat():
    from gridrpc.sim.plan import choose
    shape, why = choose(500, {"localhost": {"cores": 2}}, max_levels=3)
    assert shape.agents == [1], why
    assert "<- chosen" in why and "one host of 2 cores" in why


def test_plan_on_a_cluster_is_simulated_too():
    from gridrpc.sim.plan import choose
    hosts = {f"n{i}": {"cores": 8} for i in range(4)}
    shape, why = choose(64, hosts, max_levels=2)
    assert "4 hosts" in why and "<- chosen" in why


def test_cli_parser():
    from gridrpc.sim.cli import add_parser
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers(dest="cmd"))
    a = p.parse_args(["sim", "run", "--seds", "10", "--shape", "L2-2"])
    assert a.sim_cmd == "run" and a.seds == 10
    a = p.parse_args(["sim", "scale", "--seds", "1000", "--clients", "100"])
    assert a.func is not None


def test_costs_roundtrip(tmp_path):
    c = Costs.load(None)
    p = tmp_path / "c.json"
    p.write_text(c.to_json())
    assert Costs.load(str(p)) == c


# -- pushed state (docs/simulation.md "Scale: 100,000 SeDs, 10,000 clients") ------------------------------------------------
def _one_discovery(w, k):
    from gridrpc.sim.elements import User
    c = w.client()
    got = {}
    orig = w.record_discovery

    def rec(user, latency, h, ok):
        got["h"] = h
        orig(user, latency, h, ok)
    w.record_discovery = rec
    User(c, "u", service="noop", k=k, call=False, calls=1, think=None, user="u").begin()
    w.sim.run(until=w.sim.now + 1.0)
    return got["h"]


def test_simulated_seds_push_views_and_the_ma_answers_from_them():
    """Through a LA (SeD -> LA -> MA batches), the MA answers from its view
    in one hop; without views every discovery fans out."""
    for views in (True, False):
        w = World(seed=4, views=views).build(elements_for("L2-2", 12))
        w.wait_registered()
        w.sim.run(until=w.sim.now + 0.2)
        r = closed_loop(w, 4, seconds=0.3)
        ma = w.agents["MA"]
        assert r["call_failures"] == 0 and r["calls"] > 20
        if views:
            assert ma.state.counters.view_answers > 0 and r["view_answers"] == r["discoveries"]
            assert len(ma.state.view.seds) == 12 and ma.state.view.refused == 0
            assert "servers" not in r["ma_inbound_by_type"]         # no fan-out answers
        else:
            assert ma.state.counters.view_answers == 0 and r["view_answers"] == 0
            assert sum(s.pushes for s in w.seds.values()) == 0


def test_the_view_answer_ranks_as_the_core_on_the_seds_own_estimates():
    """Same estimates, same seed: the MA's view answer (through a LA) is what
    the core's aggregator and power-of-two choice give on the vectors the
    SeD replicas compute themselves (scheduler_tags), aged as the view ages them."""
    from gridrpc.core.view import power_of_two
    w = World(seed=6, views=True).build(elements_for("L2-2", 8))
    reps = [(s, r) for s in w.seds.values() for r in s.replicas.values()]
    for i, (_, r) in enumerate(reps):
        r.last_solve = -10.0 * (i + 1)          # distinct: the default aggregator ranks by it
    w.wait_registered()
    w.sim.run(until=w.sim.now + 0.1)
    ma = w.agents["MA"].state
    seen = {}
    orig = ma._view_answer

    def spy(h, service, k, agg, now):
        seen["rng"], seen["now"] = ma.discoveries.rng.getstate(), now
        return orig(h, service, k, agg, now)
    ma._view_answer = spy
    h = _one_discovery(w, k=8)
    assert h.get("view") is True and ma.counters.view_answers == 1
    now = seen["now"]
    servers = []
    for sed, r in reps:                         # the SeD's own vector when it pushed, aged by the view
        taken = sed.answered_at[r.name]
        est = sed.estimate(r, "noop", taken)
        age = now - ma.view.seds[r.name].at
        est["time_since_last_solve"] += age
        est["est_wait"] = max(0.0, est["est_wait"] - age)
        servers.append({"name": r.name, "address": sed.address, "estimation": est})
    rng = random.Random()
    rng.setstate(seen["rng"])
    want = power_of_two(make_aggregator("default").rank(servers, rng), 8, rng)
    assert [s["name"] for s in h["servers"]] == [s["name"] for s in want]
    for got, exp in zip(h["servers"], want):
        assert got["estimation"] == pytest.approx(exp["estimation"])
    # and the order below the power-of-two pick is the LRU order of the fan-out
    rest = [s["name"] for s in h["servers"] if s["name"] != h["servers"][0]["name"]]
    lru = [r.name for _, r in reversed(reps)]
    assert rest == [n for n in lru if n != h["servers"][0]["name"]]
