"""The Master Agent runtime: an :class:`~gridrpc.local_agent.Agent` without a
parent, answering clients, plus the HTTP status API."""
from __future__ import annotations

import logging

from ..local_agent.agent import Agent

log = logging.getLogger(__name__)


class MasterAgent(Agent):
    kind = "ma"

    def __init__(self, *, name: str = "MA", address: str = "tcp://127.0.0.1:5555",
                 http_port: int | None = None, http_host: str = "127.0.0.1", **kw) -> None:
        super().__init__(name=name, address=address, parent=None, **kw)
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
