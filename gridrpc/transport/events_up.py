"""Lifecycle events going up the tree (SeD -> LAs -> MA).

A SeD or an LA keeps its events in a bounded :class:`~gridrpc.core.events.EventOutbox`
(dropped, and counted, rather than blocking when the parent is slow) and
sends them in batches of at most 256 every ``interval`` over its parent link
(an ``events`` message). An LA relays what its children send without
decoding it; the MA validates every event once and hands them to its hub
(``/api/events``). Only a registered child's own connection may send events.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from ..core import messages as m
from ..core.events import EventOutbox
from ..core.messages import MsgType

log = logging.getLogger(__name__)
BATCH = 256


class EventsUplink:
    """Flushes ``outbox`` to the parent every ``interval`` seconds."""

    def __init__(self, name: str, outbox: EventOutbox, send: Callable[[dict], None],
                 interval: float = 0.25) -> None:
        self.name, self.outbox, self.send, self.interval = name, outbox, send, interval
        self._task: asyncio.Task | None = None
        self._seq = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"events-{self.name}")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.flush()

    def flush(self) -> None:
        while len(self.outbox) or self.outbox.dropped:
            events = self.outbox.take(BATCH)
            self._seq += 1
            try:
                self.send(m.make(MsgType.EVENTS, f"{self.name}:e{self._seq}", name=self.name, events=events,
                                 dropped=self.outbox.take_dropped()))
            except Exception as exc:  # noqa: BLE001 - the parent is away: events are best effort
                log.debug("%s: events not sent: %s", self.name, exc)
                return
            if len(events) < BATCH:
                return

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
