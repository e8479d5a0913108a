"""A SeD fetching a data reference from another SeD takes a bulk session under
CURVE (gridrpc.sed.data.fetch over gridrpc.transport.pipes), as a client's
data requests do: real SeDs and sockets, a secure tree.

What went sealed is read from both ends' counters (the fetching SeD's
``statistics()["data"]["fetch_bulk"]``, the holder's ``statistics()["bulk"]``),
not from timing (but for a refused session, which must not cost its whole
wait). Values arrive intact; the holder still refuses another
user's reference when the request comes through the session; closing an idle
holder closes its session; a holder that refuses a session is fetched from
over CURVE at once; a plain tree has no bulk path; the benchmark runs."""
from __future__ import annotations

import time

import numpy as np
import pytest

import gridrpc
from gridrpc.core import messages as m
from gridrpc.sed.data import fetch
from gridrpc.sed.data.fetch import PEER_IDLE
from gridrpc.testing import LocalTree
from gridrpc.transport.bulk_client import BulkLinks

MB = 1 << 20


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    keys = str(tmp_path_factory.mktemp("keys"))
    with LocalTree(las=0, seds_under_ma=2, keys=keys, users=["alice", "bob"], http=False) as t:
        yield t, keys


def _stats(t, sed) -> dict:
    return t.lt.call(sed.statistics)


def _fetch_bulk(t, sed) -> dict:
    return _stats(t, sed)["data"]["fetch_bulk"]


def _accepted(t, sed) -> int:
    return _stats(t, sed)["bulk"].get("accepted", 0)


@pytest.fixture
def patient(monkeypatch):
    """The first fetch waits for its session however loaded the machine is (a wait that runs
    out sends it over CURVE, which these tests would report)."""
    monkeypatch.setattr(fetch, "SESSION_WAIT", 30.0)


def test_a_large_argument_comes_from_its_holder_through_a_bulk_session(tree, patient):
    t, keys = tree
    holder, runner = t.seds
    a = np.random.default_rng(0).random(MB)                         # 8 MB
    with gridrpc.Client(t.ma_address, keys=keys, user="alice") as c:
        ref = c.put(a, server=holder.name)
        f0, acc0 = _fetch_bulk(t, runner), _accepted(t, holder)
        kept = c.call("echo", ref, server=runner.name, keep_result=True)   # runner fetches ref from holder
        assert kept.holder == runner.name
        f1 = _fetch_bulk(t, runner)
        # the first fetch already went sealed: the reference's size made the runner open the session first
        assert f1["received_bytes"] - f0["received_bytes"] >= a.nbytes
        assert f1["sent"] > f0["sent"] and f1["sessions"] == 1
        assert _accepted(t, holder) > acc0                             # the holder opened the sealed request
        assert _stats(t, runner)["data"]["fetched_bytes"] >= a.nbytes
        back = kept.get()
        assert back.dtype == a.dtype and np.array_equal(back, a)
        # several values from the same holder reuse the session
        for value in (np.arange(2_000_000, dtype=np.int32), {"x": np.ones(300_000), "tag": "t"}):
            r = c.put(value, server=holder.name)
            got = c.call("echo", r, server=runner.name)
            if isinstance(value, dict):
                assert got["tag"] == "t" and np.array_equal(got["x"], value["x"])
            else:
                assert np.array_equal(got, value)
        f2 = _fetch_bulk(t, runner)
        assert f2["received_bytes"] - f1["received_bytes"] >= 2_000_000 * 4 + 300_000 * 8 and f2["sessions"] == 1


def test_a_replica_is_copied_through_a_bulk_session(tree, patient):
    t, keys = tree
    holder, runner = t.seds
    a = np.random.default_rng(1).random(MB)
    with gridrpc.Client(t.ma_address, keys=keys, user="alice") as c:
        ref = c.put(a, server=holder.name)
        f0 = _fetch_bulk(t, runner)
        ref.replicate(2)                                # data_put with a source (and its size) on the runner
        assert [r[0] for r in ref.replicas] == [runner.name]
        f1 = _fetch_bulk(t, runner)
        assert f1["received_bytes"] - f0["received_bytes"] >= a.nbytes
        # the copy is the runner's own now: a call there reads it without fetching
        fetched = _stats(t, runner)["data"]["fetched"]
        assert np.array_equal(c.call("echo", ref, server=runner.name), a)
        assert _stats(t, runner)["data"]["fetched"] == fetched


def test_the_holder_refuses_another_users_ref_through_the_session(tree, patient):
    t, keys = tree
    holder, runner = t.seds
    a = np.random.default_rng(2).random(MB)
    with gridrpc.Client(t.ma_address, keys=keys, user="alice") as alice, \
            gridrpc.Client(t.ma_address, keys=keys, key="bob", user="bob") as bob:
        ref = alice.put(a, server=holder.name)
        assert np.array_equal(alice.call("echo", ref, server=runner.name), a)      # the session is up
        f0, acc0 = _fetch_bulk(t, runner), _accepted(t, holder)
        with pytest.raises(gridrpc.DataAccessDenied, match="belongs to another user; 'bob'"):
            bob.call("echo", ref, server=runner.name)
        bob._aclient.user = "alice"                     # a forged header: the runner fetches for bob's key
        with pytest.raises(gridrpc.DataAccessDenied, match="'bob'"):
            bob.call("echo", ref, server=runner.name)
        f1 = _fetch_bulk(t, runner)
        assert f1["sent"] >= f0["sent"] + 2                              # both requests went sealed,
        assert f1["received"] >= f0["received"] + 2                      # and both refusals came back so
        assert _accepted(t, holder) >= acc0 + 2                          # and the holder read them so
        assert f1["received_bytes"] - f0["received_bytes"] < MB          # none of alice's bytes came
        assert f1["sessions"] == 1
        assert np.array_equal(alice.call("echo", ref, server=runner.name), a)      # still alice's


def test_closing_an_idle_holder_closes_its_session(tree, patient):
    t, keys = tree
    holder, runner = t.seds
    a = np.random.default_rng(3).random(MB)
    with gridrpc.Client(t.ma_address, keys=keys, user="alice") as c:
        ref = c.put(a, server=holder.name)
        assert np.array_equal(c.call("echo", ref, server=runner.name), a)
        assert _fetch_bulk(t, runner)["sessions"] == 1
        t.lt.call(lambda: runner.data._close_idle_peers(time.monotonic() + PEER_IDLE))
        assert _fetch_bulk(t, runner)["sessions"] == 0 and len(runner.data.pipes) == 0
        f0 = _fetch_bulk(t, runner)
        assert np.array_equal(c.call("echo", ref, server=runner.name), a)       # a new pipe, a new session
        f1 = _fetch_bulk(t, runner)
        assert f1["sessions"] == 1 and f1["received_bytes"] - f0["received_bytes"] >= a.nbytes


def test_a_holder_that_refuses_a_session_is_fetched_from_over_curve_at_once(tree, monkeypatch):
    """A holder at its session limit answers ``bulk_open`` with an error: the fetching SeD stops
    waiting for the session (not after SESSION_WAIT) and fetches over CURVE."""
    t, keys = tree
    holder, runner = t.seds
    a = np.random.default_rng(5).random(MB)
    monkeypatch.setattr(fetch, "SESSION_WAIT", 60.0)            # a wait that ran out would fail the test
    with gridrpc.Client(t.ma_address, keys=keys, user="alice") as c:
        ref = c.put(a, server=holder.name)
        assert np.array_equal(c.call("echo", ref, server=runner.name), a)
        t.lt.call(lambda: runner.data._close_idle_peers(time.monotonic() + PEER_IDLE))
        bulk = holder.endpoint._bulk
        t.lt.call(lambda: setattr(bulk, "MAX_SESSIONS", bulk.sessions()))
        try:
            f0 = _fetch_bulk(t, runner)
            # a fetch that waited out SESSION_WAIT (60 s) would end this call in Timeout
            assert np.array_equal(c.call("echo", ref, server=runner.name, timeout=20), a)
        finally:
            t.lt.call(lambda: delattr(bulk, "MAX_SESSIONS"))
        f1 = _fetch_bulk(t, runner)
        assert f1["sessions"] == 0 and f1["received"] == f0["received"] and f1["sent"] == f0["sent"]


def test_bulk_links_take_a_refusal_and_forget_a_dropped_server():
    """Pure: the answer to ``bulk_open`` that is an error is consumed and delays the next
    question; another error passes; dropping a server forgets its question and its delay."""
    sent: list = []
    links = BulkLinks(lambda address, frames: sent.append((address, frames)), lambda address, frames: None)
    assert links.ask("tcp://h:1") and not links.ask("tcp://h:1") and "tcp://h:1" in links
    rid = m.parse_header(sent[0][1][0])[1]["id"]
    other = m.dumps(m.error_header("bulk-0000000000000000", "refused", "not yours"))
    assert not links.intercept("tcp://h:1", [other]) and "tcp://h:1" in links
    refusal = m.dumps(m.error_header(rid, "refused", "sed-1: 16384 bulk sessions open (limit 16384)"))
    assert links.intercept("tcp://h:1", [refusal])
    assert "tcp://h:1" not in links and not links.ask("tcp://h:1") and len(sent) == 1    # asked again later
    links.drop("tcp://h:1")
    assert links.ask("tcp://h:1") and len(sent) == 2 and "tcp://h:1" in links
    links.drop("tcp://h:1")
    assert "tcp://h:1" not in links and links.sessions() == 0


def test_a_plain_tree_fetches_without_a_bulk_path():
    with LocalTree(las=0, seds_under_ma=2, http=False) as t:
        holder, runner = t.seds
        a = np.random.default_rng(4).random(MB)
        with gridrpc.Client(t.ma_address, user="alice") as c:
            ref = c.put(a, server=holder.name)
            assert np.array_equal(c.call("echo", ref, server=runner.name), a)
        st = _stats(t, runner)
        assert st["data"]["fetched_bytes"] >= a.nbytes and "fetch_bulk" not in st["data"]
        assert runner.data.pipes.links is None and _stats(t, holder)["bulk"] == {}


def test_the_server_to_server_benchmark_runs():
    """``python -m benchmarks.s2s_bulk``: the three trees fetch, the sealed one through its session."""
    import os
    import re
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "benchmarks.s2s_bulk", "--mb", "1", "--repeats", "2", "--rounds", "1"],
                       capture_output=True, text=True, timeout=120, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert r.returncode == 0, r.stderr[-2000:]
    line = re.search(r"round 1 \(1 MB\): plain first [\d.]+ ms, median ([\d.]+) .*; curve first [\d.]+ ms, "
                     r"median ([\d.]+) .*; sealed first [\d.]+ ms, median ([\d.]+) .*: sealed/curve ([\d.]+)x.*"
                     r"sealed answers (\d+)/3", r.stdout)
    assert line, r.stdout
    curve, sealed, ratio = float(line[2]), float(line[3]), float(line[4])
    # the ratio of the medians, which the line shows rounded to 0.1 ms
    assert (sealed - 0.05) / (curve + 0.05) - 0.005 <= ratio <= (sealed + 0.05) / max(curve - 0.05, 0.01) + 0.005
    assert line[5] == "3"                               # every fetch of the sealed tree came through its session
