"""Pilot SeDs on real private schedulers (tests/batch_clusters.py): a batch
SeD with ``pilot`` settings submits pilot jobs whose SeDs register with it
and serve the calls relayed to them. Slurm carries the full set (many calls
and idle pilots leaving, through an MA; drain and replacement at a 60 s
walltime; a refusing scheduler pausing the manager); Grid Engine and OAR run
the same pilots through the scheduler registry.

Each test starts its own pilot SeD in-process (on a loop thread) and talks
to it with real gridrpc clients over ZeroMQ; the pilots are real jobs
running ``gridrpc sed``. Every wait has a deadline; the clusters are emptied
after each test and no pilot process may outlive its module.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import re
import signal
import time
from pathlib import Path

import pytest

import gridrpc
from gridrpc.master_agent import MasterAgent
from gridrpc.sed.batch.config import parse_batch_config
from gridrpc.sed.batch.sed import BatchSeD
from gridrpc.testing import LoopThread
from tests.batch_clusters import start_cluster, wait_until
from tests.daemon_procs import kill_all, processes_under

pytestmark = [pytest.mark.real, pytest.mark.slurm]

SLEEP = "gridrpc.examples.services:sleep"
ADD = "gridrpc.examples.services:add"
COUNT = "tests.reliability_services:count"       # each run appends its token to a file
REPO = str(Path(__file__).resolve().parents[1])  # where the pilots import tests.* from


@pytest.fixture(scope="module")
def scluster(tmp_path_factory):
    yield from start_cluster("slurm", tmp_path_factory)
    left = _pilot_processes(str(tmp_path_factory.getbasetemp()))
    assert not left, f"pilot SeD processes left behind: {left}"


@pytest.fixture
def cluster(scluster):
    yield scluster
    scluster.cancel_all(timeout=30)


def _pilot_processes(under: str) -> list[int]:
    """Live pilot SeDs (``gridrpc sed``) whose working directory is under *under*."""
    return processes_under(b"gridrpc\x00sed\x00", under, by_cwd=True)


@contextlib.contextmanager
def pilot_sed(cluster, shared, name="psed", batch=None, parent=None, lt=None, services=None, **pilot):
    """A started pilot SeD offering ``sleep``, ``add`` and *services*
    (name -> ``(target, add_service options)``)."""
    pilot.setdefault("host", "127.0.0.1")        # the pilots run on this machine
    own = lt is None
    lt = lt or LoopThread()
    config = parse_batch_config({"shared_dir": str(shared), "env": cluster.env, "poll_interval": 0.25,
                                 "estimate_interval": 1.0, **cluster.backend_settings(), "pilot": pilot,
                                 **(batch or {})})
    sed = BatchSeD(name, parent, config=config, hb_interval=0.5, hb_timeout=1.5)
    sed.add_service("sleep", SLEEP)
    sed.add_service("add", ADD)
    for svc, (target, options) in (services or {}).items():
        sed.add_service(svc, target, **options)
    lt.run(sed.start())
    try:
        yield sed, lt
    finally:
        lt.run(sed.aclose(), timeout=90)
        if own:
            lt.close()


@contextlib.contextmanager
def master_agent():
    lt = LoopThread()
    ma = lt.run(MasterAgent(name="MA", address="tcp://127.0.0.1:0", hb_interval=0.5, hb_timeout=1.5).start())
    try:
        yield ma, lt
    finally:
        lt.run(ma.aclose(), timeout=30)
        lt.close()


def ma_events(ma, lt, kind: str) -> list:
    return lt.call(lambda: [e for _, e in ma.events.log if e.kind.value == kind])


def client(**kw) -> gridrpc.Client:
    kw.setdefault("ping_interval", 0.3)
    kw.setdefault("ping_timeout", 3.0)
    return gridrpc.Client(kw.pop("ma", None), **kw)


def addr(sed) -> str:
    return f"{sed.address}#{sed.name}"


def stats(sed, lt) -> dict:
    return lt.call(lambda: sed.execution.statistics())


def estimate(sed, lt) -> dict:
    return lt.call(lambda: sed.estimate(next(iter(sed.replicas.values())), sed.services["sleep"], [], user="u"))


def events(sed, what: str) -> list:
    return [e for e in list(sed.execution.events) if e[1] == what]


def job_states(cluster, job_ids) -> dict[str, str]:
    out = {}
    for j in job_ids:
        line = cluster.run(["squeue", "-h", "-t", "all", "-j", j, "-o", "%T"], check=False).stdout.strip()
        out[j] = line
    return out


def job_of_pilot(sed, pilot: str) -> str:
    """The job id of *pilot*, as its ``pilot_started`` event says."""
    detail = next(e[3] for e in events(sed, "pilot_started") if e[2] == pilot)
    return re.match(r"job (\S+),", detail).group(1)


def submitted_jobs(cluster, sed: str = "psed") -> list[str]:
    text = cluster.run(["squeue", "-h", "-t", "all", "-n", f"gridrpc-pilot-{sed}", "-o", "%i"], check=False).stdout
    return [j for j in text.split() if j]


# ----------------------------------------------------------------------------------------

def test_pilots_serve_many_calls_and_leave_when_idle(cluster, tmp_path):
    """Many short calls from several clients run on few pilot jobs; the
    estimation vector says "a new pilot in about X s" before and "free
    now" while a pilot is idle; idle pilots leave after the idle timeout."""
    with master_agent() as (ma, malt), \
            pilot_sed(cluster, tmp_path / "shared", parent=ma.address, max=2, cores=2, idle_timeout=3,
                      walltime=600) as (sed, lt):
        wait_until(lambda: malt.call(lambda: "psed" in ma.registry.children), 10, "the SeD registered")
        before = estimate(sed, lt)
        assert before["pilots_ready"] == 0 and before["est_wait"] > 0
        assert before["est_wait"] == pytest.approx(before["pilot_start_estimate"])

        def work(i: int) -> list:
            with client(ma=ma.address) as c:              # discovery through the MA
                return [c.call("sleep", 0.05, timeout=120) for _ in range(10)]

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = [r for rs in pool.map(work, range(4)) for r in rs]
        assert results == [0.05] * 40
        st = stats(sed, lt)
        assert 1 <= st["jobs_submitted"] <= 2, st
        assert st["pilots"]["dispatched"] == 40 and st["pilots"]["calls_failed"] == 0
        now = estimate(sed, lt)
        assert now["pilots_ready"] >= 1 and now["est_wait"] == 0.0 and now["pilot_free_slots"] >= 1
        assert events(sed, "pilot_started")
        with client(ma=ma.address) as c:                  # what the agents see: a free pilot now
            vec = c.discover("sleep")[0].estimation
        assert vec["est_wait"] == 0.0 and vec["pilots_ready"] >= 1, vec
        # idle pilots leave (min 0): their jobs end, the vector goes back to "a new pilot in X s".
        # A second pilot, submitted while the calls queued, may register only after the first
        # served them all (its job started a scheduler pass later, its SeD imported slower): it
        # then starts idle and leaves idle, so the pilots are counted once all have left.
        wait_until(lambda: stats(sed, lt)["pilots"]["pilots"] == [], 30, "the idle pilots to leave")
        started = [e[2] for e in events(sed, "pilot_started")]
        assert len(started) == stats(sed, lt)["jobs_submitted"], sed.execution.events   # every job's SeD came
        assert {e[2] for e in events(sed, "pilot_stopped")} == set(started), sed.execution.events
        assert all("idle" in e[3] for e in events(sed, "pilot_stopped")), sed.execution.events
        jobs = [job_of_pilot(sed, p) for p in started]
        wait_until(lambda: all(s == "CANCELLED" for s in job_states(cluster, jobs).values()),
                   30, "the pilot jobs to end")
        assert estimate(sed, lt)["est_wait"] > 0


@pytest.mark.slow
def test_pilot_drains_before_its_walltime_and_is_replaced(cluster, tmp_path):
    """A pilot of 60 s walltime under a steady load stops taking calls before
    its end (max_call_time + drain_margin), finishes what it runs, leaves,
    and a replacement submitted in time takes over: no call fails."""
    with pilot_sed(cluster, tmp_path / "shared", max=2, cores=2, walltime=60, max_call_time=2,
                   drain_margin=25, idle_timeout=60) as (sed, lt), client() as c:
        done, failed = [], []
        first = None
        deadline = time.monotonic() + 100
        while time.monotonic() < deadline:
            calls = [c.submit("sleep", 0.3, server=addr(sed)) for _ in range(2)]
            for call in calls:
                try:
                    done.append(call.result(timeout=60))
                except gridrpc.GridRPCError as exc:       # pragma: no cover - the assertion shows them
                    failed.append(repr(exc))
            started = events(sed, "pilot_started")
            if first is None and started:
                first = started[0][2]
            if first and any(e[2] == first for e in events(sed, "pilot_stopped")) and len(started) >= 2 \
                    and any(e[2] != first for e in started):
                break
        assert not failed, failed[:3]
        assert first is not None, "no pilot started"
        assert any(e[2] == first for e in events(sed, "draining")), sed.execution.events
        stop = [e for e in events(sed, "pilot_stopped") if e[2] == first]
        assert stop and "drained" in stop[0][3], sed.execution.events
        assert len(events(sed, "pilot_started")) >= 2
        # the replacement took calls before the first pilot left (submitted in time, not after)
        second = next(e for e in events(sed, "pilot_started") if e[2] != first)
        assert second[0] < stop[0][0], sed.execution.events
        # the first pilot's job was cancelled by the manager, not killed by its walltime
        first_job = job_of_pilot(sed, first)
        wait_until(lambda: job_states(cluster, [first_job])[first_job] == "CANCELLED", 20,
                   "the drained pilot's job to end")
        assert len(done) >= 20


def test_rejected_submissions_pause_the_manager(cluster, tmp_path):
    """A scheduler that refuses every pilot job: after max_submit_failures
    refusals in a row the manager pauses with an event, and calls fail with
    the scheduler's reason instead of waiting."""
    # a partition the cluster does not have: sbatch refuses the job
    with master_agent() as (ma, malt), \
            pilot_sed(cluster, tmp_path / "shared", batch={"partition": "nosuchpartition"}, parent=ma.address,
                      max=2, max_submit_failures=2, pause=600) as (sed, lt):
        with client() as c:
            with pytest.raises(gridrpc.GridRPCError) as exc:    # the pause's reason, not a Timeout after 60 s
                c.call("add", 1, 2, server=addr(sed), timeout=60)
        text = str(exc.value)
        assert "paused" in text and cluster.bad_queue_words in text.lower(), text
        paused = events(sed, "paused")
        assert len(paused) == 1 and "2 failed" in paused[0][3], sed.execution.events
        # the event reaches the MA (gridrpc events, /api/events)
        wait_until(lambda: ma_events(ma, malt, "pilots_paused"), 10, "the pause event at the MA")
        assert cluster.bad_queue_words in ma_events(ma, malt, "pilots_paused")[0].detail.lower()
        st = stats(sed, lt)["pilots"]
        assert st["paused"] and st["submit_failures"] == 2 and st["submitted"] == 0
        assert estimate(sed, lt)["pilots_paused"] is True
        # while paused, nothing more is submitted: a new call fails at once
        with client() as c, pytest.raises(gridrpc.GridRPCError):
            c.call("add", 1, 2, server=addr(sed), timeout=30)
        assert stats(sed, lt)["pilots"]["submit_failures"] == 2


def test_a_non_idempotent_call_whose_pilot_is_lost_ends_in_server_lost_and_never_runs_twice(cluster, tmp_path):
    """The pilot running a non-idempotent call is lost (its SeD and worker
    killed with SIGKILL: heartbeats and pings stop) after the call started:
    the call ends in ServerLost naming the pilot SeD and the call, neither
    the pilot SeD nor the client (through an MA, so it could discover again)
    runs it anywhere else, and the lost pilot's job is cancelled."""
    runs = tmp_path / "runs.txt"
    runs.touch()
    with master_agent() as (ma, malt), \
            pilot_sed(cluster, tmp_path / "shared", parent=ma.address, batch={"job_env": {"PYTHONPATH": REPO}},
                      services={"count": (COUNT, {"idempotent": False})},
                      max=2, cores=1, idle_timeout=60, walltime=600) as (sed, lt):
        wait_until(lambda: malt.call(lambda: "psed" in ma.registry.children), 10, "the SeD registered")
        with client(ma=ma.address) as c:
            [s] = c.discover("count")
            assert s.name == "psed" and s.idempotent is False           # the pilot SeD says so
            call = c.submit("count", str(runs), "once", 60.0)
            wait_until(lambda: runs.read_text().split() == ["once"], 120, "the call running on a pilot")
            [pilot] = [e[2] for e in events(sed, "pilot_started")]
            pids = processes_under(b"gridrpc\x00sed\x00", str(tmp_path), by_cwd=True)
            assert pids, "no pilot SeD process found"
            kill_all(pids, signal.SIGKILL)                               # the pilot dies mid-call
            # ServerLost, not Timeout: the pilot SeD saw the loss (heartbeats, pings) and failed the call
            with pytest.raises(gridrpc.ServerLost) as info:
                call.result(timeout=60)
        assert info.value.server == "psed" and info.value.call_id == call.id
        assert "not idempotent" in str(info.value) and pilot in str(info.value), info.value
        st = stats(sed, lt)["pilots"]
        assert st["dispatched"] == 1 and st["calls_failed"] == 1, st
        assert [e for e in events(sed, "pilot_stopped") if e[2] == pilot], sed.execution.events
        job = job_of_pilot(sed, pilot)                   # ended: its SeD's exit or the manager's cancel
        wait_until(lambda: job_states(cluster, [job])[job] not in ("PENDING", "CONFIGURING", "RUNNING",
                                                                   "COMPLETING"), 30, "the lost pilot's job to end")
        time.sleep(2)                            # long enough for a re-run to have started somewhere
        assert runs.read_text().split() == ["once"]                       # it ran once, never again
        assert stats(sed, lt)["pilots"]["dispatched"] == 1


@pytest.fixture(scope="module", params=[pytest.param("sge", marks=pytest.mark.sge),
                                        pytest.param("oar", marks=pytest.mark.oar)])
def other_cluster(request, tmp_path_factory):
    """A private Grid Engine cell or OAR server (tests/batch_clusters.py)."""
    yield from start_cluster(request.param, tmp_path_factory)
    left = _pilot_processes(str(tmp_path_factory.getbasetemp()))
    assert not left, f"pilot SeD processes left behind: {left}"


def test_pilots_on_grid_engine_and_oar(other_cluster, tmp_path):
    """The same pilots through the scheduler registry: a pilot job of Grid
    Engine or OAR serves the calls of two clients, then leaves when idle."""
    cluster = other_cluster
    try:
        with pilot_sed(cluster, tmp_path / "shared", max=1, cores=1, idle_timeout=2, walltime=600) as (sed, lt):
            def work(i: int) -> list:
                with client() as c:
                    return [c.call("add", i, k, server=addr(sed), timeout=60) for k in range(3)]

            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                assert list(pool.map(work, range(2))) == [[0, 1, 2], [1, 2, 3]]
            pilots = stats(sed, lt)["pilots"]["pilots"]
            assert len(pilots) == 1 and stats(sed, lt)["jobs_submitted"] == 1
            job = pilots[0]["job_id"]
            assert cluster.is_running(job)
            wait_until(lambda: stats(sed, lt)["pilots"]["pilots"] == [], 30, "the idle pilot to leave")
            wait_until(lambda: not cluster.is_running(job) and not cluster.is_pending(job), 30,
                       "the pilot job to end")
            assert "idle" in events(sed, "pilot_stopped")[0][3]
    finally:
        cluster.cancel_all(timeout=30)


def test_deployment_file_with_pilots(cluster, tmp_path):
    """``pilot:`` in a ``kind: batch`` entry: ``deploy up`` starts ``gridrpc
    sed --batch slurm --pilot ...``; a discovered call runs on a pilot job;
    ``deploy down`` stops the SeD, which cancels its pilot."""
    from gridrpc.deploy import spec as deploy_spec
    from gridrpc.deploy.runner import Deployment
    data = {"master_agent": {"name": "MA", "host": "localhost", "port": 0},
            "seds": [{"name": "hpc", "parent": "MA", "kind": "batch", **cluster.backend_settings(),
                      "shared_dir": str(tmp_path / "shared"), "poll_interval": 0.25, "env": cluster.env,
                      "services": ["gridrpc.examples.services:add"],
                      "pilot": {"max": 1, "walltime": "0:10:00", "idle_timeout": 300, "host": "127.0.0.1"}}]}
    spec = deploy_spec.parse(data, name="pilot-test")
    with Deployment(spec, state_dir=tmp_path / "state", progress=lambda msg: None) as dep:
        try:
            dep.up()
            with client(ma=dep.addresses["MA"]) as c:
                (server,) = c.discover("add", 5)
                assert server.name == "hpc" and server.estimation["pilot"] is True
                assert server.estimation["est_wait"] > 0          # no pilot yet: "a new pilot in about X s"
                assert c.call("add", 1, 2, timeout=60) == 3
            (job,) = submitted_jobs(cluster, "hpc")
            assert job_states(cluster, [job])[job] == "RUNNING"
        finally:
            dep.down()
    wait_until(lambda: job_states(cluster, [job])[job] == "CANCELLED", 30, "the pilot job cancelled at stop")
