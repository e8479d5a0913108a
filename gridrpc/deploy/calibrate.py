"""``gridrpc deploy calibrate``: the figures of the planning model
(:mod:`gridrpc.deploy.plan`), measured on this machine.

Discovery latency and CPU per discovery are measured on in-process trees
(:class:`gridrpc.testing.LocalTree`): flat (N SeDs under the MA) and
two-level (L LAs with N/L SeDs each); the model's ``per_child``, ``per_hop``
and ``base`` are fitted to the CPU figures by least squares, and each tree's
fit is checked against its measurement.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

from ..cli.values import write_or_print
from .plan import DEFAULT_FIGURES

__all__ = ["calibrate", "cmd_calibrate", "measure"]


def _discovery_times(ma: str, rounds: int, k: int = 10, cpu=None) -> tuple[list[float], float]:
    """Sorted latencies of ``rounds`` discoveries, and the CPU time ``cpu()``
    (the tree's loop thread) spent per discovery, idle work subtracted."""
    from ..client import Client
    with Client(ma, discovery_timeout=10) as c:
        for _ in range(5):      # warm-up: connections, first-use costs
            c.discover("add", k)
        idle_rate = 0.0
        if cpu:
            c0, w0 = cpu(), time.perf_counter()
            time.sleep(0.3)     # heartbeats and timers: subtracted below
            idle_rate = (cpu() - c0) / (time.perf_counter() - w0)
            c0, w0 = cpu(), time.perf_counter()
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            servers = c.discover("add", k)
            times.append(time.perf_counter() - t)
            if not servers:
                raise RuntimeError("discovery found no server")
        per_cpu = 0.0
        if cpu:
            per_cpu = max(0.0, (cpu() - c0) - idle_rate * (time.perf_counter() - w0)) / rounds
    return sorted(times), per_cpu


def _quantile(sorted_times: list[float], q: float) -> float:
    return sorted_times[min(len(sorted_times) - 1, int(q * len(sorted_times)))]


def measure(n: int, las: int, rounds: int = 30, hb_interval: float = 1.0) -> dict:
    """One in-process tree: ``las`` = 0 is flat (n SeDs under the MA), else
    ``las`` LAs with n/las SeDs each. Returns the discovery latency ("p20",
    "median", s) and "cpu": the CPU time all agents and SeDs (one event loop
    thread) spent per discovery -- the work, unaffected by other jobs."""
    from ..testing import LocalTree
    opts = {"isolation": "inline"}
    if las == 0:
        tree = LocalTree(las=0, seds_per_la=0, seds_under_ma=1, replicas=n, http=False, services=["add"],
                         sed_options=opts, hb_interval=hb_interval, hb_timeout=6.0)
    else:
        if n % las:
            raise ValueError(f"{n} SeDs do not split evenly over {las} LAs")
        tree = LocalTree(las=las, seds_per_la=1, replicas=n // las, http=False, services=["add"],
                         sed_options=opts, hb_interval=hb_interval, hb_timeout=6.0)
    with tree:
        tree.wait_registered(timeout=60)
        times, per_cpu = _discovery_times(tree.ma_address, rounds, cpu=lambda: tree.lt.call(time.thread_time))
    return {"p20": _quantile(times, 0.2), "median": statistics.median(times), "cpu": per_cpu}


def _lstsq(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Least squares for a few unknowns (normal equations)."""
    k = len(rows[0])
    ata = [[sum(r[i] * r[j] for r in rows) for j in range(k)] for i in range(k)]
    aty = [sum(r[i] * y for r, y in zip(rows, ys)) for i in range(k)]
    for i in range(k):  # Gauss-Jordan
        p = max(range(i, k), key=lambda r: abs(ata[r][i]))
        ata[i], ata[p], aty[i], aty[p] = ata[p], ata[i], aty[p], aty[i]
        piv = ata[i][i] or 1e-18
        for j in range(k):
            if j != i:
                fct = ata[j][i] / piv
                ata[j] = [x - fct * y for x, y in zip(ata[j], ata[i])]
                aty[j] -= fct * aty[i]
    return [aty[i] / (ata[i][i] or 1e-18) for i in range(k)]


def calibrate(seds=(50, 100, 200), las=(5,), rounds: int = 30,
              progress=lambda s: print(s, file=sys.stderr, flush=True), hb_interval: float = 1.0) -> dict:
    """Measure in-process trees and fit the model.

    Each run gives the discovery latency and the CPU time the tree's event
    loop (every agent and SeD of the run) spent per discovery. The fit uses
    the CPU times, which other jobs on the machine do not inflate:

    * flat trees of 1 and of each N in ``seds`` SeDs: the slope is ``per_child``;
    * a chain MA -> LA -> one SeD, against MA -> one SeD: the difference is one
      extra level, ``per_child + per_hop``;
    * ``base`` is the 20th-percentile latency of the 1-SeD tree less one
      ``per_child`` (client, sockets, wake-ups);
    * two-level trees (L in ``las`` LAs, N/L SeDs each) check the fit: in one
      loop their work is the *sum* ``per_child*(N + L) + per_hop*L`` (a real
      tree pays ``per_hop`` once per level: its LAs run in parallel).

    ``per_child`` includes the SeD's side of each child, so it is an upper
    bound for the agent alone.
    """
    samples: list[dict] = []

    def run(n: int, l: int, label: str) -> dict:
        # small trees are quick and their difference is small: many more rounds
        m = measure(n, l, rounds if n > 1 else max(rounds * 5, 200), hb_interval)
        samples.append({"seds": n, "las": l, "p20_s": m["p20"], "median_s": m["median"], "cpu_s": m["cpu"]})
        progress(f"  {label:24s}: CPU {m['cpu'] * 1e3:7.3f} ms/discovery; latency p20 {m['p20'] * 1e3:7.2f} ms, "
                 f"median {m['median'] * 1e3:7.2f} ms")
        return m

    one = run(1, 0, "1 SeD under the MA")
    chain = run(1, 1, "MA -> LA -> 1 SeD")
    flat = {1: one["cpu"]}
    for n in seds:
        flat[n] = run(n, 0, f"{n} SeDs flat")["cpu"]
    _, per_child = _lstsq([[1.0, float(n)] for n in flat], list(flat.values()))
    per_child = max(per_child, 1e-7)
    per_hop = max(chain["cpu"] - one["cpu"] - per_child, 0.0)
    base = max(one["p20"] - per_child, 0.0)
    checks = []
    for n in seds:
        for l in las:
            if n % l:
                continue
            m = run(n, l, f"{n} SeDs under {l} LAs")
            checks.append({"seds": n, "las": l, "measured_cpu_s": m["cpu"],
                           "model_cpu_s": flat[1] - per_child + per_child * (n + l) + per_hop * l})
    try:
        import os
        load = f", load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    except (OSError, AttributeError):  # pragma: no cover
        load = ""
    return {"per_child": per_child, "per_hop": per_hop, "base": base,
            "rtt": DEFAULT_FIGURES["rtt"], "samples": samples, "checks": checks,
            "source": f"gridrpc deploy calibrate on {time.strftime('%Y-%m-%d')}, {rounds} rounds each{load}"}


def cmd_calibrate(a) -> int:
    try:
        seds = [int(x) for x in str(a.seds).split(",") if x.strip()]
        las = [int(x) for x in str(a.las).split(",") if x.strip()]
    except ValueError:
        print("gridrpc deploy calibrate: --seds and --las take comma-separated numbers", file=sys.stderr)
        return 2
    figs = calibrate(seds, las, a.rounds)
    print(f"per_child={figs['per_child'] * 1e6:.1f}us per_hop={figs['per_hop'] * 1e6:.1f}us "
          f"base={figs['base'] * 1e3:.2f}ms", file=sys.stderr)
    for c in figs["checks"]:
        print(f"  check: {c['seds']} SeDs under {c['las']} LAs, CPU per discovery measured "
              f"{c['measured_cpu_s'] * 1e3:.2f} ms, model {c['model_cpu_s'] * 1e3:.2f} ms", file=sys.stderr)
    text = json.dumps(figs, indent=2)
    write_or_print(text, a.output)
    return 0
