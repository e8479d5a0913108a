"""The runtime overheads of an optional-computation run, for the simulator
(:mod:`gridrpc.experiments.sim_runtime`).

Every figure is a CPU or latency cost of the real runtime, taken from the
calibrated costs of :mod:`gridrpc.sim` (:data:`gridrpc.sim.model.DEFAULT_COSTS`,
fitted by ``gridrpc sim calibrate`` on 27 real trees; or a JSON written by
``gridrpc sim calibrate -o FILE``), not guessed:

* ``client_msg``: CPU of the client process per message it sends or
  receives (``msgs["client"]``, the blocking client of the suite). One client
  process plays every user of a run, so this CPU is a shared serial resource;
* ``sed_msg`` / ``sed_item``: a SeD process per message and per replica
  named in a discovery (``msgs["sed"]``, ``items["sed"]``);
* ``ma_msg`` / ``ma_item``: the MA per message and per estimation vector
  ranked (``msgs["ma"]``, ``items["ma"]``);
* ``latency``: one hop between two processes of the host (``local_latency``);
* ``worker``: what a call's run on a SeD adds to the service time (the
  worker's CPU per call, ``exec_cpu``, and the pipe hop to and from it);
* ``client_start``: CPU of the client process to start a user (create its
  client, connect it) before its DISCOVER goes out. Not in the calibrated
  costs: fitted from the stored real runs (:data:`CLIENT_START`, see
  :func:`gridrpc.experiments.sim_validate.fit_client_start`);
* ``sched_item`` / ``sched_item_virtual``: CPU of a SeD process per request
  in a replica's queue, for every event of its ``ethic`` scheduler
  (``accounting`` cumulative / virtual): the real core re-sorts the whole
  queue on each event, a cost the per-message figures (fitted with short
  queues) do not grow with. Measured on the core itself (:data:`SCHED_ITEM`,
  :func:`gridrpc.experiments.sim_validate.measure_sched`). FCFS's scheduler is
  O(1) per event and pays nothing here;
* ``client_batch_item`` / ``sed_batch_item``: CPU of the client / a SeD
  process per call or cancel in a batch message (a loop iteration's messages
  to one server travel as one), on top of that message's ``client_msg`` /
  ``sed_msg``: measured on the scale experiment's tree (:data:`BATCH_ITEM`);
* ``ack_delay``: the SeD's ACCEPTED is sent at once for a queued call, and
  after this delay for a call that started at once (a quick RESULT stands for
  it: ``ProcessBackend.ack_delay``);
* ``ping_interval``: the client pings a server holding its accepted calls
  once per interval (one PING per client and SeD process address, and its
  PONG), as the asyncio driver does.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

__all__ = ["Overheads"]

_CPU = ("client_msg", "sed_msg", "sed_item", "ma_msg", "ma_item", "latency", "worker", "client_start",
        "sched_item", "sched_item_virtual", "client_batch_item", "sed_batch_item")

#: CPU per queued request per event of the ethic scheduler (``SedScheduler`` with ``EthicPolicy``,
#: one finished + one submitted optional request per event, queues of 10, 100 and 1000 users; the
#: slope of a least-squares line through the three: 6.8, 48, 547 us per event for cumulative; 9.9,
#: 78, 919 us for virtual), on this 2-core host. Recomputed by
#: ``python -m gridrpc.experiments.sim_validate docs/experiments/data --measure-sched``.
SCHED_ITEM = {"cumulative": 0.55e-6, "virtual": 0.93e-6}

#: Client start-up of one user, s: the median delay between the planned and the realised arrival
#: (``user_arrive``) of the *first* user of each run of the stored day scenarios (nobody else
#: starting: 96 runs, docs/experiments/data, median 4.29 ms), less the simulated discovery of
#: 10 SeDs with the calibrated costs (1.08 ms). Recomputed by
#: ``python -m gridrpc.experiments.sim_validate docs/experiments/data --fit-start``.
CLIENT_START = 3.2e-3

#: CPU per call or cancel carried in a batch message, s, on top of the message's own cost: the
#: client's and the SeD process's, measured by ``python -m benchmarks.burst`` (100 users sending
#: 14,100 calls to 2 SeD processes in batches, then cancelling them; docs/performance.md, "Bursts")
BATCH_ITEM = {"client": 35e-6, "sed": 45e-6}


@dataclass(frozen=True, kw_only=True)
class Overheads:
    client_msg: float = 0.0
    sed_msg: float = 0.0
    sed_item: float = 0.0
    ma_msg: float = 0.0
    ma_item: float = 0.0
    latency: float = 0.0
    worker: float = 0.0
    client_start: float = 0.0
    sched_item: float = 0.0
    sched_item_virtual: float = 0.0
    client_batch_item: float = 0.0
    sed_batch_item: float = 0.0
    ack_delay: float = 0.02
    ping_interval: float = 1.0
    source: str = "zero"

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name == "source":
                continue
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ValueError(f"overhead {f.name} must be a finite number >= 0, got {v!r}")

    @classmethod
    def zero(cls) -> "Overheads":
        """No overhead at all: the zero-latency simulation of :mod:`.sim`."""
        return cls(ping_interval=0.0, ack_delay=0.0, source="zero")

    @classmethod
    def from_costs(cls, costs=None) -> "Overheads":
        """From the simulator's calibrated costs (``None``: ``DEFAULT_COSTS``;
        a path: a ``gridrpc sim calibrate -o`` JSON; or a
        :class:`gridrpc.sim.model.Costs`)."""
        from ..sim.model import Costs
        if isinstance(costs, str):
            import json
            from pathlib import Path
            data = json.loads(Path(costs).read_text())
            if not isinstance(data, dict) or not isinstance(data.get("msgs"), dict):
                raise ValueError(f"{costs}: no 'msgs' table (not a `gridrpc sim calibrate -o` file)")
        if costs is None or isinstance(costs, str):
            costs = Costs.load(costs)
        return cls(client_msg=costs.msg("client"), sed_msg=costs.msg("sed"), sed_item=costs.item("sed"),
                   ma_msg=costs.msg("ma"), ma_item=costs.item("ma"), latency=costs.local_latency,
                   worker=costs.exec_cpu + 2 * costs.local_latency, client_start=CLIENT_START,
                   sched_item=SCHED_ITEM["cumulative"], sched_item_virtual=SCHED_ITEM["virtual"],
                   client_batch_item=BATCH_ITEM["client"], sed_batch_item=BATCH_ITEM["sed"],
                   source=costs.source or "gridrpc.sim.model.DEFAULT_COSTS")

    def is_zero(self) -> bool:
        return all(getattr(self, k) == 0.0 for k in _CPU) and self.ping_interval == 0.0

    def scaled(self, factor: float) -> "Overheads":
        """Every CPU and latency cost multiplied by ``factor`` (sensitivity
        runs: a loaded host is a slower host)."""
        if not (math.isfinite(factor) and factor >= 0):
            raise ValueError(f"overhead factor must be a finite number >= 0, got {factor!r}")
        return replace(self, **{k: getattr(self, k) * factor for k in _CPU},
                       source=f"{self.source} x {factor:g}")

    def to_dict(self) -> dict:
        return asdict(self)
