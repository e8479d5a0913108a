"""The discrete-event engine: a heap of events on a virtual clock, hosts with
cores, processes that queue for them, and links with latency and bandwidth.

Nothing here knows about gridrpc's protocol: the elements
(:mod:`gridrpc.sim.elements`) drive the real core objects and ask the engine
to charge CPU time and to carry messages.

CPU model: a :class:`Proc` (an OS process: an agent, a SeD process, a
client, a worker) runs one job at a time, in arrival order; a job needs one
of its :class:`Host`'s cores for ``cost`` seconds; a host serves the
processes waiting for a core in turn (round robin: a process keeps its core
for its queued jobs for up to the host's ``time_slice``, then the next one
gets it), so a saturated MA shows as a growing queue in front of its process
and two busy processes on a one-core host slow each other down.

Wake-ups: a process that was *idle* (no job queued or running) when a job
arrives pays ``wakeup`` seconds of CPU on top of that job (the event loop
returns from poll, the scheduler switches it in); every job that arrives
while it is busy -- running, or waiting for a core -- is drained in the same
busy period without that charge. A daemon under load drains its messages in
batches; a daemon answering one discovery at a time pays the wake-up on
every message. ``wake_tail`` of the wake-up is spent after the job's
messages left (the event loop going back to poll): it holds the core but is
not on the messages' path.

Crowding: the CPU of an element process's job (wake-up included) is
multiplied by ``max(1, element processes on the host / cores) **
crowding``: per message a process costs more when many share the cores.
"""
from __future__ import annotations

import collections
import heapq
import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable


class Sim:
    """The clock and the events. ``at(t, fn, *args)`` runs ``fn(*args)``
    at virtual time ``t``; equal times run in scheduling order (deterministic).

    The events are in two heaps: those due within ``HORIZON`` of the time
    they were scheduled at (messages, the ends of jobs) and the later ones
    (timers: heartbeats, deadlines, users' think times). Every event has a
    unique key (time, sequence number) and the smaller of the two heads is
    run next: the order is that of one heap, but the pops and pushes of
    messages and jobs do not walk the levels of every timer of a large
    tree (~5 % of the CPU of a 10,000-SeD fan-out)."""

    HORIZON = 1e-3

    def __init__(self, seed: int = 0) -> None:
        self.now = 0.0
        self.rng = random.Random(seed)
        self._heap: list = []           # events due within HORIZON of their scheduling
        self._far: list = []            # the others
        self._seq = 0
        self.events = 0

    def at(self, t: float, fn: Callable, *args: Any) -> None:
        self._seq += 1
        now = self.now
        if t > now + self.HORIZON:
            heapq.heappush(self._far, (t, self._seq, fn, args))
        else:
            heapq.heappush(self._heap, (t if t > now else now, self._seq, fn, args))

    def after(self, dt: float, fn: Callable, *args: Any) -> None:
        self.at(self.now + dt, fn, *args)

    def run(self, until: float | None = None, stop: Callable[[], bool] | None = None,
            max_events: int | None = None) -> None:
        heap, far = self._heap, self._far
        pop = heapq.heappop
        n = 0
        limit = until if until is not None else math.inf
        if stop is None and max_events is None:
            # the common case (every run of gridrpc sim scale): pop first, put the one past
            # ``until`` back where it was (the keys (t, seq) are unique: the order of the pops is the same)
            while True:
                src = far if far and (not heap or far[0] < heap[0]) else heap
                if not src:
                    break
                ev = pop(src)
                t = ev[0]
                if t > limit:
                    heapq.heappush(src, ev)
                    self.now = until
                    break
                self.now = t
                ev[2](*ev[3])
                n += 1
            self.events += n
            return
        while heap or far:
            src = far if far and (not heap or far[0] < heap[0]) else heap
            t = src[0][0]
            if t > limit:
                self.now = until
                break
            _, _, fn, args = pop(src)
            self.now = t
            fn(*args)
            n += 1
            if stop is not None and (n & 63) == 0 and stop():
                break
            if max_events is not None and n >= max_events:
                break
        self.events += n


class Host:
    """A machine: ``cores`` cores shared by its processes; ``speed`` scales
    every job's cost (1.0: the calibration host; 0.5: twice as slow);
    ``time_slice``: how long a process keeps its core for its queued jobs
    while others wait (0: one job, then the next process in turn)."""

    def __init__(self, sim: Sim, name: str, cores: int = 1, speed: float = 1.0,
                 time_slice: float = 0.0, crowding: float = 0.0) -> None:
        if cores < 1 or not speed > 0.0 or not time_slice >= 0.0 or not crowding >= 0.0:
            raise ValueError(f"host {name!r}: cores >= 1, speed > 0, time_slice >= 0 and crowding >= 0 "
                             f"(got {cores}, {speed}, {time_slice}, {crowding})")
        self.sim, self.name, self.cores, self.speed = sim, name, cores, speed
        self.time_slice = time_slice
        self.crowding = crowding
        self.elements = 0               # element processes (agents, SeD processes, clients) placed here
        self.factor = 1.0               # their CPU costs x max(1, elements per core) ** crowding
        self.free = cores
        self.ready: collections.deque[Proc] = collections.deque()
        self.busy_time = 0.0

    def add_element(self) -> None:
        """One more element process here: every element's CPU per job grows
        with the processes per core (context switches, cold caches)."""
        self.elements += 1
        self.factor = max(1.0, self.elements / self.cores) ** self.crowding

    def _want(self, proc: "Proc") -> None:
        if self.free > 0:
            self.free -= 1
            proc.slice_start = self.sim.now
            proc._run_next()
        else:
            self.ready.append(proc)

    def _release(self, proc: "Proc") -> None:
        """``proc`` finished a job: it goes on with its next job if nobody
        waits or its time slice is not used up; else the core goes to the
        next process in turn."""
        if proc.jobs and (not self.ready or self.sim.now - proc.slice_start < self.time_slice):
            proc._run_next()
        elif self.ready:
            nxt = self.ready.popleft()
            if proc.jobs:
                self.ready.append(proc)
            else:
                proc.running = False
            nxt.slice_start = self.sim.now
            nxt._run_next()
        else:
            proc.running = False
            self.free += 1


class Proc:
    """An OS process on a host: jobs run one at a time, in arrival order.
    ``submit(fn, *args)`` runs ``fn(*args)`` when the job *starts* (so the
    handler sees the time the process got to the message); ``fn`` returns
    None or an object with ``cost`` (CPU seconds) and ``complete()``, called
    when that CPU time is spent (e.g. the messages leave then; with a
    ``wake_tail``, that part of the wake-up is spent after ``complete()``).
    ``wakeup``: CPU seconds added to the first job after the process was idle."""

    def __init__(self, host: Host, name: str, kind: str, wakeup: float = 0.0, wake_tail: float = 0.0) -> None:
        if not wakeup >= 0.0:
            raise ValueError(f"wake-up cost must be >= 0 seconds, not {wakeup!r}")
        if not 0.0 <= wake_tail <= 1.0:
            raise ValueError(f"wake_tail is a share in [0, 1], not {wake_tail!r}")
        self.host, self.name, self.kind = host, name, kind
        self.sim = host.sim
        self.jobs: collections.deque = collections.deque()
        self.running = False
        self.busy_time = 0.0
        self.jobs_done = 0
        self.wakeup = wakeup                # CPU seconds charged when an idle process gets a job
        self.wake_tail = wake_tail          # share of the wake-up spent after the job's messages left
        self.wakeups = 0                    # idle -> busy transitions so far
        self._woken = False                 # the next job to start pays the wake-up
        self.slice_start = 0.0              # when it last got a core
        self.element = False                # its costs grow with the host's crowding (Host.add_element)
        self.io: Proc | None = None         # a helper thread taking ``io_share`` of every job (zmq's I/O thread)
        self.io_share = 0.0

    def submit(self, fn: Callable, *args: Any) -> None:
        self.jobs.append((fn, args))
        if not self.running:
            self.running = True
            self._woken = True
            self.wakeups += 1
            self.host._want(self)

    def add(self, cost: float) -> None:
        """A job of ``cost`` CPU seconds with nothing to do at its end (an
        element's I/O thread's share: :class:`IoProc` does it without the job object)."""
        self.submit(FixedJob, cost)

    def _run_next(self) -> None:
        fn, args = self.jobs.popleft()
        out = fn(*args)                      # the handler runs at the start of its job
        cost = (out.cost if out is not None else 0.0)
        tail = 0.0
        if self._woken:
            self._woken = False
            cost += self.wakeup
            tail = self.wakeup * self.wake_tail
        host = self.host
        if self.element:
            f = host.factor
            if f != 1.0:                     # x * 1.0 is x: skipped
                cost *= f
                tail *= f
        io = self.io
        if io is not None and cost > 0.0:
            side = cost * self.io_share
            cost -= side
            if cost < tail:
                tail = cost
            io.add(side)
        cost = self._charge(cost)
        speed = host.speed
        sim = self.sim
        now = sim.now
        heap = sim._heap
        # sim.after(...), inlined: the same times and sequence numbers
        seq = sim._seq
        if tail > 0.0:                       # the messages leave before the end of the wake-up's CPU
            t = now + (cost - (tail / speed if speed != 1.0 else tail))
            heapq.heappush(heap, (t if t > now else now, seq + 1, _complete, (out,)))
            t = now + cost
            heapq.heappush(heap, (t if t > now else now, seq + 2, self._finished, (None,)))
            sim._seq = seq + 2
        else:
            t = now + cost
            sim._seq = seq + 1
            heapq.heappush(heap, (t if t > now else now, seq + 1, self._finished, (out,)))

    def _charge(self, cost: float) -> float:
        """``cost`` CPU seconds of work, in seconds on this host's cores
        (its ``speed``), counted as this process's and the host's busy time."""
        host = self.host
        speed = host.speed
        if speed != 1.0:                     # x / 1.0 is x: skipped
            cost /= speed
        self.busy_time += cost
        host.busy_time += cost
        self.jobs_done += 1
        return cost

    def _finished(self, out: Any) -> None:
        if out is not None:
            done = getattr(out, "complete", None)
            if callable(done):
                done()
        self.host._release(self)


def _complete(out: Any) -> None:
    if out is not None and callable(getattr(out, "complete", None)):
        out.complete()


class FixedJob:
    """A job of a fixed cost with nothing to do at its end (an I/O thread's share, a process's
    background share)."""
    __slots__ = ("cost",)

    def __init__(self, cost: float) -> None:
        self.cost = cost

    def complete(self) -> None:
        pass


class IoProc(Proc):
    """An element's I/O thread (``Proc.io``): its jobs are fixed CPU times
    (``add``), with no wake-up cost and nothing to do at their end. What a
    :class:`Proc` does with a ``FixedJob``, without the job objects: the
    same times, sequence numbers and counters (a simulation's events are
    the same, one for the end of each job)."""

    def __init__(self, host: Host, name: str, kind: str = "io") -> None:
        super().__init__(host, name, kind, 0.0, 0.0)

    def add(self, cost: float) -> None:
        """``submit(FixedJob, cost)``."""
        self.jobs.append(cost)
        if not self.running:
            self.running = True
            self.wakeups += 1
            self.host._want(self)

    def submit(self, fn: Callable, *args: Any) -> None:      # pragma: no cover - not used
        raise TypeError("an I/O thread takes fixed costs: IoProc.add(seconds)")

    def _run_next(self) -> None:
        cost = self.jobs.popleft()
        # Proc._run_next with a FixedJob: no wake-up cost (+ 0.0 is exact), not an element, no io
        self._woken = False
        cost = self._charge(cost)
        sim = self.sim
        now = sim.now
        t = now + cost
        sim._seq += 1
        heapq.heappush(sim._heap, (t if t > now else now, sim._seq, self.host._release, (self,)))


@dataclass(slots=True)
class Link:
    """One direction between two hosts: latency, bandwidth (bytes/s), and
    the time its wire is busy until (messages serialise one after another)."""
    latency: float
    bandwidth: float
    busy_until: float = 0.0


@dataclass
class Network:
    """Links between hosts: ``local`` for two processes of one host
    (loopback, wake-up of the receiver), ``lan`` between hosts."""
    sim: Sim
    local_latency: float = 60e-6
    lan_latency: float = 100e-6
    local_bandwidth: float = 2.0e9
    lan_bandwidth: float = 1.25e8          # 1 Gb/s
    links: dict = field(default_factory=dict)
    messages: int = 0
    bytes: int = 0
    _from: dict = field(default_factory=dict, repr=False)     # src Host -> {dst Host: Link} (links_from)

    def link(self, src: Host, dst: Host) -> Link:
        """The link from ``src`` to ``dst`` (made at its first message)."""
        key = (src.name, dst.name)
        link = self.links.get(key)
        if link is None:
            same = src is dst
            link = self.links[key] = Link(self.local_latency if same else self.lan_latency,
                                          self.local_bandwidth if same else self.lan_bandwidth)
        return link

    def links_from(self, src: Host) -> dict:
        """A cache of ``src``'s links by destination :class:`Host` (for a
        sender of many messages, World.transmit_all): the caller fills it
        with :meth:`link`'s."""
        d = self._from.get(src)
        if d is None:
            d = self._from[src] = {}
        return d

    def delay(self, src: Host, dst: Host, size: int) -> float:
        link = self.link(src, dst)
        now = self.sim.now
        start = link.busy_until if link.busy_until > now else now
        link.busy_until = start + size / link.bandwidth
        self.messages += 1
        self.bytes += size
        return link.busy_until - now + link.latency
