"""The registry of SeD kinds (gridrpc.sed.backends.registry): a kind
registered in-process is accepted by ``gridrpc sed``'s parser, by the
deployment-file check and by the deployment runner's command line, with no
edit elsewhere; the built-in kinds agree with their execution back-ends."""
from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import pytest

from gridrpc.deploy.spec import load
from gridrpc.errors import ConfigError, ProtocolError
from gridrpc.sed.backends.registry import (BackendKind, get_kind, kind_for_args, kind_names, register_kind,
                                           unregister_kind)


class ToySeD:
    """What the toy kind builds: a stand-in for a SeD (nothing is started)."""

    def __init__(self, name: str, address: str, speed: int) -> None:
        self.name, self.address, self.speed = name, address, speed


def _add_toy_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("toy SeD", "calls run by the toy back-end")
    g.add_argument("--toy-speed", type=int, default=None, metavar="N", help="how fast the toy runs")


def _check_speed(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"toy_speed must be a positive whole number, not {value!r}")
    return value


def _check_toy_entry(settings, what: str) -> None:
    try:
        _check_speed(settings.get("toy_speed", 1))
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from None


TOY = BackendKind(name="toy", summary="a test kind", backends=("toy",), server_type="toy",
                  selected=lambda a: a.toy_speed is not None, add_arguments=_add_toy_arguments,
                  build=lambda a, address, common: ToySeD(a.name, address, _check_speed(a.toy_speed)),
                  keys=frozenset({"toy_speed"}), check_entry=_check_toy_entry,
                  entry_args=lambda s, what: ["--toy-speed", str(s.get("toy_speed", 1))])


@pytest.fixture
def toy():
    register_kind(TOY)
    try:
        yield TOY
    finally:
        unregister_kind("toy")
    assert "toy" not in kind_names()


DEPLOYMENT = """\
master_agent: {name: MA, host: localhost, port: 0}
seds:
  - {name: plain-1, parent: MA, services: [gridrpc.examples.services:add]}
  - name: toy-1
    parent: MA
    kind: toy
    toy_speed: 3
    services: [gridrpc.examples.services:add]
"""


def _problems(tmp_path, text: str) -> str:
    f = tmp_path / "d.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load(f)
    return str(info.value)


def test_a_registered_kind_gets_its_flags_and_builds_its_sed(toy, monkeypatch):
    """``gridrpc sed --toy-speed 5``: the flag exists, selects the kind, and
    the daemon command runs what the kind built."""
    from gridrpc import _run
    from gridrpc.cli import build_parser
    from gridrpc.cli.daemons import cmd_daemon
    ap = build_parser("sed")
    assert "--toy-speed" in ap._subparsers._group_actions[0].choices["sed"].format_help()
    a = ap.parse_args(["sed", "--name", "t1", "--port", "0", "--toy-speed", "5",
                       "--service", "gridrpc.examples.services:add"])
    assert kind_for_args(a) is toy
    ran = []
    monkeypatch.setattr(_run, "run_daemon", lambda d, ready=None: ran.append(d))
    assert cmd_daemon(a) is None and len(ran) == 1
    assert isinstance(ran[0], ToySeD) and (ran[0].name, ran[0].speed) == ("t1", 5)
    assert ran[0].address == "tcp://127.0.0.1:0"
    # the kind's own error reaches the user as any SeD's
    a = ap.parse_args(["sed", "--name", "t1", "--toy-speed", "0", "--service", "gridrpc.examples.services:add"])
    assert cmd_daemon(a) == 2 and len(ran) == 1
    # without its flag, the plain SeD is built
    a = ap.parse_args(["sed", "--name", "t1", "--service", "gridrpc.examples.services:add"])
    assert kind_for_args(a).name == "sed"


def test_a_registered_kind_is_a_deployment_kind_and_reaches_the_command_line(toy, tmp_path):
    from gridrpc.deploy.runner import Deployment
    f = tmp_path / "d.yaml"
    f.write_text(DEPLOYMENT)
    spec = load(f)
    d = Deployment(spec, state_dir=str(tmp_path / "state"))
    d.addresses.update(MA="tcp://a:1")
    cmd = d.command(spec.element("toy-1"))
    assert cmd[cmd.index("--toy-speed") + 1] == "3" and cmd[cmd.index("--name") + 1] == "toy-1"
    assert "--toy-speed" not in d.command(spec.element("plain-1"))
    # its check, its unknown keys and its values: file, line and field named
    msg = _problems(tmp_path, DEPLOYMENT.replace("toy_speed: 3", "toy_speed: 0"))
    assert f"{f}:7: seds[1].toy_speed (SeD toy-1): SeD toy-1: toy_speed must be a positive" in msg, msg
    msg = _problems(tmp_path, DEPLOYMENT.replace("toy_speed: 3", "toy_sped: 3"))
    assert f"{f}:7: seds[1].toy_sped" in msg and "did you mean toy_speed" in msg, msg


def test_kinds_not_registered_are_refused_with_the_known_ones(toy, tmp_path):
    msg = _problems(tmp_path, DEPLOYMENT.replace("kind: toy", "kind: toys"))
    assert "seds[1].kind" in msg and "'toys'" in msg, msg
    assert all(f"'{name}'" in msg for name in ("sed", "batch", "cloud", "toy")), msg
    # a plain SeD does not take the toy's keys
    msg = _problems(tmp_path, DEPLOYMENT.replace("    kind: toy\n", ""))
    assert "seds[1].toy_speed" in msg and "unknown keys toy_speed" in msg, msg
    with pytest.raises(ConfigError, match="unknown kind 'toys'; known: sed, batch, cloud, toy"):
        get_kind("toys")


def test_kind_names_are_checked():
    for bad in ("", "a b", "ma", "x/y"):
        with pytest.raises(ValueError, match="SeD kind name"):
            register_kind(BackendKind(name=bad, summary="", backends=(), server_type="x", build=lambda *a: None))
    assert kind_names()[:3] == ["sed", "batch", "cloud"]


def test_built_in_kinds_match_their_execution_backends():
    """Each built-in kind names the back-ends its SeDs run and their
    ``server_type`` estimation tag."""
    import gridrpc.sed.backends.local  # noqa: F401 - registers process and inline
    from gridrpc.sed.backends import BACKENDS
    from gridrpc.sed.batch.jobs import BatchJobs
    from gridrpc.sed.batch.pilots import PilotJobs
    from gridrpc.sed.cloud.vms import CloudVMs
    classes = {"batch": BatchJobs, "pilot": PilotJobs, "cloud": CloudVMs,
               "process": BACKENDS["process"], "inline": BACKENDS["inline"]}
    seen = []
    for name in ("sed", "batch", "cloud"):
        kind = get_kind(name)
        for backend in kind.backends:
            cls = classes[backend]
            assert cls.name == backend and cls.server_type == kind.server_type, (name, backend)
            seen.append(backend)
    assert sorted(seen) == sorted(classes)
    # the built-in kinds' flags are those of gridrpc sed
    from gridrpc.cli import build_parser
    a = build_parser("sed").parse_args(["sed", "--name", "b", "--batch", "slurm"])
    assert kind_for_args(a).name == "batch"
    a = build_parser("sed").parse_args(["sed", "--name", "c", "--cloud", "max_vms=2"])
    assert kind_for_args(a).name == "cloud"
    a = build_parser("sed").parse_args(["sed", "--name", "c", "--cloud", "max_vms=2", "--batch", "oar"])
    assert kind_for_args(a).name == "batch"                   # --batch wins, as the order of BUILTIN says


# --------------------------------------------------------------------------- estimation tags and reply details

def _unstarted_seds(tmp_path):
    """A batch SeD (a job per call), a pilot SeD and a cloud SeD, built as
    ``gridrpc sed`` builds them but not started: their back-ends' estimates
    and replies are computed from their settings and state alone."""
    from gridrpc.sed.batch.config import parse_batch_config
    from gridrpc.sed.batch.sed import BatchSeD
    from gridrpc.sed.cloud.config import parse_cloud_config
    from gridrpc.sed.cloud.sed import CloudSeD
    jobs = BatchSeD("b1", None, config=parse_batch_config({"scheduler": "slurm", "shared_dir": str(tmp_path / "b")}))
    pilots = BatchSeD("p1", None, config=parse_batch_config(
        {"scheduler": "oar", "shared_dir": str(tmp_path / "p"), "pilot": {"max_pilots": 2, "host": "127.0.0.1"}}))
    cloud = CloudSeD("c1", None, config=parse_cloud_config(
        {"image": "ami-1", "instance_type": "t3.micro", "services": ["gridrpc.examples.services:add"]}))
    for sed in (jobs, pilots):
        sed.add_service("add", "gridrpc.examples.services:add")
    return jobs, pilots, cloud


def _vector(sed) -> dict:
    import time
    replica = next(iter(sed.replicas.values()))
    return sed.execution.estimate(replica, sed.services["add"], "alice", time.time())


def test_built_in_kinds_declare_exactly_the_estimation_tags_their_seds_send(tmp_path):
    """A kind's ``tags`` are the tags its SeDs add to the standard ones: every
    vector stays within them, and every declared tag is sent by some SeD of
    the kind (a job per call in each state of the cluster, pilots, VMs) and
    documented on the kind's page."""
    from gridrpc import SeD
    from gridrpc.core.estimation import STANDARD_TAGS
    from gridrpc.sed.batch.base import ClusterInfo
    from gridrpc.sed.batch.estimate import ClusterSnapshot, batch_tags
    jobs, pilots, cloud = _unstarted_seds(tmp_path)
    plain = SeD("s1", None)
    plain.add_service("add", "gridrpc.examples.services:add")
    cluster = ClusterInfo(partition="debug", total_cpus=8, free_cpus=8, total_nodes=2, free_nodes=2,
                          max_walltime=3600.0, available=True)
    common = dict(now=1000.0, tcomp=10.0, tcomp_source="service", cpus_per_job=1, walltime=60.0, num_pending=0,
                  num_running=0, queued_here=0, submitted_cpus_since=0, max_jobs=4, last_solve=None,
                  scheduler="slurm", partition="debug")
    batch = [_vector(jobs), _vector(pilots),
             batch_tags(snapshot=ClusterSnapshot(taken=990.0, cluster=cluster, queue_length=0, est_start=5.0,
                                                 est_start_known=True), **common),
             batch_tags(snapshot=ClusterSnapshot(taken=990.0, cluster=cluster, impossible="too big"), **common)]
    sent = {"sed": [_vector(plain)], "batch": batch, "cloud": [_vector(cloud)]}
    docs = {"batch": "docs/batch.md", "cloud": "docs/cloud.md"}
    root = Path(__file__).resolve().parent.parent
    for name, vectors in sent.items():
        kind = get_kind(name)
        extra = set().union(*(set(v) - set(STANDARD_TAGS) for v in vectors))
        assert extra == kind.tags, (name, sorted(extra ^ kind.tags))
        assert all(v["server_type"] == kind.server_type for v in vectors), name
        if name in docs:
            text = (root / docs[name]).read_text()
            missing = [t for t in sorted(kind.tags) if f"`{t}`" not in text and f"`{t}:" not in text]
            assert not missing, f"{docs[name]} does not describe {missing}"
    assert get_kind("sed").tags == frozenset()


def test_replies_say_what_each_backend_did_under_its_own_name(tmp_path):
    """A batch job's, a pilot's and a VM's answer carry their detail in the
    ``backend`` field under the back-end's name (one of its kind's
    ``backends``), which the wire check of gridrpc.core accepts without
    knowing the names; a relay keeps what the SeD it relays said."""
    from gridrpc.core import messages as m
    from gridrpc.core.messages import MsgType
    from gridrpc.sed.backends import with_backend
    from gridrpc.sed.batch import jobfiles
    from gridrpc.sed.batch.base import JobInfo, JobState
    from gridrpc.sed.batch.state import CallJob
    jobs, pilots, cloud = _unstarted_seds(tmp_path)
    job = CallJob(call_id="c1", dir=str(tmp_path), service="add", user="alice", received=1.0, job_id="12")
    info = JobInfo(job_id="12", state=JobState.FAILED, reason="NonZeroExitCode", exit_code=3, signal=0,
                   node_list=("n1", "n2"), raw_state="FAILED")
    ok = jobs.execution._reply("c1", job, info, jobfiles.Outcome(ok=True, value=3), "")
    failed = jobs.execution._reply("c2", job, info, None, "last words")
    # the VM's and the pilot's SeDs answered a call; their relays add their own detail
    inner = m.make(MsgType.RESULT, "r1", value=3, server="vm-sed", backend={"batch": {"job_id": "9"}})
    on_vm = cloud.execution.relay_answered(SimpleNamespace(id="c3"), "c1-vm-1", MsgType.RESULT, inner, [])
    on_pilot = pilots.execution.relay_answered(SimpleNamespace(id="c4"), "pilot-1", MsgType.ERROR,
                                               m.error_header("r2", "remote", "boom", server="pilot-sed"), [])
    got = {}
    for backend, outcome in (("batch", ok), ("batch", failed), ("cloud", on_vm), ("pilot", on_pilot)):
        mt, h = m.parse_header(m.dumps(outcome.header))       # what the client checks
        assert mt is (MsgType.RESULT if outcome.ok else MsgType.ERROR)
        got.setdefault(backend, []).append(h["backend"])
    assert got["batch"][0]["batch"] == {"job_id": "12", "state": "FAILED", "raw_state": "FAILED",
                                        "reason": "NonZeroExitCode", "exit_code": 3, "signal": 0,
                                        "nodes": ["n1", "n2"], "scheduler": "slurm"}
    assert "exit code 3" in failed.header["error"]["message"] and got["batch"][1] == got["batch"][0]
    assert got["cloud"] == [{"batch": {"job_id": "9"}, "cloud": {"vm": "c1-vm-1"}}]
    assert got["pilot"] == [{"pilot": {"pilot": "pilot-1"}}]
    assert inner.get("backend") == {"batch": {"job_id": "9"}}           # the relayed header is not changed
    for kind in ("batch", "cloud"):
        assert {b for b, _ in got.items() if b in get_kind(kind).backends} == set(get_kind(kind).backends)
    # a new kind's detail needs nothing in gridrpc.core; the bounds still hold
    toy = with_backend(m.make(MsgType.RESULT, "r3", value=1), "toy", {"speed": 3, "lanes": ["a", "b"]})
    assert m.parse_header(m.dumps(toy))[1]["backend"] == {"toy": {"speed": 3, "lanes": ["a", "b"]}}
    with pytest.raises(ProtocolError, match="backend"):
        m.parse_header(m.dumps(with_backend(toy, "toy", {"speed": {"nested": 1}})))
