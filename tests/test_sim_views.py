"""The simulator's view answers at the root: charged per snapshot the core
handled (benchmarks/view_core.py's measured cost), and a large view
walked through the kept ranking (core/view_rank.py)."""
from __future__ import annotations

import pytest

from gridrpc.core import messages as m
from gridrpc.core.messages import MsgType
from gridrpc.sim import World, elements_for
from gridrpc.sim.agent_node import VIEW_CPU, ranked_cpu
from gridrpc.sim.node import Out
from gridrpc.sim.scale import run_shape


def _answer(w):
    """One DISCOVER handled by the simulated MA: (its charge, what its core did, the answer)."""
    ma = w.agents["MA"]
    c = ma.state.counters
    before = {k: getattr(c, k) for k in VIEW_CPU}
    out = Out(ma)
    ma.handle(b"client-x", ma.route, m.make(MsgType.DISCOVER, f"d{w.sim.now}", service="noop", k=3), out)
    did = {k: getattr(c, k) - before[k] for k in VIEW_CPU}
    return out.cost, did, [h for _, _, h in out.sends]


@pytest.mark.parametrize("n", [40, 600])
def test_a_view_answer_is_charged_for_what_the_core_did(n):
    w = World(seed=2, views=True).build(elements_for("L2-4", n, seds_per_proc=20))
    w.wait_registered()
    w.sim.run(until=w.sim.now + 0.2)                # the snapshots reached the MA
    assert len(w.agents["MA"].state.view.seds) == n
    first = _answer(w)
    w.sim.run(until=w.sim.now + 0.01)
    second = _answer(w)
    for cost, did, sent in (first, second):
        assert sent and sent[0].get("view") is True and sent[0]["answered"] == n
        assert cost == pytest.approx(ranked_cpu(did["view_ranked"]) + sum(
            VIEW_CPU[k] * did[k] for k in VIEW_CPU if k != "view_ranked")) and cost > 0
    if n < w.agents["MA"].state.config.view_index_min:
        assert first[1]["view_ranked"] == second[1]["view_ranked"] == n     # the whole view, every time
        assert first[0] == pytest.approx(ranked_cpu(n))
    else:                                           # sorted once, then the first places only
        assert first[1]["view_sorted"] == 2 * n and second[1]["view_sorted"] == 0
        assert second[0] < first[0] / 5


def test_scale_run_with_views_answers_from_the_kept_ranking():
    r = run_shape("L2-4", 2000, 200, seconds=0.5, calls_per_client=0.2, replicas=50, views=True, warmup=0.3)
    assert r["views_at_ma"] == 2000 and r["discoveries"] > 20
    assert r["view_answers"] == r["discoveries"] and r["call_failures"] == 0
    assert r["cpu_s"] > 0 and r["wall_s"] >= r["wall_register_s"]


def test_scale_cli_refuses_a_bad_shape(capsys):
    from gridrpc.sim.cli import add_parser
    import argparse
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers(dest="cmd"))
    for bad in ("L3-x", "1+a", "tree"):
        a = p.parse_args(["sim", "scale", "--seds", "10", "--clients", "2", "--shapes", bad])
        assert a.func(a) == 2
        assert f"bad shape {bad!r}" in capsys.readouterr().err
    a = p.parse_args(["sim", "scale", "--seds", "10"])
    assert a.shapes.split(",") == ["L3-15", "1+316", "1+46+2128", "1+18+309+5556", "L4-7"]


def test_a_lost_snapshot_is_asked_for_again_in_the_simulator_too():
    # the simulated SeDs and LAs answer view_missing as the runtime does (SeD._view_asked,
    # AgentRuntime._on_view_missing): the same core asks, the same snapshot comes back
    w = World(seed=3, views=True).build(elements_for("L2-2", 8, seds_per_proc=4))
    w.wait_registered()
    w.sim.run(until=w.sim.now + 0.2)
    ma = w.agents["MA"].state
    assert len(ma.view.seds) == 8
    lost = sorted(ma.view.seds)[0]
    for a in w.agents.values():
        a.state.view.seds.pop(lost, None)
    assert len(ma.view.seds) == 7
    w.sim.run(until=w.sim.now + 8.0)                 # a few heartbeats: asked at the second scan
    assert lost in ma.view.seds and len(ma.view.seds) == 8
    assert ma.counters.view_asked >= 1


def test_a_small_view_costs_less_per_sed_than_a_large_one():
    """benchmarks/view_core.py: ~2 us per SeD ranked up to 1,000 SeDs, 5 us from 10,000; rising between."""
    per = [ranked_cpu(n) / n for n in (100, 1000, 3000, 10000, 100000)]
    assert per[0] == per[1] < per[2] < per[3] == per[4] == VIEW_CPU["view_ranked"]
    assert ranked_cpu(0) == 0.0
