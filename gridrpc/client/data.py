"""Client side of data held on SeDs: :class:`DataRef`, put/get/free/replicate,
and references or pending calls as arguments.

``client.put(value)`` stores a value on a SeD and returns a :class:`DataRef`;
``client.submit(..., keep_result=True)`` leaves a result on the SeD that
computed it. A ``DataRef`` or a pending :class:`~gridrpc.Call` passed as an
argument travels as a small descriptor: the SeD that runs the call fetches
the bytes from the holder itself (see :mod:`gridrpc.sed.data.store`).
"""
from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING, Any

from ..core import codec
from ..core import messages as m
from ..core.data_request import DataRequest, Failed
from ..core.datastore import Mode, parse_mode
from ..core.messages import MsgType
from ..core.refs import RefTag
from ..errors import CommunicationError, DataAccessDenied, DataError, DataLost, NoServerAvailable, error_from_wire
from ..files import read_file
from ..runtime.data_request import DataRequests
from ..transport.channel import frame_size
from .futures import Call, ServerInfo
from .ids import new_id

if TYPE_CHECKING:  # pragma: no cover
    from ..transport.pipes import Pipe
    from .aio import AsyncClient

__all__ = ["DataRef", "DataClient", "prepare_args", "keep_spec", "MODES"]

MODES = tuple(x.value for x in Mode)
_MISSING = object()


class DataRef:
    """A value held on a SeD. ``id``, ``holder`` (SeD name), ``address``,
    ``size`` (bytes), ``mode``, ``replicas`` ([(name, address)]).
    Pass it as an argument to any call; ``get()`` brings the value here,
    ``free()`` drops it, ``replicate(n)`` keeps it on n SeDs in all."""

    def __init__(self, client: "AsyncClient", desc: dict, value: Any = _MISSING) -> None:
        self._client = client
        self._desc = {k: v for k, v in desc.items() if k != "value"}
        self._desc["__t"] = "ref"
        self._desc.setdefault("replicas", [])
        self._value = value

    id = property(lambda self: self._desc["id"])
    holder = property(lambda self: self._desc["holder"])
    address = property(lambda self: self._desc.get("address"))
    size = property(lambda self: int(self._desc.get("size") or 0))
    mode = property(lambda self: self._desc.get("mode") or "persistent")
    replicas = property(lambda self: [tuple(r) for r in self._desc.get("replicas") or []])

    def __gridrpc_ref__(self) -> dict:
        return self._desc

    def holders(self) -> list[tuple[str, str]]:
        return [(self.holder, self.address or ""), *self.replicas]

    def __repr__(self) -> str:
        return f"<gridrpc.DataRef {self.id} on {self.holder} {self.size} B {self.mode}>"

    # -- async ---------------------------------------------------------------------------------
    async def aget(self, timeout: float | None = None):
        if self._value is not _MISSING and self.mode != "volatile":
            return self._value
        return await self._client.data.get(self, timeout)

    async def afree(self) -> None:
        await self._client.data.free(self)

    async def areplicate(self, n: int) -> "DataRef":
        await self._client.data.replicate(self, n)
        return self

    # -- blocking (any thread but the client's loop) ---------------------------------------------
    def _run(self, coro, timeout=None):
        loop = self._client.loop
        try:
            if asyncio.get_running_loop() is loop:
                coro.close()
                raise RuntimeError("DataRef.get/free/replicate would block the event loop; use aget/afree/areplicate")
        except RuntimeError as exc:
            if "would block" in str(exc):
                raise
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    def get(self, timeout: float | None = None):
        """The value (fetched from the holder, or a replica)."""
        return self._run(self.aget(timeout))

    def free(self) -> None:
        self._run(self.afree())

    def replicate(self, n: int) -> "DataRef":
        """Hold the value on ``n`` SeDs in all (the holder plus n-1 replicas);
        a reference survives the loss of its holder while a replica lives."""
        return self._run(self.areplicate(n))


def keep_spec(keep_result: Any) -> dict | None:
    """The CALL's ``keep`` field from ``keep_result`` (True: persistent, or a mode name)."""
    if keep_result is None or keep_result is False:
        return None
    mode = Mode.PERSISTENT if keep_result is True else parse_mode(keep_result)
    return {"ref": "r" + new_id(), "mode": mode.value}


class DataClient:
    """A client's data requests: a channel per SeD, each request driven by
    :class:`~gridrpc.core.data_request.DataRequest` (a SeD silent for
    ``ping_timeout`` is lost). Under CURVE the requests to a SeD and its
    answers take a bulk session over that channel
    (:class:`~gridrpc.transport.pipes.Pipes`, as calls and a SeD's
    fetches do) once a message with a large frame went to it or came from it,
    or before a put or get that moves at least
    :data:`~gridrpc.transport.pipes.SEALED_FROM` bytes: bulk data then moves
    sealed with AES-256-GCM instead of through CURVE."""

    def __init__(self, client: "AsyncClient") -> None:
        from ..transport.pipes import Pipes
        self.client = client
        self._requests = DataRequests()
        self._pipes = Pipes(self._requests.on_message, secure=bool(client.secure))
        self.bytes_sent = self.bytes_received = 0
        #: this client's bulk sessions for data (None without CURVE)
        self.bulk = self._pipes.links

    def in_flight(self) -> int:
        """Data requests awaiting an answer (or, before that, their bulk session)."""
        return self._requests.in_flight

    def close(self) -> None:
        self._requests.close(CommunicationError("client closed"))
        self._pipes.close()

    # -- Links: the channels of the requests ---------------------------------------------------
    async def holder_channel(self, name: str, address: str, header: dict) -> Pipe:
        pipe = self._pipes.get(address)
        if pipe is None:
            opts = await self.client.dealer_options(address)
            # another request may have connected while this one waited for the options
            pipe = self._pipes.get(address) or self._pipes.connect(address, opts, name=f"client-data->{address}")
        return pipe

    def holder_done(self, address: str) -> None:
        """Channels to SeDs stay open for the client's life."""

    async def _walk(self, holders, header_for, timeout: float, retry=None, size=0) -> tuple:
        """Ask ``holders`` in turn (see :class:`DataRequest`): ``(Done, answer)`` or ``(Failed, None)``.
        ``size``: the bytes the request moves, when known (a large one waits for its session first)."""
        silence = max(self.client.ping_timeout, 1.0)
        req = DataRequest(holders, timeout=timeout, silence=silence, new_id=new_id, retry=retry)
        return await self._requests.run(req, self._pipes.links_for(self, size), header_for)

    async def request(self, address: str, header: dict, buffers: list = (), timeout: float = 30.0):
        """Send to the SeD at ``address`` and wait for its answer, pinging it
        meanwhile: silent for ``ping_timeout``, it is lost (CommunicationError);
        an error answer is raised."""
        def header_for(send):
            self.bytes_sent += sum(len(b) for b in buffers)
            return {**header, "id": send.id}, buffers
        end, answer = await self._walk([(address, address)], header_for, timeout,
                                       size=sum(map(frame_size, buffers)))
        if type(end) is Failed:
            if end.error is not None:
                raise error_from_wire(end.error)
            raise CommunicationError(f"{address} {end.given_up[-1].why}")
        _mt, h, frames = answer
        return h, frames

    def _timeout(self, timeout):
        return timeout if timeout is not None else (self.client.timeout or 60.0)

    async def choose(self, *, server=None, service: str | None = None, exclude=()) -> list[ServerInfo]:
        """SeDs for new data, best first: a named one, one offering ``service``
        (discovery), else the tree's SeDs holding the fewest bytes."""
        c = self.client
        if isinstance(server, ServerInfo):
            return [server]
        if isinstance(server, str):
            return [await c.resolve(server)]
        if service is not None:
            return [s for s in await c.discover(service, 10) if s.name not in exclude]
        elements = await c.tree()
        seds = [e for e in elements if e.get("kind") == "sed" and e.get("state", "alive") == "alive"
                and e.get("address") and e.get("name") not in exclude]
        random.shuffle(seds)
        seds.sort(key=lambda e: (e.get("load") or {}).get("data_bytes") or 0)
        if not seds:
            raise NoServerAvailable("no SeD in the tree to hold data")
        return [ServerInfo(name=e["name"], address=e["address"]) for e in seds]

    async def put(self, value, *, server=None, service=None, mode: Any = "persistent",
                  timeout: float | None = None) -> DataRef:
        mode = parse_mode(mode)
        buffers: list = []
        tree = codec.encode(value, buffers, read_file)
        target = (await self.choose(server=server, service=service))[0]
        ref = "r" + new_id()
        h = m.make(MsgType.DATA_PUT, new_id(), ref=ref, sed=target.name, user=self.client.user, mode=mode.value,
                   value=tree)
        hh, _ = await self.request(target.address, h, buffers, self._timeout(timeout))
        return DataRef(self.client, {"id": ref, "holder": hh.get("holder") or target.name,
                                     "address": target.address, "size": hh.get("size", 0), "mode": mode.value})

    async def get(self, ref: DataRef, timeout: float | None = None):
        """The value from its holder, else a replica: a holder lost or that
        lost the value gives way to the next; DataLost when none has it."""
        t = self._timeout(timeout)
        call = bool(ref._desc.get("call"))

        def header_for(send):
            return m.make(MsgType.DATA_GET, send.id, ref=ref.id, user=self.client.user, wait=t, call=call), ()
        end, answer = await self._walk(ref.holders(), header_for, t + 1.0, _next_holder_on,
                                       size=ref.size)
        if type(end) is Failed:
            if end.error is not None:
                raise error_from_wire(end.error)
            reasons = [g.error.get("message", "") if g.error is not None else
                       f"data reference {ref.id} is unreachable: its holder {g.name} is lost? ({g.address} {g.why})"
                       for g in end.given_up]
            raise DataLost(reasons[0] if len(reasons) == 1 else f"data reference {ref.id}: " + "; ".join(reasons))
        _mt, hh, frames = answer
        self.bytes_received += sum(len(f.buffer) for f in frames)
        return codec.decode(hh.get("value"), [f.buffer for f in frames], self.client.sink)

    async def free(self, ref: DataRef) -> None:
        errors = []
        for name, address in ref.holders():
            try:
                await self.request(address, m.make(MsgType.DATA_FREE, new_id(), ref=ref.id, user=self.client.user),
                                   timeout=self.client.ack_timeout * 2)
            except DataAccessDenied:
                raise
            except (CommunicationError, DataLost) as exc:
                errors.append(exc)
        ref._value = _MISSING

    async def replicate(self, ref: DataRef, n: int) -> None:
        if ref.mode == "sticky":
            raise DataError(f"data reference {ref.id} is sticky: it is never moved nor replicated")
        have = ref.holders()
        want = int(n) - len(have)
        if want <= 0:
            return
        names = {h[0] for h in have}
        candidates = await self.choose(exclude=names)
        # the size lets the new holder open a bulk session before fetching a large value
        src = {"name": ref.holder, "address": ref.address, "size": ref.size}
        for s in candidates:
            if want <= 0:
                break
            h = m.make(MsgType.DATA_PUT, new_id(), ref=ref.id, sed=s.name, user=self.client.user, mode=ref.mode,
                       source=src)
            try:
                await self.request(s.address, h, timeout=self._timeout(None))
            except (CommunicationError, DataLost):
                continue
            ref._desc["replicas"] = [*ref._desc.get("replicas", []), [s.name, s.address]]
            want -= 1
        if want > 0:
            raise NoServerAvailable(f"data reference {ref.id}: only {int(n) - want} of {n} copies could be made")


def _next_holder_on(error: dict) -> bool:
    """A holder's error answer after which ``get`` asks the next holder: it is lost or lost the value."""
    return isinstance(error_from_wire(error), (CommunicationError, DataLost))


# -- arguments ----------------------------------------------------------------------------------
def _has_data(v: Any, depth: int = 0) -> bool:
    t = type(v)
    if t is Call or t is DataRef or t is RefTag:
        return True
    if depth < 2 and (t is list or t is tuple) and len(v) <= 256:
        return any(_has_data(x, depth + 1) for x in v)
    if depth < 2 and t is dict and len(v) <= 256:
        return any(_has_data(x, depth + 1) for x in v.values())
    return False


def has_data(args: tuple, kwargs: dict) -> bool:
    return any(_has_data(a) for a in args) or any(_has_data(a) for a in kwargs.values())


async def _arg_of(client: "AsyncClient", v: Any, refs: list) -> Any:
    t = type(v)
    if t is DataRef or t is RefTag:
        refs.append(v)
        return v
    if t is Call:
        while v.server is None and not v.done():       # its server is known once dispatched
            await asyncio.sleep(0.002)
        if v.server == "" and not v.done():
            # a server known by address only has no name a reference could give as its holder:
            # the value is passed, once the call is done
            await asyncio.wait([v._task])
        if v.done():
            # read from the finished task itself: the thread-side future (v._future()) is completed
            # by a loop callback, and waiting on it here, in the loop, never returned
            ok, value = v._settled()
            if not ok:
                raise DataLost(f"an argument is the call {v.service} ({v.id}), which failed: "
                               f"{type(value).__name__}: {value}") from value
            if type(value) is DataRef:
                refs.append(value)
            return value
        keep = getattr(v, "_keep", None)
        if keep is not None:
            tag = RefTag({"__t": "ref", "id": keep["ref"], "holder": v.server, "address": v.address, "size": 0,
                          "mode": keep["mode"], "replicas": []})
        else:
            tag = RefTag({"__t": "ref", "id": v.id, "holder": v.server, "address": v.address, "size": 0,
                          "mode": "volatile", "replicas": [], "call": True})
        refs.append(tag)
        return tag
    if t is list or t is tuple:
        out = [await _arg_of(client, x, refs) for x in v]
        return out if t is list else tuple(out)
    if t is dict:
        return {k: await _arg_of(client, x, refs) for k, x in v.items()}
    return v


async def prepare_args(client: "AsyncClient", args: tuple, kwargs: dict) -> tuple[tuple, dict, list]:
    """Pending calls among the arguments become references (once their server
    is known); returns the arguments and the references they hold."""
    refs: list = []
    new_args = tuple([await _arg_of(client, a, refs) for a in args])
    new_kwargs = {k: await _arg_of(client, v, refs) for k, v in kwargs.items()}
    return new_args, new_kwargs, refs


def sticky_holder(refs: list) -> ServerInfo | None:
    """Where a call must run: the holder of a sticky reference among its arguments."""
    for r in refs:
        d = r.__gridrpc_ref__()
        if d.get("mode") == "sticky":
            return ServerInfo(name=d["holder"], address=d.get("address") or "")
    return None


def to_ref(client: "AsyncClient", value: Any) -> Any:
    """The result of a call that kept it: a :class:`DataRef`."""
    if type(value) is RefTag:
        return DataRef(client, value.desc, value.value if value.has_value else _MISSING)
    return value
