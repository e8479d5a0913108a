"""The scalability study's pure parts: tree shapes, saturation, profiles;
and one tiny real configuration end to end (flat, 2 SeDs, one load step)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.scalability.measure import (discovery_cost, locust_names, step_saturation,  # noqa: E402
                                            summarise_collapsed)
from benchmarks.scalability.study import best_shapes, saturation, shapes_for, table  # noqa: E402
from benchmarks.scalability.tree import Shape, default_shapes  # noqa: E402


def test_shapes():
    flat = Shape.parse("flat").elements(500)
    assert [e.kind for e in flat] == ["ma", "sed", "sed"] and sum(e.replicas for e in flat if e.kind == "sed") == 500
    l2 = Shape.parse("L2-22").elements(500)
    assert sum(e.kind == "la" for e in l2) == 22 and all(e.parent == "MA" for e in l2 if e.kind == "la")
    assert sum(e.replicas for e in l2 if e.kind == "sed") == 500
    l3 = Shape.parse("L3-8").elements(500)
    las = [e for e in l3 if e.kind == "la"]
    assert len(las) == 8 + 64 and len(l3) == 1 + 72 + 64
    leaves = {e.parent for e in l3 if e.kind == "sed"}
    assert len(leaves) == 64 and all("." in p for p in leaves)
    reps = [e.replicas for e in l3 if e.kind == "sed"]
    assert sum(reps) == 500 and max(reps) - min(reps) <= 1
    assert Shape.parse("L3-2").elements(1)[-1].replicas == 1 and not Shape.parse("L3-2").fits(3)
    for bad in ("L4-2", "L2-0", "tree", "L2-x"):
        with pytest.raises(ValueError):
            Shape.parse(bad)
    assert [s.name for s in default_shapes(1)] == ["flat"]
    assert [s.name for s in default_shapes(100)] == ["flat", "L2-2", "L2-10", "L3-2", "L3-5"]
    assert "L3-8" in [s.name for s in shapes_for(500, "auto", 140)]
    assert "L3-8" not in [s.name for s in shapes_for(500, "auto", 100)]


def test_saturation_and_best():
    steps = [{"users": 1, "rps": 10.0, "median_ms": 5, "p99_ms": 9, "cpu": {"MA": 50, "s1": 20, "locust": 5}},
             {"users": 2, "rps": 18.0, "median_ms": 7, "p99_ms": 12, "cpu": {"MA": 90, "s1": 30, "locust": 8}},
             {"users": 4, "rps": 17.0, "median_ms": 9, "p99_ms": 20, "cpu": {"MA": 95, "s1": 31, "locust": 8}}]
    s = saturation(steps)
    assert s["max_rps"] == 18.0 and s["users"] == 2 and s["busiest"] == "MA"
    assert s["cpu_by_kind"] == {"MA": 90, "LAs": 0.0, "SeDs": 30, "locust": 8}
    runs = [{"n": 10, "shape": "flat", "discovery": {"p99_ms": 5.0}, "saturation": {"max_rps": 100}},
            {"n": 10, "shape": "L2-2", "discovery": {"p99_ms": 4.0}, "saturation": {"max_rps": 90}}]
    assert best_shapes(runs)[10] == {"latency": "L2-2", "p99_ms": 4.0, "throughput": "flat", "max_rps": 100}
    cost = discovery_cost({"discovery": {"mean_ms": 10.0}, "idle_cpu": {"MA": 5.0, "LA1": 1.0, "s-LA1": 1.0},
                           "discovery_cpu": {"MA": 55.0, "LA1": 21.0, "s-LA1": 41.0}})
    assert cost == pytest.approx({"MA": 5.0, "LAs": 2.0, "SeDs": 4.0})


def test_a_step_whose_locust_process_is_saturated_is_flagged():
    """A load step records every process above 90 % of a core; a locust
    process among them means the step measured the load generator, and a
    best rate from such a step is flagged as a lower bound, not the tree's
    capacity (table and JSON)."""
    st = step_saturation({"MA": 60.0, "s1": 40.0, "locust-master": 2.0, "locust-w1": 96.0})
    assert st["saturated"] == ["locust-w1"] and st["busiest"] == "locust-w1" and st["load_generator_saturated"]
    st = step_saturation({"MA": 97.0, "locust": 89.0})
    assert st["saturated"] == ["MA"] and not st["load_generator_saturated"]
    assert step_saturation({})["load_generator_saturated"] is False
    steps = [{"users": 4, "rps": 900.0, "median_ms": 3, "p99_ms": 9, "cpu": {"MA": 40, "s1": 30, "locust": 95}},
             {"users": 8, "rps": 1000.0, "median_ms": 5, "p99_ms": 12,
              "cpu": {"MA": 50, "s1": 35, "locust-master": 1, "locust-w1": 92, "locust-w2": 70}}]
    s = saturation(steps)
    assert s["max_rps"] == 1000.0 and s["load_generator_saturated"] and s["saturated"] == ["locust-w1"]
    assert s["steps_load_generator_saturated"] == [4, 8] and s["cpu_by_kind"]["locust"] == 163
    run = {"n": 10, "shape": "flat", "levels": 1, "d": 0, "procs": 3, "discovery": {"median_ms": 1.0, "p99_ms": 2.0},
           "saturation": s}
    assert "load generator saturated" in table([run])
    s["load_generator_saturated"] = False
    assert "load generator saturated" not in table([run])


def test_locust_processes_are_named_one_by_one():
    class Kid:
        def __init__(self, pid, t, master):
            self.pid, self._t, self._master = pid, t, master

        def create_time(self):
            return self._t

        def cmdline(self):
            return ["python", "-m", "locust"] + (["--master"] if self._master else ["--worker"])
    kids = [Kid(12, 2.0, False), Kid(10, 1.0, True), Kid(11, 1.5, False)]
    assert locust_names(kids, 2) == {"locust-master": 10, "locust-w1": 11, "locust-w2": 12}
    assert locust_names(kids[:1], 0) == {"locust": 12}


def test_profile_summary():
    raw = ("main (a.py:1);loop (base_events.py:10);select (selectors.py:468) 60\n"
           "main (a.py:1);loop (base_events.py:10);_drain (/x/channel.py:146) 30\n"
           "main (a.py:1);loop (base_events.py:10);_drain (/x/channel.py:146);send (socket.py:713) 10\n")
    s = summarise_collapsed(raw)
    assert s["samples"] == 100 and s["idle_pct"] == 60.0
    assert s["own"][0] == ("select (selectors.py:468)", 60.0)
    assert ("_drain (channel.py:146)", 40.0) in s["inclusive"]


@pytest.mark.slow
def test_study_end_to_end(tmp_path):
    """One configuration for real: 2 SeDs flat, 20 discoveries, one short
    locust step (a master and one worker, each measured on its own)."""
    import subprocess
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks.scalability", "--sizes", "2", "--shapes", "flat",
                        "--users", "2", "--step-seconds", "3", "--rounds", "20", "--workers", "1", "--out", str(out),
                        "--plots", str(tmp_path / "plots")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    (run,) = data["runs"]
    assert run["n"] == 2 and run["procs"] == 3 and run["discovery"]["rounds"] == 20
    assert run["load"][0]["requests"] > 0 and run["saturation"]["max_rps"] > 0
    step = run["load"][0]
    assert set(step["cpu"]) == {"MA", "s1", "s2", "locust-master", "locust-w1"} and step["workers"] == 1
    assert step["load_generator_saturated"] == (step["cpu"]["locust-w1"] >= 90) and "saturated" in step
    assert data["meta"]["locust_workers"] == 1
    assert {p.name for p in (tmp_path / "plots").iterdir()} >= {"discovery.png", "throughput.png", "cpu.png"}
    assert "lowest discovery p99 flat" in r.stdout
