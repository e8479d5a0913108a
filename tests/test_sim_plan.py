"""``gridrpc deploy plan --model sim`` at scale: shapes whose agents cannot
even take their children's heartbeats are reported, not simulated; over
20,000 SeDs each candidate is measured on pieces (a level and one subtree at
a time), which predict what the whole tree simulates and plan 100,000
SeDs."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gridrpc.deploy.plan import shape_for
from gridrpc.errors import ConfigError
from gridrpc.sim.model import Costs
from gridrpc.sim import plan as sim_plan
from gridrpc.sim.plan import choose, heartbeat_share

HOSTS_100K = Path(__file__).resolve().parent.parent / "deployments" / "plan" / "hosts-3125x32.yaml"


def test_heartbeat_share_of_the_candidates_at_100000_seds():
    costs = Costs.load(None)
    who, flat = heartbeat_share(shape_for(100000, 1).agents, 100000, costs)
    assert who == "MA" and flat == pytest.approx(100000 * 2 * costs.msg("ma"))      # 13 cores
    for levels in (2, 3, 4):
        who, share = heartbeat_share(shape_for(100000, levels).agents, 100000, costs)
        assert 0.1 < share < 0.3 and who == "MA"        # each LA's heartbeat carries its subtree


def test_a_shape_saturated_by_heartbeats_is_skipped_and_said(tmp_path):
    costs = json.loads(json.dumps(Costs.load(None).__dict__))
    costs["msgs"]["ma"] = 1e-3                          # an MA 15x slower: flat 2,000 SeDs need 4 cores
    path = tmp_path / "slow-ma.json"
    path.write_text(json.dumps(costs))
    hosts = {f"n{i}": {"cores": 8} for i in range(8)}
    shape, why = choose(2000, hosts, max_levels=2, costs_file=str(path))
    assert shape.agents == shape_for(2000, 2).agents, why
    assert "agents per level 1 (fan-out 2000): not simulated: MA would need 4.0 cores for heartbeats alone" in why
    costs["msgs"]["la"] = 1.0
    path.write_text(json.dumps(costs))
    with pytest.raises(ConfigError, match="no shape could be simulated"):
        choose(2000, hosts, max_levels=2, costs_file=str(path))


def test_the_why_names_the_chosen_shape_and_the_runner_up(monkeypatch):
    """3,000 SeDs on 64 hosts: the 3-level tree answers fastest; the why says
    so with the runner-up's figures, and names the saturated MAs. Each
    candidate is measured briefly, as the planner does above ``LARGE`` SeDs
    (20 discoveries, 0.2 s of load: the same choice and why, in a quarter of
    the time; the full measurement: the test above and tests/test_sim.py)."""
    monkeypatch.setattr(sim_plan, "LARGE", 2000)
    hosts = {f"n{i}": {"cores": 32} for i in range(64)}
    shape, why = choose(3000, hosts, max_levels=3)
    assert "20 sequential discoveries and 0.2 s of load" in why
    lines = why.splitlines()
    chosen = next(x for x in lines if x.endswith("<- chosen"))
    name = "+".join(map(str, shape.agents))
    assert len(shape.agents) == 3 and chosen.startswith(f"  agents per level {name} ")
    line = next(x for x in lines if x.startswith(f"why {name}: the lowest median under no load"))
    assert "next 1+55:" in line and "flat's MA is saturated" in line


def test_a_large_shape_is_cut_into_pieces_no_larger_than_asked():
    """100,000 SeDs, four agent levels, pieces of at most 2,500 SeDs: the top
    level cut off twice (a root and its children of one SeD each), then the
    busiest subtree whole; the pieces hold every level's largest fan-out of
    the tree, once each, and together cover its SeDs."""
    from gridrpc.deploy.plan import Shape
    shape = shape_for(100000, 4)
    parts = sim_plan.split_shape(shape.agents, 100000, 2500)
    cuts, (last, k) = parts[:-1], parts[-1]
    assert k <= 2500 < k * cuts[-1][1]
    assert all(len(a) == 2 and a[1] == n for a, n in cuts)
    assert [n for _, n in cuts] + Shape(agents=last, seds=k).fanouts() == shape.fanouts()
    covered = k
    for _, n in cuts:
        covered *= n
    assert covered >= 100000
    assert sim_plan.split_shape(shape.agents, 100000, 200000) == [(shape.agents, 100000)]   # small enough: whole
    assert sim_plan.split_shape([1], 5000, 100) == [([1], 5000)]                            # flat: cannot be cut


def test_the_pieces_predict_what_the_whole_tree_simulates():
    """1,200 SeDs under 35 LAs on 64 hosts, simulated whole and as two
    pieces (the MA with 35 one-SeD LAs; one LA with its 35 SeDs): the same
    discovery median and calls/s within the run-to-run detail of a brief
    measurement."""
    costs = Costs.load(None)
    hosts = {f"n{i}": {"cores": 32} for i in range(64)}
    agents = shape_for(1200, 2).agents
    parts = sim_plan.compose(agents, 1200, hosts, costs, whole=60)
    assert parts["pieces"] == [(f"1+{agents[1]}", agents[1]), ("1", -(-1200 // agents[1]))]
    with sim_plan.few_collections():
        full = sim_plan.simulate(agents, 1200, hosts, costs, rounds=20, seconds=0.2)
    assert parts["median_ms"] == pytest.approx(full["median_ms"], rel=0.10)
    assert parts["rps"] == pytest.approx(full["rps"], rel=0.25)
    assert parts["busiest"][0] == "MA" and full["busiest"][0] == "MA"


@pytest.mark.slow
def test_plan_100000_seds_says_why(tmp_path):
    """``gridrpc deploy plan --seds 100000 --hosts deployments/plan/hosts-3125x32.yaml
    --pack``: a file that loads as a deployment, the candidates with their
    discovery median, calls/s and busiest element, the flat tree reported as
    not simulated, the chosen shape and why. (How long it takes is a
    figure of docs/deployment.md, not asserted here.)"""
    out = tmp_path / "plan.yaml"
    p = subprocess.run([sys.executable, "-m", "gridrpc", "deploy", "plan", "--seds", "100000", "--hosts",
                        str(HOSTS_100K), "--pack", "-o", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "" and p.stderr.rstrip().endswith(f"wrote {out}"), p.stderr[-500:]
    why = p.stderr
    cands = [x for x in why.splitlines() if x.startswith("  agents per level ") and "discovery median" in x]
    assert len(cands) == 3, why
    for line in cands:
        assert " calls/s (8 users)" in line and "busiest " in line and "of a core [pieces " in line
    assert "agents per level 1 (fan-out 100000): not simulated" in why
    chosen = next(x for x in cands if x.endswith("<- chosen"))
    name = chosen.split()[3]
    assert f"why {name}: " in why
    text = out.read_text()              # the plan parsed it before writing it (cmd_plan): its content here
    seds = re.findall(r"^  - \{name: sed-[^,]*, parent: [^,]*, host: (node\d+), examples: true(?:, replicas: (\d+))?\}$",
                      text, re.M)
    assert sum(int(r or 1) for _, r in seds) == 100000
    assert {h for h, _ in seds} == {f"node{i}" for i in range(1, 3126)}          # SeD processes on every host
    assert len(re.findall(r"^  - \{name: LA", text, re.M)) == sum(int(x) for x in name.split("+")) - 1
