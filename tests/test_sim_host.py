"""What depends on the host is apart from the model: a host profile (cores,
single-core speed) changes the predictions the way the host would; the
load generator's reuse window of view answers is the real ReusedAnswers."""
from __future__ import annotations

import json

import pytest

from gridrpc.sim import World, elements_for
from gridrpc.affinity import usable_cores
from gridrpc.sim.host import HostProfile, quick_profile
from gridrpc.sim.host_check import format_rows, predict_study
from gridrpc.sim.model import Costs
from gridrpc.sim.world import LOADTEST_REUSE, closed_loop, discovery_series
from gridrpc.loadtest.config import LoadConfig


def test_a_profile_round_trips_and_refuses_nonsense(tmp_path):
    p = HostProfile(cores=16, speed=1.7, bench_s=0.05, source="test")
    p.save(tmp_path / "h.json")
    assert HostProfile.load(tmp_path / "h.json") == p
    assert p.world_kw() == {"cores": 16, "sed_cores": 16, "speed": 1.7}
    for bad in ({"cores": 0}, {"cores": 2, "speed": 0.0}):
        with pytest.raises(ValueError):
            HostProfile(**bad)


def test_quick_profile_measures_speed_and_takes_the_affinity():
    p = quick_profile(repeats=2)
    assert p.cores == usable_cores() >= 1
    assert p.bench_s > 0 and p.speed == pytest.approx(p.reference_bench_s / p.bench_s, rel=0.01)
    assert quick_profile(cores=16, repeats=1).cores == 16


def _run(cores: int, speed: float, users: int) -> dict:
    kw = dict(seed=1, views=True, cores=cores, sed_cores=cores, speed=speed)
    els = elements_for("L2-2", 20)
    w = World(**kw).build(els)
    w.wait_registered()
    d = discovery_series(w, rounds=60)
    w = World(**kw).build(els)
    w.wait_registered()
    c = closed_loop(w, users, seconds=0.5, reuse=LOADTEST_REUSE)
    return {"median": d["discovery_median_ms"], "rps": c["throughput"]}


def test_cores_and_speed_move_the_predictions_as_a_host_would():
    base = _run(2, 1.0, 16)
    one = _run(1, 1.0, 16)
    fast = _run(2, 2.0, 16)
    assert one["rps"] < base["rps"] * 0.8          # half the cores: the loaded tree does less
    assert fast["rps"] > base["rps"] * 1.3 and fast["median"] < base["median"] * 0.85


def test_the_load_generator_reuses_view_answers_as_gridrpc_loadtest():
    assert LOADTEST_REUSE == LoadConfig.reuse_discovery > 0
    els = elements_for("flat", 20)
    out = {}
    for views in (True, False):
        w = World(seed=2, views=views).build(els)
        w.wait_registered()
        r = closed_loop(w, 4, seconds=0.5, reuse=LOADTEST_REUSE)
        reuse = w.clients[0].reuse
        out[views] = (r, reuse.reused)
        assert r["calls"] > 50 and r["call_failures"] == 0
    (with_views, reused), (fanout, reused_fanout) = out[True], out[False]
    assert reused > with_views["discoveries"]      # most calls took a kept answer
    assert reused_fanout == 0 and fanout["discoveries"] > 0     # a fan-out's answer is never kept
    # (calls waiting on one DISCOVER of the same key share its answer, as GreenClient's joined asks)


def test_predict_compares_every_load_step():
    study = {"meta": {"discovery_mode": "view"}, "runs": [
        {"n": 10, "shape": "flat", "discovery": {"median_ms": 0.5},
         "load": [{"users": 1, "rps": 1000.0}, {"users": 4, "rps": 1500.0}]}]}
    rows = predict_study(study, HostProfile(cores=2), Costs.load(None))
    assert [r["users"] for r in rows] == [1, 4]
    for r in rows:
        assert r["predicted_median_ms"] > 0 and r["predicted_rps"] > 0
        assert r["median_error"] == pytest.approx(r["predicted_median_ms"] / 0.5 - 1)
        assert r["view_answers"] > 0                # the study was measured with views: so is the prediction
    assert "within 25%" in format_rows(rows)
    json.dumps(rows)


def test_sim_run_takes_a_host_profile_and_simulates_views(tmp_path, capsys):
    import argparse
    from gridrpc.sim.cli import add_parser
    HostProfile(cores=1, speed=0.5).save(tmp_path / "h.json")
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers(dest="cmd"))

    def run(*extra) -> dict:
        a = p.parse_args(["sim", "run", "--seds", "10", "--shape", "L2-2", "--users", "2", "--rounds", "40",
                          "--seconds", "0.3", *extra])
        assert a.func(a) == 0
        return json.loads(capsys.readouterr().out)
    base = run()
    slow = run("--host-profile", str(tmp_path / "h.json"))
    fanout = run("--no-views")
    assert slow["discovery_median_ms"] > base["discovery_median_ms"] * 1.5     # half the speed, one core
    assert slow["calls_per_s"] < base["calls_per_s"]
    # a view answer is one hop: the fan-out through two LAs to the SeDs takes longer
    assert fanout["discovery_median_ms"] > base["discovery_median_ms"] * 1.5


def test_several_measurements_are_combined_per_load_step():
    from gridrpc.sim.host_check import combine, format_combined
    row = {"n": 10, "shape": "flat", "users": 1, "predicted_median_ms": 1.0, "predicted_rps": 100.0}
    a = [{**row, "measured_median_ms": 0.9, "measured_rps": 50.0}]
    b = [{**row, "measured_median_ms": 2.0, "measured_rps": 60.0}]
    (c,) = combine([a, b])
    assert c["measurements"] == 2 and c["measured_median_ms_range"] == [0.9, 2.0]
    assert c["median_error"] == pytest.approx(1.0 / 1.45 - 1) and c["median_in_range"]
    assert c["rps_error"] == pytest.approx(100 / 55 - 1) and not c["rps_in_range"]     # 100 > 60 x 1.25
    assert "| flat | 1 |" in format_combined([c])


def test_calibration_counts_a_view_study_with_views_on_its_cores():
    from gridrpc.sim.calibrate import merge_studies, study_views
    from gridrpc.sim.counts import count_discovery, count_load
    view, fanout, old = ({"meta": {"discovery_mode": "view"}, "runs": []},
                         {"meta": {"discovery_mode": "fanout"}, "runs": []}, {"meta": {}, "runs": []})
    assert study_views(view) and not study_views(fanout) and not study_views(old)
    assert study_views(merge_studies([("a", view), ("b", view)]))
    with pytest.raises(ValueError):
        merge_studies([("a", view), ("b", fanout)])
    costs = Costs.load(None)
    seds = lambda cnt: sum(c["msgs"] for c in cnt.values() if c["kind"] == "sed")   # noqa: E731
    assert seds(count_discovery("flat", 10, costs, views=True)) == 0        # answered by the MA alone
    assert seds(count_discovery("flat", 10, costs, views=False)) > 0        # a fan-out asks the SeDs
    one, rps1 = count_load("flat", 10, 8, costs, views=True, cores=1)
    two, rps2 = count_load("flat", 10, 8, costs, views=True, cores=2)
    assert rps1 < rps2 and one["MA"]["crowd"] > two["MA"]["crowd"]         # the processes per core
