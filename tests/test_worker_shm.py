"""Large arrays between the SeD and its worker processes through shared
memory (issue #12): written once each way, exact, bounded, never left behind.

Segments are memfd (never named in /dev/shm): "left behind" is checked in
/dev/shm *and* in the processes' mappings and descriptors
(``/memfd:gridrpc-...`` in /proc/PID/maps and /proc/PID/fd). The pieces
(segments, the pipe's messages) alone: test_worker_shm_parts.py.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
import zmq

import gridrpc
from gridrpc.core import messages as m
from gridrpc.core.messages import MsgType
from gridrpc.sed.backends.local import ProcessBackend
from gridrpc.sed.server import SeD
from gridrpc.sed.shm import MiB, ShmLimits
from gridrpc.testing import LoopThread, wait_for

pytestmark = pytest.mark.timeout(120)


# -- services (module level: the forked workers have them) ---------------------
def echo(a):
    return a


def fresh(a):
    return a.copy()


def inplace(a):
    a[...] = a * 2
    return a


def where(a):
    """The file mapped at the argument's memory in this worker (or None) and its writability."""
    addr = a.ctypes.data
    for line in open("/proc/self/maps"):
        parts = line.split()
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if lo <= addr < hi:
            return (parts[5] if len(parts) > 5 else None), bool(a.flags.writeable)
    return None, bool(a.flags.writeable)


def hold(a, seconds):
    time.sleep(seconds)
    return a


def crash(a):
    os._exit(3)


KEPT: list = []


def keep(a):
    KEPT.append(a)
    return float(a[0])


def peek():
    return float(KEPT[0][0]), float(KEPT[0][-1])


def forget():
    KEPT.clear()
    return 0


SERVICES = (echo, fresh, inplace, where, hold, crash, keep, peek, forget)


# -- helpers -------------------------------------------------------------------------
def memfd_maps(pid: int | str = "self") -> list[str]:
    with open(f"/proc/{pid}/maps") as f:
        return [line.split()[5] for line in f if "/memfd:gridrpc-" in line]


def memfd_fds(pid: int | str = "self") -> list[str]:
    out = []
    d = f"/proc/{pid}/fd"
    for name in os.listdir(d):
        try:
            target = os.readlink(f"{d}/{name}")
        except OSError:
            continue
        if "/memfd:gridrpc-" in target:
            out.append(target)
    return out


def dev_shm() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if "gridrpc" in n or n.startswith("psm_")}


class Sed:
    """A SeD in this process (its loop in a thread) with the services above."""

    def __init__(self, isolation: str = "process", limits: ShmLimits | None = None, **kw) -> None:
        self.lt = LoopThread()
        ex = ProcessBackend(workers=1, shm=limits) if isolation == "process" else None
        self.sed = SeD("shm-sed", None, isolation=isolation, execution=ex, **kw)
        for fn in SERVICES:
            self.sed.add_service(fn.__name__, fn)
        self.lt.run(self.sed.start())
        self.server = f"{self.sed.address}#shm-sed"
        self.client = gridrpc.Client(None, timeout=60)

    def __call__(self, service, *args):
        return self.client.handle(service, server=self.server)(*args)

    def stats(self) -> dict:
        return self.lt.call(self.sed.statistics)["shm"]

    def settle(self, busy: int = 0) -> None:
        """Wait until only ``busy`` of the SeD's segments are held. A reply
        leaves zero-copy from the segment that holds the value, and zmq
        drops the frame (the hold) in its own threads after the bytes went
        out, maybe after the client got them and sent its next call: a call
        that comes first finds the segment busy and gets a new one."""
        wait_for(lambda: self.stats()["busy"] == busy, 10, f"{busy} segment(s) held by the SeD")

    def worker_pids(self) -> list[int]:
        return self.lt.call(self.sed.pool.pids)

    def close(self) -> None:
        self.client.close()
        self.lt.run(self.sed.aclose())
        self.lt.close()


@pytest.fixture
def before_shm():
    before = dev_shm()
    yield before
    assert dev_shm() - before == set(), "a segment was left in /dev/shm"


def _samples():
    rng = np.random.default_rng(7)
    big = rng.random((512, 1024))                                     # 4 MiB, C order
    rec = np.zeros(200_000, dtype=[("a", "<i4"), ("b", ">f8")])
    rec["a"] = np.arange(200_000)
    rec["b"] = rng.random(200_000)
    return {
        "f8": big,
        "i4_big_endian": np.arange(600_000, dtype=">i4"),
        "c16": (big[:256] + 1j * big[256:]).astype(np.complex128),
        "bool": big > 0.5,
        "u1": rng.integers(0, 255, 3 * MiB, dtype=np.uint8),
        "datetime": np.arange(300_000).astype("datetime64[ns]"),
        "structured": rec,
        "f4_fortran": np.asfortranarray(big.astype(np.float32)),
        "strided": big[:, ::2],                 # not contiguous: the client sends a compact copy
        "transposed": big.T,                    # F-contiguous view
        "zero_d": np.array(2.5),
        "empty": np.zeros((0, 7)),
        "small": np.arange(10, dtype=np.int16),
    }


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return (a.dtype.str == b.dtype.str and a.dtype == b.dtype and a.shape == b.shape
            and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes())


# -- through a SeD -----------------------------------------------------------------
@pytest.mark.parametrize("isolation", ["process", "inline"])
def test_arrays_come_back_exact_for_every_dtype_and_layout(isolation, before_shm):
    s = Sed(isolation, result_cache_bytes=0)        # kept answers would hold their segments (busy)
    try:
        for name, a in _samples().items():
            assert _same(s("echo", a), a), name
            assert _same(s("fresh", a), a), name
            if a.dtype.kind in "fiuc" and a.size:
                expected = np.asarray(a) * 2
                assert _same(s("inplace", a), expected.astype(a.dtype)), name
        if isolation == "process":
            s.settle()                              # the last reply's segment comes back
            st = s.stats()
            assert st["created"] >= 1 and st["reused"] >= 1 and st["busy"] == 0
    finally:
        s.close()


def test_the_service_gets_its_array_on_the_sed_segment_and_echo_comes_back_without_a_worker_segment():
    s = Sed("process", result_cache_bytes=0)
    try:
        a = np.random.default_rng(1).random(3 * MiB // 8)
        path, writable = s("where", a)
        assert path is not None and path.startswith(f"/memfd:gridrpc-s{os.getpid()}-"), path
        assert writable                          # services may change their arrays in place
        path, _ = s("where", np.arange(100.0))   # small: through the pipe, private memory
        assert path is None or "memfd" not in path
        for _ in range(4):
            s.settle()                          # the last reply's segment free again: it is the one reused
            assert _same(s("echo", a), a)
        names = memfd_maps()
        # the echoed array went back from the SeD's own segment: no worker segment mapped here
        assert names and all(n.startswith(f"/memfd:gridrpc-s{os.getpid()}-") for n in names), names
        s.settle()
        st = s.stats()
        assert st["created"] == 1 and st["reused"] >= 4, st      # one segment, written again and again
        assert _same(s("fresh", a), a)                               # a new array: a worker segment
        wait_for(lambda: any("gridrpc-w" in n for n in memfd_maps()), 5, "the worker's segment mapped")
    finally:
        s.close()


def test_an_argument_the_service_keeps_is_never_overwritten():
    s = Sed("process", result_cache_bytes=0)
    try:
        a = np.full(3 * MiB // 8, 1.0)
        a[-1] = 7.0
        assert s("keep", a) == 1.0
        for v in (2.0, 3.0, 4.0):                   # the same size: would reuse a's segment if it were free
            b = np.full(3 * MiB // 8, v)
            s.settle(busy=1)                        # only a's: the last echo's segment is free for b
            assert _same(s("echo", b), b)
        s.settle(busy=1)
        assert s("peek") == (1.0, 7.0)              # what the service kept is intact
        st = s.stats()
        assert st["created"] == 2 and st["busy"] == 1, st   # a's segment stays lent to the worker
        assert s("forget") == 0
        st = s.stats()
        assert st["busy"] == 0, st                  # given back with forget's answer
    finally:
        s.close()


def test_limits_send_big_buffers_through_the_pipe_instead():
    s = Sed("process", limits=ShmLimits(max_segment=2 * MiB, max_total=5 * MiB))
    try:
        big = np.random.default_rng(2).random(MiB)                 # 8 MiB > max_segment
        assert _same(s("fresh", big), big)
        two = [np.full(3 * MiB // 8, float(i)) for i in range(2)]   # 3 MiB each: rounds to 3 MiB segments
        assert _same(s("fresh", two[0]), two[0])
        st = s.stats()
        assert st["over_limit"] >= 1 and st["bytes"] <= 5 * MiB
        assert all(_same(x, y) for x, y in zip(s("echo", two), two))     # 6 MiB > max_total: one by pipe
        st = s.stats()
        assert st["over_limit"] >= 2 and st["bytes"] <= 5 * MiB, st
    finally:
        s.close()


def _strict(**kw) -> Sed:
    return Sed("process", limits=ShmLimits(keep_idle=0), result_cache_bytes=0, **kw)


def _nothing_mapped(s: Sed, what: str) -> None:
    pids = ["self", *s.worker_pids()]
    wait_for(lambda: not any(memfd_maps(p) for p in pids) and not memfd_fds("self"), 10,
             f"no gridrpc segment left after {what}")


def test_nothing_left_after_a_call(before_shm):
    s = _strict()
    try:
        a = np.random.default_rng(3).random(3 * MiB // 8)
        for service in ("echo", "fresh", "inplace"):
            s(service, a.copy())
            _nothing_mapped(s, service)
        assert s.stats()["segments"] == 0
    finally:
        s.close()


def test_nothing_left_after_cancelling_a_running_call(before_shm):
    s = _strict()
    try:
        a = np.ones(3 * MiB // 8)
        assert _same(s("fresh", a), a)              # the worker owns a result segment by now
        call = s.client.handle("hold", server=s.server).submit(a, 60)
        wait_for(lambda: s.lt.call(lambda: bool(s.sed.pool.by_call)), 10, "the call running")
        old = s.worker_pids()
        # handed over is not yet read: the worker maps the argument's segment when it reads the call
        wait_for(lambda: memfd_maps(old[0]), 10, "the worker mapping the argument's segment")
        assert call.cancel() is True
        with pytest.raises(gridrpc.CallCancelled):
            call.result(30)
        # the call is interrupted in its worker, which answers and stays (no kill, no fork)
        wait_for(lambda: s.lt.call(lambda: s.sed.pool.interrupted == 1 and len(s.sed.pool.idle) == 1), 10,
                 "the worker answered the interrupt")
        assert s.worker_pids() == old and s.lt.call(lambda: s.sed.pool.killed) == 0
        _nothing_mapped(s, "a cancel")
        assert s.stats()["busy"] == 0
        assert _same(s("echo", a), a)               # the same worker serves the next call
    finally:
        s.close()


def test_nothing_left_after_a_worker_crash(before_shm):
    s = _strict()
    try:
        a = np.ones(3 * MiB // 8)
        assert _same(s("fresh", a), a)
        with pytest.raises(gridrpc.WorkerDied):
            s("crash", a)
        _nothing_mapped(s, "a worker crash")
        assert s.stats()["busy"] == 0
        assert _same(s("fresh", a), a)
    finally:
        s.close()


def test_nothing_left_after_the_sed_stops_with_segments_kept_for_reuse(before_shm):
    s = Sed("process")                              # default limits: idle segments kept
    a = np.random.default_rng(4).random(3 * MiB // 8)
    pids = []
    try:
        for service in ("echo", "fresh"):
            assert _same(s(service, a), a)
        pids = s.worker_pids()
        st = s.stats()        # idle ones kept for reuse; an answer kept for a repeated id holds its own
        assert st["segments"] >= 1 and st["idle_bytes"] <= ShmLimits().keep_idle
        assert memfd_maps() and memfd_fds()
    finally:
        s.close()
    wait_for(lambda: not memfd_maps() and not memfd_fds(), 10, "no segment after the SeD stopped")
    wait_for(lambda: not any(os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z"
                             for p in pids), 10, "its workers gone")


def test_a_worker_forked_later_does_not_inherit_the_sed_segments():
    s = Sed("process")
    try:
        a = np.ones(3 * MiB // 8)
        assert _same(s("fresh", a), a)
        assert memfd_fds() and s.stats()["segments"] == 1        # the SeD keeps its segment (idle)
        first = s.worker_pids()
        s.lt.call(lambda: s.sed.add_service("extra", echo))      # idle workers replaced by fresh forks
        assert _same(s("echo", np.arange(10)), np.arange(10))    # small: no segment involved
        [pid] = s.worker_pids()
        assert pid not in first
        assert memfd_fds(pid) == [] and memfd_maps(pid) == []   # neither descriptors nor mappings
    finally:
        s.close()


def test_a_hostile_header_cannot_make_the_sed_read_past_a_frame():
    s = _strict()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(s.sed.address)
    try:
        frame = np.arange(4, dtype="<f8").tobytes()      # 32 bytes
        lies = [[1 << 20], [-1], [2, -2], [1 << 40, 1 << 40], [4.0], [True, 4], "4", [5]]
        for i, shape in enumerate(lies):
            arg = {"__t": "nd", "i": 0, "dtype": "<f8", "shape": shape}
            sock.send_multipart([m.dumps(m.make(MsgType.CALL, f"h{i}", service="echo", args=[arg], kwargs={})),
                                 frame])
            assert sock.poll(5000), shape
            h = m.parse_header(sock.recv_multipart()[0])[1]
            assert h["type"] == "error" and h["error"]["kind"] == "protocol", (shape, h)
        for i, dtype in enumerate(["<f16", "|V64", "<U9"]):    # 32 bytes are not one of these
            arg = {"__t": "nd", "i": 0, "dtype": dtype, "shape": [1]}
            sock.send_multipart([m.dumps(m.make(MsgType.CALL, f"d{i}", service="echo", args=[arg], kwargs={})),
                                 frame])
            assert sock.poll(5000)
            h = m.parse_header(sock.recv_multipart()[0])[1]
            assert h["type"] == "error" and h["error"]["kind"] == "protocol", (dtype, h)
        assert s.stats()["created"] == 0 and not memfd_maps()      # nothing was mapped
        good = {"__t": "nd", "i": 0, "dtype": "<f8", "shape": [2, 2]}
        sock.send_multipart([m.dumps(m.make(MsgType.CALL, "ok", service="echo", args=[good], kwargs={})), frame])
        while True:
            assert sock.poll(5000)
            frames = sock.recv_multipart()
            h = m.parse_header(frames[0])[1]
            if h["type"] == "result":
                break
        assert frames[1] == frame
    finally:
        sock.close()
        s.close()
