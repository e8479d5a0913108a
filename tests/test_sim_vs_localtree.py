"""The simulator and the real runtime rank alike: they run the same core.

One tree (MA; LA1 and LA2 with two SeDs each; one SeD under the MA) is
built twice: in the simulator (``gridrpc.sim``) and as real daemons in this
process (``gridrpc.testing.LocalTree``, loopback sockets). Both get the same
state -- every SeD replica's queue (``SedScheduler``), run-time predictor and
last solve, the same host tags, the same agent RNG seeds, the same
recent-choice memory and deadlines -- and a sequence of discoveries with two
aggregators must return the same servers in the same order, through the
fan-out (``max_age`` 0) and from the MA's pushed view.

Deterministic: every ranking key differs by far more than the time a
discovery takes (ages 100 s apart, waits one 10 s call apart), so neither
timing nor tie-breaks decide an order, and the fan-out deadlines are set
far above any hiccup of a loaded machine.
"""
from __future__ import annotations

import time

import pytest

import gridrpc
from gridrpc.core.queue import Request
from gridrpc.sim import World
from gridrpc.sim.client_node import User
from gridrpc.sim.model import NOOP
from gridrpc.sim.world import Element
from gridrpc.testing import LocalTree, wait_for

SERVICE = "noop"
TCOMP = 10.0                                     # s: every replica predicts this run time
AGES = {"sed-1-1": 300.0, "sed-1-2": 100.0, "sed-2-1": 500.0, "sed-2-2": 200.0, "sed-ma-1": 400.0}
QUEUED = {"sed-1-1": 2, "sed-1-2": 0, "sed-2-1": 3, "sed-2-2": 1, "sed-ma-1": 4}     # calls (one running)
HOST_TAGS = {"nb_cpu": 2, "free_cpu": 0.5, "total_mem": 16e9, "free_mem": 8e9}
SEED = 11
#: (aggregator, k): the MA remembers its first choices (shown as load to the next rankings)
SEQUENCE = [("default", 3), ("least_wait_time", 3), ("default", 3), ("least_wait_time", 5), ("default", 5)]
ELEMENTS = [Element("ma", "MA", None), Element("la", "LA1", "MA"), Element("la", "LA2", "MA"),
            Element("sed", "sed-1-1", "LA1"), Element("sed", "sed-1-2", "LA1"),
            Element("sed", "sed-2-1", "LA2"), Element("sed", "sed-2-2", "LA2"),
            Element("sed", "sed-ma-1", "MA")]
EXACT_TAGS = ("num_waiting", "num_running", "max_concurrent", "tcomp", "server_type", *HOST_TAGS)


class _FixedHost:
    """The SeD's host metrics, fixed (the real ones are psutil's, refreshed)."""

    def __init__(self, tags: dict) -> None:
        self.tags = dict(tags)

    def refresh(self) -> dict:
        return self.tags


def _give_state(replicas: dict, now: float) -> None:
    """``replicas``: name -> an object with ``scheduler``, ``predictor``,
    ``last_solve`` (the sim's and the runtime's Replica both have them)."""
    for name, r in replicas.items():
        r.predictor.observe(SERVICE, TCOMP)
        r.last_solve = now - AGES[name]
        for j in range(QUEUED[name]):
            r.scheduler.submit(Request(id=f"{name}-q{j}", user="u", service=SERVICE, submitted=now), now)


def _tune(agent_states: list, ma_state) -> None:
    for st in agent_states:
        st.discoveries.rng.seed(SEED)
        st.latency.floor = 30.0                 # a fan-out waits for every child (no partial answer)
    ma_state.discoveries.memory = 60.0          # the recent choices outlive the whole sequence


def _load(vector: dict) -> int:
    return vector["num_waiting"] + vector["num_running"]


# -- the simulator ---------------------------------------------------------------------
def _sim_rankings(max_age: float) -> tuple[list, list, list]:
    w = World(seed=SEED, views=True).build(ELEMENTS, services={SERVICE: NOOP})
    w.wait_registered()
    replicas = {}
    for node in w.seds.values():
        node.host_tags = dict(HOST_TAGS)
        replicas.update({r.name: r for r in node.replicas.values()})
    _give_state(replicas, w.sim.now)
    for node in w.seds.values():                # the snapshots follow the new state, as a SeD pushes them
        for r in node.replicas.values():
            node.local(node._push_view, r, True, None)
    w.sim.run(until=w.sim.now + 0.2)
    ma = w.agents["MA"].state
    assert all(_load(ma.view.seds[n].vector(SERVICE)) == QUEUED[n] for n in AGES)
    _tune([a.state for a in w.agents.values()], ma)
    c = w.client()
    got: list = []
    orig = w.record_discovery

    def rec(user, latency, h, ok):
        got.append(h)
        orig(user, latency, h, ok)
    w.record_discovery = rec
    for agg, k in SEQUENCE:
        n = len(got)
        User(c, f"u{n}", service=SERVICE, k=k, call=False, calls=1, think=None, user="u", aggregator=agg,
             max_age=max_age).begin()
        w.sim.run(until=w.sim.now + 5.0, stop=lambda: len(got) > n)
        assert len(got) == n + 1, f"no simulated answer to discovery {n + 1}"
    return ([[s["name"] for s in h["servers"]] for h in got], [h["servers"] for h in got],
            [h.get("view") is True for h in got])


# -- the runtime ---------------------------------------------------------------------
def _real_rankings(max_age: float) -> tuple[list, list, list]:
    with LocalTree(las=2, seds_per_la=2, seds_under_ma=1, services=[SERVICE], http=False) as tree:
        assert sorted(tree.sed_names()) == sorted(AGES)

        def setup():
            now = time.time()
            for sed in tree.seds:
                sed.host = _FixedHost(HOST_TAGS)
            _give_state({n: r for sed in tree.seds for n, r in sed.replicas.items()}, now)
            for sed in tree.seds:
                for r in sed.replicas.values():
                    sed._push_view(r, True)
        tree.lt.call(setup)
        ma = tree.ma.state

        def view_loads():
            vecs = {n: ma.view.seds[n].vector(SERVICE) if n in ma.view.seds else None for n in AGES}
            return {n: (_load(v) if v else None) for n, v in vecs.items()}
        wait_for(lambda: tree.lt.call(view_loads) == QUEUED, 20.0, "the new snapshots at the MA")
        tree.lt.call(_tune, [tree.ma.state] + [la.state for la in tree.las], ma)
        names, servers, views = [], [], []
        with gridrpc.Client(tree.ma_address) as c:
            for agg, k in SEQUENCE:
                before = tree.lt.call(lambda: ma.counters.view_answers)
                got = c.discover(SERVICE, k, aggregator=agg, max_age=max_age)
                names.append([s.name for s in got])
                servers.append([{"name": s.name, "estimation": s.estimation} for s in got])
                views.append(tree.lt.call(lambda: ma.counters.view_answers) == before + 1)
        return names, servers, views


@pytest.mark.parametrize("max_age", [0.0, 60.0], ids=["fan-out", "view"])
def test_simulator_and_local_tree_rank_alike(max_age):
    sim_names, sim_servers, sim_views = _sim_rankings(max_age)
    real_names, real_servers, real_views = _real_rankings(max_age)
    assert real_names == sim_names
    assert sim_views == real_views == [max_age > 0] * len(SEQUENCE)
    # not a trivial order: the aggregators disagree, and the remembered choices move the default's
    assert sim_names[0] != sim_names[1][:3] and sim_names[0] != sim_names[2]
    assert sim_names[3] == sorted(AGES, key=QUEUED.get)                 # least wait: shortest queue first
    assert sim_names[0] == sorted(AGES, key=AGES.get, reverse=True)[:3]  # default: least recently used
    # and the estimation vectors are the same: exact tags equal, times within the run's seconds
    for sim_h, real_h in zip(sim_servers, real_servers):
        for s, r in zip(sim_h, real_h):
            se, re_ = s["estimation"], r["estimation"]
            assert set(se) == set(re_), (s["name"], sorted(set(se) ^ set(re_)))
            assert {t: se[t] for t in EXACT_TAGS} == {t: re_[t] for t in EXACT_TAGS}, s["name"]
            for t in ("time_since_last_solve", "est_wait"):
                assert se[t] == pytest.approx(re_[t], abs=5.0), (s["name"], t)
