"""``gridrpc deploy plan``: the latency model, the shapes it picks, placement
on hosts, the file it writes (which must load and deploy)."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest
import yaml

from gridrpc.deploy.plan import Figures, best_shape, calibrate, plan, shape_for
from gridrpc.deploy.runner import Deployment
from gridrpc.deploy.spec import load, parse
from gridrpc.errors import ConfigError

F = Figures(per_child=150e-6, per_hop=600e-6, base=2e-3, rtt=200e-6)


def test_shape_and_model():
    flat = shape_for(100, 1)
    assert flat.agents == [1] and flat.fanouts() == [100]
    two = shape_for(100, 2)
    assert two.agents == [1, 10] and two.fanouts() == [10, 10]
    three = shape_for(1000, 3)
    assert three.agents == [1, 10, 100] and three.fanouts() == [10, 10, 10]
    assert flat.latency(F) == pytest.approx(2e-3 + 100 * 150e-6)
    assert two.latency(F) == pytest.approx(2e-3 + 20 * 150e-6 + 800e-6)
    assert shape_for(3, 3).agents == [1, 2]          # collapsed levels are dropped
    for n in (1, 7, 64, 999, 5000):
        for levels in (1, 2, 3, 4):
            s = shape_for(n, levels)
            below = s.agents[1:] + [n]
            assert all(a * f >= b for a, f, b in zip(s.agents, s.fanouts(), below))   # room for all


def test_best_shape_follows_the_figures():
    assert best_shape(8, F)[0].agents == [1]                  # few SeDs: flat
    assert best_shape(400, F)[0].levels >= 2                  # many: hierarchy
    cheap_hops = Figures(per_child=150e-6, per_hop=0.0, base=0.0, rtt=0.0)
    costly_hops = Figures(per_child=150e-6, per_hop=0.05, base=0.0, rtt=0.0)
    assert best_shape(400, costly_hops)[0].levels == 1        # hops dearer than 400 children
    assert best_shape(400, cheap_hops, tolerance=0.0)[0].levels == 4
    assert max(best_shape(400, F, max_fanout=10)[0].fanouts()) <= 10
    with pytest.raises(ConfigError, match="fan-out <= 2"):
        best_shape(400, F, max_levels=2, max_fanout=2)


HOSTS = {"front": {"ssh": "grid@front", "seds": 0},
         "n1": {"ssh": "grid@n1", "python": "/opt/gr/bin/python", "seds": 2},
         "n2": {"ssh": "grid@n2", "seds": 1},
         "n3": {"ssh": "grid@n3", "seds": 1, "agents": False}}


@pytest.mark.parametrize("n, pack", [(12, False), (300, False), (300, True), (2000, True)])
def test_plan_places_every_sed_and_writes_a_loadable_file(n, pack):
    data, why = plan(n, HOSTS, F, pack=pack, name="p")
    spec = parse(data, name="p")
    seds = [e for e in spec.elements if e.kind == "sed"]
    total = sum(int(e.options.get("replicas", 1)) for e in seds)
    assert total == n
    per_host = {}
    for e in seds:
        per_host[e.host] = per_host.get(e.host, 0) + int(e.options.get("replicas", 1))
    assert "front" not in per_host                                   # seds: 0
    assert per_host["n1"] == pytest.approx(n / 2, abs=1)             # weights 2:1:1
    assert per_host["n2"] == pytest.approx(n / 4, abs=1)
    agents = [e for e in spec.elements if e.kind in ("ma", "la")]
    assert spec.ma.host == "front" and all(e.host != "n3" for e in agents)   # agents: false
    assert "seds" not in data["hosts"]["n1"] and "agents" not in data["hosts"]["n3"]
    chosen = best_shape(n, F)[0]
    children: dict[str, int] = {}
    for e in spec.elements:
        if e.parent:
            children[e.parent] = children.get(e.parent, 0) + 1
    assert len(agents) == sum(chosen.agents)
    if not pack:
        assert max(children.values()) <= max(chosen.fanouts())
    assert "<- chosen" in why and "per_child=150us" in why


def test_plan_cli_then_deploy_the_planned_tree(tmp_path):
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {"localhost": {}}}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "planned.yaml"
    r = subprocess.run([sys.executable, "-m", "gridrpc", "deploy", "plan", "--seds", "6", "--hosts", str(hosts),
                        "--max-fanout", "3", "--ma-port", str(port), "-o", str(out), "--pack",
                        "--services", "gridrpc.examples.services:add"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "<- chosen" in r.stderr and out.read_text().startswith("# planned by")
    spec = load(out)
    assert spec.name == "planned" and len([e for e in spec.elements if e.kind == "la"]) >= 2
    assert sum(int(e.options.get("replicas", 1)) for e in spec.elements if e.kind == "sed") == 6
    assert any(int(e.options.get("replicas", 1)) > 1 for e in spec.elements if e.kind == "sed")   # packed
    raw = yaml.safe_load(out.read_text())
    raw["heartbeat"] = {"interval": 0.3, "timeout": 1.0}
    for s in raw["seds"]:
        s["isolation"] = "inline"
    spec = parse(raw, name="planned")
    with Deployment(spec, state_dir=tmp_path / "st", progress=lambda _: None) as d:
        d.up()
        try:
            import gridrpc
            with gridrpc.Client(f"tcp://127.0.0.1:{port}") as c:
                assert len(c.discover("add", 10)) == 6
                assert c.call("add", 2, 3) == 5
            rows = d.status()                    # replicas NAME-1..N count as their process
            assert all(r["tree"] == "alive" and r["process"] == "running" for r in rows), rows
        finally:
            d.down()


def test_plan_cli_errors(tmp_path):
    bad = tmp_path / "h.yaml"
    bad.write_text("hosts: {a: {seds: 0}}\n")
    r = subprocess.run([sys.executable, "-m", "gridrpc", "deploy", "plan", "--seds", "4", "--hosts", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "no host may run SeDs" in r.stderr
    r = subprocess.run([sys.executable, "-m", "gridrpc", "deploy", "plan", "--seds", "4", "--hosts",
                        str(tmp_path / "none.yaml")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "cannot read hosts file" in r.stderr


def test_calibrate_fits_the_model_on_small_trees():
    figs = calibrate(seds=(8, 16), las=(2,), rounds=5, progress=lambda _: None, hb_interval=0.2)
    assert figs["per_child"] > 0 and figs["per_hop"] >= 0
    assert {(s["seds"], s["las"]) for s in figs["samples"]} == {(1, 0), (1, 1), (8, 0), (8, 2), (16, 0), (16, 2)}
    assert [(c["seds"], c["las"]) for c in figs["checks"]] == [(8, 2), (16, 2)]
    assert Figures(**{k: figs[k] for k in ("per_child", "per_hop", "base", "rtt")}).per_child == figs["per_child"]
