"""``gridrpc deploy plan``: the latency model, the shapes it picks, placement
on hosts, the file it writes (which must load and deploy)."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest
import yaml

from gridrpc.deploy.calibrate import _lstsq as REAL_LSTSQ
from gridrpc.deploy.calibrate import calibrate
from gridrpc.deploy.plan import Figures, best_shape, plan, shape_for
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


# -- calibrate: the fit -----------------------------------------------------------
#
# calibrate() clamps its results (per_child >= 1e-7, per_hop >= 0, base >= 0),
# so "positive" says nothing about the fit. These tests check the numbers:
# fed with measurements generated from known parameters, calibrate must give
# those parameters back; on a real tree, its figures must be the least-squares
# fit of its own samples (recomputed here independently with numpy).

TRUTH = {"c0": 150e-6, "per_child": 80e-6, "per_hop": 40e-6, "base": 0.5e-3}


def synthetic_measure(truth: dict, noise: float = 0.0, seed: int = 1, calls: list | None = None):
    """A stand-in for calibrate.measure: the CPU per discovery of one tree (one
    loop runs every agent and SeD) and its latency, from ``truth``:

    * flat, n SeDs under the MA:  c0 + per_child * n
    * l LAs with n/l SeDs each:   c0 + per_child * (n + l) + per_hop * l
      (the chain MA -> LA -> 1 SeD is n = l = 1: one more level than flat 1)
    * latency of the 1-SeD tree:  base + per_child (the model of plan.Shape)

    ``noise``: relative, seeded, on every figure."""
    import random
    rng = random.Random(seed)

    def measure(n, las, rounds, hb_interval):
        if calls is not None:
            calls.append((n, las, rounds))
        cpu = truth["c0"] + truth["per_child"] * (n + las) + truth["per_hop"] * las
        latency = truth["base"] + truth["per_child"] * (n if las == 0 else n / las + las) + (
            truth["per_hop"] + 200e-6) * (1 if las else 0)
        jitter = lambda: 1 + rng.uniform(-noise, noise)  # noqa: E731
        return {"p20": latency * jitter(), "median": latency * 1.2 * jitter(), "cpu": cpu * jitter()}
    return measure


def assert_recovers(figs: dict, truth: dict, noise: float = 0.0) -> None:
    """The figures are ``truth``'s, within what ``noise`` (relative, on each
    measured figure) allows: 3 noise widths of the largest figure involved."""
    ns = [s["seds"] for s in figs["samples"] if s["las"] == 0]
    cpu_max = max(s["cpu_s"] for s in figs["samples"])
    tol_child = 3 * noise * cpu_max / (max(ns) - min(ns)) + 1e-15
    chain = truth["c0"] + 2 * truth["per_child"] + truth["per_hop"]
    assert figs["per_child"] == pytest.approx(truth["per_child"], abs=tol_child)
    assert figs["per_hop"] == pytest.approx(truth["per_hop"], abs=3 * noise * 2 * chain + 2 * tol_child + 1e-15)
    assert figs["base"] == pytest.approx(truth["base"], abs=3 * noise * (truth["base"] + truth["per_child"])
                                         + tol_child + 1e-15)
    for c in figs["checks"]:      # the model of a two-level tree predicts what was measured
        assert c["model_cpu_s"] == pytest.approx(c["measured_cpu_s"], rel=6 * noise + 1e-9), c


def assert_fit_matches_samples(figs: dict) -> None:
    """calibrate's figures are the fit of its own samples (whatever they are)."""
    import numpy as np
    flat = {s["seds"]: s["cpu_s"] for s in figs["samples"] if s["las"] == 0}
    one = next(s for s in figs["samples"] if (s["seds"], s["las"]) == (1, 0))
    chain = next(s for s in figs["samples"] if (s["seds"], s["las"]) == (1, 1))
    slope, _ = np.polyfit(list(flat), list(flat.values()), 1)
    per_child = max(float(slope), 1e-7)
    assert figs["per_child"] == pytest.approx(per_child, rel=1e-6, abs=1e-12)
    assert figs["per_hop"] == pytest.approx(max(chain["cpu_s"] - one["cpu_s"] - per_child, 0.0), abs=1e-12)
    assert figs["base"] == pytest.approx(max(one["p20_s"] - per_child, 0.0), abs=1e-12)
    for c in figs["checks"]:
        sample = next(s for s in figs["samples"] if (s["seds"], s["las"]) == (c["seds"], c["las"]))
        assert c["measured_cpu_s"] == sample["cpu_s"]
        assert c["model_cpu_s"] == pytest.approx(
            flat[1] + per_child * (c["seds"] + c["las"] - 1) + figs["per_hop"] * c["las"], rel=1e-6)


def _calibrate(monkeypatch, measure, **kw):
    import gridrpc.deploy.calibrate as plan_mod
    monkeypatch.setattr(plan_mod, "measure", measure)
    return calibrate(progress=lambda _: None, **{"seds": (8, 16, 32), "las": (2, 4), "rounds": 5, **kw})


def test_calibrate_recovers_known_parameters(monkeypatch):
    calls: list = []
    figs = _calibrate(monkeypatch, synthetic_measure(TRUTH, calls=calls))
    assert_recovers(figs, TRUTH)                                # exact data: exact figures
    assert_fit_matches_samples(figs)
    # what it measured: flat 1, the chain, flat 8/16/32, each N under 2 and 4 LAs
    assert [(n, l) for n, l, _ in calls] == [(1, 0), (1, 1), (8, 0), (16, 0), (32, 0),
                                             (8, 2), (8, 4), (16, 2), (16, 4), (32, 2), (32, 4)]
    assert all(r >= 200 for n, _, r in calls if n == 1)         # the small difference: many rounds
    assert Figures(**{k: figs[k] for k in ("per_child", "per_hop", "base", "rtt")}).per_child == figs["per_child"]


@pytest.mark.parametrize("truth", [TRUTH, {"c0": 40e-6, "per_child": 300e-6, "per_hop": 0.0, "base": 2e-3},
                                   {"c0": 1e-3, "per_child": 5e-6, "per_hop": 400e-6, "base": 0.1e-3}],
                         ids=["default", "no-hop-cost", "cheap-children"])
def test_calibrate_recovers_parameters_from_noisy_measurements(monkeypatch, truth):
    figs = _calibrate(monkeypatch, synthetic_measure(truth, noise=0.01, seed=7))
    assert_recovers(figs, truth, noise=0.01)
    assert_fit_matches_samples(figs)


def _swap(rows, ys):                     # intercept and slope exchanged
    a, b = REAL_LSTSQ(rows, ys)
    return [b, a]


def _half_slope(rows, ys):
    a, b = REAL_LSTSQ(rows, ys)
    return [a, b / 2]


def _through_first_and_last(rows, ys):   # a line through two points, not least squares
    (x0, y0), (x1, y1) = (rows[0][1], ys[0]), (rows[-1][1], ys[-1])
    b = (y1 - y0) / (x1 - x0)
    return [y0 - b * x0, b]


def _sign_flipped(rows, ys):             # negative slope: clamped to 1e-7, still "> 0"
    a, b = REAL_LSTSQ(rows, ys)
    return [a, -b]


@pytest.mark.parametrize("bad_fit, gross", [(_swap, True), (_half_slope, True), (_sign_flipped, True),
                                            (_through_first_and_last, False)],
                         ids=["swapped", "half-slope", "sign-flipped", "two-point-line"])
def test_a_wrong_fit_fails_these_checks(monkeypatch, bad_fit, gross):
    """The checks above catch a broken least-squares fit (plan._lstsq
    monkeypatched), including one the clamps hide from a "> 0" check. A
    two-point line is right on exact data and close on noisy data: only the
    comparison with the samples' own fit tells it from least squares."""
    import gridrpc.deploy.calibrate as plan_mod
    monkeypatch.setattr(plan_mod, "_lstsq", bad_fit)
    noisy = _calibrate(monkeypatch, synthetic_measure(TRUTH, noise=0.01, seed=7))
    assert noisy["per_child"] > 0 and noisy["per_hop"] >= 0     # what the old test checked: still passes
    with pytest.raises(AssertionError):
        assert_fit_matches_samples(noisy)
    if gross:
        with pytest.raises(AssertionError):
            assert_recovers(noisy, TRUTH, noise=0.01)
        with pytest.raises(AssertionError):
            assert_recovers(_calibrate(monkeypatch, synthetic_measure(TRUTH)), TRUTH)


def test_calibrate_fits_the_model_on_small_trees():
    """The real thing on small in-process trees: every sample measured, and
    the figures are the fit of those samples (their values are too noisy on a
    shared machine to compare with a reference)."""
    figs = calibrate(seds=(8, 16), las=(2,), rounds=5, progress=lambda _: None, hb_interval=0.2)
    assert {(s["seds"], s["las"]) for s in figs["samples"]} == {(1, 0), (1, 1), (8, 0), (8, 2), (16, 0), (16, 2)}
    assert all(s["cpu_s"] > 0 and 0 < s["p20_s"] <= s["median_s"] for s in figs["samples"]), figs["samples"]
    assert [(c["seds"], c["las"]) for c in figs["checks"]] == [(8, 2), (16, 2)]
    assert_fit_matches_samples(figs)


def test_pack_makes_one_sed_process_per_core_of_each_host():
    """Every element is one Python process: packed SeDs use a host's cores by
    running one SeD process per core (shared between the parents on it)."""
    hosts = {"node": {"cores": 16}, "small": {"cores": 2, "seds": 1, "agents": False}}
    data, _ = plan(496, {"node": {"cores": 16, "seds": 3}, "small": hosts["small"]}, F, pack=True, name="p",
                   max_levels=1)
    seds = data["seds"]
    per_host: dict[str, list[int]] = {}
    for s in seds:
        per_host.setdefault(s["host"], []).append(int(s.get("replicas", 1)))
    assert len(per_host["node"]) == 16 and len(per_host["small"]) == 2
    assert sum(per_host["node"]) == 372 and sum(per_host["small"]) == 124
    assert max(per_host["node"]) - min(per_host["node"]) <= 1              # near-equal processes
    # a host without 'cores' elsewhere than here counts one core: one process per parent
    data, _ = plan(40, {"far": {}}, F, pack=True, name="p", max_levels=1)
    assert len(data["seds"]) == 1 and data["seds"][0]["replicas"] == 40


def test_a_host_range_names_every_host_and_numbers_its_values(tmp_path):
    from gridrpc.deploy.plan import _load_hosts, expand_hosts
    assert expand_hosts("node[8-11]") == ["node8", "node9", "node10", "node11"]
    assert expand_hosts("n[098-100].lan") == ["n098.lan", "n099.lan", "n100.lan"]
    assert expand_hosts("front") == ["front"]
    f = tmp_path / "hosts.yaml"
    f.write_text('hosts:\n  front: {agents: true, seds: 0}\n'
                 '  node[1-3]: {launcher: ssh, ssh: "grid@node[1-3]", cores: 4, seds: 4}\n')
    hosts = _load_hosts(str(f))
    assert list(hosts) == ["front", "node1", "node2", "node3"]
    assert hosts["node2"] == {"launcher": "ssh", "ssh": "grid@node2", "cores": 4, "seds": 4}
    data, _ = plan(12, hosts, F, max_levels=1)
    assert {s["host"] for s in data["seds"]} == {"node1", "node2", "node3"}
    assert data["hosts"]["node3"]["ssh"] == "grid@node3"
    f.write_text("hosts:\n  node[1-3]: {}\n  node2: {}\n")
    with pytest.raises(ConfigError, match="host node2 is named twice"):
        _load_hosts(str(f))
    f.write_text("hosts:\n  node[3-1]: {}\n")
    with pytest.raises(ConfigError, match="3 > 1"):
        _load_hosts(str(f))


@pytest.mark.parametrize("value", [
    {"name": "sed-node1-3", "parent": "LA1-2", "host": "node1", "examples": True, "replicas": 17},
    {"services": ["gridrpc.examples.services:sleep", "m:f,idempotent=false"]},
    {"ssh": "grid@node1", "x": "yes", "y": "No", "z": "null", "w": "a b", "v": "1.5", "u": 7, "t": False},
    {"address": "10.0.0.1", "python": "/opt/venv/bin/python", "args": ["--x", "-1"]},
])
def test_the_fast_writer_writes_what_yaml_writes(value):
    from gridrpc.deploy.plan import _flow
    assert _flow(value) == yaml.safe_dump(value, default_flow_style=True, width=10 ** 6, sort_keys=False).strip()
    assert yaml.safe_load(_flow(value)) == value
