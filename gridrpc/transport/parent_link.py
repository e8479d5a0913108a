"""The child side of the tree: attach to a parent, heartbeat, re-register.

A child (LA or SeD) may start before its parent: it keeps sending REGISTER
every heartbeat interval until the parent acknowledges. Afterwards it sends
HEARTBEAT; a parent that does not know it (restarted MA) answers
``known: false`` and the child registers again by itself. A parent silent past
the timeout is *lost*: the socket is re-created (fresh TCP connection, useful
after partitions) and registration starts over. Optionally, a child whose
parent stays lost past ``orphan_timeout`` asks its owner to exit.

A child that gets no answer at all (a wrong ``--parent``, a parent not started
yet) says so at WARNING, "waiting for parent at ADDRESS", once ``warn_after``
seconds passed without an answer and again every ``warn_every`` seconds; a
parent that refuses the registration (an ERROR reply) is logged at WARNING
with its reason (rate-limited the same way).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import asyncio
import logging
import time
from typing import Callable

from ..core import messages as m
from ..core.messages import MsgType
from ..core.parent_ack import parent_ack
from .channel import Channel, connect_dealer, routing_id

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # pragma: no cover
    from .security import Security


class ParentLink:
    def __init__(self, *, name: str, parent: str, register_info: Callable[[], dict],
                 heartbeat_info: Callable[[], dict], on_message: Callable[[MsgType, dict, list], None],
                 hb_interval: float = 1.0, hb_timeout: float = 3.0,
                 orphan_timeout: float | None = None, on_orphaned: Callable[[], None] | None = None,
                 warn_after: float = 5.0, warn_every: float = 30.0,
                 security: "Security | None" = None, parent_key: bytes | None = None,
                 on_attached: Callable[[], None] | None = None,
                 on_view_missing: Callable[[list], None] | None = None) -> None:
        self.name = name
        self.on_attached = on_attached      # the parent (again) knows us: what it needs beyond REGISTER
        self.on_view_missing = on_view_missing  # the parent lacks these snapshots: push them again
        # CURVE to the parent: our element key, the parent's public key pinned
        self._socket_options = security.client_options(parent_key) if security is not None and \
            security.enabled else {}
        self.parent = parent
        self.register_info = register_info
        self.heartbeat_info = heartbeat_info
        self.on_message = on_message
        self.hb_interval = hb_interval
        self.hb_timeout = hb_timeout
        self.orphan_timeout = orphan_timeout
        self.on_orphaned = on_orphaned
        self.warn_after = warn_after
        self.warn_every = warn_every
        self.attached = False
        self.last_ack = time.monotonic()
        self.lost_since: float | None = time.monotonic()
        self.channel: Channel | None = None
        self._task: asyncio.Task | None = None
        self._seq = 0
        self._routing_id = routing_id()
        self._next_warning: float | None = None     # when "waiting for parent" is due again
        self._next_refusal_log = 0.0
        self.attach_event = asyncio.Event()

    def start(self) -> None:
        self._open()
        self._send_register()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"link-{self.name}")

    def _open(self) -> None:
        if self.channel is not None:
            self.channel.close()
        # the same routing id for every socket of this link: the parent keeps
        # knowing us across reconnects (and nobody else can claim our place)
        sock = connect_dealer(self.parent, identity=self._routing_id, immediate=True,
                              options=self._socket_options)
        self.channel = Channel(sock, self._recv, name=f"{self.name}->parent")

    def _next_id(self) -> str:
        self._seq += 1
        return f"{self.name}#{self._seq}"

    def send(self, header: dict, buffers: list = ()) -> bool:
        """Whether the message left (False: the parent is unreachable or its
        queue is full, the message is dropped; heartbeats will tell)."""
        try:
            self.channel.send([m.dumps(header), *buffers])
        except Exception as exc:  # parent not reachable: heartbeats will tell
            log.debug("%s: send to parent failed: %s", self.name, exc)
            return False
        return True

    def _send_register(self) -> None:
        self.send(m.make(MsgType.REGISTER, self._next_id(), name=self.name, **self.register_info()))

    def update(self) -> None:
        """Services or subtree changed: register again (idempotent on the parent)."""
        self._send_register()

    def _recv(self, frames: list) -> None:
        try:
            mt, h = m.parse_header(frames[0].bytes)
        except Exception as exc:
            log.warning("%s: bad message from parent: %s", self.name, exc)
            return
        now = time.monotonic()
        if mt in (MsgType.REGISTERED, MsgType.HEARTBEAT_ACK):
            self.last_ack = now
            ack = parent_ack(mt, h, self.attached)
            if ack.register:
                log.info("%s: parent %s does not know us: registering again", self.name, self.parent)
                self.attached = False           # its REGISTERED makes us attached again (on_attached)
                self._send_register()
                return
            if ack.view_missing and self.on_view_missing is not None:
                log.info("%s: parent %s lacks %d snapshot(s): pushing them again", self.name, self.parent,
                         len(ack.view_missing))
                self.on_view_missing(list(ack.view_missing))
            if ack.attached_now:
                log.info("%s: attached to parent %s", self.name, self.parent)
                if self.on_attached is not None:
                    self.on_attached()
            self.attached = True
            self.lost_since = None
            self._next_warning = None
            self.attach_event.set()
            return
        if mt is MsgType.ERROR and not self.attached:
            if now >= self._next_refusal_log:
                self._next_refusal_log = now + self.warn_every
                log.warning("%s: parent at %s refused us: %s", self.name, self.parent,
                            h["error"].get("message", ""))
            return
        self.on_message(mt, h, frames)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.hb_interval)
            now = time.monotonic()
            if self.attached and now - self.last_ack > self.hb_timeout:
                log.warning("%s: parent %s silent for %.1fs: reconnecting", self.name, self.parent,
                            now - self.last_ack)
                self.attached = False
                self.attach_event.clear()
                self.lost_since = now
                self._open()
            if self.attached:
                self.send(m.make(MsgType.HEARTBEAT, self._next_id(), name=self.name, **self.heartbeat_info()))
            else:
                self._warn_waiting(now)
                self._send_register()
                if (self.orphan_timeout is not None and self.lost_since is not None
                        and now - self.lost_since > self.orphan_timeout and self.on_orphaned):
                    self.on_orphaned()

    def _warn_waiting(self, now: float) -> None:
        since = self.lost_since if self.lost_since is not None else now
        if self._next_warning is None:
            self._next_warning = since + self.warn_after
        if now >= self._next_warning:
            self._next_warning = now + self.warn_every
            log.warning("%s: waiting for parent at %s (no answer for %.0fs; is the address right?)",
                        self.name, self.parent, now - since)

    async def aclose(self, unregister: bool = True) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if self.channel is not None:
            if unregister and self.attached:
                self.send(m.make(MsgType.UNREGISTER, self._next_id(), name=self.name))
                await asyncio.sleep(0.01)
            self.channel.close()


class MultiParentLink:
    """A child attached to several parents at once (active-active master
    agents, ``--parent a,b``): one :class:`ParentLink` per parent, each with
    its own registration and heartbeats. A reply to a parent's request (same
    ``id``) goes back over the link the request came from; anything else
    (``update``) goes to every parent. Orphaned only when every parent is lost."""

    _REPLY_MEMORY = 4096

    def __init__(self, *, parents: list[str], on_message: Callable[[MsgType, dict, list], None],
                 on_orphaned: Callable[[], None] | None = None, parent_keys: list | None = None,
                 **kw) -> None:
        self.parents = list(parents)
        self.parent = ",".join(self.parents)
        self.name = kw.get("name", "")
        self._on_message = on_message
        self._on_orphaned = on_orphaned
        self._reply_to: dict[str, ParentLink] = {}
        keys = parent_keys or [None] * len(self.parents)
        self.links = [ParentLink(parent=p, on_message=self._recv_from(i), on_orphaned=self._orphaned,
                                 parent_key=keys[i], **kw)
                      for i, p in enumerate(self.parents)]
        self.attach_event = asyncio.Event()

    def _recv_from(self, i: int) -> Callable[[MsgType, dict, list], None]:
        def recv(mt: MsgType, h: dict, frames: list) -> None:
            if len(self._reply_to) >= self._REPLY_MEMORY:
                self._reply_to.pop(next(iter(self._reply_to)))
            self._reply_to[h["id"]] = self.links[i]
            self._on_message(mt, h, frames)
        return recv

    @property
    def attached(self) -> bool:
        return any(link.attached for link in self.links)

    def _orphaned(self) -> None:
        if self._on_orphaned is not None and not self.attached:
            self._on_orphaned()

    def start(self) -> None:
        for link in self.links:
            link.start()
        self._watch = asyncio.get_running_loop().create_task(self._watch_attach())

    async def _watch_attach(self) -> None:
        waits = [asyncio.ensure_future(link.attach_event.wait()) for link in self.links]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            self.attach_event.set()
        finally:
            for w in waits:
                w.cancel()

    def send(self, header: dict, buffers: list = ()) -> bool:
        link = self._reply_to.pop(header.get("id"), None)
        sent = True
        for target in ([link] if link is not None else self.links):
            sent = target.send(header, buffers) and sent
        return sent

    def update(self) -> None:
        for link in self.links:
            link.update()

    async def aclose(self, unregister: bool = True) -> None:
        watch = getattr(self, "_watch", None)
        if watch is not None and not watch.done():
            watch.cancel()
        for link in self.links:
            await link.aclose(unregister)


def parent_link(*, parent: str, **kw) -> "ParentLink | MultiParentLink":
    """A link to ``parent``, or to each of several comma-separated parents."""
    parents = [p.strip() for p in parent.split(",") if p.strip()] if isinstance(parent, str) else list(parent)
    key = kw.pop("parent_key", None)
    keys = list(key) if isinstance(key, (list, tuple)) else [key] * len(parents)
    if len(keys) != len(parents):
        raise ValueError(f"{len(parents)} parents but {len(keys)} parent keys: give one key per parent")
    if len(parents) == 1:
        return ParentLink(parent=parents[0], parent_key=keys[0], **kw)
    return MultiParentLink(parents=parents, parent_keys=keys, **kw)
