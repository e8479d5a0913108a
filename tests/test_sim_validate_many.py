"""``gridrpc sim validate`` with several measurements of the same trees
(gridrpc/sim/validate_compare.py, through gridrpc.sim.validate: judge, measurements, summarise, compare,
format_many) and ``gridrpc sim calibrate`` with several studies
(gridrpc/sim/calibrate.py: merge_studies)."""
from __future__ import annotations

import argparse
import json

import pytest

from gridrpc.sim import validate as v


def _run(n, shape, median_ms, rps, users=8, load=1.0):
    return {"n": n, "shape": shape, "loadavg_before": load, "discovery": {"median_ms": median_ms},
            "saturation": {"max_rps": rps, "users": users}}


def test_judge_within_one_and_in_the_widened_range():
    j = v.judge(1.0, [0.8, 1.3])
    assert j["errors"] == pytest.approx([0.25, 1 / 1.3 - 1])
    assert j["best_error"] == pytest.approx(1 / 1.3 - 1)          # -23 %: nearer than +25 %
    assert not j["within_one"]                                     # 25 % and 23 % away from each
    assert j["in_range"] and j["range_error"] == 0.0               # but between them
    assert j["low"] == 0.8 and j["high"] == 1.3 and j["spread"] == pytest.approx(0.625)


def test_judge_at_the_edges_of_the_tolerance():
    assert v.judge(1.149, [1.0])["within_one"]
    assert not v.judge(1.151, [1.0])["within_one"]
    assert v.judge(0.851, [1.0])["within_one"]
    assert not v.judge(0.849, [1.0])["within_one"]
    # the widened range: 0.85 x lowest .. 1.15 x highest
    assert v.judge(2.29, [1.0, 2.0])["in_range"] and v.judge(0.851, [1.0, 2.0])["in_range"]
    assert not v.judge(2.31, [1.0, 2.0])["in_range"]
    j = v.judge(2.4, [1.0, 2.0])
    assert not j["in_range"] and j["range_error"] == pytest.approx(0.2)
    j = v.judge(0.84, [1.0, 2.0])
    assert not j["in_range"] and j["range_error"] == pytest.approx(-0.16)
    assert not j["within_one"]


def test_judge_one_measurement_is_the_single_study_criterion():
    for p in (0.8, 0.9, 1.0, 1.1, 1.2):
        j = v.judge(p, [1.0])
        assert j["within_one"] == j["in_range"] == (abs(p - 1.0) <= 0.15)
        assert j["spread"] == 0.0


def test_judge_refuses_nothing_or_zero():
    with pytest.raises(ValueError):
        v.judge(1.0, [])
    with pytest.raises(ValueError):
        v.judge(1.0, [0.0, 1.0])


def test_measurements_group_trees_across_studies_and_leave_out_loaded_runs():
    a = {"runs": [_run(1, "flat", 0.7, 1400, users=4, load=2.0), _run(10, "L2-2", 1.8, 730, load=40.0)]}
    b = {"runs": [_run(50, "L3-2", 4.0, 150, users=1), _run(10, "L2-2", 1.6, 740), _run(1, "flat", 0.68, 720),
                  _run(10, "flat", 1.0, 900)]}
    t = v.measurements([("a", a), ("b", b)])
    assert list(t) == [(1, "flat"), (10, "L2-2"), (10, "flat"), (50, "L3-2")]       # by size, then as seen
    assert [m["study"] for m in t[(1, "flat")]] == ["a", "b"]
    assert t[(1, "flat")][0] == {"study": "a", "median_ms": 0.7, "rps": 1400, "users": 4, "load": 2.0}
    t = v.measurements([("a", a), ("b", b)], max_load=15.0)
    assert [m["study"] for m in t[(10, "L2-2")]] == ["b"]
    t = v.measurements([("a", {"runs": [_run(10, "L2-2", 1.8, 730, load=40.0)]})], max_load=15.0)
    assert t == {}


def test_compare_counts_and_the_throughput_at_the_users_measured():
    a = {"runs": [_run(1, "flat", 1.0, 1000, users=4), _run(10, "flat", 2.0, 500, users=8),
                  _run(10, "L2-2", 3.0, 400, users=8)]}
    b = {"runs": [_run(1, "flat", 1.4, 600, users=8), _run(10, "flat", 2.1, 520, users=8)]}
    trees = v.measurements([("a", a), ("b", b)])
    preds = {(1, "flat"): {"median_ms": 1.2, "rps_by_users": {4: 700.0, 8: 900.0, 16: 5000.0}},
             (10, "flat"): {"median_ms": 2.6, "rps_by_users": {8: 505.0}},
             (10, "L2-2"): {"median_ms": 2.9, "rps_by_users": {8: 480.0}}}
    res = v.compare(trees, preds, ["a", "b"])
    rows = {(r["n"], r["shape"]): r for r in res["rows"]}
    r1 = rows[(1, "flat")]
    # discovery: +20 % and -14 %: within 15 % of b; in range
    assert r1["median"]["errors"] == pytest.approx([0.2, 1.2 / 1.4 - 1])
    assert r1["median"]["within_one"] and r1["median"]["in_range"]
    # throughput: the highest simulated at the users where a measurement saturated (4, 8), not at 16
    assert r1["predicted_rps"] == 900.0 and r1["predicted_rps_by_users"] == {"4": 700.0, "8": 900.0}
    assert r1["rps"]["errors"] == pytest.approx([-0.1, 0.5])
    assert r1["rps"]["within_one"] and r1["rps"]["in_range"]
    # 10 flat discovery: +30 % and +24 %: neither, and above 1.15 x 2.1
    r2 = rows[(10, "flat")]
    assert not r2["median"]["within_one"] and not r2["median"]["in_range"]
    assert r2["median"]["range_error"] == pytest.approx(2.6 / 2.1 - 1)
    assert r2["rps"]["within_one"]
    # one measurement: -3 % and +20 %
    r3 = rows[(10, "L2-2")]
    assert r3["median"]["within_one"] and not r3["rps"]["within_one"] and not r3["rps"]["in_range"]
    m = res["median"]
    assert (m["of"], m["within_one"], m["in_range"], m["several"]) == (3, 2, 2, 2)
    assert m["spread_over_tol"] == 1                             # 1.0 vs 1.4; 2.0 vs 2.1 agree
    assert (m["within_one_several"], m["in_range_several"]) == (1, 1)
    assert m["per_study"]["a"] == {"within": 1, "of": 3, "median_abs_error": pytest.approx(0.2)}
    assert m["per_study"]["b"]["within"] == 1 and m["per_study"]["b"]["of"] == 2
    # the nearest measurement's error per tree: 14 %, 24 %, 3 %: median 14 %
    assert m["median_abs_best_error"] == pytest.approx(1 - 1.2 / 1.4)
    t = res["throughput"]
    assert (t["of"], t["within_one"], t["in_range"]) == (3, 2, 2)
    # best shape by discovery at 10 SeDs among each study's trees: a measured flat (2.0 < 3.0), the
    # prediction too (2.6 < 2.9); b measured only flat
    assert res["best_shape"][10] == {"a": {"measured": "flat", "predicted": "flat"},
                                     "b": {"measured": "flat", "predicted": "flat"}}
    res2 = v.compare(trees, {**preds, (10, "L2-2"): {"median_ms": 2.5, "rps_by_users": {8: 480.0}}}, ["a", "b"])
    assert res2["best_shape"][10] == {"a": {"measured": "flat", "predicted": "L2-2"},
                                      "b": {"measured": "flat", "predicted": "flat"}}
    text = v.format_many(res)
    assert "within 15% of at least one measurement 2/3" in text
    assert "1.00 (+20%)" in text and "1.40 (-14%)" in text
    assert "10 SeDs: a measured flat, predicted flat; b measured flat, predicted flat" in text
    json.dumps(res)                                              # the JSON output


def test_compare_refuses_a_missing_users_prediction():
    trees = v.measurements([("a", {"runs": [_run(1, "flat", 1.0, 1000, users=4)]})])
    with pytest.raises(ValueError, match="users"):
        v.compare(trees, {(1, "flat"): {"median_ms": 1.0, "rps_by_users": {8: 1.0}}}, ["a"])


def test_study_labels_are_distinct():
    assert v.study_labels(["x/quiet-1.json", "y/quiet-2.json"]) == ["quiet-1", "quiet-2"]
    assert v.study_labels(["x/s.json", "y/s.json", "z/s.json"]) == ["s", "s#2", "s#3"]


def test_cli_takes_several_studies():
    from gridrpc.sim.cli import add_parser
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers(dest="cmd"))
    a = p.parse_args(["sim", "validate", "--study", "a.json", "--study", "b.json"])
    assert a.study == ["a.json", "b.json"]
    a = p.parse_args(["sim", "validate"])
    assert a.study is None
    a = p.parse_args(["sim", "calibrate", "--study", "a.json", "--study", "b.json"])
    assert a.study == ["a.json", "b.json"]


def test_validate_many_end_to_end_on_two_small_studies(tmp_path):
    """Two tiny "studies" of the same trees through the command: one
    prediction per tree, compared with both."""
    from gridrpc.sim.validate import cmd_validate
    a = {"meta": {}, "runs": [_run(2, "flat", 0.8, 900, users=2)]}
    b = {"meta": {}, "runs": [_run(2, "flat", 1.2, 1100, users=4)]}
    fa, fb = tmp_path / "a.json", tmp_path / "b.json"
    fa.write_text(json.dumps(a))
    fb.write_text(json.dumps(b))
    out = tmp_path / "v.json"
    ns = argparse.Namespace(study=[str(fa), str(fb)], costs=None, max_load=None, seeds=1, json=str(out), plot=None)
    assert cmd_validate(ns) == 0
    res = json.loads(out.read_text())
    assert res["studies"] == ["a", "b"] and len(res["rows"]) == 1
    r = res["rows"][0]
    assert set(r["predicted_rps_by_users"]) == {"2", "4"}
    assert r["predicted_rps"] == max(r["predicted_rps_by_users"].values())
    assert r["median"]["errors"] == pytest.approx([r["predicted_median_ms"] / 0.8 - 1,
                                                   r["predicted_median_ms"] / 1.2 - 1])


def test_merge_studies_for_calibrate():
    from gridrpc.sim.calibrate import _describe, merge_studies
    a = {"meta": {"command": "ca", "date": "d1", "cpus": 2}, "runs": [_run(1, "flat", 1, 1), _run(10, "flat", 1, 1)]}
    b = {"meta": {"command": "cb", "date": "d2", "cpus": 2}, "runs": [_run(1, "flat", 2, 2)]}
    assert merge_studies([("a.json", a)]) is a
    m = merge_studies([("a.json", a), ("b.json", b)])
    assert [(r["n"], r["study"]) for r in m["runs"]] == [(1, 0), (10, 0), (1, 1)]
    assert "3 runs of 2 trees from 2 studies" in _describe(m) and "b.json (cb, d2, 2 CPUs)" in _describe(m)
    assert _describe(a) == "2 trees of ca (d1, 2 CPUs)"


def test_calibrate_rows_of_a_tree_measured_twice():
    """A tree in two studies gives two rows per element, each against its
    own measured CPU, with the same counts (counted once)."""
    from gridrpc.sim import Costs
    from gridrpc.sim.calibrate import fit_rows, merge_studies
    costs = Costs.load(None)
    run = {"n": 3, "shape": "flat", "loadavg_before": 1.0, "idle_cpu": {},
           "discovery": {"mean_ms": 2.0, "median_ms": 1.0}, "discovery_cpu": {"MA": 10.0},
           "load": [{"users": 2, "rps": 100.0, "cpu": {"MA": 20.0, "locust": 30.0}}],
           "saturation": {"users": 2, "max_rps": 100.0}}
    other = json.loads(json.dumps(run))
    other["discovery_cpu"]["MA"] = 20.0
    other["load"][0].update(rps=200.0, cpu={"MA": 20.0, "locust": 30.0})
    one = fit_rows({"meta": {}, "runs": [run]}, costs)
    two = fit_rows(merge_studies([("a", {"meta": {}, "runs": [run]}), ("b", {"meta": {}, "runs": [other]})]), costs)
    assert len(two["ma"]) == 2 * len(one["ma"]) == 4
    disc = [r for r in two["ma"] if r[2] == "discovery"]
    assert disc[0][0] == disc[1][0] == [r for r in one["ma"] if r[2] == "discovery"][0][0]
    assert disc[1][1] == pytest.approx(2 * disc[0][1])                  # 20 % against 10 % of a core
    load = [r for r in two["locust"] if r[2] == "load"]
    # the same counts but each step's own background column (1 / calls/s): the cached counts were copied
    assert load[0][0][:2] == load[1][0][:2] and load[0][0][2] == pytest.approx(1 / 100) \
        and load[1][0][2] == pytest.approx(1 / 200)


def test_calibrate_command_reads_the_default_study_without_study(monkeypatch):
    """No --study: the stored study, as before --study could be repeated."""
    from gridrpc.sim import calibrate as cal
    from gridrpc.sim.cli import add_parser
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers(dest="cmd"))
    seen = []

    def fake_fit(study, suite, **kw):
        seen.append(study)
        raise SystemExit(0)
    monkeypatch.setattr(cal, "fit", fake_fit)
    monkeypatch.setattr(cal, "load_inputs", lambda f, s=cal.SUITE: ({"meta": {"file": f}, "runs": []}, None))
    with pytest.raises(SystemExit):
        cal.cmd_calibrate(p.parse_args(["sim", "calibrate"]))
    assert seen[0]["meta"]["file"] == cal.STUDY
    with pytest.raises(SystemExit):
        cal.cmd_calibrate(p.parse_args(["sim", "calibrate", "--study", "a.json", "--study", "b.json"]))
    assert [x["file"] for x in seen[1]["meta"]["merged"]] == ["a.json", "b.json"]


def test_the_throughput_error_split_into_cpu_used_and_cpu_per_call():
    """A measured run whose saturation step used 150 % of a core at 500
    calls/s (3,000 us a call) against a simulation using 200 % at 800
    calls/s (2,500 us a call): 1.6 = 1.33 (CPU used) x 1.2 (CPU per call)."""
    run = _run(10, "L2-2", 2.0, 500, users=8)
    run["load"] = [{"users": 4, "rps": 400.0, "cpu": {"MA": 90.0}},
                   {"users": 8, "rps": 500.0, "cpu": {"MA": 50.0, "LA1": 40.0, "s1": 30.0, "locust": 30.0}}]
    assert sum(v.saturation_cpu(run).values()) == pytest.approx(150.0)
    assert v.saturation_cpu(_run(1, "flat", 1.0, 1.0)) is None                # not recorded: no split
    trees = v.measurements([("a", {"runs": [run]})])
    m = trees[(10, "L2-2")][0]
    assert m["cpu_total"] == pytest.approx(150.0)
    assert m["cpu_by_kind"] == {"MA": 50.0, "LAs": 40.0, "SeDs": 30.0, "locust": 30.0}
    assert v.by_kind({"MA": 0.1, "LA1": 0.1, "LA1.2": 0.1, "s-LA1": 0.2, "s-LA1-w0": 0.1, "locust": 0.3}) == \
        pytest.approx({"MA": 0.1, "LAs": 0.2, "SeDs": 0.3, "locust": 0.3})
    preds = {(10, "L2-2"): {"median_ms": 2.0, "rps_by_users": {8: 800.0}, "busy_by_users": {8: 2.0},
                            "busy_kinds_by_users": {8: {"MA": 0.4, "LAs": 0.4, "SeDs": 0.8, "locust": 0.4}}}}
    res = v.compare(trees, preds, ["a"])
    c = res["rows"][0]["cpu"][0]
    assert c["us_per_call"]["MA"] == pytest.approx([1000.0, 500.0])          # 50 % at 500/s, 40 % at 800/s
    assert res["cpu"]["small"]["per_call_ratio_by_kind"]["SeDs"] == pytest.approx(600 / 1000)
    assert c["rps_ratio"] == pytest.approx(1.6)
    assert c["share_ratio"] == pytest.approx(200 / 150) and c["per_call_ratio"] == pytest.approx(1.2)
    assert c["measured_us_per_call"] == pytest.approx(3000) and c["simulated_us_per_call"] == pytest.approx(2500)
    assert c["rps_ratio"] == pytest.approx(c["share_ratio"] * c["per_call_ratio"])
    assert res["cpu"]["small"]["of"] == 1 and "large" not in res["cpu"]
    assert "busy_by_users" not in res["rows"][0] and "busy_kinds_by_users" not in res["rows"][0]
    text = v.format_many(res)
    assert "1.60 =  200% /  150% (1.33) x   3000 /   2500 us (1.20)" in text
    json.dumps(res)


def test_calibrate_without_scipy_names_the_extra(monkeypatch):
    """scipy is in the ``sim`` extra, not a core dependency: without it the
    fit says which extra to install, no traceback."""
    import subprocess
    import sys
    code = ("import sys\nsys.modules['scipy'] = None\n"       # `import scipy` now raises ImportError
            "from gridrpc.cli import main\nraise SystemExit(main(['sim', 'calibrate']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "pip install 'gridrpc[sim]'" in r.stderr and "Traceback" not in r.stderr, r.stderr
    from gridrpc.errors import ConfigError
    from gridrpc.sim import calibrate
    monkeypatch.setitem(sys.modules, "scipy.optimize", None)
    with pytest.raises(ConfigError, match=r"gridrpc\[sim\]"):
        calibrate._nnls([[1.0]], [1.0])
