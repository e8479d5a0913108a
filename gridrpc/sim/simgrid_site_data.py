"""The data workload of the SimGrid sites (:mod:`gridrpc.sim.simgrid_sites`):
:class:`DataSedNode`, a SeD process that keeps results by reference (the
real :class:`gridrpc.core.datastore.DataStore`) and fetches the references
a call reads from their holders (DATA_GET, then DATA carrying the bytes),
and :class:`DataUser`, a user looping ``produce`` (its result kept on the
SeD) then ``solve`` on that reference (:data:`SITE_SERVICES`).
"""
from __future__ import annotations

from ..core.client_call import machine as cm
from ..core import messages as m
from ..core.datastore import DataError, DataStore, Mode
from ..core.messages import MsgType
from ..core.sed_calls import CallState
from .client_node import ClientNode, User
from .model import NOOP, ServiceModel
from .node import Out
from .sed_node import SedNode

__all__ = ["DataSedNode", "DataUser", "SITE_SERVICES"]

#: the services of the workflow: ``produce`` keeps its result, ``solve`` reads it (CPU-bound, seconds)
SITE_SERVICES = {"produce": ServiceModel(mean=0.02), "solve": ServiceModel(mean=0.05), "noop": NOOP}


class DataSedNode(SedNode):
    """A SeD process that keeps results by reference (its ``DataStore``) and
    fetches the references a call reads from their holders before running it."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.store = DataStore(memory_bytes=1 << 40)
        self.keep: dict[str, tuple[int, str]] = {}      # call id -> (bytes to keep, owner)
        self.reads: dict[str, list] = {}                # call id -> [(reference, holder)] it reads
        self.waiting: dict[str, list] = {}              # reference being fetched -> calls waiting for it
        self.asked_at: dict[str, float] = {}

    def handle(self, src, dst, h, out: Out) -> None:
        t = h["type"]
        if t == "data_get":
            self._on_get(src, dst, h, out)
            return
        if t == "data":
            self._on_data(h)
            return
        if t == "call" and h["id"] not in self.calls.live:
            if isinstance(h.get("keep"), (int, float)):
                self.keep[h["id"]] = (int(h["keep"]), h.get("user") or "anonymous")
            refs = [(r["ref"], r["holder"]) for r in h.get("refs") or ()
                    if isinstance(r, dict) and isinstance(r.get("ref"), str) and isinstance(r.get("holder"), str)]
            if refs:
                self.reads[h["id"]] = refs
        super().handle(src, dst, h, out)

    def _on_get(self, src, dst, h, out: Out) -> None:
        try:
            e = self.store.check(h["ref"], h.get("user"))
        except DataError as exc:
            out.send(dst, src, m.error_header(h["id"], "data_lost", str(exc)))
            return
        self.store.touch(h["ref"], self.world.sim.now)
        out.send(dst, src, m.make(MsgType.DATA, h["id"], ref=h["ref"], holder=dst.decode(), size=e.size,
                                  mode=e.mode.value, owner=e.owner))

    def _on_data(self, h: dict) -> None:
        ref, now = h["ref"], self.world.sim.now
        self.store.add(ref, h.get("owner") or "anonymous", Mode.VOLATILE, int(h.get("size") or 0), now)
        self.world.note_transfer(self, h, now - self.asked_at.pop(ref, now))
        for call in self.waiting.pop(ref, ()):
            call.missing.discard(ref)
            if not call.missing and call.state is CallState.RUNNING:
                SedNode._run(self, call, now)

    def _run(self, call, now: float) -> None:
        reads = self.reads.get(call.id, ())
        missing = {ref for ref, _ in reads if ref not in self.store}
        if not missing:
            super()._run(call, now)
            return
        call.missing = missing              # type: ignore[attr-defined]
        for ref, holder in reads:
            if ref not in missing:
                continue
            calls = self.waiting.setdefault(ref, [])
            if not calls:
                self.asked_at[ref] = now
                self.world.transmit(self, self.by_name[call.sed].route, holder.encode(), m.make(
                    MsgType.DATA_GET, f"{call.id}:{ref}", ref=ref, user=call.user, call=call.id))
            calls.append(call)

    def _finished(self, out: Out, call, gen: int, duration: float) -> None:
        n = len(out.sends)
        super()._finished(out, call, gen, duration)
        now = self.world.sim.now
        kept = self.keep.pop(call.id, None)
        for _, _, h in out.sends[n:]:
            if kept is not None and h["type"] == "result" and h["id"] == call.id:
                size, owner = kept
                self.store.add(call.id, owner, Mode.PERSISTENT, size, now)
                h["value"] = {"ref": call.id, "holder": call.sed, "size": size}
        for ref, _ in self.reads.pop(call.id, ()):
            self.store.used_once(ref, now)


class _CallFields:
    """An :class:`~gridrpc.sim.node.Out` that adds ``fields`` to the CALL messages sent through it."""
    __slots__ = ("out", "fields")

    def __init__(self, out: Out, fields: dict) -> None:
        self.out, self.fields = out, fields

    def send(self, src: bytes, dst: bytes, header: dict) -> None:
        if header.get("type") == "call":
            header.update(self.fields)
        self.out.send(src, dst, header)


class DataUser(User):
    """A user looping ``produce`` (its result kept on the SeD: ``keep`` bytes)
    then ``solve`` on that reference."""

    def __init__(self, client: ClientNode, uid: str, *, data_size: int, k: int = 3, user: str) -> None:
        super().__init__(client, uid, service="produce", k=k, call=True, calls=None, think=None, user=user)
        self.data_size = int(data_size)
        self.ref: dict | None = None

    def _do(self, actions: list, out: Out) -> None:
        for a in actions:
            if type(a) is cm.Done and self.service == "produce" and isinstance(a.value, dict):
                self.ref = a.value
        fields = {"keep": self.data_size} if self.service == "produce" else {"refs": [self.ref] if self.ref else []}
        super()._do(actions, _CallFields(out, fields))

    def next_round(self, out: Out) -> None:
        if self.service == "produce" and self.ref is not None:
            self.service = "solve"
        else:
            self.service, self.ref = "produce", None
        super().next_round(out)
