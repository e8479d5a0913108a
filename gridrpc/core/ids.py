"""Request ids: one scheme for every client (asyncio, gevent, the relay to remote SeDs).

An id is a prefix, a hexadecimal counter and a random part:
``"3f9c0a1b2c3d4e5f1a.9c04e1d27be3a510"``. The runtime picks a random prefix
per process and a new one after ``fork`` (see :mod:`gridrpc.client.ids`), so
ids stay unique across clients without a round trip; the counter keeps them
unique within the process. The random part (64 bits per id, from the
operating system's generator) makes an id impossible to predict from
another: a call id is shown to operators (events, the dashboard), and a peer
who could guess a user's next ids could take them first (the SeD refuses a
call id that belongs to another client) or wait on their results. Pure: the
prefix and the source of random bits are arguments (no clock, no randomness
here).

Every id matches :data:`gridrpc.core.messages.ID_RE` (at most 128 characters
of ``[A-Za-z0-9_.:#@+=-]``): the prefix is checked once; the counter would
need more than 2**70 ids to overflow the length.
"""
from __future__ import annotations

import itertools
import re
from typing import Callable

__all__ = ["IdGenerator", "MAX_PREFIX"]

#: longest prefix: leaves 18 hex digits of counter, a dot and 16 of random part under the 128-character bound
MAX_PREFIX = 93
_PREFIX_RE = re.compile(r"[A-Za-z0-9_.:#@+=-]*")


class IdGenerator:
    """``gen()`` returns ``prefix + hex(n)`` for n = start, start + 1, ...,
    followed by ``"." + random()`` when a source of random parts is given.

    >>> gen = IdGenerator("c1-")
    >>> gen(), gen()
    ('c1-1', 'c1-2')
    >>> IdGenerator("c1-", random=lambda: "ab12")()
    'c1-1.ab12'
    """

    __slots__ = ("prefix", "_next", "_random")

    def __init__(self, prefix: str, start: int = 1, random: Callable[[], str] | None = None) -> None:
        # the counter always adds hex digits: never "", "." or ".."
        if not isinstance(prefix, str) or len(prefix) > MAX_PREFIX or not _PREFIX_RE.fullmatch(prefix):
            raise ValueError(f"id prefix must be at most {MAX_PREFIX} characters of letters, digits "
                             f"and _.:#@+=-, not {prefix!r}")
        self.prefix = prefix
        self._next = itertools.count(start).__next__
        self._random = random

    def __call__(self) -> str:
        if self._random is None:
            return f"{self.prefix}{self._next():x}"
        return f"{self.prefix}{self._next():x}.{self._random()}"

    def __repr__(self) -> str:
        return f"IdGenerator({self.prefix!r})"
