"""Attacks from a stranger on the network, against real daemons on real sockets.

Each test does what an attacker did with a few raw ZeroMQ messages against a
deployed tree (issue: "A tree that can face a shared network") and checks
that it no longer works, while the tree keeps serving ordinary users.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import zmq

import gridrpc
from gridrpc.core import messages as m
from gridrpc.testing import wait_for
from tests.proc_tree import ProcTree

pytestmark = pytest.mark.real


def _dealer(address: str) -> zmq.Socket:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(address)
    return s


def _ask(sock: zmq.Socket, header: dict, buffers: list = (), timeout: float = 5.0) -> dict:
    sock.send_multipart([orjson.dumps(header), *buffers])
    assert sock.poll(int(timeout * 1000)), f"no reply to {header.get('type')}"
    return orjson.loads(sock.recv_multipart()[0])


@pytest.fixture
def attacked_tree(tmp_path):
    """MA -> LA -> SeD as real processes; the SeD's TMPDIR is a directory of
    the test's, where a victim file is planted next to the SeD's own tmpdir."""
    sed_tmp = tmp_path / "tmp"
    sed_tmp.mkdir()
    (sed_tmp / "victim.txt").write_text("precious")
    env = dict(os.environ, TMPDIR=str(sed_tmp))
    with ProcTree(tmp_path) as pt:
        ma = pt.start("ma", "MA")
        la = pt.start("la", "LA1", parent=ma.address)
        old = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = env["TMPDIR"]          # inherited by the SeD's Popen
        try:
            sed = pt.sed("sed-1", la.address)
        finally:
            if old is None:
                os.environ.pop("TMPDIR")
            else:
                os.environ["TMPDIR"] = old
        with gridrpc.Client(ma.address) as c:
            def registered():
                try:
                    return c.discover("add", 1) != []
                except (gridrpc.ServiceNotFound, gridrpc.NoServerAvailable):
                    return False                # not yet registered, or the MA still rebuilding
            wait_for(registered, 20, "the SeD registered")
        yield pt, ma, la, sed, sed_tmp


def test_import_path_aggregator_runs_nothing(attacked_tree, tmp_path):
    """A DISCOVER naming ``os:system`` ran a command on every agent."""
    _pt, ma, _la, _sed, _ = attacked_tree
    marker = tmp_path / "pwned"
    s = _dealer(ma.address)
    try:
        for i, (name, param) in enumerate((("os:system", "command"), ("subprocess:getoutput", "cmd"))):
            r = _ask(s, m.make(m.MsgType.DISCOVER, f"d-{i}", service="add", k=3,
                               aggregator={"name": name, "params": {param: f"touch {marker}"}}))
            assert r["type"] == "error", r
            assert r["error"]["kind"] == "invalid_argument"
            assert "aggregator" in r["error"]["message"]
    finally:
        s.close()
    time.sleep(0.3)                      # an agent that ran the command would have created it by now
    assert not marker.exists()
    with gridrpc.Client(ma.address) as c:      # the tree still serves
        assert c.call("add", 1, 2) == 3


def test_rogue_default_aggregator_is_ignored(attacked_tree, tmp_path):
    """A child registering ``os:system`` as its service's default aggregator
    must not make ordinary users' discoveries run it."""
    _pt, ma, la, _sed, _ = attacked_tree
    marker = tmp_path / "pwned-default"
    rogue = _dealer(la.address)
    try:
        r = _ask(rogue, m.make(m.MsgType.REGISTER, "r1", name="rogue", kind="sed", address="tcp://127.0.0.1:9",
                               services=[{"name": "add", "doc": "", "params": [],
                                          "aggregator": {"name": "os:system",
                                                         "params": {"command": f"touch {marker}"}}}]))
        assert r["type"] in ("registered", "error")
        with gridrpc.Client(ma.address, discovery_timeout=5) as c:
            for _ in range(5):
                servers = c.discover("add", 5)
                assert servers, "discovery failed"
    finally:
        rogue.close()
    assert not marker.exists()


def test_dotdot_call_id_leaves_the_temp_directory_alone(attacked_tree):
    """A call id of ``..`` with a file argument made the SeD remove the
    parent of its tmpdir (the system temp directory) when the call ended."""
    _pt, _ma, _la, sed, sed_tmp = attacked_tree
    s = _dealer(sed.address)
    try:
        for bad in ("..", ".", "../..", "a/../../x", "x" * 500, "a\x00b"):
            r = _ask(s, {"v": 1, "type": "call", "id": bad, "service": "echo", "args": ["x"], "kwargs": {},
                         "sed": "sed-1"})
            assert r["type"] == "error" and r["error"]["kind"] == "protocol", (bad, r)
        # a file argument under a hostile file name: stored inside the SeD's own directory
        buffers = [b"overwritten"]
        args = [{"__t": "file", "name": "../../victim.txt", "i": 0}]
        r = _ask(s, {"v": 1, "type": "call", "id": "ok-1", "service": "sleep", "args": [0.01],
                     "kwargs": {}, "sed": "sed-1"})
        while r["type"] == "accepted":
            assert s.poll(5000)
            r = orjson.loads(s.recv_multipart()[0])
        assert r["type"] == "result"
        r = _ask(s, {"v": 1, "type": "call", "id": "ok-2", "service": "echo", "args": args,
                     "kwargs": {}, "sed": "sed-1"}, buffers)
        while r["type"] == "accepted":
            assert s.poll(5000)
            r = orjson.loads(s.recv_multipart()[0])
        assert r["type"] == "result"
    finally:
        s.close()
    assert (sed_tmp / "victim.txt").read_text() == "precious"
    assert sed.popen.poll() is None
