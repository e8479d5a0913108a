"""The simulator's parameters: CPU costs per message and per item for each
kind of element, network latencies, and service time distributions.

:data:`DEFAULT_COSTS` are the figures ``gridrpc sim calibrate`` fitted from
the stored measurements (benchmarks/scalability/results/latest.json and
benchmarks/results/latest.json) when this was written; ``gridrpc sim
calibrate -o FILE`` refits them and ``--costs FILE`` uses the result.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: kinds of element that pay CPU for messages
KINDS = ("ma", "la", "sed", "client", "locust", "worker")
#: seconds between two background jobs of a process with a ``background`` share (Costs.background)
BACKGROUND_PERIOD = 0.01


@dataclass
class Costs:
    """CPU seconds: ``wakeups[kind]`` each time a process of that kind goes
    from idle to busy (one per batch of messages it drains: see
    :mod:`gridrpc.sim.engine`), ``msgs[kind]`` per message received or sent,
    ``items[kind]`` per item in those messages (estimation
    vectors ranked or built, replica names, subtree elements);
    ``exec_cpu``: a worker's CPU per call besides the service itself (the
    pipe hop); ``call_cpu``: the SeD process's extra work per finished call.
    ``background[kind]``: the share of a core a process of that kind spends
    whatever it handles (the load generator's: locust's own greenlets and
    timers), a job of ``background x BACKGROUND_PERIOD`` every
    :data:`BACKGROUND_PERIOD` (:class:`gridrpc.sim.client_node.ClientNode`).
    ``local_latency``: one message between two processes of one host (the
    wake-up of the receiver); ``lan_latency``: between hosts."""
    msgs: dict = field(default_factory=dict)
    items: dict = field(default_factory=dict)
    wakeups: dict = field(default_factory=dict)
    background: dict = field(default_factory=dict)
    exec_cpu: float = 50e-6
    call_cpu: float = 100e-6
    local_latency: float = 60e-6
    lan_latency: float = 100e-6
    lan_bandwidth: float = 1.25e8
    io_share: float = 0.0             # share of a message's CPU spent off the process's thread (zmq I/O)
    time_slice: float = 0.0           # a process keeps its core this long for its queued jobs (engine.Host)
    wake_tail: float = 0.0            # share of a wake-up's CPU spent after the job's messages left
    crowding: float = 0.0             # element CPU x max(1, element processes per core) ** crowding
    source: str = ""
    fit: dict = field(default_factory=dict)

    def msg(self, kind: str) -> float:
        return self.msgs.get(kind, 0.0)

    def item(self, kind: str) -> float:
        return self.items.get(kind, 0.0)

    def wake(self, kind: str) -> float:
        return self.wakeups.get(kind, 0.0)

    def bg(self, kind: str) -> float:
        return self.background.get(kind, 0.0)

    @classmethod
    def zero(cls) -> "Costs":
        return cls(msgs={}, items={}, wakeups={}, exec_cpu=0.0, call_cpu=0.0, local_latency=0.0, lan_latency=0.0,
                   source="zero (counting only)")

    @classmethod
    def load(cls, path: str | None) -> "Costs":
        if not path:
            return cls(**json.loads(json.dumps(DEFAULT_COSTS)))
        data = json.loads(Path(path).read_text())
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


# Fitted by `gridrpc sim calibrate` (see docs/simulation.md) from the stored results of
# `python -m benchmarks.scalability --profile` (27 trees, 2 vCPUs, load average 3-65: sequential
# discoveries and 156 load steps) and `python -m benchmarks` (client costs). Re-run to refresh.
DEFAULT_COSTS = {
    "wakeups": {"la": 0.0003078, "locust": 0.0, "ma": 0.0002564, "sed": 0.0002462},
    "msgs": {"client": 0.0001831, "la": 3.912e-05, "locust": 0.0001246, "ma": 3.134e-05, "sed": 5.596e-05},
    "items": {"la": 1.613e-06, "ma": 1.375e-06, "sed": 1.769e-06},
    # the load generator's share of a core whatever the calls: the fit's background column, simulated since
    # (the same NNLS on the stored study's load steps, counted at these costs: 4.06 %, 126.8 us per message)
    "background": {"locust": 0.0406},
    "exec_cpu": 5e-05, "call_cpu": 0.0, "local_latency": 9.5e-05, "lan_latency": 0.0001,
    "lan_bandwidth": 125000000.0, "io_share": 0.3, "time_slice": 0.003, "wake_tail": 0.75,
    "crowding": 0.0,
    "source": 'gridrpc sim calibrate: 27 trees of python -m benchmarks.scalability --profile (2026-11-22T01:39:34, 2 CPUs), discoveries and load steps', "fit": {},
}


@dataclass(frozen=True)
class ServiceModel:
    """A service's run time: ``dist`` ``const`` (``mean``), ``exp`` (mean),
    ``uniform`` (``lo``..``hi``) or ``lognormal`` (mean, ``cv``);
    ``cpu_bound``: the run occupies a core of the SeD's host (else it only
    takes time, like the ``sleep`` service of the ethic experiments)."""
    mean: float = 0.0
    dist: str = "const"
    lo: float = 0.0
    hi: float = 0.0
    cv: float = 1.0
    cpu_bound: bool = True

    def sample(self, rng: random.Random) -> float:
        d = self.dist
        if d == "const":
            return self.mean
        if d == "exp":
            return rng.expovariate(1.0 / self.mean) if self.mean > 0 else 0.0
        if d == "uniform":
            return rng.uniform(self.lo, self.hi)
        if d == "lognormal":
            s2 = math.log(1 + self.cv ** 2)
            return rng.lognormvariate(math.log(self.mean) - s2 / 2, math.sqrt(s2))
        raise ValueError(f"unknown distribution {d!r}")


NOOP = ServiceModel(mean=0.0)
