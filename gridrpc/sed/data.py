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
"""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core import codec
from ..core import messages as m
from ..core.datastore import DataStore, Evict, Freed, Mode, Spill, Where, parse_mode
from ..core.messages import MsgType
from ..core.refs import RefTag, fetch_bytes, find_refs, substitute
from ..errors import CommunicationError, DataAccessDenied, DataError, DataLost, ProtocolError, error_from_wire
from ..transport.channel import Channel, connect_dealer
from ..transport.endpoint import Incoming

if TYPE_CHECKING:  # pragma: no cover
    from .server import SeD

__all__ = ["DataConfig", "SedData", "requester"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class DataConfig:
    """``memory_bytes``: values held in memory; ``disk_bytes``: spill space
    past it (0: evict instead); ``policy``: lru | lfu | fifo; ``directory``:
    spill directory (default: in the SeD's temporary directory);
    ``fetch_timeout``: how long a holder has to answer (a lost holder is
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


def requester(msg: Incoming) -> str:
    """The user a data request acts for: THE one place that decides (the
    ownership check is :meth:`DataStore.check`). Without CURVE: the user
    name the request gives. With CURVE the authenticated identity wins
    (a SeD fetching for a call passes its caller's name in ``user``)."""
    from .calls import _user
    return _user(msg)      # the key's user; an element key (a SeD fetching for a call) speaks for its caller


def _nbytes(b) -> int:
    return b.nbytes if isinstance(b, memoryview) else len(memoryview(b).cast("B")) if not isinstance(
        b, (bytes, bytearray)) else len(b)


class SedData:
    def __init__(self, sed: "SeD", config: DataConfig | None = None) -> None:
        self.sed = sed
        self.config = c = config or DataConfig()
        self.store = DataStore(memory_bytes=c.memory_bytes, disk_bytes=c.disk_bytes, policy=c.policy,
                               holder=f"SeD {sed.name}")
        self.directory = c.directory or os.path.join(sed.tmpdir, "data")
        self.values: dict[str, tuple[Any, list]] = {}          # ref -> (tree, buffers) in memory
        self.files: dict[str, tuple[Any, list[int], str]] = {}  # ref -> (tree, sizes, path) spilled
        self.appear: dict[str, list[asyncio.Future]] = {}       # ref -> waiters (pending or not yet known)
        self.call_waiters: dict[str, list[asyncio.Future]] = {}  # call id -> waiters of its result
        self.call_owner: OrderedDict[str, str] = OrderedDict()
        self.resolving: dict[str, tuple[Any, asyncio.Task]] = {}  # call id -> (call, task) fetching inputs
        self.keeps: dict[str, tuple[str, Mode]] = {}
        self.pins: dict[str, list[str]] = {}                     # call id -> local refs it pinned
        self._peers: dict[str, Channel] = {}
        self._requests: dict[str, asyncio.Future] = {}
        self._heard: dict[str, float] = {}
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
        return {**self.store.statistics(), **self.stats}

    # -- bytes ---------------------------------------------------------------------------------
    def _keep_bytes(self, ref: str, tree: Any, buffers: list, actions: list) -> None:
        self.values[ref] = (tree, buffers)
        self._carry_out(actions)

    def _carry_out(self, actions: list) -> None:
        for a in actions:
            if isinstance(a, Spill):
                tree, buffers = self.values.pop(a.ref)
                os.makedirs(self.directory, exist_ok=True)
                self._files += 1
                path = os.path.join(self.directory, f"d{self._files}.bin")   # named here, never from a message
                with open(path, "wb") as fh:
                    for b in buffers:
                        fh.write(b)
                self.files[a.ref] = (tree, [_nbytes(b) for b in buffers], path)
                log.info("SeD %s: data %s spilled to disk", self.sed.name, a.ref)
            elif isinstance(a, (Evict, Freed)):
                self.values.pop(a.ref, None)
                f = self.files.pop(a.ref, None)
                if f is not None:
                    try:
                        os.unlink(f[2])
                    except OSError:
                        pass
                if isinstance(a, Evict):
                    log.info("SeD %s: data %s %s", self.sed.name, a.ref, a.reason)

    def _load(self, ref: str) -> tuple[Any, list]:
        v = self.values.get(ref)
        if v is not None:
            return v
        f = self.files.get(ref)
        if f is None:
            raise DataLost(f"data reference {ref} has no bytes on SeD {self.sed.name}")
        tree, sizes, path = f
        with open(path, "rb") as fh:
            raw = memoryview(fh.read())
        out, off = [], 0
        for n in sizes:
            out.append(raw[off:off + n])
            off += n
        return tree, out

    async def _wait_local(self, ref: str, timeout: float) -> None:
        """Until ``ref`` is here with its bytes (or gone, or ``timeout``)."""
        e = self.store.get(ref)
        if e is not None and e.where is not Where.PENDING:
            return
        if e is None and ref in self.store.tombstones:
            return
        fut = asyncio.get_running_loop().create_future()
        self.appear.setdefault(ref, []).append(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            lst = self.appear.get(ref)
            if lst and fut in lst:
                lst.remove(fut)

    def _wake(self, ref: str) -> None:
        for fut in self.appear.pop(ref, []):
            if not fut.done():
                fut.set_result(None)

    async def local_value(self, ref: str, user: str, *, transfer: bool, wait: float) -> tuple[Any, list, Any]:
        """``(tree, buffers, entry)`` of a reference held (or to be produced) here."""
        e = self.store.get(ref)
        if e is None and ref not in self.store.tombstones:
            await self._wait_local(ref, min(wait, self.config.appear_grace))
        elif e is not None and e.where is Where.PENDING:
            if e.owner == user:
                await self._wait_local(ref, wait)
        e = self.store.check(ref, user)
        if e.where is Where.PENDING:
            raise DataLost(f"data reference {ref} not produced yet on SeD {self.sed.name} after {wait}s")
        if transfer and e.mode is Mode.STICKY:
            raise DataError(f"data reference {ref} is sticky: it stays on {self.sed.name} and is never moved; "
                            f"run the call there (server={self.sed.name!r})")
        tree, buffers = self._load(ref)
        self.store.touch(ref, time.time())
        return tree, buffers, e

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
            self.sed._spawn(self._replicate_in(msg, user, mode))
            return
        buffers = [f.buffer if hasattr(f, "buffer") else f for f in msg.buffers]
        self._store_value(msg, h["ref"], user, mode, h.get("value"), buffers)

    def _store_value(self, msg: Incoming, ref: str, user: str, mode: Mode, tree: Any, buffers: list) -> None:
        size = sum(_nbytes(b) for b in buffers)
        try:
            _, actions = self.store.add(ref, user, mode, size, time.time())
        except DataError as exc:
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
                                                     "replicas": [], "call": False}), user)
        except DataError as exc:
            kind = "data_denied" if isinstance(exc, DataAccessDenied) else "data_lost" if isinstance(
                exc, DataLost) else "data"
            self.sed.endpoint.reply(msg, m.error_header(msg.id, kind, str(exc), type_=type(exc).__name__))
            return
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
            kind = ("data_denied" if isinstance(exc, DataAccessDenied) else
                    "data_lost" if isinstance(exc, DataLost) else "data")
            self.sed.endpoint.reply(msg, m.error_header(msg.id, kind, str(exc), type_=type(exc).__name__))
            return
        size = sum(_nbytes(b) for b in buffers)
        self.stats["served"] += 1
        self.stats["served_bytes"] += size
        self.sed.endpoint.reply(msg, m.make(MsgType.DATA, msg.id, ref=ref, holder=self._holder_name(h), size=size,
                                            mode=mode, value=tree), buffers)
        if not h.get("call"):
            self._carry_out(self.store.used_once(ref, time.time()))

    async def _call_result(self, cid: str, user: str, wait: float) -> tuple[Any, list, str]:
        owner = self.call_owner.get(cid)
        if owner is not None and owner != user:
            raise DataAccessDenied(f"the result of call {cid} belongs to another user; {user!r} may not use it")
        if cid in self.sed.calls or cid in self.resolving or (owner is None and wait > 0):
            fut = asyncio.get_running_loop().create_future()
            self.call_waiters.setdefault(cid, []).append(fut)
            limit = wait if (cid in self.sed.calls or cid in self.resolving) else min(wait, self.config.appear_grace)
            try:
                tree, buffers = await asyncio.wait_for(fut, limit)
                return tree, buffers, "volatile"
            except asyncio.TimeoutError:
                pass
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
            kind = "data_denied" if isinstance(exc, DataAccessDenied) else "data_lost"
            self.sed.endpoint.reply(msg, m.error_header(msg.id, kind, str(exc), type_=type(exc).__name__))
            return
        if freed is not None:
            self._carry_out([freed])
        self._wake(ref)
        self.sed.endpoint.reply(msg, m.make(MsgType.DATA, msg.id, ref=ref, holder=self._holder_name(msg.header)))

    # -- fetching from other SeDs ----------------------------------------------------------------
    def _on_peer(self, address: str, frames: list) -> None:
        try:
            mt, h = m.parse_header(frames[0].bytes)
        except ProtocolError as exc:
            log.warning("SeD %s: bad data message from %s: %s", self.sed.name, address, exc)
            return
        self._heard[address] = time.monotonic()
        fut = self._requests.pop(h["id"], None)
        if fut is not None and not fut.done():
            fut.set_result((mt, h, frames[1:]))

    def _peer_options(self, header: dict) -> dict | None:
        """Under CURVE a SeD fetches with its own element key, pinning the
        holder's public key from the shared key directory (by the holder's
        name, which the reference names)."""
        sec = self.sed.security
        if sec is None or not sec.enabled:
            return None
        holder = header.get("sed")
        if not isinstance(holder, str):
            raise CommunicationError("cannot fetch data securely: the holder's name is unknown")
        base = holder.rsplit("-", 1)[0] if holder not in {n for _, n, _, _ in sec.keys.entries()} else holder
        return sec.client_options(sec.keys.public(base, "element"))

    async def _request(self, address: str, header: dict, timeout: float) -> tuple:
        """Send and wait for the answer; while waiting (a pending producer), the
        holder is pinged: silent for ``fetch_timeout`` means lost."""
        from ..client.ids import new_id
        ch = self._peers.get(address)
        if ch is None or ch.closed:
            ch = self._peers[address] = Channel(connect_dealer(address, options=self._peer_options(header)),
                                                functools.partial(self._on_peer, address),
                                                name=f"{self.sed.name}->{address}")
        fut = asyncio.get_running_loop().create_future()
        self._requests[header["id"]] = fut
        start = time.monotonic()
        try:
            ch.send([m.dumps(header)])
            while True:
                done, _ = await asyncio.wait({fut}, timeout=min(1.0, self.config.fetch_timeout / 3))
                if done:
                    return fut.result()
                now = time.monotonic()
                if now - max(start, self._heard.get(address, start)) > self.config.fetch_timeout or now - start > timeout:
                    raise asyncio.TimeoutError()
                ch.send([m.dumps(m.make(MsgType.PING, new_id(), ids=[]))])
        finally:
            self._requests.pop(header["id"], None)

    async def fetch(self, tag: RefTag, user: str, wait: float | None = None) -> tuple[Any, list]:
        """``(tree, buffers)`` of a reference: from this process, else from its
        holder, else a replica. DataLost / DataAccessDenied otherwise."""
        from ..client.ids import new_id
        ref, is_call = tag.id, bool(tag.desc.get("call"))
        wait = self.config.max_wait if wait is None else wait
        reasons = []
        for name, address in tag.holders():
            if name in self.sed.replicas or (address and address == self.sed.address):
                if is_call:
                    tree, buffers, _ = await self._call_result(ref, user, wait)
                    return tree, buffers
                tree, buffers, _ = await self.local_value(ref, user, transfer=False, wait=wait)
                return tree, buffers
            if not address:
                reasons.append(f"{name}: no address")
                continue
            h = m.make(MsgType.DATA_GET, new_id(), ref=ref, user=user, wait=wait, transfer=True, call=is_call,
                       sed=name)
            try:
                mt, hh, frames = await self._request(address, h, self.config.fetch_timeout + wait)
            except (asyncio.TimeoutError, CommunicationError) as exc:
                reasons.append(f"holder {name} ({address}) did not answer ({type(exc).__name__}): lost?")
                continue
            if mt is MsgType.ERROR:
                err = error_from_wire(hh["error"])
                if isinstance(err, DataAccessDenied):
                    raise err
                reasons.append(f"{name}: {hh['error'].get('message')}")
                if isinstance(err, DataError) and not isinstance(err, DataLost):
                    raise DataError(f"data reference {ref}: {hh['error'].get('message')}")
                continue
            buffers = [f.buffer for f in frames]
            self.stats["fetched"] += 1
            self.stats["fetched_bytes"] += sum(len(b) for b in buffers)
            return hh.get("value"), buffers
        raise DataLost(f"data reference {ref} could not be fetched: " + "; ".join(reasons))

    # -- calls ---------------------------------------------------------------------------------
    def on_call(self, call, header: dict) -> bool:
        """A new call (decoded, checked). Registers its kept result; True if
        its inputs must be resolved first (then it is acknowledged here and
        admitted later)."""
        self.call_owner[call.id] = call.user
        while len(self.call_owner) > 100_000:
            self.call_owner.popitem(last=False)
        keep = header.get("keep")
        if keep is not None:
            mode = parse_mode(keep["mode"])
            self.store.expect(keep["ref"], call.user, mode, call.id, time.time())
            self.keeps[call.id] = (keep["ref"], mode)
        tags = find_refs(call.args) + find_refs(call.kwargs)
        if not tags:
            return False
        self.sed.endpoint.send(call.route, self.sed._accepted(call))
        task = self.sed._spawn(self._resolve(call, tags))
        self.resolving[call.id] = (call, task)
        return True

    async def _resolve(self, call, tags: list[RefTag]) -> None:
        values: dict[int, Any] = {}
        pinned: list[str] = []
        try:
            cache: dict[str, Any] = {}
            for tag in tags:
                if tag.id not in cache:
                    tree, buffers = await self.fetch(tag, call.user)
                    ex = self.sed.execution
                    cache[tag.id] = codec.decode(tree, buffers, ex.file_sink(call.workdir), ex.copy_args)
                    if tag.id in self.store and not tag.desc.get("call"):
                        self.store.pin(tag.id)          # a pending call needs it: never evicted
                        pinned.append(tag.id)
                values[id(tag)] = cache[tag.id]
        except asyncio.CancelledError:
            self._unpin(pinned)
            raise
        except Exception as exc:  # noqa: BLE001 - any failure fails this call only, with a clear error
            self._unpin(pinned)
            self.resolving.pop(call.id, None)
            kind = ("data_denied" if isinstance(exc, DataAccessDenied) else "data_lost" if isinstance(exc, DataLost)
                    else "data" if isinstance(exc, DataError) else "protocol")
            msg = f"call {call.id} ({call.service}) could not get its data: {exc}"
            self._producer_failed(call.id, msg)
            self.sed.endpoint.send(call.route, m.error_header(call.id, kind, msg, type_=type(exc).__name__,
                                                              server=call.replica.name))
            return
        self.resolving.pop(call.id, None)
        call.args = substitute(call.args, values)
        call.kwargs = substitute(call.kwargs, values)
        self.pins[call.id] = pinned
        self.sed.admit(call)

    def _unpin(self, refs: list[str]) -> None:
        for r in refs:
            self._carry_out(self.store.unpin(r))
            self._carry_out(self.store.used_once(r, time.time()))

    def state(self, cid: str) -> str | None:
        return "queued" if cid in self.resolving else None

    def cancel(self, cid: str) -> bool:
        item = self.resolving.pop(cid, None)
        if item is None:
            return False
        call, task = item
        task.cancel()
        self._producer_failed(cid, f"call {cid} was cancelled")
        self.sed.endpoint.send(call.route, m.error_header(cid, "cancelled", "call cancelled while fetching its data"))
        return True

    def _producer_failed(self, cid: str, message: str) -> None:
        keep = self.keeps.pop(cid, None)
        if keep is not None:
            self.store.fail(keep[0], message)
            self._wake(keep[0])
        for fut in self.call_waiters.pop(cid, []):
            if not fut.done():
                fut.set_exception(DataLost(message))

    def answering(self, call, header: dict, buffers, ok: bool) -> tuple[dict, list, bool]:
        """A call ends: release its inputs, keep its result, wake its waiters."""
        self._unpin(self.pins.pop(call.id, []))
        is_result = header.get("type") == MsgType.RESULT.value
        waiters = self.call_waiters.pop(call.id, [])
        if waiters:
            for fut in waiters:
                if fut.done():
                    continue
                if is_result:
                    fut.set_result((header.get("value"), list(buffers)))
                else:
                    err = header.get("error") or {}
                    fut.set_exception(DataLost(f"call {call.id} ({call.service}) that produces this argument "
                                               f"failed: {err.get('type')}: {err.get('message')}"))
        keep = self.keeps.get(call.id)
        if keep is None:
            return header, list(buffers), ok
        if not is_result:
            err = header.get("error") or {}
            self._producer_failed(call.id, f"call {call.id} ({call.service}) that was to produce it failed: "
                                           f"{err.get('type')}: {err.get('message')}")
            return header, list(buffers), ok
        self.keeps.pop(call.id, None)
        ref, mode = keep
        tree, buffers = header.get("value"), list(buffers)
        size = sum(_nbytes(b) for b in buffers)
        try:
            _, actions = self.store.add(ref, call.user, mode, size, time.time())
        except DataError as exc:
            self._wake(ref)
            return (m.error_header(call.id, "data", str(exc), type_=type(exc).__name__,
                                   **{k: header[k] for k in ("server", "timing") if k in header}), [], False)
        self._keep_bytes(ref, tree, buffers, actions)
        self._wake(ref)
        desc = {"__t": "ref", "id": ref, "holder": call.replica.name, "address": self.sed.address, "size": size,
                "mode": mode.value, "replicas": []}
        out = dict(header)
        if mode is Mode.PERSISTENT_RETURN:
            desc["value"] = tree
            return {**out, "value": desc}, buffers, ok
        return {**out, "value": desc}, [], ok

    async def close(self) -> None:
        for ch in self._peers.values():
            ch.close()
        for fut in self._requests.values():
            if not fut.done():
                fut.cancel()
        self.values.clear()
        self.files.clear()
