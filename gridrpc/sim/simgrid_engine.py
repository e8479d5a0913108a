"""The SimGrid engine of ``gridrpc sim`` (``--engine simgrid --platform
FILE.xml``): the same simulated elements (:mod:`gridrpc.sim.elements`,
driving the same pure cores) as SimGrid actors, their messages carried by
SimGrid mailboxes over the platform's links and their CPU costs run as
SimGrid executions on the platform's hosts.

What it maps, and onto what:

- :class:`SgWorld` is a :class:`~gridrpc.sim.world.World` whose ``sim`` is a
  :class:`SgClock` (``now`` is SimGrid's clock; ``at``/``after`` timers run
  by one timer actor) and whose hosts are :class:`SgHost` s, one per
  platform host (``core`` and ``speed`` from the platform file). The
  elements are built and measured by World's own code (``build``,
  ``client``, the workloads, ``summary``): the metrics are the built-in
  engine's.
- A process (:class:`~gridrpc.sim.engine.Proc`: an agent, a SeD process, a
  worker, a client, an I/O thread) is one actor (:class:`ProcActor`): it
  runs the process's jobs in arrival order, each job's handler when the job
  starts and its CPU cost as ``this_actor.execute`` on its host, then the
  job's messages leave. The wake-up charge, ``wake_tail``, ``io_share`` and
  crowding are applied as in the built-in engine. A host's cores are handed
  out as the built-in engine does (a process waits for a core and keeps it
  for its queued jobs up to the costs' time slice: the costs were fitted
  with it), or with ``cpu="fair"`` shared by SimGrid's CPU model (every
  running execution an equal share of the cores).
- A message is a detached ``Mailbox.put_init(payload, bytes)`` from the
  sender's host into the mailbox of the connection from the sender to the
  receiving element (one per pair that talks, as zmq's TCP connections); a
  receiver actor per connection takes it and queues it as a job of the
  element's process. Its
  route, latency and bandwidth are the platform's; two processes of one
  host talk over SimGrid's loopback, whose latency and bandwidth are set to
  the costs' ``local_latency`` and the built-in engine's local bandwidth.
- CPU units: a job of ``cost`` seconds on the calibration host is
  ``cost * REF_FLOPS`` flops, so a platform host of ``speed="1Gf"`` per
  core is the calibration host's core; ``2Gf`` is twice as fast.

SimGrid's Python actors are threads that SimGrid runs one at a time (its
``thread`` context factory, the one its Python module supports): no asyncio
and no threads of our own are needed, the elements being sans-IO. One
SimGrid engine per process: :func:`run_isolated` runs a simulation in a
forked child and returns its result, so one program can run several.
"""
from __future__ import annotations

import collections
import heapq
import math
import multiprocessing
import os
import random
import traceback
from typing import Any, Callable

from .engine import Host, IoProc, Proc
from .node import size
from .simgrid_loader import load_simgrid
from .world import World

__all__ = ["CPU_SHARING", "REF_FLOPS", "LOCAL_BANDWIDTH", "SgClock", "SgHost", "SgWorld", "ProcActor", "run_isolated",
           "wire_bytes", "DATA_TYPES"]

#: flops per second of one core of the calibration host (the costs' unit: CPU seconds there)
REF_FLOPS = 1e9
#: bytes/s between two processes of one host (SimGrid's loopback), as the built-in engine's ``Network``
LOCAL_BANDWIDTH = 2.0e9
#: the message types whose ``size`` field is a payload on the wire (gridrpc.sed.data's DATA and DATA_PUT)
DATA_TYPES = ("data", "data_put")
#: how long the timer actor waits when no timer is due (a timed wait, not a blocked one: SimGrid
#: would call a run in which every actor waits forever a deadlock)
IDLE_WAIT = 1e7
#: how a host's cores are shared: ``slice`` as the built-in engine (a process waits for a core, keeps it
#: for its queued jobs up to the costs' time slice, then the next waiting process gets it; the costs were
#: fitted with it), ``fair`` SimGrid's own CPU model (every running execution gets an equal share)
CPU_SHARING = ("slice", "fair")
#: the process that made a SimGrid engine (SimGrid allows one per process)
_ENGINE_PID: int | None = None
#: timers due within this of the clock run now (SimGrid's clock after a timed wait is the sum of floats)
EPSILON = 1e-12


def wire_bytes(h: dict) -> int:
    """Bytes a header takes on the wire: :func:`~gridrpc.sim.node.size`, plus
    the payload of a data message (its ``size`` field)."""
    n = size(h)
    if h.get("type") in DATA_TYPES:
        extra = h.get("size")
        if isinstance(extra, (int, float)) and extra > 0:
            n += int(extra)
    return n


class SgClock:
    """``world.sim`` on SimGrid: ``now`` (SimGrid's clock), ``at``/``after``
    (timers, in a heap run by one actor in time order, ties in scheduling
    order), ``rng``, ``events`` and ``run(until, stop)``."""

    #: simulated seconds between two looks at ``run``'s ``stop`` predicate
    STOP_STEP = 0.01

    def __init__(self, sg, engine, seed: int, timer_host) -> None:
        self.sg = sg
        self.engine = engine
        self._engine_cls = sg.Engine
        self.rng = random.Random(seed)
        self.events = 0
        self.inside = False                 # SimGrid is running: the code that runs is an actor's
        self.timer_host = timer_host
        self._timers: list = []
        self._seq = 0
        self._sem = sg.Semaphore(0)
        self._waiting_until: float | None = None
        self.error: str | None = None       # the first exception raised in an actor (raised again by run)
        sg.Actor.create("timers", timer_host, self.guard, self._timer_loop)

    @property
    def now(self) -> float:
        return self._engine_cls.clock

    def at(self, t: float, fn: Callable, *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._timers, (t, self._seq, fn, args))
        w = self._waiting_until
        if w is not None and t < w:
            self._waiting_until = None      # one wake-up is enough
            self.wake(self._sem)

    def after(self, dt: float, fn: Callable, *args: Any) -> None:
        self.at(self.now + dt, fn, *args)

    def wake(self, sem) -> None:
        """Release ``sem``: from an actor directly; from outside SimGrid's run
        (between two ``run`` calls) by a one-shot actor, since only actors
        may act on SimGrid's objects."""
        if self.inside:
            sem.release()
        else:
            self.sg.Actor.create("wake", self.timer_host, self.guard, sem.release)

    def guard(self, fn: Callable, *args: Any) -> None:
        """An actor's body: ``fn(*args)``; an exception ends the actor and is
        kept for :meth:`run` to raise (SimGrid would abort the whole process)."""
        try:
            fn(*args)
        except Exception:           # noqa: BLE001 - reported by run()
            if self.error is None:
                self.error = traceback.format_exc()

    def _timer_loop(self) -> None:
        heap, sem, clock_cls = self._timers, self._sem, self._engine_cls
        pop = heapq.heappop
        while True:
            now = clock_cls.clock
            while heap and heap[0][0] <= now + EPSILON:
                _, _, fn, args = pop(heap)
                self.events += 1
                fn(*args)
                now = clock_cls.clock
            wait = heap[0][0] - now if heap else IDLE_WAIT
            self._waiting_until = now + wait
            sem.acquire_timeout(max(wait, 0.0))
            self._waiting_until = None

    def run(self, until: float | None = None, stop: Callable[[], bool] | None = None,
            max_events: int | None = None) -> None:
        """Run SimGrid to ``until`` (simulated seconds), or until ``stop()``
        holds (looked at every :attr:`STOP_STEP`) or ``max_events`` timers ran."""
        limit = until if until is not None else math.inf
        if not math.isfinite(limit) and stop is None and max_events is None:
            raise ValueError("a SimGrid run needs an end: until, stop or max_events (its timers never run out)")
        start_events = self.events
        self.inside = True
        try:
            if stop is None and max_events is None:
                self.engine.run_until(limit)
                return
            while self.now < limit:
                self.engine.run_until(min(limit, self.now + self.STOP_STEP))
                if stop is not None and stop():
                    break
                if max_events is not None and self.events - start_events >= max_events:
                    break
        finally:
            self.inside = False
            if self.error is not None:
                raise RuntimeError(f"an actor of the SimGrid run failed:\n{self.error}")


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


class SgWorld(World):
    """A :class:`~gridrpc.sim.world.World` on a SimGrid platform file.

    ``placement`` says which platform host each process runs on: a dict
    (element or client name -> host name; ``"*"``: the default) or a
    callable ``(kind, name) -> host name``; without one, a one-host platform
    takes every process and a larger one raises. ``network_model``: SimGrid's
    (``CM02``: a message takes latency + size / bandwidth over its route, the
    built-in engine's model; ``LV08``, SimGrid's default, adds TCP's latency
    and bandwidth factors). SimGrid's cross-traffic (a reverse flow of 5 %
    of every message, TCP's acknowledgements, sharing the links) is off, as
    in the built-in engine; ``cfg=["network/crosstraffic:1"]`` turns it on. ``cpu``: how a host's cores are shared
    (:data:`CPU_SHARING`). ``cfg``: more ``--cfg`` settings for SimGrid."""

    def __init__(self, platform: str, *, placement: dict | Callable[[str, str], str] | None = None,
                 network_model: str = "CM02", cpu: str = "slice", cfg: list[str] | None = None, **kw) -> None:
        super().__init__(**kw)
        if cpu not in CPU_SHARING:
            raise ValueError(f"cpu sharing is one of {', '.join(CPU_SHARING)}, not {cpu!r}")
        self.cpu = cpu
        sg = load_simgrid()
        global _ENGINE_PID
        if _ENGINE_PID == os.getpid():
            raise RuntimeError("one SimGrid engine per process: run each SimGrid world in its own process "
                               "(gridrpc.sim.simgrid_engine.run_isolated)")
        args = ["gridrpc-sim", f"--cfg=network/model:{network_model}", "--cfg=network/crosstraffic:0",
                f"--cfg=network/loopback-lat:{self.costs.local_latency!r}",
                f"--cfg=network/loopback-bw:{LOCAL_BANDWIDTH!r}",
                "--log=root.thres:critical"]
        args += [f"--cfg={c}" for c in (cfg or [])]
        self.sg = sg
        _ENGINE_PID = os.getpid()
        self.engine = sg.Engine(args)
        self.engine.load_platform(str(platform))
        self.platform = str(platform)
        self.network_model = network_model
        hosts = self.engine.all_hosts
        if not hosts:
            raise ValueError(f"{platform}: no host in the platform")
        self.sg_hosts = {h.name: h for h in hosts}
        self.host_map = placement
        self.sim = SgClock(sg, self.engine, self.seed, hosts[0])
        self.hosts = {}
        self._mailboxes: dict[tuple[int, int], Any] = {}
        self.reset_stats()

    # -- placement ---------------------------------------------------------------------
    def sg_host(self, name: str) -> SgHost:
        """The :class:`SgHost` of platform host ``name`` (made at its first use)."""
        h = self.hosts.get(name)
        if h is None:
            sgh = self.sg_hosts.get(name)
            if sgh is None:
                raise ValueError(f"{self.platform}: no host {name!r} (hosts: {', '.join(sorted(self.sg_hosts))})")
            h = self.hosts[name] = SgHost(self.sim, sgh, time_slice=self.costs.time_slice,
                                          crowding=self.costs.crowding, cpu=self.cpu)
        return h

    def host_name_for(self, kind: str, name: str) -> str:
        p = self.host_map
        if callable(p):
            return p(kind, name)
        if isinstance(p, dict):
            if name in p:
                return p[name]
            if "*" in p:
                return p["*"]
        if len(self.sg_hosts) == 1:
            return next(iter(self.sg_hosts))
        raise ValueError(f"{self.platform} has {len(self.sg_hosts)} hosts: say where {kind} {name!r} runs "
                         "(placement)")

    def _host_for(self, kind: str, name: str, replicas: int = 1) -> Host:
        return self.sg_host(self.host_name_for(kind, name))

    def host(self, name: str, cores: int) -> Host:
        return self.sg_host(name)

    # -- the network -------------------------------------------------------------------
    def transmit(self, node, src: bytes, dst: bytes, h: dict) -> None:
        """A message sent outside a job (by a timer): the host's postman puts it."""
        node.proc.host.post(self, node, [(src, dst, h)])

    def transmit_all(self, node, sends: list) -> None:
        """One job's messages, from the actor that ran the job (on the sender's host)."""
        self.put_all(node, sends)

    def put_all(self, node, sends: list) -> None:
        """Put each message in its target's mailbox. Between two processes of
        one host the messages also queue one after another, as on the
        built-in engine's local link: SimGrid's loopback gives every message
        the whole bandwidth, so a message that would wait ``w`` seconds behind
        the previous ones is sent with ``w x bandwidth`` more bytes (it then
        arrives when the built-in engine's would; ties between processes of
        one host are broken in the order the messages were sent)."""
        routes = self.routes
        net = self.net
        host = node.proc.host
        now = self.sim.now
        for src, dst, h in sends:
            target = routes.get(dst)
            if target is None:
                continue                        # a peer that does not exist: lost
            n = wire_bytes(h)
            net.messages += 1
            net.bytes += n
            payload = n
            if target.proc.host is host:
                start = host.local_busy if host.local_busy > now else now
                host.local_busy = start + n / LOCAL_BANDWIDTH
                payload = n + int(round((start - now) * LOCAL_BANDWIDTH))
            self.mailbox(node, target).put_init((src, dst, h), payload).detach()

    def mailbox(self, sender, target):
        """The mailbox of the connection from ``sender`` to ``target`` (one per
        pair of elements, as zmq keeps one TCP connection per peer): its
        receiver actor, on ``target``'s host, queues what arrives as jobs of
        ``target``'s process. A SimGrid mailbox hands its messages out in the
        order they were put, each after the previous one arrived: a large
        message holds back the later ones of its connection only, not
        another element's."""
        key = (id(sender), id(target))
        mb = self._mailboxes.get(key)
        if mb is None:
            mb = self._mailboxes[key] = self.sg.Mailbox.by_name(
                f"{sender.name}>{target.name}:{id(sender):x}:{id(target):x}")
            self.sg.Actor.create(f"{target.name}<{sender.name}", target.proc.host.sg_host, self.sim.guard,
                                 _receive, mb, target)
        return mb

    def summary(self) -> dict:
        out = super().summary()
        out["engine"] = "simgrid"
        out["platform"] = self.platform
        out["network_model"] = self.network_model
        out["cpu_sharing"] = self.cpu
        out["wire_messages"] = self.net.messages
        out["wire_bytes"] = self.net.bytes
        return out


def _receive(mb, node) -> None:
    get = mb.get
    while True:
        src, dst, h = get()
        node.deliver(src, dst, h)


def run_isolated(fn: Callable, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a forked child process (one SimGrid engine
    per process), its result sent back pickled; an exception in the child is
    raised here as a RuntimeError with the child's traceback."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn, args, kwargs), daemon=True)
    proc.start()
    child.close()
    try:
        if not parent.poll(timeout):
            raise TimeoutError(f"SimGrid run of {getattr(fn, '__name__', fn)} took over {timeout} s")
        ok, value = parent.recv()
    except EOFError:
        proc.join(5)
        raise RuntimeError(f"SimGrid run of {getattr(fn, '__name__', fn)} died (exit code {proc.exitcode})") from None
    finally:
        parent.close()
        if proc.is_alive():
            proc.kill()
        proc.join(5)
    if not ok:
        raise RuntimeError(f"SimGrid run of {getattr(fn, '__name__', fn)} failed:\n{value}")
    return value


def _child(conn, fn, args, kwargs) -> None:
    try:
        result = (True, fn(*args, **kwargs))
    except BaseException:           # noqa: BLE001 - reported to the parent
        result = (False, traceback.format_exc())
    try:
        conn.send(result)
        conn.close()
    finally:
        os._exit(0)                 # SimGrid's threads are parked in the engine: no interpreter shutdown
