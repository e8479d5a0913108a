"""One end of the pipe between the SeD and a worker process.

A message is a Python object pickled with protocol 5: numpy arrays (and
other out-of-band buffers) are not copied into the pickle. Each buffer then
travels one of three ways (the *plan*, sent first):

- ``("pipe", n)``: through the pipe (buffers under the threshold, or when
  the limits refuse a segment);
- ``("mine", id, offset, n)``: written once into a segment the sender owns
  (:class:`~gridrpc.sed.shm.OwnSegments`); the receiver maps it (its
  descriptor follows the message the first time) and builds the value on
  a view of it, without a copy;
- ``("yours", id, offset, n)``: the buffer already lies in a segment of the
  receiver (a worker returning its argument array, changed in place or
  not): nothing is copied at all.

With the plan go ``new`` (ids and sizes of the descriptors that follow),
``released`` (the receiver's segments the sender no longer reads: all its
views died) and ``dropped`` (the sender's segments it closed: unmap them).
Only the SeD and its own forked workers speak this; it never crosses the
network.
"""
from __future__ import annotations

import collections
import os
import pickle
import socket
import struct
from typing import Callable

import numpy as np

from .shm import OwnSegments, PeerSegments, ShmError, ShmLimits, recv_fds, send_fds


class Link:
    """``send(obj)`` / ``recv()`` over a duplex ``multiprocessing`` connection
    (a Unix socket pair). ``own`` may be shared by several links (the SeD's
    argument segments serve every worker)."""

    def __init__(self, conn, own: OwnSegments, limits: ShmLimits,
                 notify: Callable[[], None] | None = None) -> None:
        self.conn = conn
        self.notify = notify            # called (any thread) when a view on a peer segment died (keep_idle 0)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=os.dup(conn.fileno()))
        self.own = own
        self.limits = limits
        self.peer = PeerSegments(limits)
        self.known: set[int] = set()            # own segments the peer has mapped
        self.lent: collections.Counter = collections.Counter()   # own segments the peer still reads
        self.released: collections.deque[int] = collections.deque()   # peer segments we stopped reading

    def fileno(self) -> int:
        return self.conn.fileno()

    def pending(self) -> bool:
        """Something to tell the peer: segments released or closed since the last message."""
        return bool(self.released) or any(not self.own.live(sid) for sid in self.known)

    def _peer_released(self, sid: int) -> None:
        self.released.append(sid)
        if self.notify is not None and self.limits.keep_idle == 0:     # else: with the next message
            self.notify()

    # -- sending -----------------------------------------------------------
    def send(self, obj, *, detach: bool = False) -> None:
        """Send ``obj``. ``detach``: the caller keeps no reference to ``obj``
        (pass it as a temporary): small buffers are copied before sending so
        that the views this message drops are released with it (a worker
        answering: its argument segments go back with the result)."""
        bufs: list = []
        head = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
        del obj
        if not bufs:                # no out-of-band buffer (small arguments, a scalar result)
            self._send_plain(head)
            return
        raws = [b.raw() for b in bufs]
        del bufs
        plan, pipe, new, fds, lent = [], [], [], [], []
        r = None
        try:
            for r in raws:
                n = r.nbytes
                entry = self._place(r, n, new, fds, lent) if n >= self.limits.threshold else None
                if entry is None:
                    entry = ("pipe", n)
                    pipe.append(bytes(r) if detach else r)
                plan.append(entry)
            del raws, r
        except BaseException:
            for sid in lent:
                self.own.returns.append(sid)
            self.known.difference_update(sid for sid, _ in new)     # not sent after all
            raise
        for sid in lent:
            self.lent[sid] += 1
        ctl = {"new": new, "released": self._drain_released(), "dropped": self._dropped()}
        _send_msg(self.conn, pickle.dumps((head, plan, ctl), protocol=5))
        for r in pipe:
            self.conn.send_bytes(r)
        if fds:
            send_fds(self.sock, fds)

    def send_small(self, obj, limit: int) -> bool:
        """Send ``obj`` only if it pickles without out-of-band buffers into at
        most ``limit`` bytes (it then fits the pipe's buffer: the write never
        waits for the other side); False, and nothing sent, otherwise."""
        bufs: list = []
        head = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
        if bufs or len(head) > limit:
            return False
        self._send_plain(head)
        return True

    def _send_plain(self, head: bytes) -> None:
        """A message with no buffer to place: the pickle and what to tell the peer about segments."""
        ctl = {"new": [], "released": self._drain_released(), "dropped": self._dropped()}
        _send_msg(self.conn, pickle.dumps((head, [], ctl), protocol=5))

    def _place(self, r, n: int, new: list, fds: list, lent: list):
        addr = int(np.frombuffer(r, np.uint8).ctypes.data)
        found = self.peer.locate(addr, n)
        if found is not None:                   # already in the receiver's memory
            return ("yours", found[0], found[1], n)
        seg = self.own.acquire(n)
        if seg is None:
            return None
        lent.append(seg.id)
        np.frombuffer(seg.mm, np.uint8, n)[:] = np.frombuffer(r, np.uint8)    # the one copy
        if seg.id not in self.known:
            self.known.add(seg.id)
            new.append((seg.id, seg.size))
            fds.append(seg.fd)
        return ("mine", seg.id, 0, n)

    def _drain_released(self) -> list[int]:
        out = []
        while self.released:
            out.append(self.released.popleft())
        if self.limits.keep_idle == 0:  # nothing is kept: the owner closes them, unmap now
            for sid in out:
                self.peer.drop(sid)
        return out

    def _dropped(self) -> list[int]:
        if not self.known:
            return []
        gone = [sid for sid in self.known if not self.own.live(sid)]
        self.known.difference_update(gone)
        return gone

    # -- receiving ---------------------------------------------------------
    def recv(self):
        head, plan, ctl = pickle.loads(_recv_msg(self.conn))
        if not isinstance(plan, list) or not isinstance(ctl, dict):
            raise ShmError("malformed message from the other side of the worker pipe")
        pipe = {}
        for i, entry in enumerate(plan):
            if not isinstance(entry, tuple) or not entry:
                raise ShmError(f"malformed plan entry {entry!r}")
            if entry[0] == "pipe":
                n = entry[1] if len(entry) == 2 else None
                if type(n) is not int or n < 0:
                    raise ShmError(f"malformed plan entry {entry!r}")
                b = bytearray(n)        # writable: services may change their arrays in place
                if n:
                    self.conn.recv_bytes_into(b)
                else:
                    self.conn.recv_bytes()
                pipe[i] = b
        new = ctl.get("new") or []
        if not isinstance(new, list) or not all(isinstance(x, tuple) and len(x) == 2 for x in new):
            raise ShmError(f"malformed segment announcement {new!r}")
        if new:
            fds = recv_fds(self.sock, len(new))
            for k, ((sid, size), fd) in enumerate(zip(new, fds)):
                try:
                    self.peer.map(sid, size, fd)
                except BaseException:
                    for rest in fds[k + 1:]:
                        os.close(rest)
                    raise
        for sid in _ids(ctl, "dropped"):
            self.peer.drop(sid)
        buffers = [pipe[i] if i in pipe else self._view(entry) for i, entry in enumerate(plan)]
        for sid in _ids(ctl, "released"):          # after our own views above took their holds
            if self.lent.get(sid, 0) > 0:
                self.lent[sid] -= 1
                self.own.returns.append(sid)
        self.own.collect()
        return pickle.loads(head, buffers=buffers)

    def _view(self, entry) -> np.ndarray:
        if not isinstance(entry, tuple) or len(entry) != 4:
            raise ShmError(f"malformed plan entry {entry!r}")
        kind, sid, off, n = entry
        if kind == "mine":              # the sender's segment, mapped here
            return self.peer.view(sid, off, n, self._peer_released)
        if kind == "yours":             # one of ours
            if self.lent.get(sid, 0) <= 0:
                raise ShmError(f"segment {sid!r} was not lent to the other side")
            return self.own.view(sid, off, n)
        raise ShmError(f"unknown plan entry {kind!r}")

    # -- end ---------------------------------------------------------------
    def close(self, peer_dead: bool = True) -> None:
        """The peer is gone or going: its segments are unmapped here; what it
        still read comes back for reuse if it is dead (``peer_dead``), else
        those segments are closed (their memory lives while the peer maps it)."""
        for sid, count in self.lent.items():
            if peer_dead:
                self.own.returns.extend([sid] * count)
            else:
                self.own.discard(sid)
        self.lent.clear()
        self.known.clear()
        self.peer.clear()
        self.close_fds()

    def close_fds(self) -> None:
        """Only the descriptors (a forked worker closing the SeD's other pipes)."""
        for c in (self.sock, self.conn):
            try:
                c.close()
            except OSError:
                pass


#: the framing of ``multiprocessing.connection.Connection.send_bytes``/``recv_bytes`` (a 4-byte
#: big-endian length, then the bytes), without their per-call checks and ``io.BytesIO``: the two
#: ends of the pipe are ours and a message a call; big ones still go through the connection
_LEN = struct.Struct("!i")
_SMALL = 16384          # Connection sends longer messages in two writes: so does it here


def _send_msg(conn, data: bytes) -> None:
    """``conn.send_bytes(data)``, the same bytes on the pipe."""
    n = len(data)
    if n > _SMALL:
        conn.send_bytes(data)
        return
    fd = conn.fileno()                  # OSError when closed, as send_bytes
    buf = _LEN.pack(n) + data
    while True:
        k = os.write(fd, buf)
        if k == len(buf):
            return
        buf = buf[k:]


def _read(fd: int, size: int) -> bytes:
    """Exactly ``size`` bytes (EOFError at once, OSError in the middle: as Connection)."""
    data = os.read(fd, size) if size > 0 else b""
    if len(data) == size:
        return data
    if not data:
        raise EOFError
    parts, remaining = [data], size - len(data)
    while remaining > 0:
        chunk = os.read(fd, remaining)
        if not chunk:
            raise OSError("got end of file during message")
        parts.append(chunk)
        remaining -= len(chunk)
    return b"".join(parts)


def _recv_msg(conn) -> bytes:
    """``conn.recv_bytes()``, reading the same bytes off the pipe."""
    fd = conn.fileno()                  # OSError when closed, as recv_bytes
    size, = _LEN.unpack(_read(fd, 4))
    if size == -1:
        size, = struct.unpack("!Q", _read(fd, 8))
    return _read(fd, size)


def _ids(ctl: dict, key: str) -> list[int]:
    ids = ctl.get(key) or []
    if not isinstance(ids, list) or not all(type(i) is int for i in ids):
        raise ShmError(f"malformed {key} list {ids!r}")
    return ids
