"""Load tests with locust: the mix/argument syntax, the gevent client, and
bounded headless runs of ``gridrpc loadtest`` (locust always runs in a child
process: importing it here would monkey-patch pytest's process)."""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
import uuid

import psutil
import pytest

import gridrpc
from gridrpc.errors import ConfigError
from gridrpc.loadtest.cli import normalise_address, parse_timespan
from gridrpc.loadtest.config import LoadConfig, MixEntry, format_mix, parse_args, parse_mix
from gridrpc.testing import LocalTree


@pytest.fixture(scope="module")
def small_tree():
    with LocalTree(las=1, seds_per_la=2, http=False) as t:
        yield t


def _locust_children() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "-m locust" in cmd or "-m gridrpc loadtest" in cmd:
            out.append(p)
    return out


def loadtest(*args: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "gridrpc", "loadtest", *args], capture_output=True,
                       text=True, timeout=timeout)
    return r, time.monotonic() - t0


# -- configuration (pure) ---------------------------------------------------
def test_parse_mix():
    assert parse_mix("add:3,sleep:1") == (MixEntry("add", "call", 3.0), MixEntry("sleep", "call", 1.0))
    assert parse_mix("add/bound:2, add/discover") == (MixEntry("add", "bound", 2.0),
                                                      MixEntry("add", "discover", 1.0))
    assert format_mix(parse_mix("add:3,noop/bound:0.5")) == "add:3,noop/bound:0.5"
    for bad in ("", "add:x", "add:0", "add/fly:1", ":2", "add:-1"):
        with pytest.raises(ConfigError):
            parse_mix(bad)


def test_parse_args_and_env():
    assert parse_args('{"add": [1, 2], "sleep": 0.5}') == {"add": [1, 2], "sleep": [0.5]}
    assert parse_args("add=[3,4]; echo=\"x\"") == {"add": [3, 4], "echo": ["x"]}
    assert parse_args(None) == {}
    for bad in ("{not json", "[1]", "add", "add=[1,"):
        with pytest.raises(ConfigError):
            parse_args(bad)
    cfg = LoadConfig.from_env({"GRIDRPC_MA": "tcp://h:1", "GRIDRPC_MIX": "add:2,noop/bound",
                               "GRIDRPC_ARGS": "add=[5,6]", "GRIDRPC_MAX_REQUESTS": "7"})
    assert cfg.master_agent == "tcp://h:1" and cfg.max_requests == 7
    assert cfg.args_for("add") == [5, 6] and cfg.args_for("sleep") == [0.01] and cfg.args_for("zz") == []
    with pytest.raises(ConfigError):
        LoadConfig.from_env({"GRIDRPC_TIMEOUT": "soon"})
    assert cfg.reuse_discovery == 0.01
    assert LoadConfig.from_env({"GRIDRPC_REUSE_DISCOVERY": "0"}).reuse_discovery == 0.0
    with pytest.raises(ConfigError):
        LoadConfig.from_env({"GRIDRPC_REUSE_DISCOVERY": "10ms"})


def test_timespan_and_address():
    assert parse_timespan("90") == 90 and parse_timespan("1m30s") == 90 and parse_timespan("2h") == 7200
    with pytest.raises(ConfigError):
        parse_timespan("ten seconds")
    assert normalise_address("host:5555") == "tcp://host:5555"
    assert normalise_address("a:1,tcp://b:2") == "tcp://a:1,tcp://b:2"      # several MAs: users spread
    with pytest.raises(ConfigError):
        normalise_address("nowhere")


def test_loadtest_help(capsys):
    from gridrpc.cli import main
    with pytest.raises(SystemExit) as exc:
        main(["loadtest", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for opt in ("--users", "--spawn-rate", "--run-time", "--max-requests", "--mix", "--csv", "--html",
                "--fail-ratio", "--workers"):
        assert opt in out
    assert main(["loadtest", "tcp://127.0.0.1:1", "--max-requests", "0"]) == 2    # bounded runs only
    assert main(["loadtest", "tcp://127.0.0.1:1", "--mix", "add:zero"]) == 2
    assert "N|auto" in out


def test_workers_auto_is_the_cores_but_one(monkeypatch):
    import argparse
    from gridrpc.loadtest import cli
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert cli.workers_arg("auto") == 15 and cli.workers_arg("AUTO") == 15
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert cli.workers_arg("auto") == 1                   # at least one
    assert cli.workers_arg("3") == 3 and cli.workers_arg("0") == 0
    for bad in ("-1", "many", "2.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            cli.workers_arg(bad)


# -- the gevent client ------------------------------------------------------
def test_green_client(small_tree):
    from gridrpc.loadtest.green import GreenClient
    import gevent
    with GreenClient(small_tree.ma_address, keep_records=True, timeout=10) as c:
        assert c.call("add", 1, 2) == 3
        assert c.last.kind == "call" and c.last.server and c.last.size > 0 and 0 < c.last.discover_ms <= c.last.ms
        servers = c.discover("add", 5)
        assert {s.name for s in servers} == set(small_tree.sed_names())
        h = c.bind("add")
        assert h(20, 22) == 42 and c.last.kind == "bound" and c.last.server == h.server.name
        assert c.call("echo", {"a": (1, 2.5)}, server=servers[0].name) == {"a": (1, 2.5)}
        with pytest.raises(gridrpc.RemoteError) as exc:
            c.call("fail", "boom")
        assert "boom" in str(exc.value) and exc.value.remote_type == "RuntimeError"
        assert c.last.error == "RemoteError"
        with pytest.raises(gridrpc.ServiceNotFound):
            c.call("no_such_service")
        with pytest.raises(gridrpc.Timeout):
            c.call("sleep", 3, timeout=0.3)
        with pytest.raises(gridrpc.NoServerAvailable):
            c.call("add", 1, 1, server="no-such-sed")
        # many greenlets share one client; each waits without blocking the others
        results = []
        gs = [gevent.spawn(lambda i=i: results.append(c.call("add", i, 1))) for i in range(20)]
        gevent.joinall(gs, timeout=20, raise_error=True)
        assert sorted(results) == list(range(1, 21))
        assert len(c.records) >= 27
    with pytest.raises(gridrpc.CommunicationError):
        c.call("add", 1, 2)


def test_green_client_reuses_view_answers(small_tree):
    """reuse_discovery (gridrpc.client.reuse) in the load-test client: calls
    within the window take a kept view answer and ask the MA nothing."""
    from gridrpc.loadtest.green import GreenClient
    import gevent
    with GreenClient(small_tree.ma_address, keep_records=True, timeout=10, reuse_discovery=30.0) as c:
        for _ in range(200):                    # until the MA answers from its view (first pushes)
            assert c.call("add", 1, 2) == 3
            if c._reuse.asked:
                break
            c._reuse.forget()
            gevent.sleep(0.05)
        assert c._reuse.asked == 1
        asked = dict(c.counters)
        for i in range(10):
            assert c.call("add", i, 1) == i + 1
            assert c.last.kind == "call" and c.last.discover_ms == 0.0 and c.last.server
        assert c._reuse.reused == 10 and c._reuse.in_flight == {}
        assert c.counters["discover_messages"] == asked["discover_messages"]      # no DISCOVER sent
        assert c.counters["calls"] - asked["calls"] == 10 <= c.counters["call_messages"] - asked["call_messages"]
    with GreenClient(small_tree.ma_address, keep_records=True, timeout=10, reuse_discovery=0) as c:
        for i in range(5):
            assert c.call("add", i, 1) == i + 1 and c.last.discover_ms > 0
        assert c._reuse is None


def test_green_client_unreachable_ma():
    from gridrpc.loadtest.green import GreenClient
    with GreenClient("tcp://127.0.0.1:9", discovery_timeout=0.3) as c:
        t0 = time.monotonic()
        with pytest.raises(gridrpc.CommunicationError):
            c.discover("add")
        assert time.monotonic() - t0 < 2


# -- headless locust runs ---------------------------------------------------
@pytest.mark.slow
def test_headless_run_counts_failures_and_latency_matches(small_tree, tmp_path):
    """One bounded run: the failing service's failures are counted, the run
    stops by itself, and locust's latencies match the client's own; the
    median matches a plain (asyncio) gridrpc.Client's within a tolerance."""
    def plain_median() -> float:
        with gridrpc.Client(small_tree.ma_address) as c:
            ts = []
            for i in range(150):
                t0 = time.perf_counter()
                c.call("add", i, 1)
                ts.append((time.perf_counter() - t0) * 1000)
        return statistics.median(ts[20:])

    before = plain_median()
    out = tmp_path / "s.json"
    r, took = loadtest(small_tree.ma_address, "-u", "1", "-t", "6s", "-n", "400", "--mix", "add:3,fail:1",
                       "--fail-ratio", "0.5", "--json", str(out), "--csv", str(tmp_path / "c"),
                       "--html", str(tmp_path / "r.html"))
    after = plain_median()
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads(out.read_text())
    add, fail = s["locust"]["call add"], s["locust"]["call fail"]
    assert add["requests"] > 20 and add["failures"] == 0
    assert fail["requests"] > 0 and fail["failures"] == fail["requests"]
    assert any("failure requested" in e["error"] for e in s["errors"])
    assert s["total"]["requests"] <= 400 and 0.1 < s["total"]["fail_ratio"] < 0.5
    assert (tmp_path / "c_stats.csv").exists() and (tmp_path / "r.html").stat().st_size > 1000
    assert "call" in r.stdout and "add" in r.stdout
    # locust's statistics vs the client's own measurements (same run)
    own = s["client"]["call add"]
    assert own["requests"] == add["requests"]
    assert add["avg_ms"] == pytest.approx(own["avg_ms"], rel=0.01)
    assert abs(add["median_ms"] - own["median_ms"]) <= 1.0 + 0.1 * own["median_ms"]   # locust rounds
    # vs a plain client, measured before and after: same order of magnitude
    # (a blocked gevent hub would add whole scheduling slices or time out)
    print(f"add median: plain Client {before:.2f} / {after:.2f} ms, green client {own['median_ms']:.2f} ms, "
          f"locust {add['median_ms']} ms")
    lo, hi = min(before, after), max(before, after)
    assert lo / 3 - 1 <= own["median_ms"] <= 3 * hi + 2, (before, after, own)
    assert not _locust_children()


@pytest.mark.slow
def test_max_requests_bounds_the_run_and_fail_ratio_sets_exit_code(small_tree, tmp_path):
    out = tmp_path / "s.json"
    r, took = loadtest(small_tree.ma_address, "-u", "3", "-t", "40s", "-n", "60", "--mix", "add:1,fail:1",
                       "--fail-ratio", "0.05", "--json", str(out))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "failure ratio" in r.stderr
    assert took < 30          # stopped by the request bound, not by the 40 s
    s = json.loads(out.read_text())
    assert 40 <= s["total"]["requests"] <= 60
    assert not _locust_children()


@pytest.mark.slow
def test_distributed_master_and_workers(small_tree, tmp_path):
    out = tmp_path / "s.json"
    r, took = loadtest(small_tree.ma_address, "--workers", "2", "-u", "4", "-t", "5s", "-n", "200",
                       "--mix", "add:2,add/bound:2,add/discover:1", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads(out.read_text())
    assert s["workers"] == 2 and "workers 2" in r.stdout
    kinds = {e["type"] for e in s["locust"].values()}
    assert kinds == {"call", "bound", "discover"}
    assert 0 < s["total"]["requests"] <= 200 + 8     # + the binding discoveries of 4 users
    assert s["client"]["call add"]["requests"] == s["locust"]["call add"]["requests"]
    assert not _locust_children()


@pytest.mark.slow
def test_deployment_file_is_started_loaded_and_stopped(tmp_path):
    tag = uuid.uuid4().hex[:8]
    dep = tmp_path / f"lt{tag}.yaml"
    dep.write_text(f"""
master_agent: {{name: MA-{tag}, host: localhost, port: 0}}
local_agents:
  - {{name: LA-{tag}, parent: MA-{tag}, host: localhost}}
seds:
  - {{name: sed-{tag}, parent: LA-{tag}, host: localhost, examples: true, replicas: 3, workers: 1}}
""")
    r, took = loadtest(str(dep), "-u", "2", "-t", "3s", "-n", "150", "--mix", "add", timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "call" in r.stdout and "registered at the MA: 5/5" in r.stderr
    left = [p for p in psutil.process_iter(["cmdline"]) if tag in " ".join(p.info["cmdline"] or [])]
    assert not left, left
    assert not _locust_children()


@pytest.mark.slow
def test_deployment_file_with_two_mas_spreads_the_users(tmp_path):
    tag = uuid.uuid4().hex[:8]
    dep = tmp_path / f"lt2{tag}.yaml"
    dep.write_text(f"""
master_agent:
  - {{name: MA1-{tag}, host: localhost, port: 0}}
  - {{name: MA2-{tag}, host: localhost, port: 0}}
seds:
  - {{name: sed-{tag}, parent: MA1-{tag}, host: localhost, examples: true, replicas: 2, workers: 1}}
""")
    out = tmp_path / "summary.json"
    r, took = loadtest(str(dep), "-u", "2", "-t", "3s", "-n", "100", "--mix", "add", "--json", str(out),
                       timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "registered at MA1-" in r.stderr and "registered at MA2-" in r.stderr
    assert re.search(r"-> tcp://127\.0\.0\.1:\d+,tcp://127\.0\.0\.1:\d+:", r.stderr), r.stderr
    s = json.loads(out.read_text())
    assert s["client"]["call add"]["requests"] > 0 and s["client"]["call add"]["failures"] == 0, s
    left = [p for p in psutil.process_iter(["cmdline"]) if tag in " ".join(p.info["cmdline"] or [])]
    assert not left, left
    assert not _locust_children()


def test_unreachable_target_fails_cleanly(tmp_path):
    r, took = loadtest("tcp://127.0.0.1:9", "-u", "1", "-t", "2s", "-n", "5", "--timeout", "0.5")
    assert r.returncode == 1
    assert "failure ratio" in r.stderr or "no request" in r.stderr
    assert not _locust_children()
    r, _ = loadtest(str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "not found" in r.stderr
    r, _ = loadtest("tcp://127.0.0.1:9", "--reuse-discovery", "-1")
    assert r.returncode == 2 and "--reuse-discovery" in r.stderr and not _locust_children()
