"""Request ids: one scheme for every client (asyncio, gevent, the cloud relay).

An id is a prefix and a hexadecimal counter: ``"3f9c0a1b2c3d4e5f1a"``. The
runtime picks a random prefix per process and a new one after ``fork`` (see
:mod:`gridrpc.client.ids`), so ids stay unique across clients without a
round trip. Pure: the prefix is an argument (no clock, no randomness here).

Every id matches :data:`gridrpc.core.messages.ID_RE` (at most 128 characters
of ``[A-Za-z0-9_.:#@+=-]``): the prefix is checked once, and the counter
would need more than 2**100 ids to overflow the length.
"""
from __future__ import annotations

import itertools
import re

__all__ = ["IdGenerator", "MAX_PREFIX"]

#: longest prefix: leaves 24 hex digits (2**96 ids) under the 128-character bound
MAX_PREFIX = 104
_PREFIX_RE = re.compile(r"[A-Za-z0-9_.:#@+=-]*")


class IdGenerator:
    """``gen()`` returns ``prefix + hex(n)`` for n = start, start + 1, ...

    >>> gen = IdGenerator("c1-")
    >>> gen(), gen()
    ('c1-1', 'c1-2')
    """

    __slots__ = ("prefix", "_next")

    def __init__(self, prefix: str, start: int = 1) -> None:
        # the counter always adds hex digits: never "", "." or ".."
        if not isinstance(prefix, str) or len(prefix) > MAX_PREFIX or not _PREFIX_RE.fullmatch(prefix):
            raise ValueError(f"id prefix must be at most {MAX_PREFIX} characters of letters, digits "
                             f"and _.:#@+=-, not {prefix!r}")
        self.prefix = prefix
        self._next = itertools.count(start).__next__

    def __call__(self) -> str:
        return f"{self.prefix}{self._next():x}"

    def __repr__(self) -> str:
        return f"IdGenerator({self.prefix!r})"
