"""Data held on the SeD by reference: the runtime over :mod:`gridrpc.core.datastore`.

Messages (all on the SeD's endpoint; ``user`` is :func:`requester`)::

    data_put {ref, mode, value + frames}      store a client's value          -> data {ref, holder, size}
    data_put {ref, mode, source}              replicate: fetch it from source -> data {ref, holder, size}
    data_get {ref, wait, transfer, call}      the value (waits for a pending  -> data {ref, value + frames}
                                              producer); ``call``: the result
                                              of a pending call that did not keep it
    data_free {ref}                           drop it                          -> data {ref}

A CALL whose arguments hold references (:class:`~gridrpc.core.refs.RefTag`)
is acknowledged at once, then its references are resolved — from this
process's store, or fetched straight from the holder SeD (or a replica) with
zero-copy frames — and only then queued: a call waiting for its data holds no
execution slot, so a consumer never blocks its producer. A CALL with
``keep`` stores its result here and answers with the reference.

Bytes live as the codec's ``(tree, buffers)``: in memory, or in a spill file
this SeD names (``d<counter>.bin`` in its data directory; never a name from
a message).

Layout: this module holds the configuration, the state and the ``data_*``
message handlers; where the bytes live is :mod:`gridrpc.sed.data.held_bytes`,
fetching from other SeDs :mod:`gridrpc.sed.data.fetch`, a call's data
:mod:`gridrpc.sed.data.call_refs`.
"""
from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...core import messages as m
from ...core.datastore import DataStore, Mode, Where, parse_mode
from ...core.messages import MsgType
from ...core.refs import RefTag, fetch_bytes
from ...core.tally import tally
from ...errors import DataError, DataLost, ProtocolError, wire_kind
from ...runtime.data_request import DataRequests
from ...transport.endpoint import Incoming
from ...transport.pipes import Pipes
from .held_bytes import HeldBytes, nbytes, value_nbytes
from .call_refs import CallData, not_yours
from .fetch import Fetching, log

if TYPE_CHECKING:  # pragma: no cover
    from ..server import SeD

__all__ = ["DataConfig", "SedData", "requester"]

#: copies from other SeDs (``data_put`` with a ``source``) one user may have in progress here at once
MAX_REPLICATIONS_PER_USER = 8
#: results of calls not yet known here that one user may wait for at once (each holds a future
#: and a task until ``appear_grace``): a consumer's request may come before its producer's CALL
MAX_EARLY_WAITS_PER_USER = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class DataConfig:
    """``memory_bytes``: values held in memory; ``disk_bytes``: spill space
    past it (0: evict instead); ``policy``: lru | lfu | fifo; ``directory``:
    spill directory (default: in the SeD's temporary directory);
    ``max_bytes_per_user``: held bytes one user may have here (the user is the
    key's under security); ``fetch_timeout``: how long a holder has to answer (a lost holder is
    reported after it); ``appear_grace``: how long a reference announced by a
    client may take to be registered here (its producing CALL may arrive
    after the consumer's fetch)."""
    memory_bytes: int = 2 << 30
    disk_bytes: int = 0
    policy: str = "lru"
    directory: str | None = None
    fetch_timeout: float = 10.0
    appear_grace: float = 10.0
    max_wait: float = 86_400.0
    max_bytes_per_user: int | None = None   # held bytes one user may have on this SeD


def requester(msg: Incoming) -> str:
    """The user a data request acts for: THE one place that decides (the
    ownership check is :meth:`DataStore.check`). Without CURVE: the user
    name the request gives. With CURVE the authenticated identity wins
    (a SeD fetching for a call passes its caller's name in ``user``)."""
    from ..calls.receive import message_user
    return message_user(msg)      # the key's user; an element key (a SeD fetching for a call) speaks for its caller


class SedData(HeldBytes, Fetching, CallData):
    def __init__(self, sed: "SeD", config: DataConfig | None = None) -> None:
        self.sed = sed
        self.config = c = config or DataConfig()
        self.store = DataStore(memory_bytes=c.memory_bytes, disk_bytes=c.disk_bytes, policy=c.policy,
                               holder=f"SeD {sed.name}", max_bytes_per_user=c.max_bytes_per_user)
        self.directory = c.directory or os.path.join(sed.tmpdir, "data")
        self.values: dict[str, tuple[Any, list]] = {}          # ref -> (tree, buffers) in memory
        self.files: dict[str, tuple[Any, list[int], str]] = {}  # ref -> (tree, sizes, path) spilled
        self.appear: dict[str, list[asyncio.Future]] = {}       # ref -> waiters (pending or not yet known)
        self.call_waiters: dict[str, list[tuple[asyncio.Future, str]]] = {}  # call id -> (waiter, its user)
        self._early_waits: dict[str, int] = {}                   # user -> waits for calls not yet known
        self._replicating: dict[str, int] = {}                   # user -> data_put copies in progress
        self.resolving: dict[str, tuple[Any, asyncio.Task]] = {}  # call id -> (call, task) fetching inputs
        self.keeps: dict[str, tuple[str, Mode]] = {}
        self.pins: dict[str, list[str]] = {}                     # call id -> local refs it pinned
        self.requests = DataRequests(log, f"SeD {sed.name}")     # fetches in flight (gridrpc.runtime)
        sec = sed.security
        self._holder_keys: dict[str, tuple[float, bytes | None]] = {}   # see Fetching._holder_key
        #: holder address -> its pipe (CURVE channel and bulk session), least recently used first
        self.pipes = Pipes(self.requests.on_message, secure=sec is not None and sec.enabled)
        self._peer_busy: dict[str, int] = {}                   # requests in flight per holder
        self._peer_used: dict[str, float] = {}                 # when each holder was last used (monotonic)
        self._peer_sweep: asyncio.TimerHandle | None = None
        self._files = 0
        self.stats = {"fetched": 0, "fetched_bytes": 0, "served": 0, "served_bytes": 0}

    def handlers(self) -> dict:
        return {MsgType.DATA_PUT: self._on_put, MsgType.DATA_GET: self._on_get, MsgType.DATA_FREE: self._on_free}

    # -- estimation / load -------------------------------------------------------------------
    def fetch_bytes(self, replica_name: str, args_light: Any) -> int:
        return fetch_bytes(args_light, set(self.sed.replicas), self._held)

    def _held(self, ref: str) -> bool:
        e = self.store.get(ref)
        return e is not None and e.where is not Where.PENDING

    def statistics(self) -> dict:
        """The store's figures and the fetches'; under CURVE ``fetch_bulk``: what the fetches' bulk
        sessions carried (messages and bytes each way) and how many are open."""
        links = self.pipes.links
        bulk = {} if links is None else {"fetch_bulk": {**links.stats, "sessions": links.sessions()}}
        return {**self.store.statistics(), **self.stats, **bulk}

    # -- messages ------------------------------------------------------------------------------
    def _holder_name(self, h: dict) -> str:
        s = h.get("sed")
        return s if isinstance(s, str) and s in self.sed.replicas else next(iter(self.sed.replicas))

    def _on_put(self, msg: Incoming) -> None:
        h, user = msg.header, requester(msg)
        try:
            mode = parse_mode(h.get("mode") or "persistent")
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
        if h.get("source") is not None:
            self.check_source(h["source"])
            if self._replicating.get(user, 0) >= MAX_REPLICATIONS_PER_USER:
                raise DataError(f"user {user!r} already has {MAX_REPLICATIONS_PER_USER} copies from other "
                                f"SeDs in progress on SeD {self.sed.name}; wait for one to end")
            tally(self._replicating, user, 1)
            self.sed._spawn(self._replicate_in(msg, user, mode))
            return
        buffers = [f.buffer if hasattr(f, "buffer") else f for f in msg.buffers]
        self._store_value(msg, h["ref"], user, mode, h.get("value"), buffers)

    def _store_value(self, msg: Incoming, ref: str, user: str, mode: Mode, tree: Any, buffers: list) -> None:
        size = value_nbytes(tree, buffers)
        try:
            _, actions = self.store.add(ref, user, mode, size, time.time())
        except DataError as exc:
            self._carry_out(getattr(exc, "actions", ()))
            self.sed.endpoint.reply(msg, m.error_header(msg.id, "data", str(exc), type_=type(exc).__name__))
            return
        self._keep_bytes(ref, tree, buffers, actions)
        self._wake(ref)
        self.sed.endpoint.reply(msg, m.make(MsgType.DATA, msg.id, ref=ref, holder=self._holder_name(msg.header),
                                            size=size, mode=mode.value))

    async def _replicate_in(self, msg: Incoming, user: str, mode: Mode) -> None:
        src = msg.header["source"]
        ref = msg.header["ref"]
        try:
            tree, buffers = await self.fetch(RefTag({"id": ref, "holder": src["name"], "address": src["address"],
                                                     "size": src.get("size", 0), "replicas": [], "call": False}),
                                             user,
                                             wait=self.config.appear_grace)
        except DataError as exc:
            self.sed.endpoint.reply(msg, m.error_header(msg.id, wire_kind(exc), str(exc), type_=type(exc).__name__))
            return
        finally:
            tally(self._replicating, user, -1)
        self._store_value(msg, ref, user, mode, tree, buffers)

    def _on_get(self, msg: Incoming) -> None:
        self.sed._spawn(self._serve(msg))

    async def _serve(self, msg: Incoming) -> None:
        h, user = msg.header, requester(msg)
        ref = h["ref"]
        wait = float(h.get("wait") or 0.0)
        wait = min(max(wait, 0.0), self.config.max_wait)
        try:
            if h.get("call"):
                tree, buffers, mode = await self._call_result(ref, user, wait)
            else:
                tree, buffers, e = await self.local_value(ref, user, transfer=bool(h.get("transfer")), wait=wait)
                mode = e.mode.value
        except DataError as exc:
            self.sed.endpoint.reply(msg, m.error_header(msg.id, wire_kind(exc), str(exc), type_=type(exc).__name__))
            return
        size = sum(nbytes(b) for b in buffers)
        self.stats["served"] += 1
        self.stats["served_bytes"] += size
        self.sed.endpoint.reply(msg, m.make(MsgType.DATA, msg.id, ref=ref, holder=self._holder_name(h), size=size,
                                            mode=mode, value=tree), buffers)
        if not h.get("call"):
            self._carry_out(self.store.used_once(ref, time.time()))

    async def _call_result(self, cid: str, user: str, wait: float) -> tuple[Any, list, str]:
        owner = self.call_user(cid)
        if owner is not None and owner != user:
            raise not_yours(cid, user)
        live = cid in self.sed.calls or cid in self.resolving
        if live or (owner is None and wait > 0):
            early = not live        # the call may arrive after its consumer's request: wait a little, bounded
            if early and self._early_waits.get(user, 0) >= MAX_EARLY_WAITS_PER_USER:
                raise DataError(f"user {user!r} already waits for {MAX_EARLY_WAITS_PER_USER} results of calls "
                                f"not yet known on SeD {self.sed.name}")
            fut = asyncio.get_running_loop().create_future()
            self.call_waiters.setdefault(cid, []).append((fut, user))
            limit = wait if live else min(wait, self.config.appear_grace)
            if early:
                tally(self._early_waits, user, 1)
            try:
                tree, buffers = await asyncio.wait_for(fut, limit)
                return tree, buffers, "volatile"
            except asyncio.TimeoutError:
                pass
            finally:
                if early:
                    tally(self._early_waits, user, -1)
                waiters = self.call_waiters.get(cid)
                if waiters is not None:
                    waiters[:] = [w for w in waiters if w[0] is not fut]
                    if not waiters:
                        del self.call_waiters[cid]
            owner = self.call_user(cid)
            if owner is not None and owner != user:
                raise not_yours(cid, user)
        frames = self.sed.lifecycle.cache.answer(cid)
        if frames is None:
            raise DataLost(f"the result of call {cid} is no longer kept on SeD {self.sed.name} (or the call is "
                           "unknown there); submit the producer with keep_result=True")
        mt, hh = m.parse_header(frames[0] if not hasattr(frames[0], "bytes") else frames[0].bytes)
        if mt is not MsgType.RESULT:
            err = hh.get("error") or {}
            raise DataLost(f"call {cid} that produces this argument failed: {err.get('type')}: {err.get('message')}")
        return hh.get("value"), [f.buffer if hasattr(f, "buffer") else f for f in frames[1:]], "volatile"

    def _on_free(self, msg: Incoming) -> None:
        user = requester(msg)
        ref = msg.header["ref"]
        try:
            freed = self.store.free(ref, user)
        except DataError as exc:
            self.sed.endpoint.reply(msg, m.error_header(msg.id, wire_kind(exc), str(exc), type_=type(exc).__name__))
            return
        if freed is not None:
            self._carry_out([freed])
        self._wake(ref)
        self.sed.endpoint.reply(msg, m.make(MsgType.DATA, msg.id, ref=ref, holder=self._holder_name(msg.header)))

    async def close(self) -> None:
        if self._peer_sweep is not None:
            self._peer_sweep.cancel()
        self.pipes.close()
        self.requests.close()
        self.values.clear()
        self.files.clear()
