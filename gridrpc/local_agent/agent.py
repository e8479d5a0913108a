"""The Local Agent program: an inner node of the tree.

All the agent logic is the pure :mod:`gridrpc.core.agent` state machine; the
runtime that puts it on sockets is :mod:`gridrpc.runtime.agent`. A Local
Agent is that runtime with the :class:`~gridrpc.core.agent.LocalRole` and a
parent.
"""
from __future__ import annotations

from ..core.agent import LocalRole
from ..runtime.agent import AgentRuntime


class LocalAgent(AgentRuntime):
    def __init__(self, *, name: str, parent: str, **kw) -> None:
        super().__init__(name=name, parent=parent, role=LocalRole(), **kw)


class Agent(AgentRuntime):
    """Compatibility for code written against the former agent class (the
    cloud SeD's VM agent overrides ``_subtree_changed()`` and
    ``_child_lost(name)``): a Local-role agent, parent optional, with those
    two hooks. New code subclasses :class:`gridrpc.runtime.agent.AgentRuntime`
    and overrides ``on_children_updated`` / ``on_child_lost``."""

    def __init__(self, **kw) -> None:
        kw.setdefault("role", LocalRole())
        super().__init__(**kw)
        self._reregister = False

    def on_children_updated(self, reregister: bool) -> None:
        self._reregister = reregister
        self._subtree_changed()

    def _subtree_changed(self) -> None:
        super().on_children_updated(self._reregister)

    def on_child_lost(self, name: str, reason: str) -> None:
        self._child_lost(name)

    def _child_lost(self, name: str) -> None:
        pass
