"""What every simulated element shares (:mod:`gridrpc.sim.elements`): a
process on a simulated host whose received messages are jobs, each charged
``msg[kind] * (1 + messages sent) + item[kind] * (items received and sent)``
of CPU time, plus ``wakeup[kind]`` when the process was idle (the engine:
:mod:`gridrpc.sim.engine`; the calibration: :mod:`gridrpc.sim.model`), and
the rough wire size of a header."""
from __future__ import annotations

import collections
from typing import Callable

from .engine import Host, IoProc, Proc

__all__ = ["Node", "Out", "items", "size"]


#: the list fields of a header counted as its items
ITEM_FIELDS = ("servers", "names", "elements", "entries", "fresh", "gone")
#: bytes on the wire per entry of a list field (measured orjson sizes of typical headers; entries: pushed
#: snapshots), on top of HEADER_BYTES
_FIELD_BYTES = (("servers", 330), ("names", 12), ("elements", 260), ("entries", 330), ("fresh", 12), ("gone", 12))
HEADER_BYTES = 140


def items(h: dict) -> int:
    """Items in a header: its servers, names, elements, entries, fresh and gone."""
    get = h.get
    n = 0
    for k in ITEM_FIELDS:           # a plain loop: as fast as the unrolled form (timeit)
        v = get(k)
        if v:
            n += len(v)
    return n


def size(h: dict) -> int:
    """Bytes on the wire, roughly."""
    get = h.get
    n = HEADER_BYTES
    for k, per in _FIELD_BYTES:
        v = get(k)
        if v:
            n += per * len(v)
    return n


class Out:
    """What one job does when its CPU time is spent: send messages."""
    __slots__ = ("node", "sends", "cost", "after", "items")

    def __init__(self, node: "Node") -> None:
        self.node = node
        self.sends: list = []
        self.cost = 0.0
        self.after: list = []
        self.items = 0              # items handled that are in no message (a view answer's ranked candidates)

    def send(self, src: bytes, dst: bytes, header: dict) -> None:
        self.sends.append((src, dst, header))

    def complete(self) -> None:
        if self.sends:
            self.node.world.transmit_all(self.node, self.sends)
        for fn in self.after:
            fn()


class Node:
    kind = "?"

    def __init__(self, world, name: str, host: Host, kind: str | None = None) -> None:
        self.world = world
        self.name = name
        self.kind = kind or self.kind
        self.proc = Proc(host, name, self.kind, world.costs.wake(self.kind), world.costs.wake_tail)
        self.proc.element = True
        host.add_element()
        share = world.costs.io_share
        if share > 0.0 and self.kind != "worker":
            self.proc.io = IoProc(host, name + "-io")
            self.proc.io_share = share
        self.inbound: collections.Counter = collections.Counter()
        self.n_msgs = 0             # messages received and sent (what the calibration fits against)
        self.n_items = 0

    def deliver(self, src: bytes, dst: bytes, h: dict) -> None:
        t = h["type"]
        self.inbound[t] += 1
        self.world.inbound[self.name][t] += 1          # World.note_inbound, inlined
        self.proc.submit(self._job, src, dst, h)

    def _job(self, src, dst, h) -> Out:
        out = Out(self)
        self.handle(src, dst, h, out)
        self.charge(out, items(h))
        return out

    def charge(self, out: Out, n_items: int) -> None:
        c = self.world.costs
        k = self.kind
        sends = out.sends
        nm = (1 if n_items >= 0 else 0) + len(sends)
        sent = 0
        for s in sends:
            sent += items(s[2])
        ni = max(n_items, 0) + sent + out.items
        self.n_msgs += nm
        self.n_items += ni
        out.cost += c.msgs.get(k, 0.0) * nm + c.items.get(k, 0.0) * ni      # c.msg(k), c.item(k)

    def handle(self, src, dst, h, out: Out) -> None:    # pragma: no cover - overridden
        raise NotImplementedError

    def local(self, fn: Callable, *args) -> None:
        """Run ``fn(out, *args)`` as a job of this process (a timer, a tick)."""
        def job():
            out = Out(self)
            fn(out, *args)
            self.charge(out, -1)        # a timer: no message received
            return out
        self.proc.submit(job)
