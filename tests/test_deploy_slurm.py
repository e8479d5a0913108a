"""``gridrpc deploy`` with the ``slurm`` launcher inside an allocation of a
private Slurm (tests/slurm_cluster.py): one ``srun --overlap`` step per
element. The deploy command gets the environment ``salloc`` gives its shell
(``SLURM_JOB_ID``, ``SLURM_JOB_NODELIST``, ``SLURM_CONF``); ``down`` and
``status`` run from "another shell" without them."""
from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time

import psutil
import pytest
import yaml

from gridrpc.deploy.runner import Deployment, DeployError
from gridrpc.deploy.spec import load
from tests.conftest_slurm import slurm_cluster  # noqa: F401

pytestmark = [pytest.mark.slurm, pytest.mark.real]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def allocation(slurm_cluster):  # noqa: F811
    r = slurm_cluster.run(["salloc", "--no-shell", "-N1", "-J", "gridrpc-deploy-test"], check=False, timeout=60)
    m = re.search(r"allocation (\d+)", r.stderr)
    assert m, f"salloc failed: {r.stdout} {r.stderr}"
    yield m.group(1)
    slurm_cluster.run(["scancel", m.group(1)], check=False)


def gridrpc(env: dict, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gridrpc", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def our_steps(cluster, job: str) -> list[str]:
    r = cluster.run(["squeue", "--steps", f"--jobs={job}", "-h", "-o", "%i %j"], check=False)
    return [line for line in r.stdout.splitlines() if " gridrpc-" in line]


def spec_file(tmp_path, cluster, node: str | None = None):
    port = free_port()
    spec = {"name": "slurm-test", "heartbeat": {"interval": 0.3, "timeout": 1.0},
            "hosts": {"node1": {"launcher": "slurm", "node": node or "@0", "address": "127.0.0.1",
                                "python": sys.executable}},
            "master_agent": {"name": "MA", "host": "node1", "port": port},
            "local_agents": [{"name": "LA1", "parent": "MA", "host": "node1"}],
            "seds": [{"name": "sed-1", "parent": "LA1", "host": "node1", "examples": True,
                      "isolation": "inline"}]}
    f = tmp_path / "slurm.yaml"
    f.write_text(yaml.safe_dump(spec))
    return f, port


def test_deploy_inside_an_allocation(slurm_cluster, allocation, tmp_path):  # noqa: F811
    c = slurm_cluster
    f, port = spec_file(tmp_path, c)
    st = str(tmp_path / "st")
    in_alloc = {**c.full_env(), "SLURM_JOB_ID": allocation, "SLURM_JOB_NODELIST": c.node_name}
    other_shell = c.full_env()                      # no SLURM_JOB_ID: state says where things run
    r = gridrpc(in_alloc, "deploy", "up", str(f), "--state-dir", st)
    try:
        assert r.returncode == 0, r.stderr
        assert f"host node1: Slurm node {c.node_name} of job {allocation}" in r.stderr
        assert "registered at the MA: 3/3" in r.stderr
        steps = our_steps(c, allocation)
        assert len(steps) == 3 and all(s.startswith(f"{allocation}.") for s in steps), steps
        call = gridrpc(other_shell, "call", "add", "20", "22", "--ma", f"tcp://127.0.0.1:{port}")
        assert call.returncode == 0 and call.stdout.strip() == "42", call.stderr
        s = gridrpc(other_shell, "deploy", "status", str(f), "--state-dir", st, "--json")
        assert s.returncode == 0, s.stderr
        rows = {row["name"]: row for row in json.loads(s.stdout)}
        assert all(row["process"] == "running" and row["tree"] == "alive" for row in rows.values())
        state = json.loads((tmp_path / "st" / "state.json").read_text())
        assert {el["started"]["job_id"] for el in state["elements"].values()} == {allocation}
        lg = gridrpc(other_shell, "deploy", "logs", str(f), "sed-1", "--state-dir", st)
        assert lg.returncode == 0 and 'READY {"name": "sed-1"' in lg.stdout
        srun_pids = [row["pid"] for row in rows.values()]
    finally:
        d = gridrpc(other_shell, "deploy", "down", str(f), "--state-dir", st)
    assert d.returncode == 0, d.stderr
    assert "stopped 3 element(s)" in d.stdout
    deadline = time.monotonic() + 15
    while our_steps(c, allocation) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert our_steps(c, allocation) == []
    assert not [p for p in srun_pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_outside_an_allocation_or_wrong_node_is_a_clear_error(slurm_cluster, allocation, tmp_path,  # noqa: F811
                                                             monkeypatch):
    c = slurm_cluster
    for k, v in c.env.items():
        monkeypatch.setenv(k, v)

    def up(node: str) -> str:
        f, _ = spec_file(tmp_path, c, node=node)
        with Deployment(load(f), state_dir=tmp_path / "st", progress=lambda _: None) as d:
            with pytest.raises(DeployError) as ei:
                d.up()
            assert not d.started
        return str(ei.value)

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    err = up(c.node_name)
    assert "host node1 (for MA, LA1, sed-1): not inside a Slurm allocation (SLURM_JOB_ID is not set)" in err
    assert "nothing was started" in err
    monkeypatch.setenv("SLURM_JOB_ID", allocation)
    monkeypatch.setenv("SLURM_JOB_NODELIST", c.node_name)
    assert f"node 'nosuchnode7' is not in allocation {allocation} (nodes: {c.node_name})" in up("nosuchnode7")
    assert "node @3 but the allocation has only 1 node(s)" in up("@3")
    assert our_steps(c, allocation) == []
