"""Smoke test of the benchmark command: it runs, writes JSON with numbers,
leaves no process behind. No timing asserts (a benchmark, not a test)."""
import json
import subprocess
import sys

import psutil
import pytest


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bench_quick_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    r = subprocess.run([sys.executable, "-m", "gridrpc", "bench", "--quick", "--only",
                        "floor_latency,memory_sed", "--json", str(out)],
                       capture_output=True, text=True, timeout=110)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "| measurement |" in r.stdout
    doc = json.loads(out.read_text())
    res = doc["results"]
    assert set(res) == {"floor_latency", "memory_sed"}
    for key in ("median_ms", "p99_ms"):
        assert isinstance(res["floor_latency"][key], float) and res["floor_latency"][key] > 0
    assert res["memory_sed"]["rss_mb"] > 0
    assert not doc["errors"]
    assert doc["leftover_processes_killed"] == []
    statuses = {t["key"]: t["status"] for t in doc["targets"]}
    assert statuses["idle_sed_rss"] in ("PASS", "SHORT")
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
