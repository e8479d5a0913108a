"""SWF traces through simulated batch SeDs (gridrpc/sim/swf*.py, batch_cluster.py,
trace_replay.py; docs/simulation-traces.md): the strict parser and its limits,
the generator, EASY backfilling and the Slurm-like start estimate against
start times worked out by hand, the vector against the real SeD's
``estimate``, the selection against the real aggregators, a policy property,
the CLI."""
from __future__ import annotations

import gzip
import json
import math
import random
import subprocess
import sys
from types import SimpleNamespace

import pytest

from gridrpc.core.aggregators import make_aggregator
from gridrpc.sed.batch.cluster import ClusterViewMixin
from gridrpc.sed.batch.estimate import RunRecord
from gridrpc.sed.batch.state import CallJob
from gridrpc.sim.batch_cluster import BatchCluster, SimJob
from gridrpc.sim.swf import SWFError, SWFJob, Trace, format_swf, parse_swf, read_swf
from gridrpc.sim.swf_gen import generate
from gridrpc.sim.trace_replay import DEFAULT_CLUSTERS, ClusterSpec, SimBatchSeD, parse_clusters, replay

GOOD = """\
; Version: 2.2
; Computer: test machine
; MaxNodes: 16
; MaxProcs: 64
; Note: first note
; Note: second: with a colon
; a free comment without a label
1 0 10 100 4 95.5 1024.25 4 120 -1 1 1 1 7 1 -1 -1 -1
2 5 -1 50 64 -1 -1 64 3600 -1 0 2 1 -1 1 -1 1 12

3 5 0 0 1 -1 -1 1 -1 -1 5 1 1 7 -1 -1 -1 -1
"""


def test_parse_good_file():
    t = parse_swf(GOOD.splitlines(True), source="good.swf")
    assert t.header["MaxProcs"] == 64 and t.header["MaxNodes"] == 16 and t.max_procs == 64
    assert t.header["Version"] == "2.2" and t.header["Computer"] == "test machine"
    assert t.header["Note"] == ["first note", "second: with a colon"]
    assert t.comments == ["a free comment without a label"]
    assert [j.job for j in t.jobs] == [1, 2, 3]
    j1, j2, j3 = t.jobs
    assert (j1.submit, j1.wait, j1.run, j1.procs, j1.req_time, j1.user, j1.app) == (0, 10, 100, 4, 120, 1, 7)
    assert j1.cpu_avg == 95.5 and j1.mem_used == 1024.25
    assert j2.wait == -1 and j2.status == 0 and j2.prev_job == 1 and j2.think == 12
    assert j3.req_time == -1 and j3.run == 0
    # round trip: the writer's text parses back to the same trace
    again = parse_swf(format_swf(t), source="again")
    assert again.jobs == t.jobs and again.header == t.header and again.comments == t.comments


def test_size_falls_back_to_requested_processors():
    t = parse_swf(["1 0 -1 10 -1 -1 -1 8 60 -1 1 1 1 1 1 1 -1 -1"])
    assert t.jobs[0].size == 8


LINE = "1 0 -1 10 4 -1 -1 4 60 -1 1 1 1 1 1 1 -1 -1"


@pytest.mark.parametrize("lines, lineno, words", [
    (["; MaxProcs: 64", "1 0 -1 10 4 -1 -1 4 60 -1 1 1 1 1 1 1 -1"], 2, "18 fields, this one has 17"),
    ([LINE + " 0"], 1, "this one has 19"),
    (["1 0 -1 ten 4 -1 -1 4 60 -1 1 1 1 1 1 1 -1 -1"], 1, "field 4 (run) must be an integer"),
    (["1 0 -1 10.5 4 -1 -1 4 60 -1 1 1 1 1 1 1 -1 -1"], 1, "field 4 (run) must be an integer"),
    (["1 0 -1 10 4 nan -1 4 60 -1 1 1 1 1 1 1 -1 -1"], 1, "field 6 (cpu_avg) must be a number"),
    (["1 0 -1 10 -2 -1 -1 4 60 -1 1 1 1 1 1 1 -1 -1"], 1, "field 5 (procs) is -2"),
    (["0 0 -1 10 4 -1 -1 4 60 -1 1 1 1 1 1 1 -1 -1"], 1, "numbers start at 1"),
    ([LINE, ";", LINE], 3, "job number 1 after 1"),
    (["2 50 -1 10 4 -1 -1 4 60 -1 1 1 1 1 1 1 -1 -1",
      "3 40 -1 10 4 -1 -1 4 60 -1 1 1 1 1 1 1 -1 -1"], 2, "submit time 40 before the previous job's 50"),
    (["1 -1 -1 10 4 -1 -1 4 60 -1 1 1 1 1 1 1 -1 -1"], 1, "submit time unknown"),
    (["1 0 -1 10 4 -1 -1 4 60 -1 7 1 1 1 1 1 -1 -1"], 1, "status 7"),
    (["; MaxProcs: 8", "", "1 0 -1 10 16 -1 -1 16 60 -1 1 1 1 1 1 1 -1 -1"], 3, "more than the header's MaxProcs 8"),
    (["; MaxProcs: lots"], 1, "header MaxProcs must be an integer"),
    (["; MaxNodes: -3"], 1, "header MaxNodes must be >= 0"),
    ([LINE + " " * 2000], 1, "longer than 1024"),
    (["1 0 -1 1_000 4 -1 -1 4 60 -1 1 1 1 1 1 1 -1 -1"], 1, "ASCII numbers only"),
    (["1 0 -1 \u0661\u0660 4 -1 -1 4 60 -1 1 1 1 1 1 1 -1 -1"], 1, "ASCII numbers only"),
])
def test_each_kind_of_bad_line_names_its_line(lines, lineno, words):
    with pytest.raises(SWFError) as e:
        parse_swf(lines, source="bad.swf")
    assert e.value.line == lineno
    assert f"bad.swf:{lineno}: " in str(e.value) and words in str(e.value)


def test_limits(tmp_path):
    lines = [f"{i} {i} -1 10 1 -1 -1 1 60 -1 1 1 1 1 1 1 -1 -1" for i in range(1, 6)]
    assert len(parse_swf(lines, max_jobs=5).jobs) == 5
    with pytest.raises(SWFError, match=r"<swf>:6: more than 5 jobs"):
        parse_swf(lines + ["6 6 -1 10 1 -1 -1 1 60 -1 1 1 1 1 1 1 -1 -1"], max_jobs=5)
    p = tmp_path / "t.swf"
    p.write_text("\n".join(lines) + "\n")
    assert len(read_swf(p).jobs) == 5
    with pytest.raises(SWFError, match=r"more than the limit of 100"):
        read_swf(p, max_bytes=100)
    with pytest.raises(SWFError, match=r"t.swf:4: more than 3 jobs"):
        read_swf(p, max_jobs=3)
    gz = tmp_path / "t.swf.gz"
    gz.write_bytes(gzip.compress(p.read_bytes()))
    with pytest.raises(SWFError, match="gzip-compressed"):
        read_swf(gz)
    latin = tmp_path / "latin.swf"
    latin.write_bytes(b"; Computer: caf\xe9\n" + p.read_bytes())
    with pytest.raises(SWFError, match="not UTF-8"):
        read_swf(latin)


def test_generator_is_deterministic_and_follows_its_model():
    a, b = format_swf(generate(1500, 7)), format_swf(generate(1500, 7))
    assert a == b
    assert format_swf(generate(1500, 8)) != a
    t = parse_swf(a.splitlines(), source="gen")          # the strict parser accepts it
    jobs = t.jobs
    assert len(jobs) == 1500 and t.max_procs == 544
    assert all(j.size == 1 or (j.size & (j.size - 1) == 0 and 2 <= j.size <= 64) for j in jobs)
    assert all(j.req_time % 60 == 0 and j.req_time >= 60 for j in jobs)
    assert all(j.req_time >= j.run for j in jobs if j.status == 1)
    under = [j for j in jobs if j.status == 0]
    assert under and all(j.run > j.req_time for j in under) and len(under) < 0.1 * len(jobs)
    assert len({j.user for j in jobs}) > 10 and len({j.app for j in jobs}) > 20
    span = jobs[-1].submit - jobs[0].submit
    load = sum(j.size * min(j.run, j.req_time) for j in jobs) / (544 * span)
    assert 0.6 < load < 1.0                                  # target 0.8


def test_generator_refuses_bad_parameters():
    with pytest.raises(ValueError, match="max_size"):
        generate(10, 1, max_size=48)
    with pytest.raises(ValueError, match="load"):
        generate(10, 1, load=0)


def _job(n, submit, cpus, run, req, user=1, app=1):
    return SWFJob(job=n, submit=submit, wait=-1, run=run, procs=cpus, cpu_avg=-1, mem_used=-1, req_procs=cpus,
                  req_time=req, req_mem=-1, status=1, user=user, group=1, app=app, queue=1, partition=1,
                  prev_job=-1, think=-1)


def test_easy_backfilling_on_a_hand_made_trace():
    """One 4-CPU cluster. By hand: J1 (2 CPUs, limit 100) starts at 0; J2 (4)
    waits, its shadow time is 100 (J1's limit), no extra CPUs; J3 (2 CPUs,
    limit 60) backfills at 10 (ends by 70 <= 100); J4 (1 CPU, limit 600) and
    J5 (1 CPU, limit 60, needs 100 s) wait on a full cluster; at 40 J3 ends:
    J4 would end after the shadow and there is no extra CPU, J5 ends by
    40 + 60 = 100 so it backfills -- and is killed at its limit, at 100, the
    instant J1 ends: J2 starts at 100 and ends at 150; J6, arriving at 100
    after those ends, finds the cluster full; at 150 J4 then J6 start."""
    trace = Trace(jobs=[_job(1, 0, 2, 100, 100), _job(2, 0, 4, 50, 50), _job(3, 10, 2, 30, 60),
                        _job(4, 20, 1, 500, 600), _job(5, 30, 1, 100, 60), _job(6, 100, 1, 10, 20)])
    out: list = []
    r = replay(trace, [ClusterSpec("c", 1, 4)], "round_robin", jobs_out=out)
    got = {j.id: (j.start, j.end, j.killed) for _, j in out}
    assert got == {1: (0, 100, False), 2: (100, 150, False), 3: (10, 40, False), 4: (150, 650, False),
                   5: (40, 100, True), 6: (150, 160, False)}
    assert r["killed"] == 1 and r["makespan_s"] == 650
    waits = [0, 100, 0, 130, 10, 50]
    assert r["mean_wait_s"] == pytest.approx(sum(waits) / 6)
    # utilisation: CPU-seconds used / (4 CPUs x 650 s)
    used = 2 * 100 + 4 * 50 + 2 * 30 + 1 * 500 + 1 * 60 + 1 * 10
    assert r["clusters"]["c"]["utilisation"] == pytest.approx(used / (4 * 650))


def test_start_estimate_from_time_limits_by_hand():
    c = BatchCluster("c", 1, 4, bf_depth=1)
    a = SimJob(id=1, submit=0, cpus=2, run=30, wall=100)
    b = SimJob(id=2, submit=0, cpus=4, run=30, wall=50)
    assert c.submit(a, 0.0) == [a] and c.submit(b, 0.0) == []
    # free CPUs: 2 until 100 (A's limit), B reserved on 4 CPUs over [100, 150), then 4
    assert c.estimate_start(2, 30, 10.0) == 0.0        # fits before the reservation
    assert c.estimate_start(2, 200, 10.0) == 140.0     # after B's reservation: 150
    assert c.estimate_start(3, 10, 10.0) == 140.0
    assert c.estimate_start(2, 90, 10.0) == 0.0        # ends at 100, exactly when B starts
    c.submit(SimJob(id=3, submit=5, cpus=4, run=1, wall=10), 5.0)
    assert c.estimate_start(1, 10, 10.0) is None       # 2 pending > bf_depth 1: Slurm has no estimate
    with pytest.raises(ValueError, match="5 CPUs asked"):
        c.estimate_start(5, 10, 10.0)


def test_the_vector_is_what_the_real_batch_sed_computes():
    """SimBatchSeD.vector against ClusterViewMixin.estimate (the real SeD's
    method) on the same jobs, history and snapshot. 8 CPUs at 700 s: A (4
    CPUs, started 100, limit 850) was predicted to end at 380: past due, its
    next predicted end (980) is capped by its limit; B (4 CPUs, started 650)
    is predicted to end at 850; C (4 CPUs) pends; D pends too but came at
    this very instant (not in the snapshot's own pending CPUs). Slurm's way
    (limits: A 850, B 1650; C reserved at 850) starts a 4-CPU job at 1710;
    the SeD's own predicted ends free 8 CPUs at 850: 150 s (scheduler+own)."""
    c = BatchCluster("c", 2, 4, price=0.5)
    sed = SimBatchSeD(c)
    for run in (40.0, 60.0, 500.0):
        sed.history.observe(RunRecord(service="app1", user="u1", run=run))
    jobs = [SimJob(id=1, submit=100.0, cpus=4, run=900, wall=750, user="u1", service="app1"),
            SimJob(id=2, submit=650.0, cpus=4, run=500, wall=1000, user="u2", service="app1"),
            SimJob(id=3, submit=660.0, cpus=4, run=50, wall=1000, user="u2", service="app2"),
            SimJob(id=4, submit=700.0, cpus=1, run=5, wall=60, user="u1", service="app1")]
    for j in jobs:
        c.submit(j, j.submit)
    assert [j.start for j in jobs] == [100.0, 650.0, None, None]
    now = 700.0
    got = sed.vector(service="app1", user="u1", cpus=4, wall=300, now=now)

    real = SimpleNamespace(config=SimpleNamespace(time_limit=300, nodes=None, ntasks=4, cpus_per_task=1,
                                                  max_jobs=1000, scheduler="sim-easy", partition="c"),
                           history=sed.history, _snapshot=sed.snapshot(4, 300, now), _submitted_since=[],
                           _jobs={j.id: CallJob(call_id=str(j.id), dir="", service=j.service, user=j.user,
                                                received=j.submit, walltime=j.wall, cpus=j.cpus,
                                                state="running" if j.start is not None else "submitted",
                                                submitted=j.submit, started=j.start) for j in jobs})
    replica = SimpleNamespace(scheduler=SimpleNamespace(requests=[], running=[]), last_solve=sed.last_solve)
    want = ClusterViewMixin.estimate(real, replica, SimpleNamespace(name="app1"), "u1", now)
    assert got.pop("price") == pytest.approx(math.ceil(want["tcomp"]) * 4 * 0.5 / 3600)   # 4 CPUs x 0.5/CPU-h
    assert got == want
    assert want["est_wait_source"] == "scheduler+own"
    assert (want["est_wait_scheduler"], want["est_wait"]) == (1010.0, 150.0)


@pytest.mark.parametrize("policy", ["least_wait_time", "least_slowdown", "least_cost"])
def test_the_replay_selects_what_the_real_aggregator_ranks_first(policy):
    trace = generate(400, 11, procs=200, load=0.9)
    seen = []
    r = replay(trace, parse_clusters(DEFAULT_CLUSTERS), policy, seed=4,
               on_choice=lambda job, servers, state, chosen: seen.append((servers, state, chosen)))
    assert len(seen) == r["jobs"] == 400
    agg = make_aggregator(policy)
    for servers, state, chosen in seen:
        rng = random.Random()
        rng.setstate(state)
        assert agg.rank(list(servers), rng)[0]["name"] == chosen
        assert all(s["estimation"]["server_type"] == "batch" for s in servers)
    if policy != "least_cost":
        assert len({chosen for _, _, chosen in seen}) >= 3     # not a constant choice


def test_least_wait_time_beats_random_on_a_loaded_trace():
    trace = generate(2500, 3, procs=544, load=0.9)
    clusters = parse_clusters(DEFAULT_CLUSTERS)
    lwt = replay(trace, clusters, "least_wait_time")
    rnd = replay(trace, clusters, "random", seed=5)
    cost = replay(trace, clusters, "least_cost")
    assert lwt["jobs"] == rnd["jobs"] == 2500
    assert lwt["mean_wait_s"] < rnd["mean_wait_s"]
    assert lwt["mean_bounded_slowdown"] < rnd["mean_bounded_slowdown"]
    assert cost["total_cost"] < min(lwt["total_cost"], rnd["total_cost"])


def test_parse_clusters():
    c = parse_clusters("a:4x8:1.5:0.1:3600, b:2x2")
    assert c == [ClusterSpec("a", 4, 8, 1.5, 0.1, 3600.0), ClusterSpec("b", 2, 2)]
    for bad in ("a:4", "a:4x0", "a:4x8:0", "a:4x8:1:-1", "a:2x2,a:2x2", ":2x2"):
        with pytest.raises(ValueError):
            parse_clusters(bad)


def test_jobs_no_cluster_can_run_are_rejected_and_unknown_ones_skipped():
    trace = Trace(jobs=[_job(1, 0, 8, 10, 60), _job(2, 1, 2, 10, 60), _job(3, 2, 2, -1, 60),
                        _job(4, 3, 2, 10, 7200)])
    r = replay(trace, [ClusterSpec("small", 1, 4, max_walltime=3600)], "least_wait_time")
    assert (r["jobs"], r["rejected"], r["skipped"]) == (1, 2, 1)
    capped = {"name": "least_cost", "params": {"max_cost": 0.001}}    # a 10 s job on 2 CPUs costs 0.0056
    r = replay(trace, [ClusterSpec("small", 1, 4, price=1.0, max_walltime=3600)], capped)
    assert (r["jobs"], r["rejected"], r["policy"]) == (0, 3, "least_cost")


def test_cli_generate_and_replay(tmp_path, capsys):
    from gridrpc.cli import main
    swf = tmp_path / "t.swf"
    assert main(["sim", "trace-generate", "--jobs", "300", "--seed", "2", "--procs", "100", str(swf)]) == 0
    assert "generated by: gridrpc sim trace-generate --jobs 300 --seed 2 --procs 100" in swf.read_text()
    out = tmp_path / "r.json"
    assert main(["sim", "trace", str(swf), "--clusters", "x:8x8:1:0.1,y:4x8:2:0.3", "--policy",
                 "least_wait_time,random", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert [r["policy"] for r in res["results"]] == ["least_wait_time", "random"]
    assert all(r["jobs"] == 300 for r in res["results"])
    assert "least_wait_time" in capsys.readouterr().out
    bad = tmp_path / "bad.swf"
    bad.write_text("; MaxProcs: 4\n1 0 -1 10 1 -1 -1 1 60 -1 1 1 1 1 1 1 -1\n")
    assert main(["sim", "trace", str(bad)]) == 2
    assert "bad.swf:2: a job line has 18 fields" in capsys.readouterr().err
    assert main(["sim", "trace", str(swf), "--policy", "no_such_rule"]) == 2
    assert "unknown aggregator 'no_such_rule'" in capsys.readouterr().err


def test_cli_help_in_a_process():
    r = subprocess.run([sys.executable, "-m", "gridrpc", "sim", "trace", "--help"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "--clusters" in r.stdout and "round_robin" in r.stdout
