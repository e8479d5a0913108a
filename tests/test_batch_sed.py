"""The batch SeD against real private clusters of each scheduler: Slurm
(tests/slurm_cluster.py), Grid Engine (tests/sge_cluster.py) and OAR
(tests/oar_cluster.py), behind one interface (tests/batch_clusters.py).

Each test starts its own BatchSeD (in-process, on a loop thread) with a fresh
shared directory; the clients are real gridrpc clients over ZeroMQ. Every
wait has a deadline. The tests that hold for any scheduler run once per
scheduler (``test_x[slurm]``, ``test_x[sge]``, ``test_x[oar]``; one private
cluster per scheduler for the module); the Slurm-specific ones (start
estimates, two clusters, CURVE) run on the 2-CPU Slurm clusters of
tests/conftest_slurm.py. ``bcluster`` advertises 8 CPUs on this machine's cores (Slurm:
``SlurmdParameters=config_overrides``; Grid Engine: 8 slots; OAR: 8
resources) so that many short jobs run a few at a time; the second Slurm
cluster (``slurm_cluster2``) has 2.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import gridrpc
from gridrpc.master_agent import MasterAgent
from gridrpc.sed.batch import JobSpec, JobState, make_backend
from gridrpc.sed.batch.config import parse_batch_config
from gridrpc.sed.batch.sed import BatchSeD
from gridrpc.testing import LoopThread
from tests.batch_clusters import start_cluster, wait_until
from tests.daemon_procs import processes_under
from tests.conftest_slurm import slurm_cluster, slurm_cluster2  # noqa: F401 - fixtures

pytestmark = [pytest.mark.real]

SCHEDULERS = [pytest.param("slurm", marks=pytest.mark.slurm), pytest.param("sge", marks=pytest.mark.sge),
              pytest.param("oar", marks=pytest.mark.oar)]


SERVICES = {s: f"gridrpc.examples.services:{s}" for s in ("add", "sleep", "echo", "fail")}
SERVICES["job_info"] = "gridrpc.sed.batch.services:job_info"
NON_IDEMPOTENT = {"sleep_once": "gridrpc.examples.services:sleep"}


@pytest.fixture(scope="module", params=SCHEDULERS)
def bcluster(request, tmp_path_factory):
    """A private cluster of the scheduler, advertising 8 CPUs (more than the machine has)."""
    yield from start_cluster(request.param, tmp_path_factory)
    left = _run_job_processes(str(tmp_path_factory.getbasetemp()))
    assert not left, f"run_job processes left behind: {left}"


@pytest.fixture
def cluster(bcluster):
    yield bcluster
    bcluster.cancel_all(timeout=30)


@pytest.fixture
def c1(slurm_cluster):  # noqa: F811
    """The 2-CPU private Slurm of tests/conftest_slurm.py, emptied after the test."""
    yield slurm_cluster
    slurm_cluster.cancel_all(timeout=30)


def _run_job_processes(under: str) -> list[int]:
    """Live run_job processes of calls whose directory is under *under*."""
    return processes_under(b"gridrpc.sed.batch.run_job", under)


@contextlib.contextmanager
def running_sed(cluster, shared, name="bsed", parent=None, address="tcp://127.0.0.1:0", lt=None, **cfg):
    own = lt is None
    lt = lt or LoopThread()
    config = parse_batch_config({"shared_dir": str(shared), "env": cluster.env, "poll_interval": 0.25,
                                 "estimate_interval": 1.0, "time_limit": 600, **cluster.backend_settings(),
                                 **cfg})
    sed = BatchSeD(name, parent, config=config, address=address, hb_interval=0.5, hb_timeout=1.5)
    for svc, target in SERVICES.items():
        sed.add_service(svc, target)
    for svc, target in NON_IDEMPOTENT.items():
        sed.add_service(svc, target, idempotent=False)
    lt.run(sed.start())
    sed.test_loop = lt          # to read the SeD's state on its own loop
    try:
        yield sed
    finally:
        lt.run(sed.aclose(), timeout=60)
        if own:
            lt.close()


def client(**kw) -> gridrpc.Client:
    kw.setdefault("ping_interval", 0.3)
    kw.setdefault("ping_timeout", 3.0)
    return gridrpc.Client(kw.pop("ma", None), **kw)


def addr(sed) -> str:
    return f"{sed.address}#{sed.name}"


def job_of(sed, call_id, state=None, timeout=30.0) -> dict:
    def get():
        j = sed.test_loop.call(lambda: sed.jobs().get(call_id))
        return j if j and j["job_id"] and (state is None or j["state"] == state) else None
    wait_until(lambda: get() is not None, timeout, f"call {call_id} to have a job {state or ''}")
    return get()


# ----------------------------------------------------------------------------------------

def test_calls_run_as_jobs_and_return_values(cluster, tmp_path):
    shared = tmp_path / "shared"
    with running_sed(cluster, shared) as sed, client() as c:
        assert c.call("add", 2, 3, server=addr(sed), timeout=60) == 5
        a = np.arange(12, dtype=">i4").reshape(3, 4)
        back = c.call("echo", {"a": a, "t": (1, b"\x00x"), "inf": float("inf")}, server=addr(sed), timeout=60)
        assert back["a"].dtype == a.dtype and (back["a"] == a).all()
        assert back["t"] == (1, b"\x00x") and back["inf"] == float("inf")
        # per-call resources, and the meta variables a parallel service reads
        call = c.submit("job_info", _batch={"ntasks": 2, "walltime": 120}, server=addr(sed))
        info = call.result(timeout=60)
        assert info["GRIDRPC_NB_TASKS"] == "2" and info["GRIDRPC_NB_NODES"] == "1"
        assert info["nodes"] == cluster.nodes == info["nodefile"]
        job_id = info["GRIDRPC_JOB_ID"]
        assert call.timing["job_id"] == job_id
        assert cluster.job_limits(job_id) == (120.0, 2)       # the scheduler's own view of the job
        assert sed.batch_stats["completed"] == 3
        # the call directories are gone once answered; the history learnt the run times
        wait_until(lambda: not any((shared / "bsed" / "jobs").iterdir()), 10, "cleanup")
        vec = sed.estimate(sed._replica, sed.services["add"], [], user=c.user)
        assert vec["tcomp_source"] == "user" and vec["tcomp"] < 30
        assert vec["server_type"] == "batch" and vec["nb_total_resources"] == cluster.total_cpus
        assert vec["batch_scheduler"] == cluster.scheduler


def test_the_backend_sees_a_busy_cluster(cluster, tmp_path):
    """The backend itself against the scheduler: with every CPU held by a
    foreign job, the cluster shows no free CPU, a job cannot start now and
    waits (OAR gives its start estimate), the pending queue counts it, and
    a cancel removes it."""
    settings = cluster.backend_settings()
    backend = make_backend(cluster.scheduler, env=cluster.env, **settings.get("scheduler_options", {}))
    blocker = cluster.block()
    spec = JobSpec(script="#!/bin/sh\n", name="gridrpc-probe", workdir=str(tmp_path), time_limit=120,
                   output=str(tmp_path / "probe.out"))
    spec = dataclasses.replace(spec, script=backend.render_script(spec, ["sleep", "60"]))
    info = backend.cluster_info()
    assert (info.total_cpus, info.free_cpus, info.free_nodes, info.available) == (cluster.total_cpus, 0, 0, True)
    assert backend.estimate_start(spec) != 0.0           # a time later (Slurm) or no estimate
    job = backend.submit(spec)
    wait_until(lambda: cluster.is_pending(job), 20, "the job pending")
    state = backend.states([job])[job]
    assert state.state is JobState.PENDING and state.start_time is None and state.node_list == ()
    assert backend.queue_length() == 1
    if cluster.scheduler == "oar":                       # OAR's Gantt: after the blocker's walltime
        wait_until(lambda: backend.states([job])[job].expected_start, 20, "OAR's start estimate")
        assert backend.states([job])[job].expected_start > time.time() + 60
    final = backend.cancel(job, timeout=30)
    assert final.state is JobState.CANCELLED, final
    assert cluster.ended_cancelled(job) and cluster.is_running(blocker)


def test_service_exception_and_bad_requests(cluster, tmp_path):
    with running_sed(cluster, tmp_path / "shared") as sed, client() as c:
        with pytest.raises(gridrpc.RemoteError) as exc:
            c.call("fail", "boom on the node", server=addr(sed), timeout=60)
        assert exc.value.remote_type == "RuntimeError"
        assert "boom on the node" in str(exc.value)
        assert "raise RuntimeError(message)" in exc.value.remote_traceback
        # refused before any job: unknown resource key, impossible values, wrong arguments
        with pytest.raises(gridrpc.InvalidArgument):
            c.call("add", 1, 2, _batch={"gpus": 1}, server=addr(sed), timeout=10)
        with pytest.raises(gridrpc.InvalidArgument):
            c.call("add", 1, 2, _batch={"nodes": 0}, server=addr(sed), timeout=10)
        with pytest.raises(gridrpc.InvalidArgument):
            c.call("add", 1, server=addr(sed), timeout=10)
        # a job the scheduler refuses (more CPUs than the cluster has): a clear error
        with pytest.raises(gridrpc.RemoteError) as exc:
            c.call("add", 1, 2, _batch={"ntasks": 64}, server=addr(sed), timeout=60)
        assert exc.value.remote_type == "BatchSubmitError" and cluster.refused_word in str(exc.value)
        assert sed.batch_stats["submitted"] == 1


def test_cancel_while_pending_and_while_running(cluster, tmp_path):
    shared = tmp_path / "shared"
    with running_sed(cluster, shared) as sed, client() as c:
        # running: the job starts, the service runs, cancel kills it for real
        running = c.submit("job_info", 300, server=addr(sed))
        job = job_of(sed, running.id, "running")
        # the call's directory is the SeD's choice (never named after the request id)
        assert running.id not in job["dir"] and job["dir"].startswith(str(shared / "bsed" / "jobs"))
        started = Path(job["dir"]) / "started.json"
        wait_until(started.exists, 20, "the service to start")
        pid = json.loads(started.read_text())["pid"]
        running.cancel()
        with pytest.raises(gridrpc.CallCancelled):
            running.result(timeout=30)
        wait_until(lambda: cluster.ended_cancelled(job["job_id"]), 30, "the job cancelled")
        wait_until(lambda: not _alive(pid), 15, "the service process to be gone")
        # pending: the cluster is full, the job waits, cancel removes it from the queue
        blocker = cluster.block()
        pending = c.submit("add", 1, 1, server=addr(sed))
        job = job_of(sed, pending.id)
        assert (Path(job["dir"]) / "call.json").exists()
        wait_until(lambda: cluster.is_pending(job["job_id"]), 10, "the job pending")
        pending.cancel()
        with pytest.raises(gridrpc.CallCancelled):
            pending.result(timeout=30)
        wait_until(lambda: cluster.ended_cancelled(job["job_id"]), 30, "the job cancelled")
        wait_until(lambda: not Path(job["dir"]).exists(), 10, "the call directory to be removed")
        assert sed.batch_stats["cancelled"] == 2
        assert cluster.is_running(blocker)              # only our jobs were touched


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    st = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    return st[0] not in "ZX"


def test_restart_with_jobs_in_flight_loses_nothing(cluster, tmp_path):
    """Stop the SeD while one job runs and one is about to end; restart it 6 s
    later on the same address (longer than the client's ping_timeout: the
    SeD's ``patience`` keeps the calls alive). Both results arrive."""
    shared = tmp_path / "shared"
    lt = LoopThread()
    try:
        with client(ping_timeout=3.0) as c:
            with running_sed(cluster, shared, lt=lt) as sed:
                address = sed.address
                short = c.submit("sleep", 1.0, server=addr(sed))     # ends while the SeD is down
                long = c.submit("job_info", 9.0, server=addr(sed))   # still running at the restart
                for call in (short, long):
                    job_of(sed, call.id, "running")
            down = time.monotonic()
            time.sleep(6.0)
            assert not short.done() and not long.done()
            with running_sed(cluster, shared, address=address, lt=lt) as sed2:
                assert sed2.batch_stats["recovered"] == 2
                assert short.result(timeout=30) == 1.0
                info = long.result(timeout=30)
                assert info["GRIDRPC_CALL_ID"] == long.id
                assert time.monotonic() - down > 6.0
                wait_until(lambda: not any((shared / "bsed" / "jobs").iterdir()), 10, "cleanup")
    finally:
        lt.close()


def test_two_clusters_the_busy_one_loses(c1, slurm_cluster2, tmp_path):  # noqa: F811
    """One SeD per Slurm cluster under one MA: with cluster c1 full (a job
    holding its 2 CPUs for up to 10 min), least_wait_time and least_slowdown
    rank the idle cluster first and the call runs there."""
    cluster = c1
    blocker = cluster.block()
    lt = LoopThread()
    ma = lt.run(MasterAgent(name="MA", address="tcp://127.0.0.1:0", hb_interval=0.5,
                            hb_timeout=1.5).start())
    try:
        with running_sed(cluster, tmp_path / "s1", name="busy", parent=ma.address, lt=lt) as busy, \
                running_sed(slurm_cluster2, tmp_path / "s2", name="idle", parent=ma.address, lt=lt), \
                client(ma=ma.address) as c:
            wait_until(lambda: len(lt.call(lambda: [e for e in ma.tree() if e.get("kind") == "sed"])) == 2,
                       10, "both SeDs registered")
            wait_until(lambda: busy.snapshot.est_start and busy.snapshot.est_start > 300, 10,
                       "the busy cluster's estimate")
            for agg in ("least_wait_time", "least_slowdown"):
                ranked = c.discover("add", 2, aggregator=agg)
                assert [s.name for s in ranked] == ["idle", "busy"], (agg, ranked)
            est = {s.name: s.estimation for s in ranked}
            assert est["busy"]["est_wait"] > 300 and est["busy"]["est_wait_source"] == "scheduler"
            assert est["idle"]["est_wait"] < 5 and est["idle"]["nb_free_resources"] == 2
            assert est["busy"]["nb_free_resources"] == 0 and est["busy"]["eft"] > est["idle"]["eft"]
            call = c.submit("add", 20, 22, aggregator="least_wait_time")
            assert call.result(timeout=60) == 42 and call.server == "idle"
        assert cluster.is_running(blocker)
    finally:
        lt.run(ma.aclose())
        lt.close()


def test_many_concurrent_calls(cluster, tmp_path):
    """Many calls at once (50 on Slurm; 20 on Grid Engine, 10 on OAR, whose
    jobs take longer to start and end), one state query per poll for all of them."""
    n = {"slurm": 50, "sge": 20}.get(cluster.scheduler, 10)
    with running_sed(cluster, tmp_path / "shared") as sed, client() as c:
        calls_before = sed.batch_stats["polls"]
        seen_batches = []
        states = sed.backend.states

        def counting_states(ids):
            ids = list(ids)
            seen_batches.append(len(ids))
            return states(ids)
        sed.backend.states = counting_states
        t0 = time.monotonic()
        calls = [c.submit("add", i, i, server=addr(sed)) for i in range(n)]
        assert [call.result(timeout=120) for call in calls] == [2 * i for i in range(n)]
        elapsed = time.monotonic() - t0
        # one state query per poll for all the jobs, not one per job
        assert max(seen_batches) >= 10
        assert len(seen_batches) <= elapsed / sed.config.poll_interval + 5
        assert sed.batch_stats["polls"] - calls_before == len(seen_batches)
        assert sed.batch_stats["completed"] == n


@pytest.mark.slow
def test_time_limit_kills_the_job(cluster, tmp_path):
    """A call asking for a short walltime runs a 5-minute service; the
    scheduler kills the job at its limit and the client gets BatchJobTimeout
    naming the job, the scheduler's own reason and the limit.

    Slurm's limits are whole minutes, checked every 30 s: once the job runs
    with its 1-minute limit the test moves its end forward (``scontrol update
    EndTime=now``), the same time-limit path as a minute later
    (tests/test_slurm_backend.py waits out a real limit). Grid Engine takes a
    5 s ``h_rt`` as it is."""
    w = cluster.short_walltime
    with running_sed(cluster, tmp_path / "shared") as sed, client() as c:
        call = c.submit("sleep", 300, _batch={"walltime": w}, server=addr(sed))
        job_id = job_of(sed, call.id, "running")["job_id"]
        assert cluster.job_limits(job_id)[0] == w
        cluster.expire(job_id)
        with pytest.raises(gridrpc.RemoteError) as exc:
            call.result(timeout=90)
        err = exc.value
        assert err.remote_type == "BatchJobTimeout", err
        assert f"batch job {job_id} of sleep reached its time limit" in str(err)
        assert all(word in str(err) for word in cluster.timeout_words), str(err)
        assert f"time limit {w}s" in str(err)
        assert cluster.ended_by_time_limit(job_id)


def test_admin_cancel_and_failed_jobs_name_the_job_and_the_reason(cluster, tmp_path):
    """A running job cancelled with the scheduler's own command (an admin), a
    job whose script fails (no such Python on the node: exit 127), a queue
    that does not exist: each call fails with the job id (or the refusal) and
    the scheduler's words."""
    with running_sed(cluster, tmp_path / "shared") as sed, client() as c:
        call = c.submit("job_info", 300, server=addr(sed))
        job_id = job_of(sed, call.id, "running")["job_id"]
        cluster.admin_cancel(job_id)
        with pytest.raises(gridrpc.RemoteError) as exc:
            call.result(timeout=60)
        assert exc.value.remote_type == "BatchJobCancelled", exc.value
        assert f"batch job {job_id} of job_info was cancelled outside gridrpc" in str(exc.value)
        assert all(word in str(exc.value) for word in cluster.cancel_words), str(exc.value)
    with running_sed(cluster, tmp_path / "shared2", remote_python="/nonexistent/python") as sed, client() as c:
        call = c.submit("add", 1, 2, server=addr(sed))
        with pytest.raises(gridrpc.RemoteError) as exc:
            call.result(timeout=60)
        assert exc.value.remote_type == "BatchJobFailed", exc.value
        assert re.search(r"batch job \d+ of add failed \(", str(exc.value)), str(exc.value)
        assert "exit code 127:0" in str(exc.value), str(exc.value)
        assert "/nonexistent/python" in exc.value.remote_traceback     # the job's output, last lines
    with running_sed(cluster, tmp_path / "shared3", partition="nosuchqueue") as sed, client() as c:
        with pytest.raises(gridrpc.RemoteError) as exc:
            c.call("add", 1, 2, server=addr(sed), timeout=60)
        assert exc.value.remote_type == "BatchSubmitError", exc.value
        assert cluster.bad_queue_words in str(exc.value).lower() or cluster.bad_queue_words in str(exc.value)
        est = sed.estimate(sed._replica, sed.services["add"], [], user=c.user)
        assert est["batch_available"] is False and est["est_wait"] >= 1e9


def test_a_non_idempotent_call_is_never_run_again_by_the_scheduler(cluster, tmp_path):
    """Schedulers may run a job again on their own: Slurm requeues batch jobs
    after a node failure or preemption (JobRequeue=1, its default), Grid
    Engine reruns jobs marked rerunnable, OAR resubmits jobs of type
    ``idempotent``. The job of a non-idempotent call never may, even where the
    site's submit options ask it for every job; an idempotent call's job keeps
    the site's choice."""
    site = {"slurm": "--requeue", "sge": "-r y", "oar": "-t idempotent"}[cluster.scheduler]
    with running_sed(cluster, tmp_path / "shared", submit_options=[site]) as sed, client() as c:
        once = c.submit("sleep_once", 300, server=addr(sed))
        again = c.submit("sleep", 300, server=addr(sed))
        job_once = job_of(sed, once.id)["job_id"]
        job_again = job_of(sed, again.id)["job_id"]
        assert cluster.rerun_allowed(job_once) is False
        assert cluster.rerun_allowed(job_again) is True
        assert once.cancel() and again.cancel()
    # with the scheduler's defaults: off for the non-idempotent call all the same
    with running_sed(cluster, tmp_path / "shared2") as sed, client() as c:
        once = c.submit("sleep_once", 300, server=addr(sed))
        assert cluster.rerun_allowed(job_of(sed, once.id)["job_id"]) is False
        assert once.cancel()


def test_node_failure_ends_a_non_idempotent_call_instead_of_running_it_again(cluster, tmp_path):
    """The node running a non-idempotent call's job fails the way its
    scheduler sees a failed node (Slurm: the node DOWN, which kills its jobs
    and would requeue them; Grid Engine: the host crashes -- execd, shepherd
    and job killed -- and its execd starts again; OAR: the node Dead, which
    frags its jobs): the call fails with BatchNodeFailure naming the job and
    the scheduler's own words, and the job is not run again once the node
    is back."""
    with running_sed(cluster, tmp_path / "shared") as sed, client() as c:
        once = c.submit("sleep_once", 300, server=addr(sed))
        job = job_of(sed, once.id, "running")
        job_id = job["job_id"]
        wait_until((Path(job["dir"]) / "started.json").exists, 30, "the service to start")
        with cluster.node_failure(job_id):
            with pytest.raises(gridrpc.RemoteError) as exc:
                once.result(timeout=90)
        err = exc.value
        assert err.remote_type == "BatchNodeFailure", err
        assert f"batch job {job_id} of sleep_once was lost to a node failure ({cluster.scheduler} state" \
            in str(err), err
        assert all(word in str(err) for word in cluster.node_failure_words), str(err)
        wait_until(lambda: cluster.ended_by_node_failure(job_id), 30, "the job's end")
        time.sleep(3)                         # the node is back: time to requeue or rerun, if it would
        assert cluster.ended_by_node_failure(job_id), "the job ran again"
        assert sed.batch_stats["submitted"] == 1 and sed.batch_stats["failed"] == 1


def _cli_options(cluster) -> list[str]:
    """``gridrpc sed`` flags for the cluster's settings (--batch, --batch-env,
    --scheduler-option, --batch-bin-dir, --job-env...)."""
    from gridrpc.sed.batch.config import config_to_cli
    return config_to_cli(parse_batch_config({**cluster.backend_settings(), "env": cluster.env}))


def test_command_line_batch_sed(cluster, tmp_path):
    """``gridrpc sed --batch NAME ...`` as a process; SIGTERM stops it cleanly."""
    ready = tmp_path / "ready.json"
    cmd = [sys.executable, "-m", "gridrpc", "sed", "--name", "cli-batch", "--port", "0",
           "--ready-file", str(ready), *_cli_options(cluster), "--shared-dir", str(tmp_path / "shared"),
           "--time-limit", "0:05:00", "--poll-interval", "0.25",
           f"--submit-option={cluster.marker_option('gridrpc')}",
           "--service", "gridrpc.examples.services:add"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(ready.exists, 30, "the batch SeD process to be ready")
        info = json.loads(ready.read_text())
        with client() as c:
            call = c.submit("add", 40, 2, server=f"{info['address']}#cli-batch")
            assert call.result(timeout=60) == 42
        job_id = call.timing["job_id"]
        assert cluster.job_limits(job_id)[0] == 300.0 and cluster.job_has_marker(job_id, "gridrpc")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()[-2000:]


def test_deployment_file_with_a_batch_sed(cluster, tmp_path):
    """``kind: batch`` in a deployment file: ``deploy up`` starts ``gridrpc sed
    --batch`` with the entry's settings; the call runs as a job of the scheduler."""
    from gridrpc.deploy import spec as deploy_spec
    from gridrpc.deploy.runner import Deployment
    data = {"master_agent": {"name": "MA", "host": "localhost", "port": 0},
            "seds": [{"name": "hpc", "parent": "MA", "kind": "batch", **cluster.backend_settings(),
                      "time_limit": "0:03:00", "shared_dir": str(tmp_path / "shared"), "poll_interval": 0.25,
                      "env": cluster.env, "options": [cluster.marker_option("deployed")],
                      "services": ["gridrpc.examples.services:add"]}]}
    spec = deploy_spec.parse(data, name="batch-test")
    with Deployment(spec, state_dir=tmp_path / "state", progress=lambda msg: None) as dep:
        try:
            dep.up()
            with client(ma=dep.addresses["MA"]) as c:
                (server,) = c.discover("add", 5)
                assert server.name == "hpc" and server.estimation["server_type"] == "batch"
                assert server.estimation["batch_scheduler"] == cluster.scheduler
                call = c.submit("add", 1, 2)
                assert call.result(timeout=60) == 3 and call.server == "hpc"
            job_id = call.timing["job_id"]
            assert cluster.job_limits(job_id)[0] == 180.0 and cluster.job_has_marker(job_id, "deployed")
        finally:
            dep.down(quiet=True)


def test_a_batch_sed_in_a_secure_tree(c1, tmp_path):
    """CURVE on every link: the MA, the batch SeD under it (element keys), a
    user's client pinning only the MA's key; the job runs on the cluster and
    the SeD accounts it to the key's user."""
    from gridrpc.transport.security import KeyStore, Security
    keys = KeyStore(tmp_path / "keys")
    for n in ("MA", "bsed-secure"):
        keys.create(n, "element")
    keys.create("alice", "user")
    lt = LoopThread()
    ma = lt.run(MasterAgent(name="MA", address="tcp://127.0.0.1:0", hb_interval=0.5, hb_timeout=1.5,
                            security=Security(keys=keys, name="MA")).start())
    try:
        config = parse_batch_config({"shared_dir": str(tmp_path / "shared"), "env": c1.env,
                                     "poll_interval": 0.25, "estimate_interval": 1.0, "time_limit": 600,
                                     **c1.backend_settings()})
        sed = BatchSeD("bsed-secure", ma.address, config=config, hb_interval=0.5, hb_timeout=1.5,
                       security=Security(keys=keys, name="bsed-secure"), parent_key=keys.public("MA", "element"))
        sed.add_service("add", SERVICES["add"])
        lt.run(sed.start())
        sed.test_loop = lt
        try:
            with client(ma=ma.address, keys=str(keys.dir), user="alice") as c:
                wait_until(lambda: _discovers(c), 30, "the batch SeD registered over CURVE")
                call = c.submit("add", 20, 22)
                assert call.result(120) == 42 and call.server == "bsed-secure"
                # the job ran for the key's user (the SeD's events, as the MA received them)
                story = lambda: lt.call(lambda: [e for _, e in ma.events.log.story(call.id)])  # noqa: E731
                wait_until(lambda: any(e.kind.value == "call_finished" for e in story()), 10, "events at the MA")
                assert {e.user for e in story() if e.kind.value.startswith("call_")} == {"alice"}
            with client(ma=ma.address) as plain:                  # no keys: nothing answers
                with pytest.raises(gridrpc.CommunicationError):
                    plain.discover("add", 1)
        finally:
            lt.run(sed.aclose(), timeout=60)
    finally:
        lt.run(ma.aclose())
        lt.close()


def _discovers(c) -> bool:
    try:
        return bool(c.discover("add", 1))
    except gridrpc.GridRPCError:
        return False
