"""The Local Agent program: an inner node of the tree.

All the agent logic is the pure :mod:`gridrpc.core.agent.machine` state machine; the
runtime that puts it on sockets is :mod:`gridrpc.runtime.agent`. A Local
Agent is that runtime with the :class:`~gridrpc.core.agent.machine.LocalRole` and a
parent.
"""
from __future__ import annotations

from ..core.agent.machine import LocalRole
from ..runtime.agent import AgentRuntime


class LocalAgent(AgentRuntime):
    def __init__(self, *, name: str, parent: str, **kw) -> None:
        super().__init__(name=name, parent=parent, role=LocalRole(), **kw)
