"""A deployment with two master agents (one redundant root, active-active) on
this machine: deployments/two-mas.yaml's shape on free ports. Both MAs see
the whole tree and answer discoveries; with one MA killed (its pid, a process
this deployment started), calls through a client given both addresses still
succeed; `down` leaves no process behind. The same tree under CURVE: children
attach with one key per MA, clients reach each MA with its own key."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml

import gridrpc
from gridrpc.deploy.runner import Deployment, format_status
from gridrpc.deploy.spec import parse
from gridrpc.testing import wait_for

REPO = Path(__file__).resolve().parents[1]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _procs_in(directory: Path) -> list[int]:
    """Processes whose working directory is ``directory`` (local elements run there)."""
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.cwd() == str(directory) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (psutil.Error, OSError):
            pass
    return out


def two_mas(**top) -> dict:
    """deployments/two-mas.yaml on free ports: MA1 + MA2, LA1, sed-1 under LA1, sed-2 under MA2."""
    data = yaml.safe_load((REPO / "deployments" / "two-mas.yaml").read_text())
    data["heartbeat"] = {"interval": 0.3, "timeout": 1.0}
    data["master_agent"] = [{"name": "MA1", "port": 0}, {"name": "MA2", "port": 0}]
    data["seds"] = [{"name": "sed-1", "parent": "LA1", "examples": True, "isolation": "inline"},
                    {"name": "sed-2", "parent": "MA2", "examples": True, "isolation": "inline"}]
    data.update(top)
    return data


def test_two_mas_one_killed_calls_go_on(tmp_path):
    data = two_mas()
    state = tmp_path / "st"
    lines: list[str] = []
    d = Deployment(parse(data, name="two-mas"), state_dir=state, progress=lines.append)
    pids: list[int] = []
    try:
        summary = d.up()
        pids = [s.pid for s in d.started.values()]
        ma1, ma2 = summary["mas"]["MA1"], summary["mas"]["MA2"]
        assert summary["ma"] == f"{ma1},{ma2}" and ma1 != ma2
        assert "  registered at MA1: 4/4" in lines and "  registered at MA2: 4/4" in lines, lines
        assert any(f"2 MAs at {ma1},{ma2}" in x for x in lines), lines

        # each MA on its own holds the whole tree and answers discoveries for both SeDs
        for ma in (ma1, ma2):
            with gridrpc.Client(ma, discovery_timeout=5) as c:
                assert {s.name for s in c.discover("add", 10)} == {"sed-1", "sed-2"}, ma
                assert c.call("add", 1, 2) == 3

        rows = {r["name"]: r for r in d.status()}
        assert all(r["process"] == "running" and r["tree"] == "alive" for r in rows.values()), rows
        assert rows["LA1"]["tree_at"] == {"MA1": "alive", "MA2": "alive"}
        assert rows["MA2"]["tree_at"] == {"MA2": "alive"}                 # an MA: itself only
        text = format_status(list(rows.values()))
        assert text.splitlines()[1].startswith("MA1") and text.splitlines()[2].startswith("MA2"), text

        # kill MA1 (a process this deployment started, by its pid): calls go through MA2
        ma1_pid = d.started["MA1"].pid
        os.kill(ma1_pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while not _gone(ma1_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(ma1_pid)
        with gridrpc.Client([ma1, ma2], discovery_timeout=5) as c:
            assert [c.call("add", i, 1) for i in range(10)] == [i + 1 for i in range(10)]
            assert {s.name for s in c.discover("add", 10)} == {"sed-1", "sed-2"}
        r = subprocess.run([sys.executable, "-m", "gridrpc", "call", "add", "2", "3", "--ma", summary["ma"]],
                           capture_output=True, text=True, timeout=30)     # the list `deploy up` prints
        assert r.returncode == 0 and r.stdout.strip() == "5", r.stderr

        rows = {r["name"]: r for r in d.status()}
        assert rows["MA1"]["process"] == "stopped" and rows["MA1"]["tree"] == "absent"
        assert rows["MA1"]["tree_at"] == {"MA1": "no answer"}
        assert rows["MA2"]["tree"] == "alive" and rows["sed-1"]["tree"] == "alive"
        assert rows["sed-1"]["tree_at"] == {"MA1": "no answer", "MA2": "alive"}
    finally:
        stopped = d.down()
        d.close()
    assert set(stopped) >= {"MA2", "LA1", "sed-1", "sed-2"}
    assert len(pids) == 5 and all(_gone(p) for p in pids), [p for p in pids if not _gone(p)]
    assert not _procs_in(state)
    assert not (state / "state.json").exists()


def test_two_mas_under_security(tmp_path):
    """CURVE on every link: children get --parent-key MA1,MA2, clients one key per MA."""
    state = tmp_path / "st"
    d = Deployment(parse(two_mas(security={"enabled": True}), name="two-mas-secure"), state_dir=state,
                   progress=lambda line: None)
    pids: list[int] = []
    try:
        summary = d.up()                          # creates the keys; waits until each MA sees all (CURVE)
        pids = [s.pid for s in d.started.values()]
        keys = state / "keys"
        assert {p.stem for p in (keys / "elements").glob("*.key")} == {"MA1", "MA2", "LA1", "sed-1", "sed-2"}
        la_cmd = d.command(d.spec.element("LA1"))
        assert la_cmd[la_cmd.index("--parent-key") + 1] == "MA1,MA2"
        opts = d.client_options()
        assert opts["ma_key"] == "MA1,MA2"
        for ma in (summary["mas"]["MA1"], summary["mas"]["MA2"]):        # each MA, with its own key
            with gridrpc.Client(ma, discovery_timeout=5, **d.client_options(
                    [n for n, a in summary["mas"].items() if a == ma])) as c:
                assert {s.name for s in c.discover("add", 10)} == {"sed-1", "sed-2"}
        r = subprocess.run([sys.executable, "-m", "gridrpc", "call", "add", "4", "5", "--ma", summary["ma"],
                            "--keys", opts["keys"], "--key", opts["key"], "--ma-key", "MA1,MA2"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and r.stdout.strip() == "9", r.stderr
        rows = d.status()
        assert all(r["process"] == "running" and r["tree"] == "alive" for r in rows), rows
    finally:
        d.down()
        d.close()
    assert len(pids) == 5 and all(_gone(p) for p in pids)
    assert not _procs_in(state)


def test_two_sites_federated_by_their_deployment_files(tmp_path):
    """Two deployments (two sites) whose MAs list each other in ``peers:``:
    a client of site A gets the service only site B offers; both come down
    clean."""
    import socket

    def port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    pa, pb = port(), port()
    site_a = {"heartbeat": {"interval": 0.3, "timeout": 1.0},
              "master_agent": {"name": "MA-A", "port": pa, "peers": [f"tcp://127.0.0.1:{pb}"]},
              "seds": [{"name": "sed-a", "parent": "MA-A", "isolation": "inline",
                        "services": ["gridrpc.examples.services:add"]}]}
    site_b = {"heartbeat": {"interval": 0.3, "timeout": 1.0},
              "master_agent": {"name": "MA-B", "port": pb, "peers": [f"tcp://127.0.0.1:{pa}"], "peer_hops": 1},
              "seds": [{"name": "sed-b", "parent": "MA-B", "isolation": "inline",
                        "services": ["gridrpc.examples.services:echo"]}]}
    da = Deployment(parse(site_a, name="site-a"), state_dir=tmp_path / "a", progress=lambda line: None)
    db = Deployment(parse(site_b, name="site-b"), state_dir=tmp_path / "b", progress=lambda line: None)
    pids: list[int] = []
    try:
        ma_a = da.up()["ma"]
        db.up()
        pids = [s.pid for d in (da, db) for s in d.started.values()]
        with gridrpc.Client(ma_a, discovery_timeout=5, timeout=20) as c:
            assert c.call("add", 1, 2) == 3

            def peer_linked() -> bool:
                # MA-A started before MA-B: its link to the peer reconnects within a second
                try:
                    return bool(c.discover("echo", 1))
                except (gridrpc.CommunicationError, gridrpc.NoServerAvailable, gridrpc.ServiceNotFound):
                    return False
            wait_for(peer_linked, 15, "site B's echo reachable from site A")
            call = c.submit("echo", "from site A")
            assert call.result(timeout=20) == "from site A" and call.server == "sed-b"
    finally:
        for d in (da, db):
            d.down()
            d.close()
    assert len(pids) == 4 and all(_gone(p) for p in pids)
