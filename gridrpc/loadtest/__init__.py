"""Load tests of gridrpc trees with locust.

- :class:`GridRPCUser` — the locust user class (imports locust, hence gevent's
  monkey-patching: it is loaded lazily, on first access).
- :class:`GreenClient` — a gridrpc client on ``zmq.green`` for gevent.
- ``gridrpc loadtest FILE_OR_ADDR`` — a headless, bounded run (see
  :mod:`gridrpc.loadtest.cli` and docs/loadtest.md).
"""
from __future__ import annotations

from .config import LoadConfig, MixEntry, parse_args, parse_mix  # noqa: F401

__all__ = ["GridRPCUser", "GreenClient", "GreenHandle", "LoadConfig", "MixEntry", "parse_mix", "parse_args"]


def __getattr__(name: str):
    if name == "GridRPCUser":
        from .user import GridRPCUser
        return GridRPCUser
    if name in ("GreenClient", "GreenHandle", "Record"):
        from . import green
        return getattr(green, name)
    raise AttributeError(f"module 'gridrpc.loadtest' has no attribute {name!r}")
