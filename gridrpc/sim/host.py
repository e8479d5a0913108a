"""What the simulator needs to know about a host, apart from the model.

The model (:mod:`gridrpc.sim.model`, ``Costs``) gives every element's CPU
per wake-up, message and item in seconds *of the reference host*, the one
the costs were fitted on. A :class:`HostProfile` says how a host differs:

- ``cores``: the cores its processes share (:func:`gridrpc.affinity.usable_cores`,
  so a run under ``taskset -c 0`` is a 1-core host);
- ``speed``: its single-core speed relative to the reference host (2.0:
  every job takes half the time), from :func:`single_core_benchmark` run
  on both (``REFERENCE_BENCH_S``, measured on the reference host);
- ``costs``: a costs file fitted on that host (``gridrpc sim calibrate
  --study``), or none: the built-in costs scaled by ``speed``.

``gridrpc sim calibrate --quick -o host.json`` measures the first two (a
few seconds) and writes the profile; ``gridrpc sim run --host-profile
host.json`` (or ``--cores N --speed X``) simulates on it. A profile with
``speed`` 1.0 and the built-in costs is the reference host.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from ..affinity import usable_cores
from .model import Costs

__all__ = ["HostProfile", "REFERENCE_BENCH_S", "quick_profile", "single_core_benchmark"]

#: :func:`single_core_benchmark` on the kind of host the built-in costs were fitted on (this project's shared
#: 2-vCPU build host, Python 3.11): 0.393-0.418 ms over four runs, 2026-11-28, load average 9-18, on both
#: cores and under ``taskset -c 0``
REFERENCE_BENCH_S = 0.000395


@dataclass(frozen=True)
class HostProfile:
    """A host: ``cores``, ``speed`` (relative to the reference host), the
    benchmark behind it (``bench_s``), and optionally a ``costs`` file."""
    cores: int
    speed: float = 1.0
    bench_s: float | None = None
    reference_bench_s: float = REFERENCE_BENCH_S
    costs: str | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if self.cores < 1 or not self.speed > 0:
            raise ValueError(f"host profile: cores >= 1 and speed > 0 (got {self.cores}, {self.speed})")

    def load_costs(self) -> Costs:
        return Costs.load(self.costs)

    def world_kw(self) -> dict:
        """The :class:`~gridrpc.sim.world.World` arguments of this host
        (every process on it: ``placement="single"``)."""
        return {"cores": self.cores, "sed_cores": self.cores, "speed": self.speed}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "HostProfile":
        data = json.loads(Path(path).read_text())
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def _work(rounds: int) -> int:
    """What an element does per message, in miniature: build a header with a
    few estimation vectors, encode and decode it, rank the vectors."""
    n = 0
    for i in range(rounds):
        servers = [{"name": f"sed-{j}", "address": "tcp://127.0.0.1:5000",
                    "estimation": {"tcomp": 0.001 * j, "num_waiting": j % 3, "free_cpu": 0.5,
                                   "time_since_last_solve": float(i - j)}} for j in range(8)]
        h = {"v": 1, "type": "servers", "id": f"c.{i}", "servers": servers}
        back = orjson.loads(orjson.dumps(h))
        ranked = sorted(back["servers"], key=lambda s: (s["estimation"]["num_waiting"],
                                                         -s["estimation"]["time_since_last_solve"]))
        n += len(ranked[0]["name"])
    return n


def single_core_benchmark(repeats: int = 300, rounds: int = 60) -> float:
    """Seconds of one short burst of :func:`_work` (``rounds``, ~0.4 ms),
    the fastest of ``repeats`` bursts 0.5 ms apart. Short bursts with pauses,
    as an element handles a message and waits for the next: on a host shared
    with CPU-bound work the scheduler serves such bursts at once, so the
    fastest burst measures the core's speed, not the share of it that other
    work leaves (which a long CPU-bound loop measures)."""
    _work(rounds * 5)             # warm up
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        _work(rounds)
        d = time.perf_counter() - t
        if d < best:
            best = d
        time.sleep(0.0005)
    return best


def quick_profile(*, cores: int | None = None, repeats: int = 300, costs: str | None = None) -> HostProfile:
    """This host's profile: its cores (or ``cores``) and its speed from
    :func:`single_core_benchmark` against :data:`REFERENCE_BENCH_S`."""
    t = time.perf_counter()
    bench = single_core_benchmark(repeats)
    speed = REFERENCE_BENCH_S / bench
    n = cores if cores is not None else usable_cores()
    return HostProfile(cores=n, speed=round(speed, 3), bench_s=round(bench, 7), costs=costs,
                       source=f"gridrpc sim calibrate --quick: {n} cores, benchmark {bench * 1e3:.3f} ms "
                              f"(reference {REFERENCE_BENCH_S * 1e3:.3f} ms) in {time.perf_counter() - t:.1f} s, "
                              f"load average {os.getloadavg()[0]:.1f}")
