"""Reliability on real processes (issue #15), counted: MA failover with two
active MAs, restart of the only MA, kill -9 of a SeD with idempotent and
non-idempotent calls (executions counted in a file), orphaned calls.

Load is scaled to 2 shared cores: a few client threads at ~40 calls/s for
~8 s. The figures printed (``-s``) are the ones docs/reliability.md quotes."""
from __future__ import annotations

import collections
import os
import signal
import threading
import time
import uuid

import pytest

import gridrpc
from gridrpc.testing import wait_for
from tests.proc_tree import free_port

pytestmark = pytest.mark.real

COUNT = "tests.reliability_services:count"


def discoverable(client, service: str, n: int) -> bool:
    try:
        return len(client.discover(service, 10)) >= n
    except gridrpc.GridRPCError:
        return False


def load(ma, *, clients: int, rate: float, duration: float, events=(), timeout: float = 10.0):
    """``clients`` threads each calling ``add`` at ``rate`` calls/s for
    ``duration`` s; ``events``: (at_seconds, fn) run meanwhile. Returns
    (latencies, failures)."""
    lat: list[float] = []
    fails: list[str] = []
    lock = threading.Lock()
    t0 = time.monotonic()

    def worker(i: int) -> None:
        with gridrpc.Client(ma, timeout=timeout) as c:
            n = 0
            while True:
                due = t0 + n / rate
                if due - t0 > duration:
                    break
                time.sleep(max(0.0, due - time.monotonic()))
                s = time.monotonic()
                try:
                    assert c.call("add", i, n) == i + n
                    with lock:
                        lat.append(time.monotonic() - s)
                except Exception as exc:  # noqa: BLE001 - counted
                    with lock:
                        fails.append(f"{type(exc).__name__}: {exc}")
                n += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for at, fn in events:
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        fn()
    for t in threads:
        t.join(60)
    return lat, fails


def report(what: str, lat: list[float], fails: list[str]) -> None:
    lat = sorted(lat)
    p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else float("nan")   # noqa: E731
    print(f"\n[{what}] calls={len(lat) + len(fails)} ok={len(lat)} failed={len(fails)} "
          f"p50={p(0.5):.1f}ms p99={p(0.99):.1f}ms max={p(1.0):.1f}ms")


#: the issue's load (4 clients x 50 calls/s = 200 calls/s for 30 s) with GRIDRPC_RELIABILITY_FULL=1;
#: CI runs a tenth of it (2 x 20 calls/s for 8 s) on its 2 shared cores
FULL = os.environ.get("GRIDRPC_RELIABILITY_FULL") == "1"
LOAD = dict(clients=4, rate=50, duration=30) if FULL else dict(clients=2, rate=20, duration=8)


@pytest.mark.timeout(180)
def test_kill_one_of_two_mas_under_load(proc_tree):
    ma1 = proc_tree.start("ma", "MA1")
    ma2 = proc_tree.start("ma", "MA2")
    both = f"{ma1.address},{ma2.address}"
    for i in (1, 2):
        proc_tree.sed(f"s{i}", both, "--max-concurrent", "4")
    with gridrpc.Client([ma1.address, ma2.address]) as c:
        wait_for(lambda: discoverable(c, "add", 2), 15, "both SeDs under both MAs")
        assert {e["name"] for e in c.tree()} >= {"s1", "s2"}
    lat, fails = load(both, **LOAD, events=[(3.0, lambda: ma1.signal(signal.SIGKILL))])
    report("kill -9 of MA1 of 2", lat, fails)
    assert fails == []
    assert max(lat) <= 1.5          # disruption: measured ~0.4-0.5 s (the hedge delay); bound loose for CI


@pytest.mark.timeout(180)
def test_restart_of_the_only_ma_under_load(proc_tree):
    port = free_port()
    ma = proc_tree.start("ma", "MA", port=port)
    for i in (1, 2):
        proc_tree.sed(f"s{i}", ma.address, "--max-concurrent", "4")
    with gridrpc.Client(ma.address) as c:
        wait_for(lambda: discoverable(c, "add", 2), 15, "SeDs")

    def restart():
        ma.signal(signal.SIGKILL)
        ma.popen.wait(5)
        time.sleep(1.0)
        proc_tree.start("ma", "MA", port=port)

    lat, fails = load(ma.address, **LOAD, events=[(3.0, restart)], timeout=10.0)
    report("kill -9 + restart of the only MA", lat, fails)
    assert fails == []


def test_unknown_service_is_permanent_once_rebuilt(proc_tree):
    ma = proc_tree.start("ma", "MA", "--rebuild-time", "1.0")
    proc_tree.sed("s1", ma.address)
    with gridrpc.Client(ma.address, timeout=10) as c:
        wait_for(lambda: discoverable(c, "add", 1), 15, "SeD")
        t = time.monotonic()
        with pytest.raises(gridrpc.ServiceNotFound):
            c.call("no-such-service")
        assert time.monotonic() - t < 2.0


def test_discover_waits_out_a_rebuilding_ma():
    """``Client.discover`` retries an MA's ``rebuilding`` answer, as calls do:
    asked before any SeD registered, it returns the SeD that registers
    meanwhile, not the error."""
    from gridrpc.testing import LocalTree
    with LocalTree(las=0, seds_per_la=0, http=False, hb_interval=0.5, hb_timeout=5.0) as tree:
        with gridrpc.Client(tree.ma_address, retry_timeout=0.01) as c:  # no time to retry: the bare answer
            with pytest.raises(gridrpc.NoServerAvailable, match="rebuilding"):
                c.discover("add", 1)
        with gridrpc.Client(tree.ma_address) as c:
            timer = threading.Timer(0.3, tree.add_sed, ("late", tree.ma_address))
            timer.start()
            try:
                servers = c.discover("add", 1)
            finally:
                timer.join()
            assert [s.name for s in servers] == ["late"]


def run_kill_sed(proc_tree, tmp_path, service_opts: str, n: int = 12, isolation: str = "process"):
    """Two SeDs offering ``count`` (each call appends its token), one call at a
    time each, run by the ``isolation`` back-end (worker processes or inline);
    ``n`` calls of 0.6 s; kill -9 of the SeD running a call."""
    path = tmp_path / "executions.txt"
    path.touch()
    ma = proc_tree.start("ma", "MA")
    seds = {f"s{i}": proc_tree.start("sed", f"s{i}", "--service", COUNT + service_opts, "--isolation", isolation,
                                     parent=ma.address)
            for i in (1, 2)}
    outcomes: dict[str, object] = {}
    with gridrpc.Client(ma.address, ping_interval=0.3, ping_timeout=1.0, timeout=30) as c:
        wait_for(lambda: discoverable(c, "count", 2), 15, "SeDs")
        tokens = [uuid.uuid4().hex for _ in range(n)]
        calls = {tok: c.submit("count", str(path), tok, 0.6) for tok in tokens}
        wait_for(lambda: all(cl.server for cl in calls.values()), 10, "dispatched")
        time.sleep(0.8)
        victim = next(cl.server for cl in calls.values() if not cl.done())
        seds[victim].signal(signal.SIGKILL)
        for tok, cl in calls.items():
            try:
                outcomes[tok] = cl.result(40)
            except gridrpc.GridRPCError as exc:
                outcomes[tok] = exc
    runs = collections.Counter(path.read_text().split())
    return victim, outcomes, runs


def test_kill_sed_idempotent_calls_are_rerun_none_lost(proc_tree, tmp_path):
    victim, outcomes, runs = run_kill_sed(proc_tree, tmp_path, "")
    assert all(v == tok for tok, v in outcomes.items()), outcomes          # every call completed
    twice = [t for t, k in runs.items() if k > 1]
    print(f"\n[kill -9 of {victim}, idempotent] calls={len(outcomes)} completed={len(outcomes)} "
          f"re-run={len(twice)} (each at most twice: the killed run and the re-run)")
    assert all(runs[t] in (1, 2) for t in outcomes)
    assert len(twice) <= 1                     # only the call that was running on the victim


@pytest.mark.parametrize("isolation", ["process", "inline"])
def test_kill_sed_non_idempotent_calls_never_run_twice(proc_tree, tmp_path, isolation):
    victim, outcomes, runs = run_kill_sed(proc_tree, tmp_path, ",idempotent=false", isolation=isolation)
    lost = {t: e for t, e in outcomes.items() if isinstance(e, gridrpc.ServerLost)}
    ok = {t for t, v in outcomes.items() if v == t}
    print(f"\n[kill -9 of {victim}, non-idempotent] calls={len(outcomes)} completed={len(ok)} "
          f"server_lost={len(lost)} ran_twice={sum(1 for k in runs.values() if k > 1)}")
    assert len(ok) + len(lost) == len(outcomes), outcomes                  # every call accounted for
    assert all(k == 1 for k in runs.values()), runs                        # none ran twice
    assert 1 <= len(lost) <= 1                                             # the one running on the victim
    for tok, e in lost.items():
        assert e.server == victim and e.call_id and runs[tok] == 1
    # the queued ones moved and ran exactly once
    assert all(runs[t] == 1 for t in ok)


def test_non_idempotent_call_whose_worker_dies_is_not_run_again(proc_tree, tmp_path):
    """The process back-end: the worker running a non-idempotent call dies;
    the call ends in WorkerDied, on that server, and ran once (another SeD
    offers the service: nothing moved it there)."""
    path = tmp_path / "executions.txt"
    path.touch()
    ma = proc_tree.start("ma", "MA")
    for i in (1, 2):
        proc_tree.start("sed", f"s{i}", "--service", "tests.reliability_services:count_then_exit,idempotent=false",
                        parent=ma.address)
    with gridrpc.Client(ma.address, ping_interval=0.3, ping_timeout=1.0, timeout=30) as c:
        wait_for(lambda: discoverable(c, "count_then_exit", 2), 15, "SeDs")
        call = c.submit("count_then_exit", str(path), "once")
        with pytest.raises(gridrpc.WorkerDied):
            call.result(30)
        assert call.server in ("s1", "s2")
    assert path.read_text().split() == ["once"]


def test_orphaned_call_is_killed(proc_tree, tmp_path):
    """A client that vanished (no pings): the SeD kills its idempotent call."""
    ma = proc_tree.start("ma", "MA")
    sed = proc_tree.sed("s1", ma.address, "--orphan-call-timeout", "1.0")
    with gridrpc.Client(ma.address) as c:
        wait_for(lambda: discoverable(c, "sleep", 1), 15, "SeD")
    import zmq
    from gridrpc.core import messages as m
    from gridrpc.core.messages import MsgType
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(sed.address)
    s.send(m.dumps(m.make(MsgType.CALL, "orphan-1", service="sleep", args=[20.0], kwargs={}, user="u")))
    assert s.poll(5000)
    s.close()                                            # the client goes away, never pings
    wait_for(lambda: "killed (orphan)" in sed.log.read_text(), 10, "orphan killed")
