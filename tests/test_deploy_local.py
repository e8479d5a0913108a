"""``gridrpc deploy`` on this machine (no root needed): the ready file
deployments/local.yaml on free ports, from separate processes ("shells"), a
broken element, and the deployment file syntax."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest
import yaml

from gridrpc.deploy.runner import Deployment, format_status
from gridrpc.deploy.spec import DEFAULT_ORPHAN_TIMEOUT, parse
from gridrpc.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
LOCAL_YAML = REPO / "deployments" / "local.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gridrpc(*args, env=None, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gridrpc", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def procs_in(directory: Path) -> list[psutil.Process]:
    """Processes whose working directory is ``directory`` (local elements run there)."""
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.cwd() == str(directory):
                out.append(p)
        except (psutil.Error, OSError):
            pass
    return out


@pytest.fixture
def local_file(tmp_path):
    """deployments/local.yaml with free ports instead of 5555/8080."""
    data = yaml.safe_load(LOCAL_YAML.read_text())
    data["master_agent"].update(port=free_port(), http_port=free_port())
    data["heartbeat"] = {"interval": 0.3, "timeout": 1.0}
    f = tmp_path / "local.yaml"
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    return f, data["master_agent"]["port"], data["master_agent"]["http_port"]


def test_local_yaml_up_status_logs_down(local_file, tmp_path):
    f, port, http_port = local_file
    home = tmp_path / "home"            # state under $GRIDRPC_HOME/deployments/local
    env = {"GRIDRPC_HOME": str(home)}
    r = gridrpc("deploy", "up", str(f), env=env)
    try:
        assert r.returncode == 0, r.stderr
        ma = f"tcp://127.0.0.1:{port}"
        assert r.stdout.strip() == f"MA: {ma}"
        for name in ("MA", "LA1", "LA2", "sed-1", "sed-2", "sed-3", "sed-4"):
            assert re.search(rf"{name} on localhost: serving at tcp://127\.0\.0\.1:\d+ \(pid \d+", r.stderr)
        assert "registered at the MA: 7/7" in r.stderr
        state = home / "deployments" / "local" / "state.json"
        assert state.exists()

        c = gridrpc("call", "add", "1", "2", "--ma", ma)
        assert c.returncode == 0 and c.stdout.strip() == "3", c.stderr
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/api/tree", timeout=5) as resp:
            assert resp.status == 200

        s = gridrpc("deploy", "status", "local", "--json", env=env)       # by name, another process
        assert s.returncode == 0, s.stderr
        rows = {row["name"]: row for row in json.loads(s.stdout)}
        assert len(rows) == 7
        assert all(row["process"] == "running" and row["tree"] == "alive" for row in rows.values())
        assert rows["LA1"]["load"]["children"] == 2 and rows["sed-4"]["parent"] == "LA2"
        tree_text = format_status(list(rows.values()))                   # the human form: a tree
        assert "├─ LA1" in tree_text and "│  ├─ sed-1" in tree_text and "└─ sed-4" in tree_text

        lg = gridrpc("deploy", "logs", str(f), "sed-3", "-n", "200", env=env)        # by file
        assert lg.returncode == 0 and 'READY {"name": "sed-3"' in lg.stdout
        lg = gridrpc("deploy", "logs", "local", "nobody", env=env)
        assert lg.returncode == 1 and "no element named 'nobody'" in lg.stderr

        again = gridrpc("deploy", "up", str(f), env=env)
        assert again.returncode == 1 and "already running" in again.stderr
        pids = [row["pid"] for row in rows.values()]
    finally:
        d = gridrpc("deploy", "down", str(f), env=env)
    assert d.returncode == 0, d.stderr
    assert "stopped 7 element(s)" in d.stdout
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
    assert not procs_in(home / "deployments" / "local")
    assert not (home / "deployments" / "local" / "state.json").exists()
    d = gridrpc("deploy", "down", str(f), env=env)         # a second `down`: nothing to do, not an error
    assert d.returncode == 0 and "nothing running" in d.stdout


def test_broken_element_fails_clearly_and_leaves_nothing(tmp_path):
    spec = {"name": "broken", "heartbeat": {"interval": 0.3, "timeout": 1.0},
            "master_agent": {"name": "MA", "port": 0},
            "local_agents": [{"name": "LA1", "parent": "MA"}],
            "seds": [{"name": "good", "parent": "LA1", "examples": True, "isolation": "inline"},
                     {"name": "bad", "parent": "LA1", "services": ["no_such_module_zz:f"]}]}
    f = tmp_path / "broken.yaml"
    f.write_text(yaml.safe_dump(spec))
    st = tmp_path / "st"
    r = gridrpc("deploy", "up", str(f), "--state-dir", str(st))
    assert r.returncode == 1
    err = r.stderr
    assert "gridrpc deploy up: bad on host localhost" in err, err
    assert re.search(r"bad on host localhost (exited before it was ready|failed to start)", err), err
    assert "cannot load service" in err and "no_such_module_zz" in err      # the log tail says why
    assert re.search(r"stopping the [34] element\(s\) started", err)      # MA, LA1, good (+ bad, dead)
    pids = [int(p) for p in re.findall(r"serving at \S+ \(pid (\d+)", err)]
    assert len(pids) == 3
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not procs_in(st)
    assert not (st / "state.json").exists()


def test_wrong_python_on_local_host_is_a_clear_error(tmp_path):
    spec = {"hosts": {"here": {"launcher": "local", "python": "/nonexistent/bin/python3"}},
            "master_agent": {"name": "MA", "host": "here", "port": 0}}
    f = tmp_path / "nopy.yaml"
    f.write_text(yaml.safe_dump(spec))
    r = gridrpc("deploy", "up", str(f), "--state-dir", str(tmp_path / "st"))
    assert r.returncode == 1
    assert "host here (for MA): python '/nonexistent/bin/python3' not found" in r.stderr
    assert "nothing was started" in r.stderr


def test_python_api_and_state_survive_the_file(tmp_path):
    """Deployment objects: up, then status/down from a state directory alone
    (the file removed meanwhile), with progress going to a callback."""
    spec_data = {"name": "api", "heartbeat": {"interval": 0.3, "timeout": 1.0},
                 "master_agent": {"name": "MA", "port": 0},
                 "seds": [{"name": "s1", "parent": "MA", "examples": True, "isolation": "inline"}]}
    lines: list[str] = []
    with Deployment(parse(spec_data, name="api"), state_dir=tmp_path / "st", progress=lines.append) as d:
        summary = d.up()
    assert summary["ma"].startswith("tcp://127.0.0.1:") and set(summary["elements"]) == {"MA", "s1"}
    assert any("s1 on localhost: serving at" in x for x in lines)
    with Deployment.load_state(tmp_path / "st", progress=lines.append) as d2:
        rows = d2.status()
        assert [r["process"] for r in rows] == ["running", "running"]
        assert "READY" in d2.logs("s1")
        assert sorted(d2.down()) == ["MA", "s1"]
    assert not (tmp_path / "st" / "state.json").exists()


# -- the file format ------------------------------------------------------------

BASE = {"master_agent": {"name": "MA", "host": "localhost", "port": 0},
        "local_agents": [{"name": "LA", "parent": "MA", "host": "n2"}],
        "seds": [{"name": "s", "parent": "LA", "host": "n2", "examples": True}]}


def _spec(**hosts_and_top):
    data = json.loads(json.dumps(BASE))
    data["hosts"] = hosts_and_top.pop("hosts", {"n2": {"ssh": "n2.example.org"}})
    data.update(hosts_and_top)
    return parse(data)


def test_orphan_timeout_precedence():
    s = _spec()
    assert s.orphan_timeout_for(s.element("LA")) == DEFAULT_ORPHAN_TIMEOUT   # ssh host default
    assert s.orphan_timeout_for(s.element("MA")) is None                    # the root never
    s = _spec(hosts={"n2": {"ssh": "n2", "orphan_timeout": 12}}, orphan_timeout=50)
    assert s.orphan_timeout_for(s.element("LA")) == 12
    s = _spec(hosts={"n2": {"ssh": "n2"}}, orphan_timeout=50)
    assert s.orphan_timeout_for(s.element("LA")) == 50
    s = _spec(hosts={"n2": {"ssh": "n2"}}, orphan_timeout=None)
    assert s.orphan_timeout_for(s.element("s")) is None
    s = _spec(hosts={"n2": {"launcher": "local"}})
    assert s.orphan_timeout_for(s.element("LA")) is None                    # local: none by default
    data = json.loads(json.dumps(BASE))
    data["hosts"] = {"n2": {"ssh": "n2", "orphan_timeout": 9}}
    data["seds"][0]["orphan_timeout"] = 4
    s = parse(data)
    assert s.orphan_timeout_for(s.element("s")) == 4
    d = Deployment(s, state_dir="/tmp/unused")
    d.addresses.update(MA="tcp://a:1", LA="tcp://b:2")
    la, sed, ma = d.command(s.element("LA")), d.command(s.element("s")), d.command(s.element("MA"))
    assert la[la.index("--orphan-timeout") + 1] == "9" and la[la.index("--host") + 1] == "n2"
    assert sed[sed.index("--orphan-timeout") + 1] == "4" and sed[sed.index("--parent") + 1] == "tcp://b:2"
    assert "--orphan-timeout" not in ma


def test_host_fields():
    s = _spec(hosts={"n2": {"ssh": "10.0.0.2", "user": "grid", "port": 2222, "key": "~/.ssh/k",
                            "venv": "/opt/gr", "workdir": "/scratch/gr", "env": {"OMP_NUM_THREADS": 1},
                            "address": "192.168.1.2"}})
    h = s.hosts["n2"]
    assert h.target == "grid@10.0.0.2" and h.launcher == "ssh" and h.port == 2222
    assert h.address == "192.168.1.2" and h.env == {"OMP_NUM_THREADS": "1"}
    d = Deployment(s, state_dir="/tmp/unused")
    d.addresses.update(MA="tcp://127.0.0.1:1")
    cmd = d.command(s.element("LA"))
    assert cmd[0] == "/opt/gr/bin/python" and cmd[cmd.index("--host") + 1] == "192.168.1.2"
    s = _spec(hosts={"n2": {"ssh": "grid@node7"}})
    assert s.hosts["n2"].address == "node7" and s.hosts["n2"].target == "grid@node7"
    s = _spec(hosts={"n2": {"launcher": "slurm", "node": "cn12"}})
    assert s.hosts["n2"].launcher == "slurm" and s.hosts["n2"].address == "cn12"


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(bogus=1), "bogus: unknown keys bogus"),
    (lambda d: d["hosts"]["n2"].update(sshh="x"), "hosts.n2.sshh: unknown keys sshh (did you mean ssh?)"),
    (lambda d: d["hosts"].update(n3={"launcher": "ssh"}), "'ssh: user@host' is required"),
    (lambda d: d["seds"][0].update(parent="nobody"), "parent 'nobody' is not an agent"),
    (lambda d: d["seds"][0].update(host="n9"), "host 'n9' is not 'localhost' nor listed"),
    (lambda d: d["local_agents"][0].update(orphan_timeout=-1), "orphan_timeout (LA LA): must be > 0"),
    (lambda d: d["local_agents"][0].update(orphan_timeout="soon"), "orphan_timeout (LA LA): must be a number of seconds"),
    (lambda d: d.pop("master_agent"), "needs a 'master_agent"),
    (lambda d: d["seds"].append({"name": "LA", "parent": "MA", "examples": True}), "must be unique: LA"),
])
def test_bad_files_are_clear(mutate, message):
    data = json.loads(json.dumps(BASE))
    data["hosts"] = {"n2": {"ssh": "n2"}}
    mutate(data)
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(data)


@pytest.mark.parametrize("name", ["local", "two-hosts", "slurm-allocation"])
def test_ready_files_load(name):
    from gridrpc.deploy.spec import load
    spec = load(REPO / "deployments" / f"{name}.yaml")
    assert spec.name == name and spec.ma.name == "MA"
    launchers = {spec.host(e.host).launcher for e in spec.elements}
    assert launchers == {"local": {"local"}, "two-hosts": {"local", "ssh"}, "slurm-allocation": {"slurm"}}[name]
    d = Deployment(spec, state_dir="/tmp/unused")
    d.addresses = {e.name: "tcp://127.0.0.1:1" for e in spec.elements}
    for e in spec.elements:
        cmd = d.command(e)
        assert cmd[1:4] == ["-m", "gridrpc", e.kind]
        if spec.host(e.host).launcher != "local" and e.kind != "ma":
            assert "--orphan-timeout" in cmd       # remote agents/SeDs never outlive a lost tree
