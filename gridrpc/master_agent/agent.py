"""The Master Agent program: the root of the tree, the clients' entry point,
and the HTTP status API.

All the agent logic is the pure :mod:`gridrpc.core.agent.machine` state machine; the
runtime that puts it on sockets is :mod:`gridrpc.runtime.agent`. The Master
Agent is that runtime with the :class:`~gridrpc.core.agent.machine.MasterRole`, no
parent, and the dashboard.
"""
from __future__ import annotations

import logging

import time

from ..core.agent.machine import MasterRole
from ..core.events import EventKind, decode_events, make_event
from ..core.messages import MsgType
from ..dashboard.stream import EventHub, JsonlWriter
from ..runtime.agent import AgentRuntime

log = logging.getLogger(__name__)


class MasterAgent(AgentRuntime):
    """``events_file``: also write the tree's events there (JSON lines);
    ``http_token``: required by the HTTP API (mandatory off loopback)."""

    def __init__(self, *, name: str = "MA", address: str = "tcp://127.0.0.1:5555",
                 http_port: int | None = None, http_host: str = "127.0.0.1", http_token: str | None = None,
                 events_file: str | None = None, **kw) -> None:
        super().__init__(name=name, address=address, parent=None, role=MasterRole(), **kw)
        self.http_port = http_port
        self.http_host = http_host
        self.http_token = http_token
        self.http = None
        writer = JsonlWriter(events_file) if events_file else None
        self.events = EventHub(writer=writer)     # the tree's events: /api/events, the dashboard, the file
        self.on_cleanup(self.events.aclose)       # last: ends the streams, flushes the file
        self._asked: dict[str, tuple] = {}        # discovery id -> (time, user, service), bounded
        self._watch_answers = True

    async def setup(self) -> None:
        await super().setup()
        if self.events.writer is not None:
            self.events.writer.start()
        if self.http_port is not None:
            from ..dashboard.http import StatusServer
            self.http = StatusServer(self, host=self.http_host, port=self.http_port, token=self.http_token)
            self.on_cleanup(self.http.aclose)
            await self.http.start()
            self.state.info["http"] = self.http.url

    def describe(self) -> str:
        line = super().describe()
        return line + f"; HTTP status at {self.http.url}" if self.http is not None else line

    def ready_info(self) -> dict:
        info = super().ready_info()
        if self.http is not None:
            info["http"] = self.http.url
        return info

    # -- events: the MA's own, and its subtree's ----------------------------------------
    def _on_message(self, msg) -> None:
        if msg.type is MsgType.DISCOVER:
            h = msg.header
            if len(self._asked) >= 10_000:
                self._asked.pop(next(iter(self._asked)))
            now = time.time()
            self._asked[h["id"]] = (now, h.get("user"), h["service"])
            self.events.emit(make_event(EventKind.DISCOVERY_ASKED, now, self.name, id=h["id"],
                                        user=h.get("user"), service=h["service"]))
        super()._on_message(msg)

    def on_answer(self, header: dict) -> None:
        asked = self._asked.pop(header.get("id"), None)
        if asked is None:
            return
        t0, user, service = asked
        now = time.time()
        if header.get("type") == MsgType.SERVERS.value and header.get("servers"):
            self.events.emit(make_event(EventKind.DISCOVERY_ANSWERED, now, self.name, id=header["id"], user=user,
                                        service=service, server=header["servers"][0].get("name"),
                                        duration=now - t0, detail="view" if header.get("view") else None))
        else:
            err = header.get("error") if isinstance(header.get("error"), dict) else {}
            self.events.emit(make_event(EventKind.DISCOVERY_FAILED, now, self.name, id=header.get("id"),
                                        user=user, service=service, duration=now - t0,
                                        detail=str(err.get("message") or "no server")))

    def accept_events(self, events: list, dropped: int, origin: str) -> None:
        evs, bad = decode_events(events)
        self.events.emit_many(evs, rejected=bad, lost=dropped, origin=origin)

