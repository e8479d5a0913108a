"""Fast paths of the SeD's per-call work that must not change what they do:
codec.decode of plain scalar lists and dicts, the worker pipe's framing
(gridrpc.sed.worker_link: the bytes of multiprocessing's Connection), an
idle worker found dead before it gets a call (WorkerPool)."""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import struct

import numpy as np
import pytest

from gridrpc.core import codec
from gridrpc.core import messages as m
from gridrpc.sed import worker_link
from gridrpc.sed.shm import OwnSegments, ShmLimits
from gridrpc.sed.worker_link import Link
from gridrpc.sed.workers import WorkerPool


# -- codec.decode: a list or dict of JSON scalars ------------------------------------
@pytest.mark.parametrize("tree", [[], [1, 2], [1.5, "a", None, True, False], {}, {"a": 1, "b": "x", "c": None}])
def test_decode_of_plain_scalars_is_an_equal_new_container(tree):
    out = codec.decode(tree, [], None, False)
    assert out == tree and type(out) is type(tree) and out is not tree
    if isinstance(out, dict):
        out["changed"] = 1
    else:
        out.append("changed")
    assert tree != out                                          # the header's value is not shared


@pytest.mark.parametrize("tree, want", [
    ([1, {"__t": "t", "v": [1, 2]}], [1, (1, 2)]),
    ([{"__t": "f", "v": "inf"}, 2], [float("inf"), 2]),
    ({"a": 1, "b": {"__t": "t", "v": []}}, {"a": 1, "b": ()}),
    ({"a": [1, 2]}, {"a": [1, 2]}),
    ([[1], [2, [3]]], [[1], [2, [3]]]),
])
def test_decode_of_a_container_with_tagged_or_nested_values_takes_the_full_path(tree, want):
    assert codec.decode(tree, [], None, True) == want


def test_decode_still_refuses_a_bad_tag_after_scalars():
    with pytest.raises(Exception):
        codec.decode([1, 2, {"__t": "nope"}], [], None, True)


def test_make_names_the_type_as_its_value():
    for mt in m.MsgType:
        assert m.make(mt, "x")["type"] == mt.value


# -- the worker pipe's framing ----------------------------------------------------------
@pytest.mark.parametrize("size", [0, 1, 100, 16384, 16385, 200_000])     # Connection: one write up to 16 KiB
def test_link_framing_is_the_connections(size):
    data = os.urandom(size)
    a, b = mp.Pipe()
    try:
        worker_link._send_msg(a, data)              # ours -> Connection
        assert b.recv_bytes() == data
        b.send_bytes(data)                          # Connection -> ours
        assert worker_link._recv_msg(a) == data
        if size <= 16384:                           # the same bytes on the pipe
            worker_link._send_msg(a, data)
            raw = os.read(b.fileno(), 4 + size) if size else os.read(b.fileno(), 4)
            assert raw == struct.pack("!i", size) + data
    finally:
        a.close()
        b.close()


def test_link_framing_eof_and_closed_are_the_connections():
    a, b = mp.Pipe()
    b.close()
    with pytest.raises(EOFError):
        worker_link._recv_msg(a)
    a.close()
    with pytest.raises(OSError):
        worker_link._recv_msg(a)
    with pytest.raises(OSError):
        worker_link._send_msg(a, b"x")


def test_link_framing_eof_inside_a_message_is_an_oserror():
    a, b = mp.Pipe()
    os.write(b.fileno(), struct.pack("!i", 10) + b"abc")
    b.close()
    with pytest.raises(OSError, match="end of file during message"):
        worker_link._recv_msg(a)
    a.close()


def test_a_link_message_with_and_without_out_of_band_buffers():
    limits = ShmLimits()
    a, b = mp.Pipe()
    la = Link(a, OwnSegments(limits, "s"), limits)
    lb = Link(b, OwnSegments(limits, "w"), limits)
    try:
        la.send(("c1", "add", [1, 2], {}))              # no buffer: the short path
        assert lb.recv() == ("c1", "add", [1, 2], {})
        arr = np.arange(10, dtype=">i4")
        la.send(("c2", "echo", [arr], {}))              # a pickle-5 buffer through the pipe
        got = lb.recv()
        assert got[0] == "c2" and got[2][0].dtype == arr.dtype and (got[2][0] == arr).all()
    finally:
        la.close()
        lb.close()


# -- an idle worker that died before its next call ----------------------------------------
def _add(a, b):
    return a + b


def test_an_idle_worker_found_dead_is_replaced_before_it_gets_a_call():
    async def go():
        pool = WorkerPool({"add": _add}, size=1, prestart=1)
        pool.start()
        try:
            first = await pool.run("c1", "add", [1, 1], {})
            dead = pool.idle[0]
            os.kill(dead.proc.pid, signal.SIGKILL)
            dead.proc.join(5)               # dead (its EOF not read yet: the loop has not run)
            got: list = []
            started = pool.start_now("c2", "add", [2, 2], {}, lambda v, e: got.append((v, e)))
            # handed to a worker (the dead one: a bug), the call would end with its EOF, read in a loop
            # turn or two; a call nobody got calls back never: a few turns, not seconds, tell them apart
            for _ in range(5000 if started else 50):
                if got:
                    break
                await asyncio.sleep(0.002)
            return first, started, got, dead in pool.workers, pool.spawned
        finally:
            await pool.aclose()
    first, started, got, dead_kept, spawned = asyncio.run(go())
    assert first == (True, 2)
    # the dead one is retired, not handed the call: no worker is idle, so start_now starts
    # nothing (the runtime then runs the call in a task: run() forks a fresh worker)
    assert not dead_kept and not started and got == [] and spawned == 1
