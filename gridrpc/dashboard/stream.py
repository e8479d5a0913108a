"""Live events on the MA: fan-out to subscribers, Server-Sent Events, a
JSON-lines file.

:class:`EventHub` is the MA's :class:`~gridrpc.core.events.EventSink`:
``emit`` records the event in the :class:`~gridrpc.core.events.EventLog` and
offers it to every subscriber's bounded queue and to the file writer. A slow
subscriber loses events (counted, and told so in its stream); nobody waits.
JSON is only encoded when a subscriber or the writer reads the event. ``emit``
must be called on the MA's event loop thread.

HTTP (mounted by :func:`gridrpc.dashboard.app.add_dashboard_routes`):

* ``GET /api/events`` — ``text/event-stream``. Each event is one SSE message,
  ``id: EPOCH.SEQ`` and ``data: {event JSON, "seq": SEQ}``. Query:
  ``id=REQUEST_ID`` (only that call's events, its story so far first),
  ``kinds=call_failed,dropped`` (only those kinds), ``replay=N`` (the last N
  events first), ``since=SEQ``, ``follow=0`` (send the past and end). A reconnecting ``EventSource`` sends
  ``Last-Event-ID`` and gets what it missed if still in the ring (else an
  ``event: gap``). Losses are announced as ``event: dropped``
  (``{"dropped": N}``); a ``: keepalive`` comment is sent every 15 s.
* ``GET /api/events/{id}`` — one call's story: ``{"id", "summary", "events"}``
  (404 when the id is unknown).
"""
from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections import deque
from typing import Callable

import orjson
from aiohttp import web

from ..core.events import ID_RE, Event, EventKind, EventLog, story_summary

log = logging.getLogger(__name__)

_CLOSED = object()


class Subscriber:
    """One reader of the live stream: a bounded queue of ``(seq, event)``."""

    def __init__(self, maxsize: int, *, request_id: str | None = None,
                 kinds: frozenset[EventKind] | None = None, peer: str | None = None) -> None:
        self.queue: asyncio.Queue = asyncio.Queue(maxsize)
        self.peer = peer          # the reader's address (streams per address are bounded)
        self.request_id = request_id
        self.kinds = kinds
        self.dropped = 0          # lost since the reader last looked (see take_dropped)
        self.dropped_total = 0
        self.closed = False

    def wants(self, ev: Event) -> bool:
        return ((self.request_id is None or ev.id == self.request_id)
                and (self.kinds is None or ev.kind in self.kinds))

    def offer(self, seq: int, ev: Event) -> bool:
        if self.closed or not self.wants(ev):
            return False
        try:
            self.queue.put_nowait((seq, ev))
            return True
        except asyncio.QueueFull:
            self.dropped += 1
            self.dropped_total += 1
            return False

    def take_dropped(self) -> int:
        n, self.dropped = self.dropped, 0
        return n

    def close(self) -> None:
        """Wake the reader and make it stop (even when its queue is full)."""
        self.closed = True
        while True:
            try:
                self.queue.get_nowait()
            except asyncio.QueueEmpty:
                break
        self.queue.put_nowait(_CLOSED)


class EventHub:
    """Records events and fans them out. ``emit`` is O(subscribers), never
    blocks, never raises on a slow reader."""

    def __init__(self, event_log: EventLog | None = None, *, clock: Callable[[], float] = time.time,
                 queue_size: int = 2000, max_subscribers: int = 64,
                 writer: "JsonlWriter | None" = None) -> None:
        self.log = event_log if event_log is not None else EventLog()
        self.clock = clock
        self.queue_size = queue_size
        self.max_subscribers = max_subscribers
        self.max_per_peer = max(1, max_subscribers // 4)      # one address cannot take every stream
        self.writer = writer
        self.epoch = secrets.token_hex(4)     # a new MA numbers afresh: ids from another epoch restart
        self.subscribers: set[Subscriber] = set()
        self.dropped_total = 0                # lost by subscribers, gone or present
        self.lost_upstream: dict[str, int] = {}   # events lost below the MA, reported per element
        self.rejected = 0                     # invalid events received from children

    def emit(self, event: Event) -> int:
        seq = self.log.append(event, self.clock())
        for s in self.subscribers:
            s.offer(seq, event)
        if self.writer is not None:
            self.writer.offer(seq, event)
        return seq

    def emit_many(self, events, *, rejected: int = 0, lost: int = 0, origin: str | None = None) -> None:
        """Events forwarded by a child, already validated
        (:func:`~gridrpc.core.events.decode_events`), with the counts of the
        invalid ones and of those its outbox dropped. Each event is handled
        as by :meth:`emit` (the same code, without a call per event)."""
        append, clock, subscribers, writer = self.log.append, self.clock, self.subscribers, self.writer
        for e in events:
            seq = append(e, clock())
            for s in subscribers:
                s.offer(seq, e)
            if writer is not None:
                writer.offer(seq, e)
        self.rejected += rejected
        if lost and origin:
            self.lost_upstream[origin] = self.lost_upstream.get(origin, 0) + lost

    def subscribe(self, *, request_id: str | None = None,
                  kinds: frozenset[EventKind] | None = None, peer: str | None = None) -> Subscriber:
        if len(self.subscribers) >= self.max_subscribers:
            raise OverflowError(f"too many event subscribers (max {self.max_subscribers})")
        if peer is not None and sum(1 for x in self.subscribers if x.peer == peer) >= self.max_per_peer:
            raise OverflowError(f"too many event streams from {peer} (max {self.max_per_peer} per address)")
        s = Subscriber(self.queue_size, request_id=request_id, kinds=kinds, peer=peer)
        self.subscribers.add(s)
        return s

    def unsubscribe(self, s: Subscriber) -> None:
        if s in self.subscribers:
            self.subscribers.discard(s)
            self.dropped_total += s.dropped_total

    async def aclose(self, *_args) -> None:
        """Ends every stream (aiohttp ``on_shutdown``: before the server
        waits for its handlers) and flushes the file writer."""
        for s in list(self.subscribers):
            s.close()
        if self.writer is not None:
            await self.writer.aclose()

    def statistics(self) -> dict:
        return {"subscribers": len(self.subscribers), "seq": self.log.seq, "epoch": self.epoch,
                "dropped": self.dropped_total + sum(s.dropped_total for s in self.subscribers),
                "rejected": self.rejected, "lost_upstream": dict(self.lost_upstream),
                "file": self.writer.statistics() if self.writer else None}


# -- Server-Sent Events ------------------------------------------------------
def _event_bytes(seq: int, ev: Event, epoch: str) -> bytes:
    d = ev.to_dict()
    d["seq"] = seq
    return b"id: %s.%d\ndata: %s\n\n" % (epoch.encode(), seq, orjson.dumps(d))


def _parse_last_id(text: str | None, epoch: str) -> int | None:
    """``EPOCH.SEQ`` of this hub -> SEQ; another epoch (the MA restarted) -> 0."""
    if not text:
        return None
    ep, _, seq = text.strip().partition(".")
    if ep != epoch or not seq.isdigit() or len(seq) > 18:
        return 0
    return int(seq)


def _int_param(request: web.Request, name: str, default: int, hi: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or len(raw) > 18:
        raise web.HTTPBadRequest(text=f"{name} must be a non-negative integer")
    return min(int(raw), hi)


def _kinds_param(request: web.Request) -> frozenset[EventKind] | None:
    raw = request.query.get("kinds")
    if not raw:
        return None
    try:
        return frozenset(EventKind(k) for k in raw.split(",") if k)
    except ValueError:
        raise web.HTTPBadRequest(
            text="kinds: comma-separated among " + ", ".join(k.value for k in EventKind)) from None


def _id_param(value: str | None) -> str | None:
    if value is None:
        return None
    if not ID_RE.fullmatch(value):
        raise web.HTTPBadRequest(text="not a valid request id")
    return value


#: how often a quiet stream checks that its reader is still connected (seconds)
GONE_CHECK_S = 1.0


async def sse_handler(request: web.Request, hub: EventHub, *, keepalive: float = 15.0) -> web.StreamResponse:
    rid = _id_param(request.query.get("id"))
    kinds = _kinds_param(request)
    replay = _int_param(request, "replay", 0, hub.log.capacity)
    follow = request.query.get("follow", "1") not in ("0", "false", "no")
    since = _parse_last_id(request.headers.get("Last-Event-ID"), hub.epoch)
    if since is None and "since" in request.query:
        since = _int_param(request, "since", 0, 1 << 62)
    try:
        sub = hub.subscribe(request_id=rid, kinds=kinds, peer=request.remote)
    except OverflowError as exc:
        raise web.HTTPServiceUnavailable(text=str(exc)) from None
    resp = web.StreamResponse(headers={
        "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no", "X-Content-Type-Options": "nosniff"})
    try:
        # the past is read right after subscribing, with no await in between:
        # queued live events with seq <= last are then duplicates, skipped
        if since is not None:
            gap = hub.log.first_seq > since + 1 and since < hub.log.seq
            past = hub.log.since(since)
        elif rid is not None:
            gap, past = False, hub.log.story(rid)
        else:
            gap, past = False, hub.log.latest(replay) if replay else []
        past = [(q, e) for q, e in past if sub.wants(e)]
        last = hub.log.seq
        head = b"retry: 2000\n\n"
        if gap:
            head += b"event: gap\ndata: %s\n\n" % orjson.dumps({"since": since, "first": hub.log.first_seq})
        head += b"".join(_event_bytes(q, e, hub.epoch) for q, e in past)
        await resp.prepare(request)
        await resp.write(head)
        quiet_since = time.monotonic()
        while follow:
            try:
                item = await asyncio.wait_for(sub.queue.get(), min(keepalive, GONE_CHECK_S))
            except asyncio.TimeoutError:
                transport = request.transport
                if transport is None or transport.is_closing():
                    break                   # the reader left: its slot is free now, not at the next write
                if time.monotonic() - quiet_since >= keepalive:
                    await resp.write(b": keepalive\n\n")
                    quiet_since = time.monotonic()
                continue
            quiet_since = time.monotonic()
            chunks = []
            while item is not _CLOSED:      # batch what is already queued into one write
                seq, ev = item
                if seq > last:
                    chunks.append(_event_bytes(seq, ev, hub.epoch))
                if sub.queue.empty() or len(chunks) >= 256:
                    break
                item = sub.queue.get_nowait()
            n = sub.take_dropped()
            if n:
                chunks.append(b"event: dropped\ndata: %s\n\n" % orjson.dumps({"dropped": n}))
            if chunks:
                await resp.write(b"".join(chunks))
            if item is _CLOSED:
                break
    except ConnectionError:               # the reader went away (aiohttp's reset errors included)
        pass
    finally:
        hub.unsubscribe(sub)
    return resp


async def story_handler(request: web.Request, hub: EventHub) -> web.Response:
    rid = _id_param(request.match_info.get("id"))
    story = hub.log.story(rid)
    if not story:
        return web.json_response({"id": rid, "error": "no events for this request id "
                                  "(unknown, or forgotten: the log keeps the latest calls)"}, status=404)
    return web.json_response({"id": rid, "summary": story_summary(story),
                              "events": [dict(e.to_dict(), seq=q) for q, e in story]},
                             dumps=lambda o: orjson.dumps(o).decode())


# -- JSON-lines file -------------------------------------------------------------
class JsonlWriter:
    """Appends events to ``path`` as JSON lines (``{"seq", ...event}``), in
    batches from a background task, the writes in a thread. Bounded twice:
    a queue of ``queue_size`` events (beyond: dropped, counted) and the file:
    past ``max_bytes`` it is rotated to ``path.1`` (``path.1`` to ``path.2``...,
    ``backups`` files kept; ``backups=0``: the file is truncated)."""

    def __init__(self, path: str, *, max_bytes: int = 64 << 20, backups: int = 3,
                 queue_size: int = 20000, interval: float = 0.5) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.interval = interval
        self._q: deque[tuple[int, Event]] = deque()
        self.queue_size = queue_size
        self.dropped = 0
        self.written = 0
        self.rotations = 0
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._size = os.path.getsize(path) if os.path.exists(path) else 0

    def offer(self, seq: int, ev: Event) -> None:
        if len(self._q) >= self.queue_size:
            self.dropped += 1
            return
        self._q.append((seq, ev))

    def start(self) -> "JsonlWriter":
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval)
            except asyncio.TimeoutError:
                pass
            await self.flush()
            if self._wake.is_set():
                return

    async def flush(self) -> None:
        if not self._q:
            return
        batch = [orjson.dumps(dict(e.to_dict(), seq=q)) + b"\n" for q, e in self._q]
        self._q.clear()
        try:
            await asyncio.to_thread(self._write, batch)
        except OSError as exc:
            self.dropped += len(batch)
            log.warning("event file %s: %s", self.path, exc)

    def _write(self, lines: list[bytes]) -> None:
        fh = open(self.path, "ab")
        try:
            for line in lines:
                if self._size and self._size + len(line) > self.max_bytes:
                    fh.close()
                    self._rotate()
                    fh = open(self.path, "ab")
                fh.write(line)
                self._size += len(line)
                self.written += 1
        finally:
            fh.close()

    def _rotate(self) -> None:
        self.rotations += 1
        if self.backups <= 0:
            open(self.path, "wb").close()
        else:
            for i in range(self.backups - 1, 0, -1):
                src = f"{self.path}.{i}"
                if os.path.exists(src):
                    os.replace(src, f"{self.path}.{i + 1}")
            os.replace(self.path, f"{self.path}.1")
        self._size = 0

    async def aclose(self) -> None:
        if self._task is not None and not self._task.done():
            self._wake.set()
            try:
                await self._task
            except Exception as exc:  # noqa: BLE001 - closing: report, do not raise
                log.warning("event file %s: %s", self.path, exc)
        else:
            await self.flush()

    def statistics(self) -> dict:
        return {"path": self.path, "written": self.written, "dropped": self.dropped,
                "rotations": self.rotations, "bytes": self._size}
