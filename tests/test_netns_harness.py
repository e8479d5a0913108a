"""The namespace cluster harness and the SSH launcher against real sshd's.

Every ssh client and TCP probe runs on a namespace host (``cluster.exec`` /
``cluster.wrapper``); nothing here sends to the test subnet from the root
namespace. Each host has its own PID and mount namespaces and a private
directory (``cluster.host_dir``), so the launcher's pids and files are
checked *as the remote host sees them*: a launcher that ran its commands
locally would fail here.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gridrpc.deploy.launchers import (
    AuthenticationFailed, ExitedImmediately, HostKeyMismatch, HostUnreachable, LaunchError,
    PythonMissing, SSHHostConfig, SSHLauncher, Started,
)
from tests.conftest_netns import netns_cluster  # noqa: F401
from tests.netns import (
    NetnsCluster, _pid_alive, blackhole_present, netns_list, netns_pids, route_holders,
)
from tests.requirements import require

pytestmark = [pytest.mark.netns, pytest.mark.real]

REPO = str(Path(__file__).resolve().parents[1])
HTTP_PORT = 8765


def _config(cluster: NetnsCluster, tmp_path: Path, *, to: str = "h2", frm: str = "h1",
            **over) -> SSHHostConfig:
    kw = dict(target=f"root@{cluster.address(to)}", key_path=str(cluster.client_key),
              known_hosts=str(cluster.known_hosts), ssh_config="/dev/null",
              wrapper=tuple(cluster.wrapper(frm)), python=sys.executable,
              workdir=f"{cluster.host_dir}/{tmp_path.name}", env={"PYTHONPATH": REPO},
              connect_timeout=3, check_window=0.5)
    kw.update(over)
    assert kw["wrapper"], "the ssh client must run inside a namespace"
    return SSHHostConfig(**kw)


# Runs first in this module, before the module-scoped fixture exists.
def test_stop_leaves_nothing_behind():
    require("netns", "sshd")
    cluster = NetnsCluster(2)
    with cluster:
        prefix, tmp = cluster.prefix, cluster.tmp
        assert set(cluster.namespaces()) <= set(netns_list())
        assert blackhole_present(cluster.subnet)
        sshd = list(cluster.sshd_pids.values())
        assert all(_pid_alive(p) for p in sshd)
        tracked = cluster.popen("h1", ["sleep", "300"])
        # a daemonised process the cluster never saw: found through `ip netns pids`
        cluster.exec("h2", "sleep 300 >/dev/null 2>&1 </dev/null & echo $!")
        stray = [p for p in netns_pids(cluster.ns("h2")) if p not in sshd]
        assert stray
    assert not [ns for ns in netns_list() if ns.startswith(prefix)]
    for pid in sshd + stray + [tracked.pid]:
        assert not _pid_alive(pid), pid
    assert tmp is not None and not tmp.exists()
    if not route_holders(cluster.subnet):  # no concurrent cluster holds the route
        assert not blackhole_present(cluster.subnet)
        assert "10.200." not in subprocess.run(["ip", "route"], capture_output=True, text=True).stdout


def test_hosts_reach_each_other(netns_cluster):
    c = netns_cluster
    assert c.tcp_check("h1", c.address("h2"), 22)
    assert c.tcp_check("h2", c.address("h3"), 22)
    addrs = c.exec("h3", ["ip", "-4", "-o", "addr", "show", "dev", "eth0"]).stdout
    assert c.address("h3") in addrs


def test_ssh_from_h1_to_h2_runs_a_command(netns_cluster):
    c = netns_cluster
    res = subprocess.run(c.ssh_cmd("h1", "h2", "ip -4 -o addr show dev eth0"),
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert c.address("h2") in res.stdout  # it ran inside h2's namespace


@pytest.mark.parametrize("silent", [False, True], ids=["link-down", "silent"])
def test_partition_and_heal(netns_cluster, silent):
    c = netns_cluster
    assert c.tcp_check("h1", c.address("h2"), 22)
    c.partition("h2", silent=silent)
    try:
        assert not c.tcp_check("h1", c.address("h2"), 22, timeout=1.0)
        assert c.tcp_check("h1", c.address("h3"), 22)  # the others still talk
    finally:
        c.heal("h2")
    assert c.tcp_check("h1", c.address("h2"), 22, timeout=10)


def test_ssh_launcher_start_alive_logs_stop(netns_cluster, tmp_path):
    c = netns_cluster
    launcher = SSHLauncher(_config(c, tmp_path))
    assert launcher.check().startswith(f"{sys.version_info.major}.")
    addr = c.address("h2")
    started = launcher.start([sys.executable, "-u", "-m", "http.server", "--bind", addr, str(HTTP_PORT)],
                             name="web")
    try:
        local = c.local_pid("h2", started.pid)         # the remote pid, as h2 numbers it
        assert local is not None and local != started.pid
        cmdline = Path(f"/proc/{local}/cmdline").read_bytes()
        assert b"http.server" in cmdline
        assert started.log_path.startswith(f"{c.host_dir}/{tmp_path.name}/logs/")
        assert launcher.alive(started)
        assert c.tcp_check("h1", addr, HTTP_PORT, timeout=10)
        assert "Serving HTTP" in launcher.logs(started, lines=10)
    finally:
        result = launcher.stop(started, timeout=5)
    assert result == "terminated"
    assert not launcher.alive(started)
    assert started.pid not in c.host_pids("h2") and not _pid_alive(local)
    assert not c.tcp_check("h1", addr, HTTP_PORT, timeout=0.3)
    assert launcher.stop(started) == "not-running"


def test_ssh_launcher_reports_immediate_exit(netns_cluster, tmp_path):
    launcher = SSHLauncher(_config(netns_cluster, tmp_path))
    cmd = [sys.executable, "-c", "import sys; print('boom: bad config'); sys.exit(3)"]
    with pytest.raises(ExitedImmediately) as ei:
        launcher.start(cmd, name="bad")
    assert ei.value.returncode == 3
    assert "boom: bad config" in str(ei.value)
    assert "exited immediately" in str(ei.value)


def test_ssh_launcher_wrong_key(netns_cluster, tmp_path):
    key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    launcher = SSHLauncher(_config(netns_cluster, tmp_path, key_path=str(key)))
    with pytest.raises(AuthenticationFailed, match="(?i)authentication"):
        launcher.start(["sleep", "30"])


def test_ssh_launcher_host_key_mismatch(netns_cluster, tmp_path):
    c = netns_cluster
    kind, blob = c.host_key_pub("h3").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"{c.address('h2')} {kind} {blob}\n")  # h3's key claimed for h2
    launcher = SSHLauncher(_config(c, tmp_path, known_hosts=str(known)))
    with pytest.raises(HostKeyMismatch, match="(?i)host key"):
        launcher.start(["sleep", "30"])


@pytest.mark.parametrize("target, port", [("root@10.200.0.99", 22), (None, 2222)],
                         ids=["no-such-host", "port-closed"])
def test_ssh_launcher_unreachable(netns_cluster, tmp_path, target, port):
    c = netns_cluster
    cfg = _config(c, tmp_path, target=target or f"root@{c.address('h3')}", port=port, connect_timeout=2)
    with pytest.raises(HostUnreachable, match="(?i)unreachable"):
        SSHLauncher(cfg).start(["sleep", "30"])


def test_ssh_launcher_python_missing(netns_cluster, tmp_path):
    launcher = SSHLauncher(_config(netns_cluster, tmp_path, python="/nonexistent/venv/bin/python3"))
    with pytest.raises(PythonMissing, match="(?i)python not found.*/nonexistent/venv/bin/python3"):
        launcher.start(["/nonexistent/venv/bin/python3", "-m", "gridrpc", "sed"])


def test_ssh_launcher_gridrpc_not_importable(netns_cluster, tmp_path):
    launcher = SSHLauncher(_config(netns_cluster, tmp_path, env={}, check_module="gridrpc_not_here"))
    with pytest.raises(PythonMissing, match="(?i)cannot import 'gridrpc_not_here'"):
        launcher.start(["sleep", "30"])
    assert issubclass(PythonMissing, LaunchError)


# -- hosts are hosts: own files, own PIDs ----------------------------------------

def _pstart(pid: int) -> str:
    """The start time the launcher records (field 22 of /proc/PID/stat)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def test_each_host_has_its_own_files_and_pids(netns_cluster):
    c = netns_cluster
    path = f"{c.host_dir}/only-on-h2.txt"
    assert c.exec("h2", f"echo written-on-h2 > {path}").returncode == 0
    assert c.read_file("h2", path) == "written-on-h2\n"
    assert c.read_file("h3", path) is None and c.read_file("h1", path) is None
    assert not os.path.exists(path) and os.listdir(c.host_dir) == []     # the machine: an empty dir
    # a PID namespace per host: its init is PID 1 there, and it sees its own processes only
    assert c.exec("h2", ["cat", "/proc/1/cmdline"]).stdout.split("\0")[:2] == [sys.executable, "-c"]
    assert c.local_pid("h2", 1) == c.init_pid("h2") != c.init_pid("h3")
    sleeper = c.popen("h2", ["sleep", "300"])
    try:
        _wait(lambda: [hp for hp, lp in c.host_pids("h2").items() if _cmdline(lp) == "sleep 300"], 10,
              "the sleeper on h2")
        (host_pid, machine_pid), = [(hp, lp) for hp, lp in c.host_pids("h2").items()
                                    if _cmdline(lp) == "sleep 300"]
        assert host_pid != machine_pid
        on_h2 = {int(p) for p in c.exec("h2", ["ls", "/proc"]).stdout.split() if p.isdigit()}
        assert host_pid in on_h2 and machine_pid not in on_h2
        assert c.exec("h2", ["pgrep", "-x", "sleep"]).stdout.split() == [str(host_pid)]
        assert c.exec("h3", ["pgrep", "-x", "sleep"]).returncode == 1      # h3 sees no such process
    finally:
        os.killpg(sleeper.pid, signal.SIGKILL)
        sleeper.wait(5)
    # a daemon started on the host is reparented to the host's init, yet is no "infrastructure"
    c.exec("h2", "nohup sleep 301 >/dev/null 2>&1 </dev/null &", check=True)
    daemon = [lp for lp in c.host_pids("h2").values() if _cmdline(lp) == "sleep 301"]
    assert len(daemon) == 1 and daemon[0] in _children_of(c.init_pid("h2"))
    assert daemon[0] not in c.infra_pids("h2") and c.init_pid("h2") in c.infra_pids("h2")
    assert c.exec("h2", ["pkill", "-x", "-f", "sleep 301"]).returncode == 0
    _wait(lambda: not _pid_alive(daemon[0]), 5, "the daemon killed on h2")


def _children_of(pid: int) -> list[int]:
    return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_ssh_launcher_logs_alive_stop_act_on_the_remote_host(netns_cluster, tmp_path):
    """``logs`` reads a file that only h2 has; ``alive`` and ``stop`` judge and
    signal h2's process -- not the process with the same command line on the
    machine, on h1 (where the ssh client runs) or on h3."""
    c = netns_cluster
    token = f"twin-{os.getpid()}-{time.monotonic_ns()}"
    argv = [sys.executable, "-u", "-c", f"import time; print({token!r}, flush=True); time.sleep(300)"]
    launcher = SSHLauncher(_config(c, tmp_path, to="h2", frm="h1"))
    local_twin = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True)
    h1_twin = c.popen("h1", argv, stdout=subprocess.DEVNULL)
    h3_twin = c.popen("h3", argv, stdout=subprocess.DEVNULL)
    started = None
    try:
        started = launcher.start(argv, name="twin")
        # logs: the file exists on h2 only
        log = started.log_path
        assert log.startswith(f"{c.host_dir}/")
        _wait(lambda: token in launcher.logs(started), 10, "the remote element's first line")
        assert not os.path.exists(log)
        assert c.read_file("h1", log) is None and c.read_file("h3", log) is None
        c.exec("h2", f"echo only-h2-wrote-this >> {log}", check=True)
        assert launcher.logs(started, lines=1).strip() == "only-h2-wrote-this"

        # pids: the launcher's pid is h2's numbering of h2's process
        remote = c.local_pid("h2", started.pid)
        assert remote is not None and remote != started.pid
        assert token.encode() in Path(f"/proc/{remote}/cmdline").read_bytes()
        assert _pstart(remote) == started.pid_start

        def twin(pid_on_host: int, local: int) -> Started:
            return Started(launcher="ssh", host=launcher.host, pid=pid_on_host, log_path=log,
                           command=tuple(argv), name="twin", workdir="", pid_start=_pstart(local),
                           started_at=time.time())
        def h1_twin_pids() -> list[int]:
            return [hp for hp, lp in c.host_pids("h1").items() if _cmdline(lp) == " ".join(argv)]
        _wait(h1_twin_pids, 10, "h1's twin")
        h1_pid, = h1_twin_pids()
        fake_local = twin(local_twin.pid, local_twin.pid)              # "alive" if run on the machine
        fake_h1 = twin(h1_pid, c.local_pid("h1", h1_pid))              # "alive" if run on the ssh client's host
        assert launcher.alive(started)
        assert not launcher.alive(fake_local) and not launcher.alive(fake_h1)
        assert launcher.alive_many([started, fake_local, fake_h1]) == {
            started.pid: True, fake_local.pid: False, fake_h1.pid: False}

        # stop: h2's process ends, the twins (same command line) live on
        assert launcher.stop(fake_local, timeout=2) == "not-running"
        assert launcher.stop(fake_h1, timeout=2) == "not-running"
        assert launcher.stop(started, timeout=5) == "terminated"
        started_done, started = started, None
        assert not _pid_alive(remote) and started_done.pid not in c.host_pids("h2")
        assert not launcher.alive(started_done)
        assert local_twin.poll() is None and h1_twin.poll() is None and h3_twin.poll() is None
        assert _pid_alive(c.local_pid("h1", h1_pid))
    finally:
        if started is not None:
            launcher.stop(started, timeout=2)
        local_twin.kill()
        local_twin.wait(5)
        for p in (h1_twin, h3_twin):
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)
