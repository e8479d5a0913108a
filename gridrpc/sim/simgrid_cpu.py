"""The hosts and CPUs of the SimGrid engine (:mod:`gridrpc.sim.simgrid_engine`):
:class:`SgHost` is a platform host as the elements see a
:class:`~gridrpc.sim.engine.Host` (its postman actor sends the messages of
timers), and :class:`ProcActor` the actor of one process, running its jobs
in arrival order with their CPU costs as SimGrid executions. A host's cores
are handed out as the built-in engine does (``slice``: a process waits for
a core and keeps it for its queued jobs up to the costs' time slice) or
shared by SimGrid's CPU model (``fair``). A job of ``cost`` seconds on the
calibration host is ``cost * REF_FLOPS`` flops.
"""
from __future__ import annotations

import collections
from typing import TYPE_CHECKING

from .engine import Host, IoProc, Proc
from .simgrid_clock import SgClock

if TYPE_CHECKING:
    from .simgrid_engine import SgWorld

__all__ = ["CPU_SHARING", "REF_FLOPS", "SgHost", "ProcActor"]

#: flops per second of one core of the calibration host (the costs' unit: CPU seconds there)
REF_FLOPS = 1e9
#: how a host's cores are shared: ``slice`` as the built-in engine (a process waits for a core, keeps it
#: for its queued jobs up to the costs' time slice, then the next waiting process gets it; the costs were
#: fitted with it), ``fair`` SimGrid's own CPU model (every running execution gets an equal share)
CPU_SHARING = ("slice", "fair")


class SgHost(Host):
    """A platform host as the elements see a :class:`~gridrpc.sim.engine.Host`
    (``name``, ``cores``, ``speed`` relative to :data:`REF_FLOPS`, busy time,
    crowding); its processes' jobs are run by :class:`ProcActor` s."""

    def __init__(self, clock: SgClock, sg_host, *, time_slice: float = 0.0, crowding: float = 0.0,
                 cpu: str = "slice") -> None:
        super().__init__(clock, sg_host.name, sg_host.core_count, sg_host.speed / REF_FLOPS, time_slice, crowding)
        self.sg_host = sg_host
        if cpu not in CPU_SHARING:
            raise ValueError(f"cpu sharing is one of {', '.join(CPU_SHARING)}, not {cpu!r}")
        # "slice": a process holds a core (a token of this semaphore) for its queued jobs up to the time slice
        self.cores_sem = clock.sg.Semaphore(self.cores) if cpu == "slice" else None
        self.waiting = 0                    # processes waiting for a core
        self.local_busy = 0.0               # the local link is busy until then (SgWorld.put_all)
        self.actors: dict[int, ProcActor] = {}
        self.outbox: collections.deque = collections.deque()     # messages sent outside a job (timers)
        self._post_sem = clock.sg.Semaphore(0)
        self._postman = False

    def _want(self, proc: Proc) -> None:
        """``proc`` has a job and was idle (``Proc.submit``): its actor runs it."""
        a = self.actors.get(id(proc))
        if a is None:
            a = self.actors[id(proc)] = ProcActor(self, proc)
            self.sim.sg.Actor.create(proc.name, self.sg_host, self.sim.guard, a.loop)
        else:
            self.sim.wake(a.sem)

    def post(self, world: "SgWorld", node, sends: list) -> None:
        """Send ``sends`` from this host outside any job of ``node`` (a timer's
        message: a registration, a held ACCEPTED): a postman actor of the host puts them."""
        self.outbox.append((node, sends))
        if not self._postman:
            self._postman = True
            self.sim.sg.Actor.create(f"postman-{self.name}", self.sg_host, self.sim.guard, self._post_loop, world)
        else:
            self.sim.wake(self._post_sem)

    def _post_loop(self, world: "SgWorld") -> None:
        while True:
            while self.outbox:
                node, sends = self.outbox.popleft()
                world.put_all(node, sends)
            self._post_sem.acquire()


class ProcActor:
    """The actor of one process: its jobs in arrival order, the handler when
    the job starts, the CPU as a SimGrid execution, then the job's
    ``complete()`` (its messages leave); the wake-up, its tail, the I/O
    thread's share and crowding as :meth:`gridrpc.sim.engine.Proc._run_next`
    charges them."""

    __slots__ = ("host", "proc", "sem", "seen_wakeups")

    def __init__(self, host: SgHost, proc: Proc) -> None:
        self.host, self.proc = host, proc
        self.sem = host.sim.sg.Semaphore(0)
        self.seen_wakeups = 0

    def loop(self) -> None:
        proc, host = self.proc, self.host
        jobs, sem = proc.jobs, self.sem
        sg = host.sim.sg
        execute = sg.this_actor.execute
        clock = sg.Engine
        cores = host.cores_sem              # None: SimGrid's fair sharing of the cores
        slice_ = host.time_slice
        holding = False
        slice_start = 0.0
        fixed = isinstance(proc, IoProc)        # jobs are CPU seconds, not (fn, args)
        clock_obj = host.sim
        while True:
            if not jobs:
                if holding:
                    holding = False
                    cores.release()
                proc.running = False
                sem.acquire()
                continue
            if cores is not None:
                if holding and host.waiting and clock.clock - slice_start >= slice_:
                    holding = False             # the time slice is used up and others wait: next in turn
                    cores.release()
                if not holding:
                    host.waiting += 1
                    cores.acquire()
                    host.waiting -= 1
                    holding = True
                    slice_start = clock.clock
            item = jobs.popleft()
            clock_obj.events += 1
            if fixed:
                out, cost = None, item
            else:
                fn, args = item
                out = fn(*args)                 # the handler runs at the start of its job
                cost = out.cost if out is not None else 0.0
            tail = 0.0
            if proc.wakeups != self.seen_wakeups:       # the first job since the process was idle
                self.seen_wakeups = proc.wakeups
                cost += proc.wakeup
                tail = proc.wakeup * proc.wake_tail
            if proc.element:
                f = host.factor
                cost *= f
                tail *= f
            io = proc.io
            if io is not None and cost > 0.0:
                side = cost * proc.io_share
                cost -= side
                tail = min(tail, cost)
                io.add(side)
            secs = cost / host.speed
            proc.busy_time += secs
            host.busy_time += secs
            proc.jobs_done += 1
            head = cost - tail
            if head > 0.0:
                execute(head * REF_FLOPS)
            if out is not None:
                done = getattr(out, "complete", None)
                if done is not None:
                    done()
            if tail > 0.0:
                execute(tail * REF_FLOPS)
