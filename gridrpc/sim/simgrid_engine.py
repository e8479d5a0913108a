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
SimGrid engine per process: :func:`~gridrpc.sim.simgrid_isolate.run_isolated`
runs a simulation in a forked child and returns its result, so one program
can run several.

The engine's parts: :mod:`gridrpc.sim.simgrid_clock` (:class:`SgClock`: the
clock, timers and runs), :mod:`gridrpc.sim.simgrid_cpu` (:class:`SgHost`,
:class:`ProcActor`: hosts, cores and the processes' jobs),
:mod:`gridrpc.sim.simgrid_isolate` (:func:`run_isolated`); this module holds
the world (:class:`SgWorld`: the SimGrid engine, placement) and the message
transport (connections' mailboxes and their receiver actors).
"""
from __future__ import annotations

import os
from typing import Any, Callable

from .engine import Host
from .node import size
from .simgrid_clock import SgClock
from .simgrid_cpu import CPU_SHARING, SgHost
from .simgrid_loader import load_simgrid
from .world import World

__all__ = ["LOCAL_BANDWIDTH", "SgWorld", "wire_bytes", "DATA_TYPES"]

#: bytes/s between two processes of one host (SimGrid's loopback), as the built-in engine's ``Network``
LOCAL_BANDWIDTH = 2.0e9
#: the message types whose ``size`` field is a payload on the wire (gridrpc.sed.data.store's DATA and DATA_PUT)
DATA_TYPES = ("data", "data_put")
#: the process that made a SimGrid engine (SimGrid allows one per process)
_ENGINE_PID: int | None = None


def wire_bytes(h: dict) -> int:
    """Bytes a header takes on the wire: :func:`~gridrpc.sim.node.size`, plus
    the payload of a data message (its ``size`` field)."""
    n = size(h)
    if h.get("type") in DATA_TYPES:
        extra = h.get("size")
        if isinstance(extra, (int, float)) and extra > 0:
            n += int(extra)
    return n


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
                               "(gridrpc.sim.simgrid_isolate.run_isolated)")
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
