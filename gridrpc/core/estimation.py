"""Estimation vectors (pure): the standard tags and the run-time predictor.

Standard tags (DIET's names in lower case): ``tcomp`` (predicted run time of
the service, learnt), ``eft`` (earliest finish time, unix seconds),
``free_cpu`` (0..1), ``free_mem`` (bytes), ``nb_cpu``, ``total_mem``,
``num_waiting``, ``num_running``, ``max_concurrent``, ``time_since_last_solve``,
``est_wait`` (predicted seconds before the call starts), ``server_type``
(``serial`` | ``batch`` | ``cloud``...). Each kind of SeD declares the tags it
adds (``BackendKind.tags`` in :mod:`gridrpc.sed.backends.registry`: batch
``nb_free_resources``, ``slowdown``...; cloud ``price``, ``boot_time``...).
Services may add or override tags with their own function.
"""
from __future__ import annotations

from dataclasses import dataclass, field

STANDARD_TAGS = ("tcomp", "eft", "free_cpu", "free_mem", "nb_cpu", "total_mem", "num_waiting",
                 "num_running", "max_concurrent", "time_since_last_solve", "est_wait", "server_type")


@dataclass(slots=True)
class RunTimePredictor:
    """Per-service predicted run time: exponentially weighted mean of past
    durations (``alpha`` weight of the newest), ``default`` before any call."""
    alpha: float = 0.3
    default: float = 0.0
    means: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def observe(self, service: str, seconds: float) -> None:
        n = self.counts.get(service, 0)
        m = self.means.get(service)
        self.means[service] = seconds if m is None else (1 - self.alpha) * m + self.alpha * seconds
        self.counts[service] = n + 1

    def predict(self, service: str) -> float:
        return self.means.get(service, self.default)


def queue_tags(*, service: str, predictor: RunTimePredictor, now: float, num_waiting: int,
               num_running: int, max_concurrent: int, last_solve: float | None,
               running: list[tuple[float, str]], waiting_services: list[str]) -> dict:
    """The SeD-state part of the vector, with ``eft`` computed by simulating
    the queue: each slot frees when its running call is predicted to end."""
    tcomp = predictor.predict(service)
    if not running and not waiting_services and max_concurrent > 0:
        first = now                 # idle (every SeD of a large tree, mostly): a free slot now
    else:
        slots = sorted(max(now, start + predictor.predict(svc)) for start, svc in running)
        slots += [now] * max(0, max_concurrent - len(slots))
        slots.sort()
        for s in waiting_services:      # waiting calls take the earliest free slot in turn
            slots[0] += predictor.predict(s)
            slots.sort()
        first = slots[0]
    eft = first + tcomp
    return {
        "tcomp": tcomp, "eft": eft, "num_waiting": num_waiting, "num_running": num_running,
        "max_concurrent": max_concurrent,
        "time_since_last_solve": (now - last_solve) if last_solve is not None else 1e9,
        "est_wait": first - now,
    }


def scheduler_tags(*, scheduler, service: str, predictor: RunTimePredictor, now: float,
                   last_solve: float | None) -> dict:
    """:func:`queue_tags` of one SeD replica, read from its
    :class:`~gridrpc.core.queue.SedScheduler`: what the SeD runtime and the
    simulator (:mod:`gridrpc.sim`) put in the estimation vector."""
    sch = scheduler
    if sch.requests:
        running = [(start, sch.requests[rid].service) for rid, start in sch.running.items()]
        waiting = [q.service for q in sch.waiting()]
    else:                           # idle: no lists to build
        running, waiting = [], []
    return queue_tags(
        service=service, predictor=predictor, now=now,
        num_waiting=len(sch.requests) - len(sch.running), num_running=len(sch.running),
        max_concurrent=sch.max_concurrent, last_solve=last_solve, running=running, waiting_services=waiting)


def estimation_vector(host_tags: dict, server_type: str, *, scheduler, service: str,
                      predictor: RunTimePredictor, now: float, last_solve: float | None) -> dict:
    """A replica's whole vector: ``host_tags``, ``server_type``, then
    :func:`scheduler_tags` (the same dict as ``{**host_tags, "server_type":
    server_type, **scheduler_tags(...)}``, keys in that order). An idle
    scheduler's is filled in place (a large tree's fan-out asks every idle
    SeD; tests/test_core_fast_paths.py compares it with the merge)."""
    vec = host_tags.copy() if type(host_tags) is dict else dict(host_tags)
    vec["server_type"] = server_type
    sch = scheduler
    if not sch.requests and sch.max_concurrent > 0:     # scheduler_tags's idle case
        tcomp = predictor.predict(service)
        vec["tcomp"] = tcomp
        vec["eft"] = now + tcomp
        vec["num_waiting"] = 0                         # no requests: none waiting, none running
        vec["num_running"] = 0
        vec["max_concurrent"] = sch.max_concurrent
        vec["time_since_last_solve"] = (now - last_solve) if last_solve is not None else 1e9
        vec["est_wait"] = 0.0
        return vec
    vec.update(scheduler_tags(scheduler=sch, service=service, predictor=predictor, now=now,
                              last_solve=last_solve))
    return vec
