"""SlurmBackend against a real private Slurm (tests/slurm_cluster.py).

Every wait polls ``backend.states`` with a deadline; nothing sleeps and hopes.
The private node has 2 CPUs; a job asking ``cpus_per_task=2`` fills it.
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from gridrpc.sed.batch import (BatchSubmitError, JobInfo, JobSpec, JobState, SlurmBackend,
                               render_job_script)
from tests.conftest_slurm import require_slurm, slurm_cluster, slurm_cluster2  # noqa: F401
from tests.slurm_cluster import PrivateSlurm

pytestmark = [pytest.mark.slurm, pytest.mark.real]


@pytest.fixture
def backend(slurm_cluster):  # noqa: F811
    yield SlurmBackend(env=slurm_cluster.env, command_timeout=20)
    slurm_cluster.cancel_all(timeout=30)     # leave the shared cluster idle


@pytest.fixture(scope="module")
def timed_out_job(tmp_path_factory):
    """A job with a 30 s time limit running ``sleep 600`` on a private 1-CPU
    Slurm of its own. Slurm's resolution is one minute and slurmctld checks
    limits every 30 s: to save a minute, once the job runs with its 1-minute
    limit its end is moved to now (``scontrol update EndTime=now``), and
    slurmctld's own time-limit check ends it TIMEOUT/TimeLimit -- the same path
    as a minute later. Started with the module's first test (below), so that
    the wait for that check passes while the other tests run."""
    require_slurm()
    tmp = tmp_path_factory.mktemp("tl-jobs")
    with PrivateSlurm(tmp_path_factory.mktemp("slurm-tl-"), name="tl", cpus=1) as tl:
        backend = SlurmBackend(env=tl.env, command_timeout=20)
        job_id = backend.submit(spec_for(tmp, "sleep 600", name="tlimit", time_limit=30))
        running = wait_running(backend, job_id)
        tl.run(["scontrol", "update", f"JobId={job_id}", "EndTime=now"])
        yield backend, job_id, running


@pytest.fixture(scope="module", autouse=True)
def _time_limit_runs_meanwhile(request):
    """Start ``timed_out_job`` at the module's first test when its test is selected."""
    if any(item.module is request.module and "timed_out_job" in getattr(item, "fixturenames", ())
           for item in request.session.items):
        request.getfixturevalue("timed_out_job")


def wait_state(backend, job_id, predicate, timeout=30.0, what="") -> JobInfo:
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        info = backend.states([job_id])[job_id]
        if predicate(info):
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id}: {what or 'condition'} not reached in "
                                 f"{timeout}s; last: {info}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def wait_final(backend, job_id, timeout=30.0) -> JobInfo:
    return wait_state(backend, job_id, lambda i: i.state.is_final, timeout, "final state")


def wait_running(backend, job_id, timeout=30.0) -> JobInfo:
    return wait_state(backend, job_id, lambda i: i.state is JobState.RUNNING, timeout, "RUNNING")


def spec_for(tmp_path: Path, body: str, **kw) -> JobSpec:
    kw.setdefault("workdir", str(tmp_path))
    kw.setdefault("output", str(tmp_path / "out-%j.txt"))
    return JobSpec(script=f"#!/bin/bash\n{body}\n", **kw)


def wait_file(path: Path, timeout=10.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text().strip():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} not written in {timeout}s")
        time.sleep(0.05)
    return path.read_text()


# ---------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_submit_and_complete_with_meta_variables(backend, slurm_cluster, tmp_path):  # noqa: F811
    base = JobSpec(script="-", name="meta", workdir=str(tmp_path), ntasks=1,
                   output=str(tmp_path / "out-%j.txt"), env={"GRIDRPC_TEST_VALUE": "a,b c"})
    script = render_job_script(base, ["bash", "-c",
        'echo "id=$GRIDRPC_JOB_ID nodes=$GRIDRPC_NB_NODES tasks=$GRIDRPC_NB_TASKS"; '
        'echo "list=$GRIDRPC_NODELIST"; echo "file=$(cat "$GRIDRPC_NODEFILE")"; '
        'echo "value=$GRIDRPC_TEST_VALUE"'])
    job_id = backend.submit(JobSpec(**{**_fields(base), "script": script}))
    assert job_id.isdigit()
    info = wait_final(backend, job_id)
    assert info.state is JobState.COMPLETED, info
    assert (info.exit_code, info.signal) == (0, 0)
    assert info.node_list == (slurm_cluster.node_name,) and info.nb_nodes == 1
    assert info.name == "meta" and info.partition == "debug"
    assert info.start_time is not None and info.end_time >= info.start_time
    out = wait_file(tmp_path / f"out-{job_id}.txt")
    assert f"id={job_id} nodes=1 tasks=1" in out
    assert f"list={slurm_cluster.node_name}" in out
    assert f"file={slurm_cluster.node_name}" in out
    assert "value=a,b c" in out


def _fields(spec: JobSpec) -> dict:
    return {f: getattr(spec, f) for f in spec.__dataclass_fields__}


@pytest.mark.timeout(60)
def test_failed_job_reports_exit_code(backend, tmp_path):
    job_id = backend.submit(spec_for(tmp_path, "echo failing; exit 7", name="fail7"))
    info = wait_final(backend, job_id)
    assert info.state is JobState.FAILED
    assert (info.exit_code, info.signal) == (7, 0)
    assert info.reason == "NonZeroExitCode"


@pytest.mark.timeout(60)
def test_cancel_running_job_kills_it(backend, tmp_path):
    pidfile = tmp_path / "pid"
    job_id = backend.submit(spec_for(tmp_path, f"echo $$ > {pidfile}; exec sleep 300",
                                     name="long"))
    wait_running(backend, job_id)
    pid = int(wait_file(pidfile))
    assert Path(f"/proc/{pid}").exists()
    info = backend.cancel(job_id)
    assert info.state is JobState.CANCELLED and info.state.is_final
    assert info.signal == 15
    # verified gone: the queue no longer lists it as active, its process is dead
    active = slurm_cluster_queue(backend)
    assert job_id not in active
    deadline = time.monotonic() + 10
    while _alive(pid):
        assert time.monotonic() < deadline, f"job process {pid} survived scancel"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def slurm_cluster_queue(backend) -> list[str]:
    """Ids of the jobs squeue lists as active (its default state filter)."""
    return backend._run(["squeue", "-h", "-o", "%i"]).stdout.split()


@pytest.mark.timeout(60)
def test_cancel_pending_job(backend, tmp_path):
    blocker = backend.submit(spec_for(tmp_path, "sleep 300", name="blocker", cpus_per_task=2))
    wait_running(backend, blocker)
    waiting = backend.submit(spec_for(tmp_path, "true", name="waiting", cpus_per_task=1))
    pending = wait_state(backend, waiting, lambda i: i.state is JobState.PENDING
                         and i.reason not in (None, "None"), what="PENDING with a reason")
    assert pending.reason in ("Resources", "Priority"), pending
    assert backend.queue_length() == 1 and backend.queue_length("debug") == 1
    assert backend.queue_length("short") == 0
    info = backend.cancel(waiting)
    assert info.state is JobState.CANCELLED
    assert info.start_time is None and info.node_list == ()
    assert waiting not in slurm_cluster_queue(backend)
    assert backend.states([blocker])[blocker].state is JobState.RUNNING
    assert backend.cancel(blocker).state is JobState.CANCELLED
    assert backend.queue_length() == 0


@pytest.mark.timeout(60)
def test_cancel_finished_or_unknown_job_is_not_an_error(backend, tmp_path):
    job_id = backend.submit(spec_for(tmp_path, "true"))
    assert wait_final(backend, job_id).state is JobState.COMPLETED
    assert backend.cancel(job_id).state is JobState.COMPLETED
    assert backend.cancel("987654").state is JobState.UNKNOWN


@pytest.mark.timeout(60)
def test_cluster_info_numbers(backend, slurm_cluster, tmp_path):  # noqa: F811
    idle = backend.cluster_info()
    assert idle.partition == "debug" and idle.default_partition == "debug"
    assert (idle.total_cpus, idle.free_cpus, idle.total_nodes, idle.free_nodes) == (2, 2, 1, 1)
    assert idle.max_walltime is None and idle.available
    assert idle.partitions == ("debug", "short")
    assert backend.cluster_info("short").max_walltime == 1800.0

    job_id = backend.submit(spec_for(tmp_path, "sleep 300", cpus_per_task=1))
    wait_running(backend, job_id)
    busy = wait_for(lambda: backend.cluster_info("debug"), lambda c: c.free_cpus == 1)
    assert (busy.total_cpus, busy.free_cpus, busy.total_nodes, busy.free_nodes) == (2, 1, 1, 0)
    backend.cancel(job_id)
    again = wait_for(lambda: backend.cluster_info(), lambda c: c.free_cpus == 2)
    assert again.free_nodes == 1
    with pytest.raises(Exception, match="no partition"):
        backend.cluster_info("nope")


def wait_for(fetch, predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if predicate(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached in {timeout}s; last: {value}")
        time.sleep(0.1)


@pytest.mark.timeout(60)
def test_estimate_start_behind_busy_node(backend, tmp_path):
    probe = spec_for(tmp_path, "true", cpus_per_task=1, time_limit=60)
    assert backend.estimate_start(probe) == pytest.approx(0.0, abs=2.0)   # idle node

    blocker = backend.submit(spec_for(tmp_path, "sleep 300", name="blocker",
                                      cpus_per_task=2, time_limit=120))
    wait_running(backend, blocker)
    estimate = backend.estimate_start(probe)
    assert estimate is not None and 60.0 < estimate <= 125.0, estimate

    # the queued twin gets the same kind of estimate from squeue after a backfill pass
    queued = backend.submit(probe)
    info = wait_state(backend, queued, lambda i: i.expected_start is not None,
                      what="an expected start")
    assert info.state is JobState.PENDING
    assert 60.0 < info.expected_start - time.time() <= 125.0

    with pytest.raises(BatchSubmitError):
        backend.estimate_start(spec_for(tmp_path, "true", cpus_per_task=3))


@pytest.mark.timeout(60)
def test_submit_refused(backend, tmp_path):
    with pytest.raises(BatchSubmitError, match="invalid partition"):
        backend.submit(spec_for(tmp_path, "true", partition="nope"))
    # Without EnforcePartLimits, sbatch accepts a job larger than any node: it
    # pends forever with reason PartitionConfig. estimate_start refuses it.
    too_big = spec_for(tmp_path, "true", cpus_per_task=64)
    with pytest.raises(BatchSubmitError, match="could never run"):
        backend.estimate_start(too_big)
    job_id = backend.submit(too_big)
    info = wait_state(backend, job_id, lambda i: i.reason not in (None, "None"), what="a reason")
    assert info.state is JobState.PENDING and info.reason == "PartitionConfig"


@pytest.mark.timeout(60)
def test_states_one_squeue_call_for_many_jobs(backend, tmp_path):
    ids = [backend.submit(spec_for(tmp_path, f"exit {i}", name=f"j{i}")) for i in range(4)]
    for j in ids:
        wait_final(backend, j)
    calls = []
    real_run = backend._run

    def counting_run(args, **kw):
        calls.append(args[0])
        return real_run(args, **kw)

    backend._run = counting_run
    infos = backend.states([*ids, "999999"])
    assert calls.count("squeue") == 1
    assert [infos[j].exit_code for j in ids] == [0, 1, 2, 3]
    assert infos["999999"].state is JobState.UNKNOWN
    assert set(infos) == {*ids, "999999"}
    assert backend.states([]) == {}


@pytest.mark.timeout(60)
def test_states_fall_back_to_sacct_job_completion_log(backend, tmp_path):
    """Jobs purged from the controller (after MinJobAge) are found by sacct -c."""
    job_id = backend.submit(spec_for(tmp_path, "exit 5"))
    assert wait_final(backend, job_id).exit_code == 5
    real_run = backend._run
    seen = []

    def forgetful_run(args, **kw):          # squeue/scontrol have "purged" the job
        seen.append(args[0])
        if args[0] in ("squeue", "scontrol"):
            return subprocess.CompletedProcess(args, 1, "",
                                               "slurm_load_jobs error: Invalid job id specified\n")
        return real_run(args, **kw)

    backend._run = forgetful_run
    info = backend.states([job_id])[job_id]
    assert seen == ["squeue", "scontrol", "sacct", "sacct"]   # then sacct -c
    assert info.state is JobState.FAILED and info.exit_code == 5


@pytest.mark.timeout(90)
def test_two_clusters_side_by_side(slurm_cluster, slurm_cluster2, tmp_path):  # noqa: F811
    b1 = SlurmBackend(env=slurm_cluster.env)
    b2 = SlurmBackend(env=slurm_cluster2.env)
    assert slurm_cluster.ctld_port != slurm_cluster2.ctld_port
    try:
        j1 = b1.submit(spec_for(tmp_path, "sleep 300", name="on-c1", cpus_per_task=2))
        wait_running(b1, j1)
        # c1 is full, c2 is not
        assert b1.cluster_info().free_cpus == 0
        assert wait_for(b2.cluster_info, lambda c: c.free_cpus == 2).free_nodes == 1
        j2 = b2.submit(spec_for(tmp_path, "exit 2", name="on-c2"))
        i2 = wait_final(b2, j2)
        assert i2.node_list == (slurm_cluster2.node_name,) and i2.exit_code == 2
        i1 = b1.states([j1])[j1]
        assert i1.state is JobState.RUNNING and i1.node_list == (slurm_cluster.node_name,)
        assert b1.cancel(j1).state is JobState.CANCELLED
    finally:
        slurm_cluster.cancel_all()
        slurm_cluster2.cancel_all()


@pytest.mark.timeout(90)
def test_private_cluster_stop_leaves_no_process(tmp_path, tmp_path_factory):
    require_slurm()
    # a short directory: slurmd's socket paths under it must fit in 107 bytes
    cluster = PrivateSlurm(tmp_path_factory.mktemp("leak"), name="leak", cpus=2)
    with cluster:
        backend = SlurmBackend(env=cluster.env)
        job_id = backend.submit(spec_for(tmp_path, "sleep 600", name="orphan?"))
        wait_running(backend, job_id)
        mine = cluster.processes()
        daemons = set(cluster.pids.values())
        assert daemons <= set(mine) and len(mine) > len(daemons)   # slurmstepd + sleep
    assert cluster.processes() == []
    assert not any(_alive(p) for p in mine)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_time_limit_gives_timeout(timed_out_job):
    """Last in the module: ``timed_out_job`` started with its first test."""
    backend, job_id, running = timed_out_job
    assert running.time_limit == 60.0          # 30 s rounded up to Slurm's minute
    info = wait_final(backend, job_id, timeout=200)
    assert info.state is JobState.TIMEOUT and info.reason == "TimeLimit"
    assert info.signal == 15
    assert info.end_time - info.start_time <= 60
