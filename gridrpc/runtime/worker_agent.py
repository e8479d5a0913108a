"""An agent whose children are the workers of another element: the SeDs a
batch SeD's pilot jobs start (and, in the same way, a cloud SeD's VMs).

It is an ordinary inner agent (registration, heartbeats, a child dropped for
silence) that tells its owner, through two callbacks, when its children
change and when one is gone; the owner decides what a child means.
"""
from __future__ import annotations

from collections.abc import Callable

from ..core.agent.machine import LocalRole
from .agent import AgentRuntime

__all__ = ["WorkerAgent"]


class WorkerAgent(AgentRuntime):
    """``on_changed()``: a child registered, heartbeated or left;
    ``on_lost(name, reason)``: child ``name`` left or missed its heartbeats."""

    def __init__(self, *, on_changed: Callable[[], None], on_lost: Callable[[str, str], None], **kw) -> None:
        super().__init__(role=LocalRole(), **kw)
        self._on_changed = on_changed
        self._on_lost = on_lost

    def on_children_updated(self, reregister: bool) -> None:
        super().on_children_updated(reregister)
        self._on_changed()

    def on_child_lost(self, name: str, reason: str) -> None:
        super().on_child_lost(name, reason)
        self._on_lost(name, reason)
