"""Where events go first (:mod:`gridrpc.core.events`): the sink a runtime
emits into, and the bounded outbox that carries them to the parent."""
from __future__ import annotations

from collections import deque
from typing import Any, Iterable, Protocol

from .event import Event

__all__ = ["EventSink", "NullSink", "EventOutbox"]


class EventSink(Protocol):
    """Where a runtime puts its events: an :class:`EventOutbox` on SeDs and
    LAs (sent to the parent), the dashboard's hub on the MA. ``emit`` must be
    cheap and must never block or raise."""
    def emit(self, event: Event) -> None: ...


class NullSink:
    def emit(self, event: Event) -> None:
        pass


class EventOutbox:
    """Events waiting to go to the parent. Bounded: when full, the oldest
    event is dropped and counted (:attr:`dropped`), the emitter never waits.

    An LA relays its children's events with :meth:`relay`: as received (dicts,
    not decoded: the MA validates every event once), counted and bounded the
    same way, their own losses added to :attr:`dropped`."""

    def __init__(self, capacity: int = 2000) -> None:
        self._q: deque[Event | dict] = deque(maxlen=max(1, capacity))
        self.dropped = 0

    def emit(self, event: Event) -> None:
        if len(self._q) == self._q.maxlen:
            self.dropped += 1
        self._q.append(event)

    def extend(self, events: Iterable[Event]) -> None:
        for e in events:
            self.emit(e)

    def relay(self, items: Any, dropped: Any = 0, *, max_events: int = 1000) -> None:
        """A child's batch (``items``: its list of event dicts, ``dropped``: its
        losses). Non-dict items and the part beyond ``max_events`` are dropped."""
        if type(dropped) is int and 0 < dropped < 1 << 40:
            self.dropped += dropped
        if type(items) is not list:
            return
        self.dropped += max(0, len(items) - max_events)
        q = self._q
        for d in items[:max_events]:
            if type(d) is dict:
                if len(q) == q.maxlen:
                    self.dropped += 1
                q.append(d)

    def take(self, max_n: int = 256) -> list[dict]:
        """Up to ``max_n`` oldest events as JSON-able dicts (for one message)."""
        q, n = self._q, min(max_n, len(self._q))
        out = []
        for _ in range(n):
            e = q.popleft()
            out.append(e if type(e) is dict else e.to_dict())
        return out

    def take_dropped(self) -> int:
        """Drops since the last call (to report them upwards once)."""
        n, self.dropped = self.dropped, 0
        return n

    def __len__(self) -> int:
        return len(self._q)
