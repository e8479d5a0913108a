"""The process's request ids: :class:`gridrpc.core.ids.IdGenerator` with a
random prefix and 64 random bits per id from ``os.urandom`` (read 4 KiB at
a time: one system call per 512 ids), drawn again in a forked child (it must
not reuse its parent's ids or random bytes). Used by every client and by the
relay to remote SeDs (cloud VMs, pilots)."""
from __future__ import annotations

import os
import uuid

from ..core.ids import IdGenerator

__all__ = ["new_id"]

_CHUNK = 4096           # bytes of randomness read at once


class _RandomParts:
    """16 hex digits of fresh operating-system randomness per call."""

    __slots__ = ("_buf", "_pos")

    def __init__(self) -> None:
        self._buf = b""
        self._pos = _CHUNK

    def __call__(self) -> str:
        pos = self._pos
        if pos >= len(self._buf):
            self._buf = os.urandom(_CHUNK)
            pos = 0
        self._pos = pos + 8
        return self._buf[pos:pos + 8].hex()


def _generator() -> IdGenerator:
    return IdGenerator(uuid.uuid4().hex[:16], random=_RandomParts())


_gen = _generator()


def _reseed() -> None:
    global _gen
    _gen = _generator()


os.register_at_fork(after_in_child=_reseed)


def new_id() -> str:
    """A request id unique across processes and clients, and not predictable
    from any other id."""
    return _gen()
