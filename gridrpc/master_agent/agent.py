"""The Master Agent program: the root of the tree, the clients' entry point,
and the HTTP status API.

All the agent logic is the pure :mod:`gridrpc.core.agent` state machine; the
runtime that puts it on sockets is :mod:`gridrpc.runtime.agent`. The Master
Agent is that runtime with the :class:`~gridrpc.core.agent.MasterRole`, no
parent, and the dashboard.
"""
from __future__ import annotations

import logging

from ..core.agent import MasterRole
from ..runtime.agent import AgentRuntime

log = logging.getLogger(__name__)


class MasterAgent(AgentRuntime):
    def __init__(self, *, name: str = "MA", address: str = "tcp://127.0.0.1:5555",
                 http_port: int | None = None, http_host: str = "127.0.0.1", **kw) -> None:
        super().__init__(name=name, address=address, parent=None, role=MasterRole(), **kw)
        self.http_port = http_port
        self.http_host = http_host
        self.http = None

    async def start(self) -> "MasterAgent":
        await super().start()
        if self.http_port is not None:
            from ..dashboard.http import StatusServer
            self.http = StatusServer(self, host=self.http_host, port=self.http_port)
            await self.http.start()
        return self

    async def aclose(self) -> None:
        if self.http:
            await self.http.aclose()
        await super().aclose()
