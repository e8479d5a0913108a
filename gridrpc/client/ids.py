"""The process's request ids: :class:`gridrpc.core.ids.IdGenerator` with a
random prefix, drawn again in a forked child (it must not reuse its parent's
ids). Used by every client and by the cloud relay."""
from __future__ import annotations

import os
import uuid

from ..core.ids import IdGenerator

__all__ = ["new_id"]


def _generator() -> IdGenerator:
    return IdGenerator(uuid.uuid4().hex[:16])


_gen = _generator()


def _reseed() -> None:
    global _gen
    _gen = _generator()


os.register_at_fork(after_in_child=_reseed)


def new_id() -> str:
    """A request id unique across processes and clients."""
    return _gen()
