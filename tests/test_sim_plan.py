"""``gridrpc deploy plan --model sim`` at scale: shapes whose agents cannot
even take their children's heartbeats are reported, not simulated."""
from __future__ import annotations

import json

import pytest

from gridrpc.deploy.plan import shape_for
from gridrpc.errors import ConfigError
from gridrpc.sim.model import Costs
from gridrpc.sim import plan as sim_plan
from gridrpc.sim.plan import choose, heartbeat_share


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
