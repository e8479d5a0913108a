"""The pieces of the SeD <-> worker shared-memory path alone (issue #12):
segments (reuse, limits), mapping a peer's segment (sizes checked), the
pipe's messages (plan entries checked), descriptor passing. Through a
real SeD: test_worker_shm.py."""
from __future__ import annotations

import os
import socket

import numpy as np
import pytest

from gridrpc.sed.shm import MiB, OwnSegments, PeerSegments, ShmError, ShmLimits
from gridrpc.sed.worker_link import Link
from tests.test_worker_shm import _same, memfd_fds

pytestmark = pytest.mark.timeout(60)


def test_segments_are_reused_bounded_and_closed_when_idle_beyond_keep_idle():
    own = OwnSegments(ShmLimits(max_segment=8 * MiB, max_total=12 * MiB, keep_idle=4 * MiB), "t")
    try:
        a = own.acquire(3 * MiB)
        assert a is not None and a.size == 3 * MiB and a.holders == 1
        assert own.acquire(9 * MiB) is None                  # above max_segment
        b = own.acquire(8 * MiB)
        assert b is not None and own.total == 11 * MiB
        own.returned(a.id)
        own.collect()
        assert own.acquire(2 * MiB + 1).id == a.id           # reused (fits, not twice too big)
        assert own.acquire(2 * MiB) is None                  # 3 + 8 + 2 > 12 and nothing idle to close
        own.returned(b.id)
        own.collect()                                        # 8 MiB idle > keep_idle: closed
        assert not own.live(b.id) and own.total == 3 * MiB
        st = own.statistics()
        assert st["created"] == 2 and st["reused"] == 1 and st["closed"] == 1 and st["over_limit"] == 2
    finally:
        own.close()
    assert own.total == 0 and not memfd_fds()


def test_a_peer_segment_is_mapped_and_read_only_within_its_size():
    own = OwnSegments(ShmLimits(), "t")
    peer = PeerSegments(ShmLimits(max_segment=4 * MiB))
    seg = own.acquire(2 * MiB)
    try:
        np.frombuffer(seg.mm, np.uint8, 4)[:] = [1, 2, 3, 4]
        with pytest.raises(ShmError, match="claims"):
            peer.map(seg.id, 3 * MiB, os.dup(seg.fd))       # lies about its size
        with pytest.raises(ShmError, match="refused"):
            peer.map(seg.id, 8 * MiB, os.dup(seg.fd))       # above max_segment
        with pytest.raises(ShmError):
            peer.map("1", 2 * MiB, os.dup(seg.fd))          # not an int id
        fd = os.dup(seg.fd)
        peer.map(seg.id, 2 * MiB, fd)
        with pytest.raises(OSError):                         # the received descriptor is closed
            os.fstat(fd)
        released = []
        v = peer.view(seg.id, 0, 4, released.append)
        assert list(v) == [1, 2, 3, 4]
        for sid, off, n in [(seg.id, 2 * MiB - 3, 4), (seg.id, -1, 4), (seg.id, 0, 0), (seg.id, 0, 2 * MiB + 1),
                            (seg.id + 1, 0, 4), (seg.id, 0.0, 4), (seg.id, 0, "4")]:
            with pytest.raises(ShmError):
                peer.view(sid, off, n, released.append)
        assert released == []
        del v
        assert released == [seg.id]                          # told when the last view died
    finally:
        peer.clear()
        own.close()


def _pair(limits: ShmLimits):
    import multiprocessing as mp
    a, b = mp.get_context("fork").Pipe()
    return (Link(a, OwnSegments(limits, "a"), limits), Link(b, OwnSegments(limits, "b"), limits))


def test_link_sends_big_buffers_once_and_takes_back_its_own_without_copy():
    left, right = _pair(ShmLimits())
    try:
        big = np.random.default_rng(5).random(MiB // 4)                     # 2 MiB
        left.send({"big": big, "small": np.arange(5), "text": "x"})
        got = right.recv()
        assert _same(got["big"], big) and _same(got["small"], np.arange(5)) and got["text"] == "x"
        seg = next(iter(left.own.segs.values()))
        addr = got["big"].ctypes.data
        assert right.peer.locate(addr, big.nbytes) == (seg.id, 0)          # a view on left's segment
        right.send(got.pop("big"), detach=True)     # back as it is: "yours", no copy, no segment of right's
        back = left.recv()
        assert _same(back, big) and back.ctypes.data == seg.addr and not right.own.segs
        assert seg.holders == 1                     # right let go of it; left's own view holds it
        del back
        left.own.collect()
        assert seg.holders == 0 and seg.id in left.own.idle
    finally:
        left.close()
        right.close()


def test_link_refuses_a_plan_that_does_not_fit_its_segments():
    import pickle
    left, right = _pair(ShmLimits())
    try:
        left.send(np.zeros(MiB // 8))               # right now maps one of left's segments
        right.recv()
        sid = next(iter(left.own.segs))
        head = pickle.dumps(np.zeros(1), protocol=5, buffer_callback=lambda b: False)
        ok = {"new": [], "released": [], "dropped": []}
        for plan, ctl in [([("mine", sid, MiB - 4, 8)], ok),           # past the end of the segment
                          ([("mine", sid + 7, 0, 8)], ok),             # a segment never announced
                          ([("yours", 1, 0, 8)], ok),                  # one of right's it never lent
                          ([("elsewhere", sid, 0, 8)], ok), ([("mine", sid, 0)], ok),
                          ([("pipe", -1)], ok), ([5], ok),
                          ([("mine", sid, 0, 8)], {**ok, "released": ["x"]}),
                          ([("mine", sid, 0, 8)], {**ok, "new": [(1, 2, 3)]})]:
            left.conn.send_bytes(pickle.dumps((head, plan, ctl)))
            with pytest.raises(ShmError):
                right.recv()
    finally:
        left.close()
        right.close()


def test_descriptors_are_checked_and_extra_ones_closed():
    from gridrpc.sed.shm import recv_fds, send_fds
    a, b = socket.socketpair()
    r, w = os.pipe()
    try:
        send_fds(a, [r, w])
        with pytest.raises(ShmError, match="expected 1"):
            recv_fds(b, 1)
        before = len(os.listdir("/proc/self/fd"))
        send_fds(a, [r])
        [fd] = recv_fds(b, 1)
        assert len(os.listdir("/proc/self/fd")) == before + 1
        os.close(fd)
    finally:
        for x in (r, w):
            os.close(x)
        a.close()
        b.close()
