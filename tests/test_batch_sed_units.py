"""The batch SeD without Slurm: configuration, estimation, the job files and
``run_job``, and the SeD's logic (outcomes, cancel, restart, estimates)
driven by an in-memory backend whose jobs the test runs and ends at will.
Real-Slurm tests are in tests/test_batch_sed.py."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

import gridrpc
from gridrpc.cli import build_parser
from gridrpc.core import messages as m
from gridrpc.core.messages import MsgType
from gridrpc.deploy import spec as deploy_spec
from gridrpc.deploy.runner import Deployment
from gridrpc.errors import ConfigError, InvalidArgument
from gridrpc.master_agent import MasterAgent
from gridrpc.sed.batch import (BatchError, BatchSubmitError, ClusterInfo, JobInfo, JobSpec, JobState)
from gridrpc.sed.batch import jobfiles, run_job
from gridrpc.sed.batch.cli import batch_settings_from_args
from gridrpc.sed.batch.config import (BatchConfig, batch_settings, config_to_cli, parse_batch_config,
                                      parse_call_request, parse_duration)
from gridrpc.sed.batch.estimate import (UNREACHABLE_WAIT, ClusterSnapshot, JobHistory, RunRecord,
                                        batch_tags)
from gridrpc.sed.batch.sed import BatchSeD, importable_target
from gridrpc.testing import LoopThread
from gridrpc.examples import services as example_services


@pytest.fixture(autouse=True)
def _job_variables_stay_here():
    """run_job sets the job's variables (GRIDRPC_CALL_ID, ...) in the process
    it runs in: here the test process; taken back after each test, so that
    they do not reach later tests and the processes those start."""
    saved = dict(os.environ)
    yield
    for k in [k for k in os.environ if k not in saved]:
        del os.environ[k]
    os.environ.update({k: v for k, v in saved.items() if os.environ.get(k) != v})


# --------------------------------------------------------------------------- configuration


def test_parse_duration():
    assert parse_duration(90) == 90.0 and parse_duration("90") == 90.0
    assert parse_duration("1:30") == 90.0            # Slurm M:S
    assert parse_duration("01:00:00") == 3600.0
    assert parse_duration("1-00:00:00") == 86400.0
    assert parse_duration(None) is None and parse_duration("unlimited") is None
    for bad in (0, -5, "abc", True, "1:xx", float("nan")):
        with pytest.raises(ConfigError):
            parse_duration(bad)


def test_parse_batch_config_checks_everything():
    c = parse_batch_config({"scheduler": "slurm", "partition": "debug", "time": "0:10:00",
                            "nodes": "2", "sbatch_options": "--mem=1G", "batch_env": ["A=1", "B=x=y"],
                            "poll_interval": 0.5, "cancel_on_exit": True})
    assert c.time_limit == 600 and c.nodes == 2 and c.submit_options == ("--mem=1G",)
    assert c.env == {"A": "1", "B": "x=y"} and c.poll_interval == 0.5 and c.cancel_on_exit
    for bad, msg in (({"nodes": 0}, "positive integer"), ({"nodes": "two"}, "positive integer"),
                     ({"colour": "red"}, "unknown batch setting"), ({"scheduler": "pbs9"}, "unknown scheduler"),
                     ({"time_limit": 100, "max_time_limit": 50}, "exceeds"),
                     ({"shared_dir": "/tmp/with space"}, "white space"), ({"poll_interval": -1}, "> 0"),
                     ({"env": "A=1"}, "mapping"), ({"submit_options": ["--a\n--b"]}, "option strings"),
                     ({"cancel_on_exit": "yes"}, "true or false")):
        with pytest.raises(ConfigError, match=msg):
            parse_batch_config(bad)


def test_call_requests():
    c = BatchConfig(max_time_limit=3600)
    assert parse_call_request({"nodes": 2, "ntasks": 4, "cpus": 2, "time": "0:30:00"}, c) == {
        "nodes": 2, "ntasks": 4, "cpus_per_task": 2, "walltime": 1800.0}
    assert parse_call_request(None, c) == {}
    for bad in ({"gpus": 1}, {"nodes": 0}, {"nodes": True}, {"ntasks": 1.5}, {"walltime": 7200},
                {"walltime": "soon"}, [1, 2]):
        with pytest.raises(InvalidArgument):
            parse_call_request(bad, c)


def test_cli_and_deployment_round_trip(tmp_path):
    c = parse_batch_config({"partition": "short", "account": "proj", "time_limit": 120, "ntasks": 4,
                            "sbatch_options": ["--mem=2G", "--qos=fast"], "shared_dir": str(tmp_path),
                            "env": {"SLURM_CONF": "/etc/x.conf"}, "cancel_on_exit": True,
                            "remote_python": "/opt/py/bin/python"})
    argv = ["sed", "--name", "b", *config_to_cli(c)]
    a = build_parser().parse_args(argv)
    assert parse_batch_config(batch_settings_from_args(a)) == c
    # deployment file entries
    data = {"master_agent": {"name": "MA", "port": 0},
            "seds": [{"name": "hpc", "parent": "MA", "kind": "batch", "scheduler": "slurm",
                      "partition": "short", "time_limit": "0:02:00", "shared_dir": str(tmp_path),
                      "options": ["--mem=1G"], "services": ["gridrpc.examples.services:add"]}]}
    spec = deploy_spec.parse(data)
    dep = Deployment(spec, state_dir=tmp_path / "state")
    dep.addresses["MA"] = "tcp://127.0.0.1:5555"
    cmd = dep.command(spec.element("hpc"))
    assert cmd[cmd.index("--batch") + 1] == "slurm"
    assert cmd[cmd.index("--partition") + 1] == "short" and cmd[cmd.index("--time-limit") + 1] == "120"
    assert "--submit-option=--mem=1G" in cmd
    assert parse_batch_config(batch_settings(spec.element("hpc").options)).partition == "short"
    bad = {**data, "seds": [{**data["seds"][0], "nodes": -1}]}
    with pytest.raises(ConfigError, match="positive integer"):
        deploy_spec.parse(bad)
    bad = {**data, "seds": [{**data["seds"][0], "colour": "red"}]}
    with pytest.raises(ConfigError, match="colour"):
        deploy_spec.parse(bad)


def test_schedulers_come_from_the_registry(tmp_path):
    """The CLI, the configuration and deployment files read one registry of
    schedulers; each brings its own options; a bad name lists the known ones."""
    from gridrpc.sed.batch import (Scheduler, SchedulerOption, make_backend, register_scheduler,
                                   scheduler_names)
    from gridrpc.sed.batch import registry
    assert {"slurm", "sge", "oar"} <= set(scheduler_names())
    with pytest.raises(ConfigError, match="unknown scheduler 'pbs'; known: oar, sge, slurm"):
        parse_batch_config({"scheduler": "pbs"})
    c = parse_batch_config({"scheduler": "sge", "scheduler_options": {"pe": "mpi"},
                            "sbatch_options": ["-l h_vmem=1G"]})         # the old name of submit_options
    assert c.scheduler_options == {"pe": "mpi"} and c.submit_options == ("-l h_vmem=1G",)
    assert c.backend_options()["pe"] == "mpi"
    with pytest.raises(ConfigError, match="unknown scheduler option 'queue' for sge; known: pe, shell"):
        parse_batch_config({"scheduler": "sge", "scheduler_options": {"queue": "x"}})
    with pytest.raises(ConfigError, match="unknown scheduler option 'pe' for slurm; known: none"):
        parse_batch_config({"scheduler_options": {"pe": "x"}})
    with pytest.raises(ConfigError, match="repeats"):
        parse_batch_config({"submit_options": ["-a"], "sbatch_options": ["-b"]})
    # the command line: --batch NAME, --scheduler-option, --sbatch-option as an alias
    a = build_parser().parse_args(["sed", "--name", "b", "--batch", "sge", "--scheduler-option", "pe=smp",
                                   "--sbatch-option=-l h_rt=60"])
    c = parse_batch_config(batch_settings_from_args(a))
    assert (c.scheduler, c.scheduler_options, c.submit_options) == ("sge", {"pe": "smp"}, ("-l h_rt=60",))
    again = build_parser().parse_args(["sed", "--name", "b", *config_to_cli(c)])
    assert parse_batch_config(batch_settings_from_args(again)) == c
    # deployment files: the same registry decides
    data = {"master_agent": {"name": "MA", "port": 0},
            "seds": [{"name": "hpc", "parent": "MA", "kind": "batch", "scheduler": "pbs", "shared_dir": str(tmp_path),
                      "services": ["gridrpc.examples.services:add"]}]}
    with pytest.raises(ConfigError, match="unknown scheduler 'pbs'; known: oar, sge, slurm"):
        deploy_spec.parse(data)
    data["seds"][0].update(scheduler="oar", scheduler_options={"core": "cpu"})
    assert deploy_spec.parse(data).element("hpc").options["scheduler_options"] == {"core": "cpu"}
    # a new scheduler is one registration, with its options
    register_scheduler(Scheduler(name="fake9", backend=lambda **kw: kw,
                                 options={"depth": SchedulerOption("how deep", int)}))
    try:
        c = parse_batch_config({"scheduler": "fake9", "scheduler_options": {"depth": "3"}})
        assert make_backend("fake9", **c.backend_options())["depth"] == 3
        assert "fake9" in scheduler_names()
        with pytest.raises(ConfigError, match="scheduler option depth"):
            parse_batch_config({"scheduler": "fake9", "scheduler_options": {"depth": "deep"}})
    finally:
        registry._REGISTRY.pop("fake9")


def test_deployment_file_in_the_repository_parses():
    path = Path(__file__).parent.parent / "deployments" / "batch.yaml"
    spec = deploy_spec.load(path)
    kinds = {e.name: e.options.get("kind") for e in spec.elements if e.kind == "sed"}
    assert "batch" in kinds.values()


# --------------------------------------------------------------------------- estimation

def test_history_prefers_the_users_last_two_runs():
    h = JobHistory()
    assert h.predict("s", "alice", None) == (h.default, "default")
    assert h.predict("s", "alice", 300.0) == (300.0, "walltime")
    for run in (100.0, 10.0, 20.0):
        h.observe(RunRecord(service="s", user="alice", run=run))
    assert h.predict("s", "alice", 300.0) == (15.0, "user")          # last two: 10, 20
    assert h.predict("s", "bob", 300.0) == (pytest.approx(130 / 3), "service")
    assert h.predict("s", "alice", 12.0) == (12.0, "user")           # never beyond the walltime
    assert h.predict("other", "alice", None)[1] == "default"


def _snap(**kw):
    cluster = ClusterInfo(partition="p", total_cpus=kw.pop("total", 8), free_cpus=kw.pop("free", 8),
                          total_nodes=1, free_nodes=1, max_walltime=None, available=kw.pop("up", True))
    return ClusterSnapshot(taken=kw.pop("taken", 1000.0), cluster=cluster, **kw)


def _tags(snapshot, **kw):
    args = dict(now=1000.0, snapshot=snapshot, tcomp=10.0, tcomp_source="user", cpus_per_job=1,
                walltime=60.0, num_pending=0, num_running=0, queued_here=0, submitted_cpus_since=0,
                max_jobs=100, last_solve=None, scheduler="slurm", partition="p")
    args.update(kw)
    return batch_tags(**args)


def test_batch_tags():
    t = _tags(_snap(queue_length=0, est_start=0.0, est_start_known=True))
    assert t["est_wait"] == 0 and t["eft"] == 1010.0 and t["slowdown"] == 1.0
    assert t["server_type"] == "batch" and t["nb_free_resources"] == 8 and t["batch_available"]
    # the scheduler's estimate, aged since the snapshot
    t = _tags(_snap(est_start=100.0, est_start_known=True, taken=970.0), now=1000.0)
    assert t["est_wait"] == 70.0 and t["est_wait_source"] == "scheduler"
    assert t["slowdown"] == pytest.approx(8.0) and t["eft"] == 1080.0
    # no scheduler estimate: idle cluster, else a coarse model (waves of total/need)
    assert _tags(_snap(queue_length=0))["est_wait_source"] == "idle"
    t = _tags(_snap(free=0, queue_length=15))
    assert t["est_wait_source"] == "model" and t["est_wait"] == 20.0      # ceil(16/8) * 10
    # our own submissions since the snapshot took the free CPUs
    t = _tags(_snap(free=2, queue_length=0, est_start=0.0, est_start_known=True), submitted_cpus_since=2)
    assert t["est_wait"] == 10.0 and t["est_wait_source"] == "scheduler+recent"
    # calls waiting inside the SeD (over max_jobs)
    assert _tags(_snap(est_start=0.0, est_start_known=True), queued_here=3, max_jobs=2)["est_wait"] == 20.0
    # unreachable, down or impossible clusters lose any wait-based ranking
    for snap in (None, ClusterSnapshot(taken=0.0, error="sinfo failed"), _snap(up=False),
                 _snap(impossible="never")):
        t = _tags(snap)
        assert t["est_wait"] == UNREACHABLE_WAIT and not t["batch_available"]


# --------------------------------------------------------------------------- job files and run_job

def _call_dir(tmp_path, target, args=(), kwargs=None) -> Path:
    d = tmp_path / "call"
    d.mkdir()
    jobfiles.write_call(d, target=target, service="s", call_id="c1", args=list(args), kwargs=kwargs or {})
    return d


def test_run_job_success_keeps_values_exact(tmp_path, monkeypatch):
    monkeypatch.setenv("GRIDRPC_JOB_STARTED", str(time.time() - 0.5))
    value = {"a": np.arange(6, dtype="<f4").reshape(2, 3, order="F"), "b": b"\x00\xff", "t": (1, None),
             "big": 1 << 70, "nan": float("nan")}
    d = _call_dir(tmp_path, "gridrpc.examples.services:echo", [value])
    assert run_job.run(str(d)) == 0
    out = jobfiles.read_outcome(d)
    from gridrpc.core import codec
    back = codec.decode(out.value, list(out.buffers))
    assert back["a"].dtype == value["a"].dtype and (back["a"] == value["a"]).all()
    assert back["b"] == value["b"] and back["t"] == (1, None) and back["big"] == 1 << 70
    assert back["nan"] != back["nan"]
    started = jobfiles.read_json(d / "started.json")
    assert started["job_started"] < started["started"] and out.ended >= out.started


def test_run_job_errors(tmp_path):
    d = _call_dir(tmp_path, "gridrpc.examples.services:fail", ["boom"])
    assert run_job.run(str(d)) == 1
    out = jobfiles.read_outcome(d)
    assert not out.ok and out.type == "RuntimeError" and out.message == "boom"
    assert "raise RuntimeError" in out.traceback
    d2 = tmp_path / "x"
    d2.mkdir()
    jobfiles.write_call(d2, target="no.such.module:fn", service="s", call_id="c", args=[], kwargs={})
    assert run_job.run(str(d2)) == 2
    assert jobfiles.read_outcome(d2).type == "BatchSetupError"
    d3 = tmp_path / "y"
    d3.mkdir()
    jobfiles.write_call(d3, target="gridrpc.examples.services:upper_file", service="s", call_id="c",
                        args=[str(tmp_path / "nope.txt")], kwargs={})
    assert run_job.run(str(d3)) == 1 and jobfiles.read_outcome(d3).type == "FileNotFoundError"
    assert run_job.main([]) == 2


def test_run_job_file_results(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("hello")
    d = _call_dir(tmp_path, "gridrpc.examples.services:upper_file", [str(src)])
    assert run_job.run(str(d)) == 0
    out = jobfiles.read_outcome(d)
    assert out.value["__t"] == "file" and bytes(out.buffers[0]) == b"HELLO"


def test_importable_target_and_safe_names():
    assert importable_target(example_services.add) == "gridrpc.examples.services:add"
    with pytest.raises(ConfigError):
        importable_target(lambda x: x)

    def nested():
        pass
    with pytest.raises(ConfigError):
        importable_target(nested)
    assert jobfiles.safe_name("abc123") == "abc123"
    a, b = jobfiles.safe_name("a/b"), jobfiles.safe_name("a_b")
    assert a != b and "/" not in a and jobfiles.safe_name("..") != ".."


# --------------------------------------------------------------------------- the SeD, on a fake scheduler

class FakeBackend:
    """A scheduler in memory: jobs stay PENDING until the test runs or ends them."""
    name = "fake"

    def __init__(self, cpus: int = 4):
        self.lock = threading.Lock()
        self.jobs: dict[str, dict] = {}
        self.specs: list[JobSpec] = []
        self.cancelled: list[str] = []
        self.states_calls: list[list[str]] = []
        self.n = 0
        self.cpus = cpus
        self.est: float | None = 0.0
        self.refuse: str | None = None
        self.submit_gate: threading.Event | None = None
        self.submit_entered = threading.Event()     # set when sbatch (submit) is running
        self.fail_cancel = 0

    def submit(self, spec):
        self.submit_entered.set()
        if self.submit_gate is not None:
            self.submit_gate.wait(10)
        if self.refuse:
            raise BatchSubmitError(self.refuse, cmd=["fake-sbatch"])
        with self.lock:
            self.n += 1
            jid = str(100 + self.n)
            self.jobs[jid] = {"spec": spec, "state": JobState.PENDING, "reason": "Priority",
                              "exit": None, "sig": None, "start": None, "end": None}
            self.specs.append(spec)
        return jid

    def _info(self, jid):
        j = self.jobs.get(jid)
        if j is None:
            return JobInfo(job_id=jid, state=JobState.UNKNOWN, reason="purged")
        return JobInfo(job_id=jid, state=j["state"], reason=j["reason"], exit_code=j["exit"], signal=j["sig"],
                       start_time=j["start"], end_time=j["end"], raw_state=j["state"].value,
                       node_list=("fnode1",) if j["start"] else ())

    def states(self, ids):
        ids = list(ids)
        with self.lock:
            self.states_calls.append(ids)
            return {j: self._info(j) for j in ids}

    def cancel(self, jid, *, timeout=30.0):
        if self.fail_cancel:
            self.fail_cancel -= 1
            raise BatchError("scancel failed", cmd=["scancel", jid])
        with self.lock:
            j = self.jobs.get(jid)
            if j is not None and not j["state"].is_final:
                j.update(state=JobState.CANCELLED, reason=None, end=time.time())
            self.cancelled.append(jid)
            return self._info(jid)

    def estimate_start(self, spec):
        if (spec.ntasks or 1) * (spec.cpus_per_task or 1) > self.cpus:
            raise BatchSubmitError("the job could never run", cmd=["fake-sbatch", "--test-only"],
                                   stderr="Requested node configuration is not available")
        return self.est

    def cluster_info(self, partition=None):
        busy = sum(1 for j in self.jobs.values() if j["state"] is JobState.RUNNING)
        return ClusterInfo(partition=partition or "fake", total_cpus=self.cpus,
                           free_cpus=max(0, self.cpus - busy), total_nodes=1, free_nodes=int(busy == 0),
                           max_walltime=None)

    def queue_length(self, partition=None):
        return sum(1 for j in self.jobs.values() if j["state"] is JobState.PENDING)

    def render_script(self, spec, command):
        return "#!/bin/sh\n" + shlex.join(command) + "\n"

    # -- test controls
    def wait_jobs(self, n, timeout=10.0):
        deadline = time.monotonic() + timeout
        while len(self.jobs) < n:
            assert time.monotonic() < deadline, f"{n} jobs not submitted (have {len(self.jobs)})"
            time.sleep(0.01)
        return sorted(self.jobs, key=int)[n - 1]

    def job_for(self, call_id, timeout=10.0) -> str:
        """The job id of a call (submissions run in threads: ids follow no call order)."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                for jid, j in self.jobs.items():
                    if j["spec"].env.get("GRIDRPC_CALL_ID") == call_id:
                        return jid
            assert time.monotonic() < deadline, f"no job for call {call_id}"
            time.sleep(0.01)

    def run(self, jid):
        """Run the job's command here (``run_job`` in-process), then end it."""
        with self.lock:
            j = self.jobs[jid]
            j.update(state=JobState.RUNNING, start=time.time(), reason=None)
        d = shlex.split(j["spec"].script.splitlines()[1])[-1]
        os.environ["GRIDRPC_JOB_STARTED"] = str(time.time())     # undone by _job_variables_stay_here
        rc = run_job.run(d)
        self.finish(jid, JobState.COMPLETED if rc == 0 else JobState.FAILED,
                    "NonZeroExitCode" if rc else None, rc)

    def finish(self, jid, state, reason=None, exit_code=0, sig=0):
        with self.lock:
            j = self.jobs[jid]
            j.update(state=state, reason=reason, exit=exit_code, sig=sig, end=time.time(),
                     start=j["start"] or time.time())


@contextlib.contextmanager
def fake_sed(tmp_path, backend, lt=None, name="fsed", address="tcp://127.0.0.1:0", parent=None, **cfg):
    own = lt is None
    lt = lt or LoopThread()
    config = parse_batch_config({"shared_dir": str(tmp_path / "shared"), "poll_interval": 0.05,
                                 "estimate_interval": 0.2, "time_limit": 300, **cfg})
    sed = BatchSeD(name, parent, config=config, backend=backend, address=address, hb_interval=0.5,
                   hb_timeout=1.5)
    sed.result_grace = 0.2
    for s in ("add", "sleep", "echo", "fail"):
        sed.add_service(s, f"gridrpc.examples.services:{s}")
    lt.run(sed.start())
    sed.test_loop = lt
    try:
        yield sed
    finally:
        lt.run(sed.aclose(), timeout=30)
        if own:
            lt.close()


def _client(**kw):
    kw.setdefault("ping_interval", 0.1)
    kw.setdefault("ping_timeout", 1.0)
    return gridrpc.Client(kw.pop("ma", None), **kw)


def _addr(sed):
    return f"{sed.address}#{sed.name}"


def _wait(pred, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_call_runs_through_the_files(tmp_path):
    fake = FakeBackend()
    with fake_sed(tmp_path, fake) as sed, _client() as c:
        call = c.submit("add", 2, 40, server=_addr(sed))
        jid = fake.wait_jobs(1)
        spec = fake.specs[0]
        assert spec.time_limit == 300 and spec.env["GRIDRPC_CALL_ID"] == call.id
        # the job's directory is the SeD's own choice, never derived from the request id
        assert call.id not in spec.workdir and os.path.dirname(spec.workdir) == sed.jobs_dir
        fake.run(jid)
        assert call.result(timeout=10) == 42
        t = call.timing
        assert t["job_id"] == jid and t["submitted"] <= t["job_started"] <= t["job_ended"]
        _wait(lambda: not any((tmp_path / "shared" / "fsed" / "jobs").iterdir()), what="cleanup")
        assert sed.history.count("add", c.user) == 1
        assert sed.records[-1]["predicted_tcomp_source"] == "walltime"
        assert sed.estimate(sed._replica, sed.services["add"], [], user=c.user)["tcomp_source"] == "user"
        # every poll asks about all the live jobs at once
        calls = [c.submit("add", i, 1, server=_addr(sed)) for i in range(5)]
        last = fake.wait_jobs(6)
        _wait(lambda: any(len(ids) == 5 for ids in fake.states_calls), what="one query for 5 jobs")
        for jid in sorted(fake.jobs, key=int)[1:]:
            fake.run(jid)
        assert [x.result(timeout=10) for x in calls] == [1, 2, 3, 4, 5]
        assert last


@pytest.mark.parametrize("state,reason,rtype,words", [
    (JobState.TIMEOUT, "TimeLimit", "BatchJobTimeout", "reached its time limit"),
    (JobState.NODE_FAIL, "NodeDown", "BatchNodeFailure", "node failure"),
    (JobState.PREEMPTED, None, "BatchJobPreempted", "was preempted"),
    (JobState.OUT_OF_MEMORY, "OutOfMemory", "BatchOutOfMemory", "ran out of memory"),
    (JobState.CANCELLED, None, "BatchJobCancelled", "cancelled outside gridrpc"),
    (JobState.FAILED, "NonZeroExitCode", "BatchJobFailed", "failed"),
    (JobState.COMPLETED, None, "BatchJobFailed", "left no result"),
])
def test_job_states_become_clear_errors(tmp_path, state, reason, rtype, words):
    fake = FakeBackend()
    with fake_sed(tmp_path, fake) as sed, _client() as c:
        call = c.submit("sleep", 5, server=_addr(sed))
        jid = fake.wait_jobs(1)
        Path(fake.specs[0].output).write_text("line 1\nslurmstepd: error: *** JOB CANCELLED ***\n")
        fake.finish(jid, state, reason, exit_code=137 if state is JobState.FAILED else 0,
                    sig=9 if state is JobState.FAILED else 0)
        with pytest.raises(gridrpc.RemoteError) as exc:
            call.result(timeout=10)
        err = exc.value
        assert err.remote_type == rtype and f"batch job {jid} of sleep" in str(err) and words in str(err)
        assert state.value in str(err) and (reason is None or reason in str(err))
        assert "JOB CANCELLED" in err.remote_traceback     # the tail of the job's output
        if state is JobState.FAILED:
            assert "exit code 137:9" in str(err)
        assert sed.batch_stats["failed"] == 1 and not sed.history.count("sleep")


def test_lost_job_and_refused_submissions(tmp_path):
    fake = FakeBackend(cpus=4)
    with fake_sed(tmp_path, fake, lost_after=0.3) as sed, _client() as c:
        call = c.submit("add", 1, 1, server=_addr(sed))
        jid = fake.wait_jobs(1)
        del fake.jobs[jid]                     # purged by the scheduler, no result
        with pytest.raises(gridrpc.RemoteError) as exc:
            call.result(timeout=10)
        assert exc.value.remote_type == "BatchJobLost" and jid in str(exc.value)
        # a shape no node can hold is refused before submitting (Slurm would let it pend forever)
        with pytest.raises(gridrpc.RemoteError) as exc:
            c.call("add", 1, 1, _batch={"ntasks": 8}, server=_addr(sed), timeout=10)
        assert exc.value.remote_type == "BatchSubmitError" and "never run" in str(exc.value)
        assert len(fake.jobs) == 0
        # the scheduler refuses
        fake.refuse = "Invalid account"
        with pytest.raises(gridrpc.RemoteError, match="Invalid account") as exc:
            c.call("add", 1, 1, server=_addr(sed), timeout=10)
        assert exc.value.remote_type == "BatchSubmitError"
        assert sed.batch_stats["submit_errors"] == 2
        _wait(lambda: not any((tmp_path / "shared" / "fsed" / "jobs").iterdir()), what="cleanup")


def test_per_call_resources_reach_the_job(tmp_path):
    fake = FakeBackend(cpus=16)
    with fake_sed(tmp_path, fake, max_time_limit=3600, partition="big", account="proj",
                  sbatch_options=["--mem=1G"]) as sed, _client() as c:
        call = c.submit("add", 1, 2, _batch={"nodes": 2, "ntasks": 4, "cpus_per_task": 2,
                                             "walltime": "0:20:00"}, server=_addr(sed))
        jid = fake.wait_jobs(1)
        s = fake.specs[0]
        assert (s.nodes, s.ntasks, s.cpus_per_task, s.time_limit) == (2, 4, 2, 1200.0)
        assert s.partition == "big" and s.account == "proj" and s.extra_options == ("--mem=1G",)
        fake.run(jid)
        assert call.result(timeout=10) == 3
        with pytest.raises(gridrpc.InvalidArgument, match="exceeds"):
            c.call("add", 1, 2, _batch={"walltime": 7200}, server=_addr(sed), timeout=10)


def test_cancel_while_submitting_and_failed_cancels(tmp_path):
    fake = FakeBackend()
    fake.submit_gate = threading.Event()
    with fake_sed(tmp_path, fake) as sed, _client() as c:
        call = c.submit("sleep", 100, server=_addr(sed))
        # the job's state says "submitting" one save before sbatch runs: a cancel in between
        # submits nothing (another path); wait for sbatch itself
        assert fake.submit_entered.wait(10), "sbatch never ran"
        assert any(j["state"] == "submitting" for j in sed.test_loop.call(sed.jobs).values())
        call.cancel()
        with pytest.raises(gridrpc.CallCancelled):
            call.result(timeout=5)
        fake.submit_gate.set()                 # sbatch answers after the cancel: the job is cancelled
        _wait(lambda: fake.cancelled == ["101"], what="the late job to be cancelled")
        _wait(lambda: not any((tmp_path / "shared" / "fsed" / "jobs").iterdir()), what="cleanup")
        # scancel failing: retried at the next poll until it works
        fake.fail_cancel = 2
        call = c.submit("sleep", 100, server=_addr(sed))
        jid = fake.wait_jobs(2)
        fake.jobs[jid].update(state=JobState.RUNNING, start=time.time())
        call.cancel()
        with pytest.raises(gridrpc.CallCancelled):
            call.result(timeout=5)
        _wait(lambda: jid in fake.cancelled, what="the retried cancel")
        # the count moves on the SeD's loop after scancel returned in its thread
        _wait(lambda: sed.batch_stats["cancelled"] >= 2, what="the cancel counted")
        assert fake.jobs[jid]["state"] is JobState.CANCELLED and sed.batch_stats["cancelled"] == 2


def test_restart_recovers_running_and_finished_jobs(tmp_path):
    """SeD stops with two jobs in the scheduler; one finishes while it is
    down; a new SeD (same name and directory, same address) answers both
    calls. The client waits longer than its ping_timeout thanks to the
    patience the batch SeD announced."""
    fake = FakeBackend()
    lt = LoopThread()
    try:
        with _client(ping_timeout=0.5) as c:
            with fake_sed(tmp_path, fake, lt=lt, restart_grace=30) as sed:
                address = sed.address
                a = c.submit("add", 1, 2, server=_addr(sed))
                b = c.submit("add", 3, 4, server=_addr(sed))
                ja, jb = fake.job_for(a.id), fake.job_for(b.id)
                _wait(lambda: sed.batch_stats["submitted"] == 2)
            fake.run(ja)                        # ends while no SeD runs
            time.sleep(1.5)                     # > ping_timeout
            assert not a.done() and not b.done()
            with fake_sed(tmp_path, fake, lt=lt, address=address) as sed2:
                assert sed2.batch_stats["recovered"] == 2
                assert a.result(timeout=10) == 3
                fake.run(jb)
                assert b.result(timeout=10) == 7
                _wait(lambda: not any((tmp_path / "shared" / "fsed" / "jobs").iterdir()), what="cleanup")
    finally:
        lt.close()


def test_kept_answers_survive_restarts_and_duplicate_calls_get_them(tmp_path):
    """A SeD stopped while sbatch ran (state 'submitting', no job id) keeps a
    clear error for that call; a finished, undelivered result survives a
    second restart; a CALL repeating the id gets the kept answer (no new job)."""
    fake = FakeBackend()
    jobs = tmp_path / "shared" / "fsed" / "jobs"
    d = jobs / "lost-call"
    d.mkdir(parents=True)
    jobfiles.write_json(d / "meta.json", {"call_id": "lost-call", "service": "add", "user": "u",
                                          "received": time.time(), "state": "submitting", "written": True})
    lt = LoopThread()
    try:
        with fake_sed(tmp_path, fake, lt=lt) as sed:
            assert sed.jobs()["lost-call"]["state"] == "done"
            address = sed.address
        with fake_sed(tmp_path, fake, lt=lt, address=address) as sed:
            assert "lost-call" in sed.jobs()
            ctx = zmq.Context.instance()
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(sed.address)
            try:
                s.send_multipart([m.dumps(m.make(MsgType.CALL, "lost-call", service="add", args=[1, 2],
                                                 kwargs={}, sed="fsed"))])
                assert s.poll(5000)
                mt, h = m.parse_header(s.recv_multipart()[0])
                assert mt is MsgType.ERROR and h["error"]["type"] == "BatchJobLost"
                assert "stopped while submitting" in h["error"]["message"]
                s.send_multipart([m.dumps(m.make(MsgType.PING, "p1", ids=["lost-call"]))])
                assert s.poll(5000)
                mt, h = m.parse_header(s.recv_multipart()[0])
                assert mt is MsgType.PONG and h["calls"] == {"lost-call": "done"}
            finally:
                s.close()
            assert not fake.jobs
            _wait(lambda: not d.exists(), what="the delivered answer to be removed")
    finally:
        lt.close()


def test_estimates_through_discovery(tmp_path):
    fake = FakeBackend(cpus=4)
    fake.est = 120.0
    lt = LoopThread()
    ma = lt.run(MasterAgent(name="MA", address="tcp://127.0.0.1:0", hb_interval=0.5, hb_timeout=1.5).start())
    try:
        with fake_sed(tmp_path, fake, lt=lt, parent=ma.address, max_jobs=1) as sed, \
                _client(ma=ma.address) as c:
            _wait(lambda: lt.call(lambda: [e for e in ma.tree() if e.get("kind") == "sed"]), what="register")
            est = c.discover("add", 1)[0].estimation
            assert est["server_type"] == "batch" and est["tcomp_source"] == "walltime"
            assert est["tcomp"] == 300 and 115 < est["est_wait"] <= 120 and est["est_wait_source"] == "scheduler"
            assert est["slowdown"] == pytest.approx((est["est_wait"] + 300) / 300)
            assert est["nb_total_resources"] == 4 and est["batch_available"]
            # max_jobs=1: a second call waits in the SeD and the estimate says so
            first = c.submit("add", 1, 1, server=_addr(sed))
            second = c.submit("add", 2, 2, server=_addr(sed))
            jid = fake.wait_jobs(1)
            _wait(lambda: sed.test_loop.call(lambda: sed.estimate(sed._replica, sed.services["add"], []))[
                "num_waiting"] == 2, what="num_waiting")
            assert len(fake.jobs) == 1
            fake.run(jid)
            assert first.result(timeout=10) == 2
            fake.run(fake.wait_jobs(2))
            assert second.result(timeout=10) == 4
            # the user's history now drives tcomp
            est = c.discover("add", 1)[0].estimation
            assert est["tcomp_source"] == "user" and est["tcomp"] < 60
    finally:
        lt.run(ma.aclose())
        lt.close()


def test_cancel_on_exit(tmp_path):
    fake = FakeBackend()
    with _client() as c:
        with fake_sed(tmp_path, fake, cancel_on_exit=True) as sed:
            call = c.submit("sleep", 100, server=_addr(sed))
            jid = fake.wait_jobs(1)
            _wait(lambda: sed.batch_stats["submitted"] == 1)
        with pytest.raises(gridrpc.CallCancelled):
            call.result(timeout=5)
        assert fake.cancelled == [jid] and fake.jobs[jid]["state"] is JobState.CANCELLED


def test_own_jobs_cap_the_schedulers_pessimism():
    """Slurm's estimate assumes our running jobs use their whole time limit;
    their predicted ends (history) give a tighter bound when nobody else waits."""
    from gridrpc.sed.batch.estimate import own_wait
    assert own_wait(now=0.0, free_cpus=2, need=1, running=[]) == 0.0
    assert own_wait(now=0.0, free_cpus=0, need=2, running=[(30.0, 1), (10.0, 1), (50.0, 4)]) == 30.0
    assert own_wait(now=0.0, free_cpus=0, need=9, running=[(30.0, 1)]) is None
    snap = _snap(free=0, total=4, queue_length=1, est_start=119.0, est_start_known=True)
    t = _tags(snap, num_pending=1, own_running=[(1005.0, 2), (1008.0, 2)])
    assert t["est_wait"] == 5.0 and t["est_wait_source"] == "scheduler+own"
    # someone else's job is pending too: keep the scheduler's word
    snap = _snap(free=0, total=4, queue_length=3, est_start=119.0, est_start_known=True)
    assert _tags(snap, num_pending=1, own_running=[(1005.0, 4)])["est_wait"] == 119.0
    # our own pending jobs are ahead of a new call
    snap = _snap(free=0, total=4, queue_length=1, est_start=119.0, est_start_known=True)
    assert _tags(snap, num_pending=1, own_pending_cpus=2,
                 own_running=[(1005.0, 2), (1008.0, 2)])["est_wait"] == 8.0


def test_restart_resumes_cancels_and_adopts_jobs_that_started(tmp_path):
    """State left by a SeD killed at awkward moments: a cancel not yet
    verified is carried out; a job whose sbatch answer was lost but which
    started (``started.json`` names it) is followed to its end."""
    fake = FakeBackend()
    jobs = tmp_path / "shared" / "fsed" / "jobs"
    for cid in ("to-cancel", "started-unknown"):
        (jobs / cid).mkdir(parents=True)
    jid_cancel = fake.submit(JobSpec(script="#!/bin/sh\n", env={"GRIDRPC_CALL_ID": "to-cancel"}))
    jobfiles.write_json(jobs / "to-cancel" / "meta.json", {
        "call_id": "to-cancel", "service": "add", "user": "u", "received": time.time(),
        "state": "cancelling", "job_id": jid_cancel, "cancel_requested": True, "written": True})
    jobfiles.write_call(jobs / "started-unknown", target="gridrpc.examples.services:add", service="add",
                        call_id="started-unknown", args=[20, 22], kwargs={})
    jid_started = fake.submit(JobSpec(script="#!/bin/sh\nx " + str(jobs / "started-unknown") + "\n",
                                      env={"GRIDRPC_CALL_ID": "started-unknown"}))
    jobfiles.write_json(jobs / "started-unknown" / "meta.json", {
        "call_id": "started-unknown", "service": "add", "user": "u", "received": time.time(),
        "state": "submitting", "written": True})
    jobfiles.write_json(jobs / "started-unknown" / "started.json", {"job_id": jid_started})
    with fake_sed(tmp_path, fake) as sed:
        _wait(lambda: jid_cancel in fake.cancelled, what="the unfinished cancel")
        _wait(lambda: not (jobs / "to-cancel").exists(), what="its directory to go")
        assert sed.test_loop.call(sed.jobs)["started-unknown"]["job_id"] == jid_started
        fake.run(jid_started)
        _wait(lambda: sed.test_loop.call(sed.jobs).get("started-unknown", {}).get("state") == "done",
              what="the adopted job's answer to be kept")
        # the answer is held in memory at once and written to disk off the loop (_io_call): wait for the file
        _wait(lambda: jobfiles.read_reply(jobs / "started-unknown") is not None, what="the kept answer on disk")
        assert jobfiles.read_reply(jobs / "started-unknown")[0]["value"] == 42


def test_state_files_results_and_job_scripts_are_written_off_the_event_loop(tmp_path, monkeypatch):
    """Before: meta.json (with an fsync), job.sh, history.jsonl and kept answers
    (reply.json/.bin: result buffers) were written by the SeD's event loop."""
    import builtins
    import importlib
    import pkgutil
    import gridrpc.sed.batch as batch_pkg

    on_loop: list[str] = []
    loop_thread: list[int] = []

    def watch(name, fn):
        def wrapper(*a, **kw):
            if loop_thread and threading.get_ident() == loop_thread[0]:
                on_loop.append(f"{name}({a[0] if a else ''})")
            return fn(*a, **kw)
        return wrapper

    for name in ("write_json", "read_json", "write_buffers", "read_buffers", "write_call", "write_reply",
                 "read_reply", "read_outcome", "tail"):
        monkeypatch.setattr(jobfiles, name, watch(name, getattr(jobfiles, name)))
    for info in pkgutil.iter_modules(batch_pkg.__path__):     # open() in any module of the batch SeD
        mod = importlib.import_module(f"gridrpc.sed.batch.{info.name}")
        if info.name not in ("jobfiles", "run_job"):
            monkeypatch.setattr(mod, "open", watch("open", builtins.open), raising=False)
    fake = FakeBackend()
    lt = LoopThread()
    loop_thread.append(lt.thread.ident)
    try:
        with fake_sed(tmp_path, fake, lt=lt) as sed, _client() as c:
            call = c.submit("echo", np.arange(1000.0), server=_addr(sed))
            fake.run(fake.wait_jobs(1))
            assert (call.result(timeout=10) == np.arange(1000.0)).all()
            # an answer nobody is there to take is kept on disk
            s = zmq.Context.instance().socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(sed.address)
            from gridrpc.core import codec
            bufs: list = []
            tree = codec.encode([b"x" * 5000], bufs)
            s.send_multipart([m.dumps(m.make(MsgType.CALL, "gone-client", service="echo", args=tree,
                                             kwargs={}, sed="fsed")), *bufs])
            assert s.poll(5000)
            s.close()
            time.sleep(0.2)
            fake.run(fake.wait_jobs(2))
            _wait(lambda: lt.call(sed.jobs).get("gone-client", {}).get("state") == "done", what="kept answer")
            # cancelled and refused calls
            call = c.submit("sleep", 100, server=_addr(sed))
            fake.wait_jobs(3)
            call.cancel()
            fake.refuse = "no"
            with pytest.raises(gridrpc.RemoteError):
                c.call("add", 1, 1, server=_addr(sed), timeout=10)
        assert not on_loop, f"blocking file I/O on the event loop: {on_loop}"
    finally:
        lt.close()


def test_requeue_false_reaches_every_schedulers_options_after_the_sites():
    """``JobSpec.requeue=False`` (a non-idempotent call): Slurm ``--no-requeue``
    and Grid Engine ``-r n`` after the site's options (the last one wins), OAR
    without the ``idempotent`` type; ``None`` leaves the site's choice."""
    from gridrpc.sed.batch.oar import oarsub_options, render_job_script as oar_script
    from gridrpc.sed.batch.sge import qsub_options
    from gridrpc.sed.batch.slurm import render_job_script as slurm_script, sbatch_options
    from gridrpc.sed.batch.base import JobSpec
    base = JobSpec(script="#!/bin/sh\n", name="j")
    never = dataclasses.replace(base, requeue=False)
    assert sbatch_options(dataclasses.replace(never, extra_options=("--requeue",)))[-2:] == ["--requeue",
                                                                                             "--no-requeue"]
    assert "#SBATCH --no-requeue" in slurm_script(never, ["true"])
    assert not any("requeue" in o for o in sbatch_options(base))
    assert qsub_options(dataclasses.replace(never, extra_options=("-r y",)))[-2:] == [["-r", "y"], ["-r", "n"]]
    assert not any(o[0] == "-r" for o in qsub_options(base))
    site = ("-t idempotent", "--type=besteffort,idempotent", "-p cluster=a")
    assert oarsub_options(dataclasses.replace(base, extra_options=site))[-5:] == [
        "-t", "idempotent", "--type=besteffort,idempotent", "-p", "cluster=a"]
    opts = oarsub_options(dataclasses.replace(never, extra_options=site))
    assert "idempotent" not in " ".join(opts) and opts[-3:] == ["--type=besteffort", "-p", "cluster=a"]
    script = oar_script(dataclasses.replace(never, extra_options=site), ["true"])
    assert "idempotent" not in script and "#OAR --type=besteffort" in script
    with pytest.raises(ValueError, match="requeue"):
        JobSpec(script="#!/bin/sh\n", requeue="no")
