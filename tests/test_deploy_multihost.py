"""``gridrpc deploy`` over ssh on three namespace hosts (tests/netns.py).

Every client, the deploy command itself and every probe run *inside* a
namespace (``ip netns exec``); the root namespace never talks to the test
subnet (a blackhole route guards it). The tests of this module share one
deployment and run in file order:

    MA on h1 (+ sed-h1), LA1 on h2 (+ sed-h2), LA2 on h3 (+ sed-h3)

Each host has its own PID and mount namespaces (tests/netns.py): the PIDs in
the state file are the hosts' own numbering (mapped with ``local_pid``), and
every work directory and log lives in the host's private directory, which
neither the machine nor the other hosts can read. The elements run this
checkout's code (``PYTHONPATH`` in each host's ``env``).

up -> call from h1 -> status -> logs -> partition h2 / heal -> freeze LA1 /
thaw -> kill -9 the MA: LA2 and sed-h3 (short orphan_timeout) exit by
themselves -> down from another shell: nothing left on any host.
Then: bad hosts (wrong address, wrong key, missing python) and an element
that dies at start-up, each with a clear error and nothing left running.
"""
from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest_netns import netns_cluster  # noqa: F401
from tests.netns import SSHD, NetnsCluster

pytestmark = [pytest.mark.netns, pytest.mark.real]

HB_INTERVAL, HB_TIMEOUT = 0.3, 1.0
DISCOVERY_TIMEOUT = 2.0            # the probe's client: budget 0.6 * 2 s = 1.2 s
MA_PORT = 5555                      # inside h1's own network namespace: no clash with the machine
REPO = str(Path(__file__).resolve().parents[1])


def wait_until(pred, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def host_entry(c: NetnsCluster, h: str, tmp: Path, **over) -> dict:
    d = {"ssh": f"root@{c.address(h)}", "key": str(c.client_key), "known_hosts": str(c.known_hosts),
         "ssh_config": "/dev/null", "python": sys.executable, "connect_timeout": 3,
         # private to each host (same path everywhere); the code under test, not an installed copy
         "workdir": f"{c.host_dir}/{tmp.name}", "env": {"PYTHONPATH": REPO}}
    d.update(over)
    return d


def deploy(c: NetnsCluster, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    """``gridrpc deploy ARGS`` run inside h1."""
    return c.exec("h1", [sys.executable, "-m", "gridrpc", "deploy", *args], timeout=timeout)


def gridrpc_pids(c: NetnsCluster, h: str) -> list[int]:
    """Machine PIDs of the processes on host ``h`` other than its own
    machinery (init, sshd and sshd's session children)."""
    infra = c.infra_pids(h)
    out = []
    for pid in c.host_pids(h).values():
        if pid in infra:
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cmd.startswith("sshd:") or cmd.startswith(SSHD):
            continue  # a session in progress: sshd's own per-connection processes
        out.append(pid)
    return out


def assert_hosts_clean(c: NetnsCluster, timeout: float = 10.0) -> None:
    def clean():
        left = {h: gridrpc_pids(c, h) for h in c.hosts}
        return all(not v for v in left.values()) or None
    try:
        wait_until(clean, timeout, "no process left on any host")
    except AssertionError:
        left = {h: [(p, Path(f"/proc/{p}/cmdline").read_bytes()[:120]) for p in gridrpc_pids(c, h)
                    if Path(f"/proc/{p}").exists()] for h in c.hosts}
        raise AssertionError(f"processes left behind: {left}") from None


def element_pids(c: NetnsCluster, names: set[str]) -> dict[str, list[int]]:
    """Per host, the gridrpc processes started with ``--name N`` for N in ``names``."""
    out: dict[str, list[int]] = {}
    for h in c.hosts:
        for pid in gridrpc_pids(c, h):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"--name" in argv and argv.index(b"--name") + 1 < len(argv) and \
                    argv[argv.index(b"--name") + 1].decode() in names:
                out.setdefault(h, []).append(pid)
    return out


PROBE = r"""
import json, sys, time
import gridrpc
c = gridrpc.Client(sys.argv[1], discovery_timeout=float(sys.argv[2]), keys=sys.argv[3])
print(json.dumps({"ok": True, "ready": True}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    t = time.monotonic()
    try:
        if cmd["op"] == "discover":
            r = sorted(s.name for s in c.discover(cmd["service"], cmd.get("k", 10)))
        elif cmd["op"] == "tree":
            r = {e["name"]: e.get("state", "alive") for e in c.tree()}
        else:
            r = c.call(cmd["service"], *cmd["args"])
        out = {"ok": True, "result": r}
    except Exception as exc:
        out = {"ok": False, "error": type(exc).__name__ + ": " + str(exc)}
    out["t"] = time.monotonic() - t
    print(json.dumps(out), flush=True)
"""


class Probe:
    """A long-lived client inside a namespace host, driven over its stdin/stdout."""

    def __init__(self, c: NetnsCluster, host: str, ma: str, keys: str) -> None:
        self.proc = c.popen(host, [sys.executable, "-u", "-c", PROBE, ma, str(DISCOVERY_TIMEOUT), keys],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
        assert self._read(20)["ready"]

    def _read(self, timeout: float) -> dict:
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not r:
            raise AssertionError(f"probe silent for {timeout}s")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"probe exited ({self.proc.poll()})")
        return json.loads(line)

    def ask(self, timeout: float = 15.0, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)

    def discover(self) -> dict:
        return self.ask(op="discover", service="add", k=10)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


ALL_SEDS = ["sed-h1", "sed-h2", "sed-h3"]


@pytest.fixture(scope="module")
def env(netns_cluster, tmp_path_factory):
    c = netns_cluster
    tmp = tmp_path_factory.mktemp("deploy-multihost")
    spec = {
        "name": "three-hosts",
        "heartbeat": {"interval": HB_INTERVAL, "timeout": HB_TIMEOUT},
        "hosts": {h: host_entry(c, h, tmp) for h in c.hosts},
        "master_agent": {"name": "MA", "host": "h1", "port": MA_PORT},
        "local_agents": [{"name": "LA1", "parent": "MA", "host": "h2"},
                         {"name": "LA2", "parent": "MA", "host": "h3", "orphan_timeout": 1.5}],
        "seds": [{"name": "sed-h1", "parent": "MA", "host": "h1", "examples": True, "isolation": "inline"},
                 {"name": "sed-h2", "parent": "LA1", "host": "h2", "examples": True, "isolation": "inline"},
                 {"name": "sed-h3", "parent": "LA2", "host": "h3", "examples": True, "isolation": "inline",
                  "orphan_timeout": 1.5}],
    }
    f = tmp / "three-hosts.yaml"
    f.write_text(yaml.safe_dump(spec, sort_keys=False))
    state = tmp / "state"
    t0 = time.monotonic()
    up = deploy(c, "up", str(f), "--state-dir", str(state))
    info = {"cluster": c, "file": str(f), "state": str(state), "up": up, "tmp": tmp,
            "up_seconds": time.monotonic() - t0, "ma": f"tcp://{c.address('h1')}:{MA_PORT}",
            "keys": str(state / "keys")}     # security is on by default: the hosts are not loopback
    probe = None
    try:
        if up.returncode == 0:
            probe = Probe(c, "h1", info["ma"], info["keys"])
        info["probe"] = probe
        yield info
    finally:
        if probe:
            probe.close()
        deploy(c, "down", str(f), "--state-dir", str(state))


def state_rows(env) -> dict:
    """Name -> {pid, host} from the state file (what `status` reads; no ssh)."""
    data = json.loads((Path(env["state"]) / "state.json").read_text())
    return {n: {"pid": el["started"]["pid"], "host": el["host"]} for n, el in data["elements"].items()}


def status(env) -> tuple[int, dict]:
    r = deploy(env["cluster"], "status", env["file"], "--state-dir", env["state"], "--json")
    assert r.stdout.strip(), r.stderr
    return r.returncode, {row["name"]: row for row in json.loads(r.stdout)}


def test_up_reports_each_element_and_registers(env):
    up = env["up"]
    assert up.returncode == 0, up.stderr
    for name, host in (("MA", "h1"), ("LA1", "h2"), ("LA2", "h3"), ("sed-h1", "h1"), ("sed-h2", "h2"),
                       ("sed-h3", "h3")):
        assert f"{name} on {host}: serving at tcp://{env['cluster'].address(host)}:" in up.stderr
    assert "registered at the MA: 6/6" in up.stderr
    assert "host h2 (root@10.200.0.12): reachable" in up.stderr
    assert up.stdout.strip() == f"MA: {env['ma']}"


def test_call_from_host1(env):
    c = env["cluster"]
    r = c.exec("h1", [sys.executable, "-m", "gridrpc", "call", "add", "1", "2", "--ma", env["ma"],
                      "--keys", env["keys"]])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "3"
    assert env["probe"].discover()["result"] == ALL_SEDS


def test_a_multihost_tree_is_secure_by_default(env):
    """The hosts are not loopback: CURVE is on without asking. A client
    without keys gets no answer, and is told why; every element runs with --secure."""
    c = env["cluster"]
    r = c.exec("h2", [sys.executable, "-m", "gridrpc", "discover", "add", "--ma", env["ma"]], timeout=60)
    assert r.returncode != 0 and "is secure (CURVE) and this client gave no key" in r.stderr, r.stderr
    data = json.loads((Path(env["state"]) / "state.json").read_text())
    for name, el in data["elements"].items():
        cmd = el["started"]["command"]
        assert "--secure" in cmd and "--keys" in cmd, (name, cmd)


def test_status_hosts_pids_load(env):
    c = env["cluster"]
    rc, rows = status(env)
    assert rc == 0
    for name, host in (("MA", "h1"), ("LA1", "h2"), ("LA2", "h3"), ("sed-h2", "h2")):
        row = rows[name]
        assert row["host"] == host and row["process"] == "running" and row["tree"] == "alive"
        assert row["address"].startswith(f"tcp://{c.address(host)}:")  # bound to the host's address
        assert row["pid"] in c.host_pids(host)                           # and really runs there
    assert rows["LA1"]["load"]["children"] == 1
    assert rows["sed-h2"]["load"]["num_running"] == 0
    # the orphan timeout: 30 s by default on ssh hosts, as given where given
    cmdline = lambda n: Path(  # noqa: E731
        f"/proc/{c.local_pid(rows[n]['host'], rows[n]['pid'])}/cmdline").read_bytes().split(b"\0")
    assert cmdline("LA1")[cmdline("LA1").index(b"--orphan-timeout") + 1] == b"30"
    assert cmdline("LA2")[cmdline("LA2").index(b"--orphan-timeout") + 1] == b"1.5"
    assert b"--orphan-timeout" not in cmdline("MA")


def test_logs_of_a_remote_element(env):
    r = deploy(env["cluster"], "logs", env["file"], "LA1", "--state-dir", env["state"], "-n", "100")
    assert r.returncode == 0, r.stderr
    assert 'READY {"name": "LA1"' in r.stdout and "attached to parent" in r.stdout


def _fault_and_recover(env, fault, recover) -> dict:
    """Apply ``fault`` to LA1's side; discovery must keep answering from the
    other SeDs, stop waiting for the lost branch within the heartbeat
    deadline, and see the branch again after ``recover`` by itself."""
    probe = env["probe"]
    assert probe.discover()["result"] == ALL_SEDS
    fault()
    t0 = time.monotonic()
    answers = []
    try:
        while True:
            r = probe.discover()
            answers.append((time.monotonic() - t0, r))
            assert r["ok"], r
            assert {"sed-h1", "sed-h3"} <= set(r["result"]), r   # the rest keeps answering
            if "sed-h2" not in r["result"] and r["t"] < 0.5:
                break                                             # lost branch dropped: fast again
            assert time.monotonic() - t0 < 10, answers
        dropped_after = time.monotonic() - t0
    finally:
        recover()
    t1 = time.monotonic()
    wait_until(lambda: "sed-h2" in (probe.discover().get("result") or []), 15,
               "sed-h2 back in discovery after healing")
    back_after = time.monotonic() - t1
    assert all(r["t"] <= DISCOVERY_TIMEOUT * 0.6 + 0.5 for _, r in answers), answers
    # dropped within the heartbeat deadline (+ one discovery budget in flight, + slack)
    assert dropped_after <= HB_TIMEOUT + HB_INTERVAL + DISCOVERY_TIMEOUT * 0.6 + 1.0, answers
    tree = probe.ask(op="tree")["result"]
    assert tree.get("LA1") == "alive" and tree.get("sed-h2") == "alive"
    print(f"lost branch dropped from discovery after {dropped_after:.2f}s "
          f"(slowest answer meanwhile {max(r['t'] for _, r in answers):.2f}s), back {back_after:.2f}s after recovery")
    return {"dropped_after": dropped_after, "back_after": back_after}


@pytest.mark.parametrize("silent", [False, True], ids=["link-down", "silent"])
def test_partition_la_host_then_heal(env, silent):
    c = env["cluster"]
    _fault_and_recover(env, lambda: c.partition("h2", silent=silent), lambda: c.heal("h2"))


def test_freeze_la_then_thaw(env):
    c = env["cluster"]
    pid = state_rows(env)["LA1"]["pid"]                              # h2's numbering
    local = c.local_pid("h2", pid)
    assert local is not None and b"LA1" in Path(f"/proc/{local}/cmdline").read_bytes()
    _fault_and_recover(env, lambda: os.kill(local, signal.SIGSTOP), lambda: os.kill(local, signal.SIGCONT))
    assert c.local_pid("h2", pid) == local                          # the same process, thawed


def test_orphans_exit_by_themselves_when_the_ma_is_killed(env):
    c = env["cluster"]
    rows = state_rows(env)
    os.kill(c.local_pid("h1", rows["MA"]["pid"]), signal.SIGKILL)
    t0 = time.monotonic()
    # LA2 (orphan_timeout 1.5 s) exits by itself, then its SeD (1.5 s) too
    gone = lambda n: rows[n]["pid"] not in c.host_pids(rows[n]["host"])  # noqa: E731
    wait_until(lambda: gone("LA2"), HB_TIMEOUT + 1.5 + 5, "LA2 to exit by itself")
    la2_after = time.monotonic() - t0
    wait_until(lambda: gone("sed-h3"), 2 * (HB_TIMEOUT + 1.5) + 8, "sed-h3 to exit by itself")
    assert la2_after >= 1.5  # not before its grace period
    la2_log = json.loads((Path(env["state"]) / "state.json").read_text())["elements"]["LA2"]["started"]["log_path"]
    assert not os.path.exists(la2_log)                                # h3's private directory
    assert "parent gone for more than 1.5s: exiting" in c.read_file("h3", la2_log)
    # LA1 and the SeDs with the 30 s default are still there: `down` stops them
    assert not gone("LA1") and not gone("sed-h1")
    rc, rows2 = status(env)
    assert rc == 1 and rows2["MA"]["process"] == "stopped" and rows2["LA2"]["process"] == "stopped"


def test_down_from_another_shell_leaves_nothing(env):
    c = env["cluster"]
    if env["probe"]:
        env["probe"].close()
    # h2 cut off: what runs there cannot be stopped now; the state keeps it for a second `down`
    c.partition("h2")
    try:
        r = deploy(c, "down", env["file"], "--state-dir", env["state"])
    finally:
        c.heal("h2")
    assert r.returncode == 1
    assert "could not stop 2 element(s):\n  - sed-h2, LA1: host root@10.200.0.12 (port 22) unreachable" in r.stderr, \
        r.stderr
    assert "they exit by themselves 30s after losing their parent" in r.stderr
    assert "run 'gridrpc deploy down' again" in r.stderr
    kept = json.loads((Path(env["state"]) / "state.json").read_text())["elements"]
    assert sorted(kept) == ["LA1", "sed-h2"]
    r = deploy(c, "down", env["file"], "--state-dir", env["state"])
    assert r.returncode == 0, r.stderr
    assert re.search(r"LA1 on h2 \(pid \d+\): terminated", r.stderr)
    assert not (Path(env["state"]) / "state.json").exists()
    assert_hosts_clean(c)
    r = deploy(c, "status", env["file"], "--state-dir", env["state"])
    assert r.returncode == 1 and "no deployment state" in r.stderr


# -- failures -------------------------------------------------------------------

BAD_NAMES = {"xMA", "xLA", "xs", "xs4"}


def _small_spec(c: NetnsCluster, tmp: Path, hosts: dict, sed_host: str = "h3", sed_extra: dict | None = None):
    """A small tree with its own names (other deployments may run beside it) and MA port."""
    return {"name": "bad", "heartbeat": {"interval": HB_INTERVAL, "timeout": HB_TIMEOUT}, "hosts": hosts,
            "master_agent": {"name": "xMA", "host": "h1", "port": MA_PORT + 1},
            "local_agents": [{"name": "xLA", "parent": "xMA", "host": "h2"}],
            "seds": [{"name": "xs", "parent": "xLA", "host": sed_host, "examples": True, "isolation": "inline",
                      **(sed_extra or {})}]}


def test_bad_hosts_are_reported_before_anything_starts(netns_cluster, tmp_path):
    c = netns_cluster
    other_key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True)
    hosts = {"h1": host_entry(c, "h1", tmp_path),
             "h2": host_entry(c, "h2", tmp_path, key=str(other_key)),              # wrong key
             "h3": host_entry(c, "h3", tmp_path, python="/nonexistent/venv/bin/python3"),  # no python
             "h4": host_entry(c, "h1", tmp_path, ssh="root@10.200.0.99", connect_timeout=2)}  # no such host
    spec = _small_spec(c, tmp_path, hosts)
    spec["seds"].append({"name": "xs4", "parent": "xMA", "host": "h4", "examples": True})
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(spec))
    r = deploy(c, "up", str(f), "--state-dir", str(tmp_path / "st"))
    assert r.returncode == 1
    err = r.stderr
    assert "host h2 (for xLA): authentication failed for root@10.200.0.12" in err, err
    assert "host h3 (for xs): python not found on root@10.200.0.13: '/nonexistent/venv/bin/python3'" in err, err
    assert "host h4 (for xs4): host root@10.200.0.99 (port 22) unreachable" in err, err
    assert "3 host(s) not usable" in err
    assert "nothing was started" in err and "starting" not in err
    assert not (tmp_path / "st" / "state.json").exists()
    assert not element_pids(c, BAD_NAMES)


def test_element_dying_at_start_stops_the_others(netns_cluster, tmp_path):
    c = netns_cluster
    hosts = {h: host_entry(c, h, tmp_path) for h in c.hosts}
    spec = _small_spec(c, tmp_path, hosts, sed_extra={"examples": False, "parent": "xMA",
                                                      "services": ["no_such_module_zz:f"]})
    f = tmp_path / "dies.yaml"
    f.write_text(yaml.safe_dump(spec))
    r = deploy(c, "up", str(f), "--state-dir", str(tmp_path / "st"))
    assert r.returncode == 1
    assert "xs on host h3" in r.stderr and "no_such_module_zz" in r.stderr, r.stderr   # why, from its log
    assert re.search(r"stopping the [23] element\(s\) started", r.stderr)
    assert re.search(r"xLA on h2 \(pid \d+\): terminated", r.stderr)
    assert re.search(r"xMA on h1 \(pid \d+\): terminated", r.stderr)
    assert not (tmp_path / "st" / "state.json").exists()
    wait_until(lambda: not element_pids(c, BAD_NAMES), 5, "no element of the failed deployment left")
