"""Real processes: kill -9 of a SeD mid-call, SIGSTOP of an LA during
discovery, MA restart, children started before their parent."""
import signal
import time

import pytest

import gridrpc
from gridrpc.testing import discoverable, wait_for
from tests.proc_tree import free_port

pytestmark = pytest.mark.real


def tree_names(client):
    return {e["name"] for e in client.tree()}


def sed_load(client, name: str) -> dict:
    """The SeD's own statistics, as its last heartbeat carried them up."""
    return next((e.get("load") or {} for e in client.tree() if e["name"] == name), {})


def wait_running(client, name: str, n: int = 1, timeout: float = 5) -> None:
    """Wait until SeD ``name`` reports ``n`` calls running (not just sent)."""
    wait_for(lambda: sed_load(client, name).get("num_running") == n, timeout,
             f"{n} call(s) running on {name} (its statistics)")


def test_children_start_before_parent(proc_tree):
    port = free_port()
    ma_addr = f"tcp://127.0.0.1:{port}"
    sed = proc_tree.sed("early-sed", ma_addr)               # parent not there yet
    la = proc_tree.start("la", "early-la", parent=ma_addr)
    proc_tree.sed("late-sed", la.address)
    proc_tree.start("ma", "MA", port=port)
    with gridrpc.Client(ma_addr) as c:
        wait_for(lambda: {"early-sed", "early-la", "late-sed"} <= tree_names(c), 15, "late attachment")
        assert c.call("add", 2, 3) == 5
    assert sed.popen.poll() is None


def test_kill_sed_mid_call_fails_over_and_is_dropped(proc_tree):
    ma = proc_tree.start("ma", "MA")
    s1 = proc_tree.sed("s1", ma.address)
    s2 = proc_tree.sed("s2", ma.address)
    by_name = {"s1": s1, "s2": s2}
    with gridrpc.Client(ma.address, ping_interval=0.3, ping_timeout=1.0) as c:
        wait_for(lambda: {"s1", "s2"} <= tree_names(c), 10, "both SeDs")
        call = c.submit("sleep", 2.0)
        wait_for(lambda: call.server is not None, 5, "call dispatched")
        victim = call.server
        wait_running(c, victim)              # the call runs on its server: the kill interrupts it
        other = ({"s1", "s2"} - {victim}).pop()
        assert sed_load(c, other).get("num_running") == 0
        by_name[victim].signal(signal.SIGKILL)
        t = time.monotonic()
        assert call.result(15) == 2.0        # failed over to the other SeD
        assert call.server == other and len(call.attempts) == 2
        assert time.monotonic() - t < 8
        wait_for(lambda: sed_load(c, other).get("completed") == 1, 5, f"the call completed on {other}")
        wait_for(lambda: victim not in tree_names(c), 5, "dead SeD dropped from the tree")
        assert c.call("add", 1, 1) == 2


def test_kill_sed_mid_call_without_failover_raises(proc_tree):
    ma = proc_tree.start("ma", "MA")
    s1 = proc_tree.sed("s1", ma.address)
    with gridrpc.Client(ma.address, ping_interval=0.3, ping_timeout=1.0, failover=False) as c:
        wait_for(lambda: "s1" in tree_names(c), 10, "SeD")
        call = c.submit("sleep", 5.0)
        wait_for(lambda: call.server is not None, 5, "dispatched")
        wait_running(c, "s1")
        s1.signal(signal.SIGKILL)
        t = time.monotonic()
        with pytest.raises(gridrpc.CommunicationError):
            call.result(10)
        assert time.monotonic() - t < 4.5    # the lost server was noticed, not the 5 s call's end
        assert len(call.attempts) == 1


def test_sigstop_la_during_discovery(proc_tree):
    ma = proc_tree.start("ma", "MA")
    la1 = proc_tree.start("la", "LA1", parent=ma.address)
    la2 = proc_tree.start("la", "LA2", parent=ma.address)
    for i in (1, 2):
        proc_tree.sed(f"a{i}", la1.address)
        proc_tree.sed(f"b{i}", la2.address)
    with gridrpc.Client(ma.address, discovery_timeout=5, discovery_budget=0.5) as c:
        wait_for(lambda: discoverable(c, "add", 4), 10, "all four SeDs discoverable")
        la2.signal(signal.SIGSTOP)
        try:
            t = time.monotonic()
            # max_age=0: a fan-out (from the MA's view b1 and b2, alive and reachable
            # by clients, stay discoverable while their pushed state is fresh)
            servers = c.discover("add", 10, max_age=0)
            elapsed = time.monotonic() - t
            assert {s.name for s in servers} == {"a1", "a2"}
            assert elapsed < 1.5                    # bounded by the discovery budget, not blocked
            assert c.call("add", 1, 2) == 3
            wait_for(lambda: "LA2" not in tree_names(c), 5, "frozen LA dropped")
        finally:
            la2.signal(signal.SIGCONT)
        wait_for(lambda: {"LA2", "b1", "b2"} <= tree_names(c), 10, "thawed branch back")
        wait_for(lambda: discoverable(c, "add", 4), 10, "thawed branch discoverable")


def test_ma_restart_gets_whole_tree_back(proc_tree):
    port = free_port()
    ma = proc_tree.start("ma", "MA", port=port)
    la = proc_tree.start("la", "LA1", parent=ma.address)
    proc_tree.sed("s1", la.address)
    proc_tree.sed("s2", ma.address)
    want = {"MA", "LA1", "s1", "s2"}
    with gridrpc.Client(ma.address) as c:
        wait_for(lambda: tree_names(c) == want, 10, "initial tree")
    ma.signal(signal.SIGKILL)
    ma.popen.wait(5)
    proc_tree.start("ma", "MA", port=port)
    with gridrpc.Client(ma.address) as c:
        wait_for(lambda: tree_names(c) == want, 15, "tree re-registered with the new MA")
        assert c.call("add", 20, 22) == 42
        # the new MA's view holds the idle SeD under the LA too (the LA pushes its whole view when a
        # parent registers it anew), so discoveries are answered in one hop again, not by fan-outs
        wait_for(lambda: _ma_load(c).get("view_snapshots") == 2, 5, "both SeDs in the new MA's view")


def _ma_load(c) -> dict:
    return next((e.get("load") or {} for e in c.tree() if e["name"] == "MA"), {})


def test_frozen_sed_dropped_then_back(proc_tree):
    ma = proc_tree.start("ma", "MA")
    s1 = proc_tree.sed("s1", ma.address)
    with gridrpc.Client(ma.address) as c:
        wait_for(lambda: "s1" in tree_names(c), 10, "SeD")
        s1.signal(signal.SIGSTOP)
        try:
            # silent past 2.5 heartbeat intervals: shown as lost, then dropped at the timeout
            wait_for(lambda: any(e["name"] == "s1" and e["state"] == "lost" for e in c.tree()), 5,
                     "frozen SeD shown as lost")
            wait_for(lambda: "s1" not in tree_names(c), 5, "frozen SeD dropped")
            with pytest.raises((gridrpc.ServiceNotFound, gridrpc.NoServerAvailable)):
                c.call("add", 1, 1)
        finally:
            s1.signal(signal.SIGCONT)
        wait_for(lambda: "s1" in tree_names(c), 10, "SeD back")
        assert c.call("add", 1, 1) == 2


def test_sed_workers_do_not_outlive_sed(proc_tree):
    import psutil
    ma = proc_tree.start("ma", "MA")
    s1 = proc_tree.sed("s1", ma.address, "--max-concurrent", "2")
    with gridrpc.Client(ma.address) as c:
        wait_for(lambda: "s1" in tree_names(c), 10, "SeD")
        calls = [c.submit("sleep", 0.2) for _ in range(2)]
        gridrpc.wait(calls, timeout=10)
        assert [x.result(0) for x in calls] == [0.2, 0.2]
        kids = psutil.Process(s1.pid).children(recursive=True)
        assert kids, "worker processes expected"
    s1.stop()
    wait_for(lambda: not any(k.is_running() and k.status() != "zombie" for k in kids), 5, "workers gone")


def test_sed_killed_hard_leaves_no_workers(proc_tree):
    import psutil
    ma = proc_tree.start("ma", "MA")
    s1 = proc_tree.sed("s1", ma.address, "--max-concurrent", "3")
    with gridrpc.Client(ma.address) as c:
        wait_for(lambda: "s1" in tree_names(c), 10, "SeD")
        calls = [c.submit("sleep", 60) for _ in range(2)]       # two busy workers, others idle
        wait_for(lambda: all(x.server for x in calls), 5, "dispatched")
        wait_running(c, "s1", 2)
        kids = psutil.Process(s1.pid).children(recursive=True)
        assert len(kids) >= 2
        s1.signal(signal.SIGKILL)
        wait_for(lambda: not any(k.is_running() and k.status() != "zombie" for k in kids), 5,
                 "workers of a SeD killed by SIGKILL gone")
        for x in calls:
            x.cancel()
