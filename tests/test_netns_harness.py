"""The namespace cluster harness and the SSH launcher against real sshd's.

Every ssh client and TCP probe runs inside a namespace (``ip netns exec``);
nothing here sends to the test subnet from the root namespace.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gridrpc.deploy.launchers import (
    AuthenticationFailed, ExitedImmediately, HostKeyMismatch, HostUnreachable, LaunchError,
    PythonMissing, SSHHostConfig, SSHLauncher,
)
from tests.conftest_netns import netns_cluster  # noqa: F401
from tests.netns import (
    NetnsCluster, _pid_alive, blackhole_present, netns_list, netns_pids, route_holders,
    skip_unless_root_netns,
)

pytestmark = [pytest.mark.netns, pytest.mark.real]

REPO = str(Path(__file__).resolve().parents[1])
HTTP_PORT = 8765


def _config(cluster: NetnsCluster, tmp_path: Path, *, to: str = "h2", frm: str = "h1",
            **over) -> SSHHostConfig:
    kw = dict(target=f"root@{cluster.address(to)}", key_path=str(cluster.client_key),
              known_hosts=str(cluster.known_hosts), ssh_config="/dev/null",
              wrapper=tuple(cluster.wrapper(frm)), python=sys.executable,
              workdir=str(tmp_path / "remote-work"), env={"PYTHONPATH": REPO},
              connect_timeout=3, check_window=0.5)
    kw.update(over)
    assert kw["wrapper"], "the ssh client must run inside a namespace"
    return SSHHostConfig(**kw)


# Runs first in this module, before the module-scoped fixture exists.
def test_stop_leaves_nothing_behind():
    reason = skip_unless_root_netns()
    if reason:
        pytest.skip(reason)
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
        assert started.pid in netns_pids(c.ns("h2"))  # the remote pid, on h2
        cmdline = Path(f"/proc/{started.pid}/cmdline").read_bytes()
        assert b"http.server" in cmdline
        assert started.log_path.startswith(str(tmp_path / "remote-work" / "logs"))
        assert launcher.alive(started)
        assert c.tcp_check("h1", addr, HTTP_PORT, timeout=10)
        assert "Serving HTTP" in launcher.logs(started, lines=10)
    finally:
        result = launcher.stop(started, timeout=5)
    assert result == "terminated"
    assert not launcher.alive(started)
    assert started.pid not in netns_pids(c.ns("h2"))
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
