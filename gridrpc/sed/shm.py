"""Shared-memory segments between the SeD and its worker processes.

Large buffers (numpy arrays from :data:`ShmLimits.threshold` up) cross the
pipe to a worker as *segments*: anonymous shared memory (``memfd_create``)
that the writer owns and keeps for reuse, and the reader maps once (its file
descriptor travels over the pipe, a Unix socket, with ``SCM_RIGHTS``).
Each side writes into its own segments: the SeD the arguments of a call, a
worker its results. The reader builds its arrays on a *view* of the segment
(no copy) and says when the last one died (:attr:`OwnSegments.returns`, sent
back with the next message), so the owner writes there again only then.

Nothing is ever named in ``/dev/shm``: a segment is memory held by file
descriptors and mappings, so the kernel frees it when the processes holding
it close them or die (a SeD killed by SIGKILL leaves nothing behind). Why
reuse: writing 8 MiB into a fresh segment costs 7-11 ms of page faults on
this VM, into one already mapped 0.25 ms (docs/performance.md).

Limits (:class:`ShmLimits`): a buffer above ``max_segment``, or one that
would take the owner's segments above ``max_total``, goes through the pipe
instead (slower, never refused); idle segments beyond ``keep_idle`` bytes
are closed. Each process (the SeD, each worker) applies them to the
segments it owns.
"""
from __future__ import annotations

import collections
import itertools
import mmap
import os
import socket
import weakref
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import ProtocolError

MiB = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class ShmLimits:
    threshold: int = MiB                 # buffers from this size go through segments
    max_segment: int = 512 * MiB         # larger buffers take the pipe
    max_total: int = 2048 * MiB          # bytes of segments one process owns
    keep_idle: int = 64 * MiB            # idle segments kept for reuse (0: close after each use)

    def __post_init__(self) -> None:
        if min(self.threshold, self.max_segment, self.max_total) < 1 or self.keep_idle < 0:
            raise ValueError("shared-memory limits must be positive (keep_idle >= 0)")


class ShmError(ProtocolError):
    """A segment message that does not fit the segment (size, offset, unknown id)."""


def _base_address(mm: mmap.mmap) -> int:
    probe = np.frombuffer(mm, np.uint8, 1)
    try:
        return int(probe.ctypes.data)
    finally:
        del probe


class Segment:
    __slots__ = ("id", "size", "fd", "mm", "holders", "addr")

    def __init__(self, id_: int, size: int, fd: int | None, mm: mmap.mmap) -> None:
        self.id, self.size, self.fd, self.mm, self.holders = id_, size, fd, mm, 0
        self.addr = _base_address(mm)


def _map(fd: int, size: int) -> mmap.mmap:
    mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    # not inherited by workers forked later: they must not keep the SeD's memory alive
    mm.madvise(mmap.MADV_DONTFORK)
    return mm


class OwnSegments:
    """The segments one process writes into, kept for reuse. A segment is
    busy while it has holders (a peer reading it, a local view on it); the
    end of a hold is queued in :attr:`returns` (thread-safe: zmq's I/O
    thread may drop the last view) and applied at the next :meth:`acquire`."""

    def __init__(self, limits: ShmLimits, tag: str, notify: Callable[[], None] | None = None) -> None:
        self.limits, self.tag = limits, tag
        self.notify = notify            # called (any thread) when a segment closed (keep_idle 0: a hold ended)
        self.segs: dict[int, Segment] = {}
        self.idle: collections.OrderedDict[int, Segment] = collections.OrderedDict()
        self.returns: collections.deque[int] = collections.deque()
        self.total = 0
        self._ids = itertools.count(1)
        self.stats = {"created": 0, "reused": 0, "closed": 0, "over_limit": 0}

    def returned(self, sid: int) -> None:
        """A hold on ``sid`` ended (thread-safe; applied by :meth:`collect`,
        at once when nothing is kept idle, else at the next use)."""
        self.returns.append(sid)
        if self.notify is not None and self.limits.keep_idle == 0:
            self.notify()

    def acquire(self, n: int) -> Segment | None:
        """A segment of at least ``n`` bytes with one holder, or None (limits)."""
        self.collect()
        lim = self.limits
        for seg in self.idle.values():                     # best fit, at most twice the need
            if n <= seg.size <= max(2 * n, n + MiB):
                del self.idle[seg.id]
                seg.holders = 1
                self.stats["reused"] += 1
                return seg
        size = -(-n // MiB) * MiB
        if size > lim.max_segment:
            self.stats["over_limit"] += 1
            return None
        while self.total + size > lim.max_total and self.idle:
            self._close(next(iter(self.idle.values())))
        if self.total + size > lim.max_total:
            self.stats["over_limit"] += 1
            return None
        seg = self._create(size)
        if seg is not None:
            seg.holders = 1
        return seg

    def _create(self, size: int) -> Segment | None:
        sid = next(self._ids)
        try:
            fd = os.memfd_create(f"gridrpc-{self.tag}{os.getpid()}-{sid}", os.MFD_CLOEXEC)
        except OSError:                     # out of descriptors...
            self.stats["over_limit"] += 1
            return None
        try:
            os.ftruncate(fd, size)
            os.posix_fallocate(fd, 0, size)     # no memory: an error now, not SIGBUS on first write
            seg = Segment(sid, size, fd, _map(fd, size))
        except OSError:
            os.close(fd)
            self.stats["over_limit"] += 1
            return None
        self.segs[sid] = seg
        self.total += size
        self.stats["created"] += 1
        return seg

    def hold(self, sid: int) -> Segment:
        seg = self.segs.get(sid)
        if seg is None:
            raise ShmError(f"no segment {sid} here")
        self.idle.pop(sid, None)
        seg.holders += 1
        return seg

    def view(self, sid: int, off: int, n: int) -> np.ndarray:
        """A local view on an own segment (held until the view dies)."""
        seg = self.hold(sid)
        try:
            return lease(seg, off, n, self.returned)
        except ShmError:
            seg.holders -= 1
            raise

    def collect(self) -> None:
        """Apply the holds that ended; idle segments beyond ``keep_idle`` are closed."""
        while self.returns:
            seg = self.segs.get(self.returns.popleft())
            if seg is None or seg.holders <= 0:
                continue
            seg.holders -= 1
            if seg.holders == 0:
                self.idle[seg.id] = seg
        idle = sum(s.size for s in self.idle.values())
        while idle > self.limits.keep_idle:
            seg = next(iter(self.idle.values()))
            idle -= seg.size
            self._close(seg)

    def _close(self, seg: Segment) -> None:
        self.idle.pop(seg.id, None)
        if self.segs.pop(seg.id, None) is None:
            return
        self.total -= seg.size
        self.stats["closed"] += 1
        if seg.fd is not None:
            os.close(seg.fd)
            seg.fd = None
        seg.mm = None                   # unmapped when the last view on it dies
        if self.notify is not None:     # the peers that mapped it may unmap it
            self.notify()

    def discard(self, sid: int) -> None:
        """Never reuse this segment (a peer that may still write to it)."""
        seg = self.segs.get(sid)
        if seg is not None:
            self._close(seg)

    def live(self, sid: int) -> bool:
        return sid in self.segs

    def close(self) -> None:
        for seg in list(self.segs.values()):
            self._close(seg)
        self.returns.clear()

    def statistics(self) -> dict:
        busy = [s for s in self.segs.values() if s.holders > 0]
        return {"segments": len(self.segs), "bytes": self.total, "busy": len(busy),
                "idle_bytes": sum(s.size for s in self.idle.values()), **self.stats}


def lease(seg: Segment, off: int, n: int, on_release) -> np.ndarray:
    """``n`` bytes of ``seg`` from ``off`` as a writable uint8 array;
    ``on_release(seg.id)`` runs when it and every view derived from it died."""
    if type(off) is not int or type(n) is not int or off < 0 or n < 1 or off + n > seg.size:
        raise ShmError(f"{n!r} bytes at offset {off!r} do not fit segment {seg.id} of {seg.size} bytes")
    view = np.frombuffer(seg.mm, np.uint8, n, off)
    weakref.finalize(view, on_release, seg.id)
    return view


class PeerSegments:
    """The other side's segments, mapped here."""

    def __init__(self, limits: ShmLimits) -> None:
        self.limits = limits
        self.segs: dict[int, Segment] = {}

    def map(self, sid, size, fd: int) -> None:
        """Map a received descriptor (always closed here). The declared size
        must be the segment's real size and within ``max_segment``."""
        try:
            if type(sid) is not int or type(size) is not int or not 0 < size <= self.limits.max_segment:
                raise ShmError(f"segment {sid!r} of {size!r} bytes refused (limit {self.limits.max_segment})")
            real = os.fstat(fd).st_size
            if real != size:
                raise ShmError(f"segment {sid} claims {size} bytes but holds {real}")
            self.segs[sid] = Segment(sid, size, None, _map(fd, size))
        finally:
            os.close(fd)

    def view(self, sid, off, n, on_release) -> np.ndarray:
        seg = self.segs.get(sid) if type(sid) is int else None
        if seg is None:
            raise ShmError(f"unknown segment {sid!r}")
        return lease(seg, off, n, on_release)

    def locate(self, addr: int, n: int) -> tuple[int, int] | None:
        """``(segment id, offset)`` if ``n`` bytes at ``addr`` lie in a mapped segment."""
        for seg in self.segs.values():
            if seg.addr <= addr and addr + n <= seg.addr + seg.size:
                return seg.id, addr - seg.addr
        return None

    def drop(self, sid) -> None:
        seg = self.segs.pop(sid, None)
        if seg is not None:
            seg.mm = None

    def clear(self) -> None:
        for sid in list(self.segs):
            self.drop(sid)


def send_fds(sock: socket.socket, fds: list[int]) -> None:
    socket.send_fds(sock, [bytes([len(fds) % 256])], fds)


def recv_fds(sock: socket.socket, count: int) -> list[int]:
    """Exactly ``count`` descriptors, or ShmError (any received are closed)."""
    msg, fds, flags, _ = socket.recv_fds(sock, 1, count, socket.MSG_CMSG_CLOEXEC)
    if len(fds) != count or flags & socket.MSG_CTRUNC or not msg:
        for fd in fds:
            os.close(fd)
        if not msg:
            raise EOFError("pipe closed while descriptors were expected")
        raise ShmError(f"expected {count} segment descriptors, got {len(fds)}")
    return fds
