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


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bench_quick_curve_pair(tmp_path):
    """One CURVE item on a secure tree A (keys in the run's temp dir) and its
    plain item on tree A, in one run: both measured, the ratio in the JSON."""
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "gridrpc", "bench", "--quick", "--only", "call_bound_curve",
                        "--json", str(out)], capture_output=True, text=True, timeout=110)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "| security cost |" in r.stdout
    doc = json.loads(out.read_text())
    assert set(doc["results"]) == {"call_bound", "call_bound_curve"}
    assert "CURVE" in doc["results"]["call_bound_curve"]["tree"]
    cost = doc["security_cost"]["call_bound_curve"]
    assert cost["ratio"] > 0 and cost["target_ratio"] == 1.15
    assert not doc["errors"] and doc["leftover_processes_killed"] == []


def test_curve_rows_bring_their_plain_rows_and_ratios():
    """The ``curve`` group: selecting it selects the plain items too (one run),
    and the report puts secure / plain ratios in the table and the JSON.
    No process started."""
    from benchmarks import report, suite
    assert suite.select("curve") == {"call_discovery", "call_bound", "throughput_bound", "array_8mb",
                                     "call_discovery_curve", "call_bound_curve", "throughput_bound_curve",
                                     "array_8mb_curve"}
    assert suite.select("call_bound_curve") == {"call_bound", "call_bound_curve"}
    cpu = {"client": 100.0, "sed": 100.0}
    res = {"call_bound": {"median_ms": 1.0, "p99_ms": 2.0, "cpu_us_per_call": cpu},
           "call_bound_curve": {"median_ms": 1.25, "p99_ms": 2.5, "cpu_us_per_call": {"client": 150.0, "sed": 150.0}},
           "throughput_bound": {"calls_per_s": {"median": 1000.0}, "n": 400},
           "throughput_bound_curve": {"calls_per_s": {"median": 800.0}, "n": 400},
           "array_8mb": {"median_ms": 40.0, "p99_ms": 50.0, "gb_per_s": 0.42},
           "array_8mb_curve": {"median_ms": 42.0, "p99_ms": 55.0, "gb_per_s": 0.40}}
    cost = report.security_cost(res)
    assert set(cost) == {"call_bound_curve", "throughput_bound_curve", "array_8mb_curve"}
    assert cost["call_bound_curve"]["ratio"] == pytest.approx(1.25)
    assert cost["call_bound_curve"]["cpu_ratio"] == pytest.approx(1.5)
    assert cost["call_bound_curve"]["met"] is False
    assert cost["throughput_bound_curve"]["ratio"] == pytest.approx(1.25)    # time per call, not calls/s
    assert cost["array_8mb_curve"]["met"] is True
    targets = {t["key"]: t["status"] for t in report.evaluate(res)}
    assert targets["curve_bound_call"] == "SHORT" and targets["curve_8mb"] == "PASS"
    text = report.security_table(res, cost, report.evaluate(res))
    assert "1.25x (+25 %)" in text and "1.05x (+5 %)" in text
    assert "1.25x plain" in report.table(res, report.evaluate(res), {})


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_standalone_bench_writes_json_and_stops_its_sed(tmp_path):
    out = tmp_path / "standalone.json"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    r = subprocess.run([sys.executable, "-m", "benchmarks.standalone", "--n", "500", "--repeat", "1",
                        "--json", str(out)], capture_output=True, text=True, timeout=110)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    assert doc["calls_per_s"] > 0 and doc["sed_us"] > 0 and doc["client_us"] > 0
    assert len(doc["rounds"]) == 1 and doc["isolation"] == "process"
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
    try:                            # its SeD (own session, not our child) was stopped
        assert psutil.Process(doc["sed_pid"]).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        pass


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bench_diagnostic_floors_run_and_stop_their_workers(tmp_path):
    """The floor echo through a worker and the least Python RPC through a worker: numbers in the
    JSON, rows in the table compared with the floor, and their servers' worker processes gone
    (the suite kills any process left with its token: none may be)."""
    out = tmp_path / "floors.json"
    r = subprocess.run([sys.executable, "-m", "gridrpc", "bench", "--quick", "--only",
                        "floor_latency,floor_hop_latency,floor_rpc_latency", "--json", str(out)],
                       capture_output=True, text=True, timeout=110)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    res = doc["results"]
    assert set(res) == {"floor_latency", "floor_hop_latency", "floor_rpc_latency"}
    for item in res.values():
        assert isinstance(item["median_ms"], float) and item["median_ms"] > 0
    assert "diagnostic: floor echo through a worker process" in r.stdout
    assert "diagnostic: least Python RPC through a worker" in r.stdout
    assert not doc["errors"] and doc["leftover_processes_killed"] == []


def test_the_rpc_floor_server_ignores_a_malformed_call():
    """``serve rpc`` checks id, service and args before use: a bad header gets no answer and the
    server keeps answering good ones."""
    import asyncio

    import orjson
    import zmq
    import zmq.asyncio

    from benchmarks.procs import Procs
    from benchmarks.floor import start_server

    async def go(addr):
        ctx = zmq.asyncio.Context()
        d = ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.connect(addr)
        try:
            for bad in ({"id": 1, "service": "add", "args": [1, 2]}, {"id": "x", "service": "os.system", "args": []},
                        {"id": "y", "service": "add", "args": "1,2"}):
                await d.send(orjson.dumps(bad))
            await d.send(orjson.dumps({"type": "call", "id": "ok", "service": "add", "args": [4, 5]}))
            reply = orjson.loads(await asyncio.wait_for(d.recv(), 10))
            return reply
        finally:
            d.close()
            ctx.term()
    procs = Procs()
    try:
        addr = start_server(procs, "rpc")
        assert asyncio.run(go(addr)) == {"type": "result", "id": "ok", "value": 9}
    finally:
        procs.stop()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bench_quick_load_rows(tmp_path):
    """The ``load`` group: 64 independent GreenClients in load processes, bound
    and with discovery in one run; failures counted; no process left."""
    out = tmp_path / "bench.json"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    r = subprocess.run([sys.executable, "-m", "gridrpc", "bench", "--quick", "--only", "load", "--json", str(out)],
                       capture_output=True, text=True, timeout=110)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    res = doc["results"]
    assert set(res) == {"load_bound", "load_discovery"}
    for item in res.values():
        assert item["clients"] == 64 and item["n"] > 0 and item["calls_per_s"]["median"] > 0
        assert isinstance(item["failed"], int) and item["cpu_us_per_call"]["client"] > 0
    assert res["load_bound"]["call_messages_per_call"] == 1.0 and res["load_bound"]["discover_messages_per_call"] == 0
    assert res["load_discovery"]["discover_messages_per_call"] > 0
    statuses = {t["key"]: t["status"] for t in doc["targets"]}
    assert statuses["load_discovery_08"] in ("PASS", "SHORT") and statuses["load_no_failure"] in ("PASS", "SHORT")
    assert "64 independent GreenClients" in r.stdout
    assert not doc["errors"] and doc["leftover_processes_killed"] == []
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def test_load_rows_report_failures_and_the_ratio():
    """No process started: the report of the ``load`` items."""
    from benchmarks import report
    row = {"calls_per_s": {"median": 1000.0, "all": [1000.0]}, "n": 3000, "failed": 2, "clients": 64,
           "load_processes": 2, "load_process_cpu_pct_max": 41.0}
    res = {"load_bound": dict(row, failed=0), "load_discovery": dict(row, calls_per_s={"median": 850.0})}
    targets = {t["key"]: t for t in report.evaluate(res)}
    assert targets["load_discovery_08"]["status"] == "PASS" and targets["load_discovery_08"]["measured"] == "0.85x bound"
    assert targets["load_no_failure"]["status"] == "SHORT"
    text = report.table(res, report.evaluate(res), {})
    assert "2 failed, 64 clients in 2 processes (busiest at 41 % of a core)" in text
    res["load_discovery"]["calls_per_s"] = {"median": 700.0}
    assert {t["key"]: t["status"] for t in report.evaluate(res)}["load_discovery_08"] == "SHORT"


def test_blocking_client_rows_bring_their_async_rows_and_targets():
    """A blocking-client item selects its AsyncClient item too (one run), and
    the targets compare the two: within 1.1x passes, beyond it falls short.
    No process started."""
    from benchmarks import report, suite
    assert suite.select("call_bound_sync") == {"call_bound", "call_bound_sync"}
    assert suite.select("call_discovery_sync") == {"call_discovery", "call_discovery_sync"}
    res = {"call_discovery": {"median_ms": 0.50, "p99_ms": 1.0},
           "call_discovery_sync": {"median_ms": 0.54, "p99_ms": 1.0},
           "call_bound": {"median_ms": 0.40, "p99_ms": 1.0}, "call_bound_sync": {"median_ms": 0.48, "p99_ms": 1.0}}
    targets = {t["key"]: t for t in report.evaluate(res)}
    assert targets["blocking_discovery_call"]["status"] == "PASS"
    assert targets["blocking_discovery_call"]["measured"] == "1.08x AsyncClient"
    assert targets["blocking_bound_call"]["status"] == "SHORT"
    assert targets["blocking_bound_call"]["measured"] == "1.20x AsyncClient"
    assert {t["key"]: t["status"] for t in report.evaluate({})}["blocking_bound_call"] == "n/a"
