"""``gridrpc sim calibrate``: fit the simulator's costs to stored measurements.

Inputs (what is there):

- the scalability study (``benchmarks/scalability/results/latest.json``):
  for 27 real trees (1-500 SeDs, flat, L2-d, L3-d, every element a real
  process on one 2-core host), the CPU each element used during 300
  sequential discoveries (``discovery_cpu``, % of a core, and
  ``idle_cpu``), the discovery latency, and the load steps to saturation;
- the benchmark suite (``benchmarks/results/latest.json``): CPU microseconds
  per call by role (client, SeD, worker) for bound calls and discoveries.

Method: the *simulator itself* counts, for each of those trees, how many
messages and items (estimation vectors, replica names, subtree elements)
each element handles per discovery — it runs the real agent state machines
with zero costs. The measured CPU per discovery of each element is then
fitted, per kind of element (MA, LA, SeD process), by non-negative least
squares: ``cpu = msgs * msg[kind] + items * item[kind]``. Client costs come
from the benchmark suite (blocking client) and from the load generator's CPU
at the load steps (locust). Last, the one-way latency of a local message
(wake-up of the receiving process, loopback) is fitted so that the simulated
discovery medians match the measured ones (least squares on the runs taken
at a load average below ``max_load``).
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from .model import Costs
from .world import World, discovery_series, elements_for

STUDY = "benchmarks/scalability/results/latest.json"
SUITE = "benchmarks/results/latest.json"


def _nnls(rows: list[list[float]], ys: list[float]) -> list[float]:
    try:
        from scipy.optimize import nnls
        import numpy as np
        x, _ = nnls(np.array(rows), np.array(ys))
        return [float(v) for v in x]
    except ImportError:          # pragma: no cover - plain normal equations, clamped
        from ..deploy.plan import _lstsq
        return [max(0.0, v) for v in _lstsq(rows, ys)]


def measured_cpu(run: dict) -> dict[str, float]:
    """CPU seconds per discovery of each element of a study run."""
    mean_s = run["discovery"]["mean_ms"] / 1e3
    idle = run.get("idle_cpu", {})
    return {el: max(0.0, (pct - idle.get(el, 0.0)) / 100.0 * mean_s) for el, pct in run["discovery_cpu"].items()}


def count(shape: str, n: int, rounds: int = 20) -> dict[str, dict]:
    """Messages and items per discovery of each process, counted by the
    simulator on the real core (zero costs)."""
    w = World(costs=Costs.zero(), seed=0, hb_interval=1000.0).build(elements_for(shape, n))
    w.wait_registered()
    nodes = {**w.agents, **w.seds}
    c = w.client("client", "client")
    from .elements import User
    for node in nodes.values():
        node.n_msgs = node.n_items = 0
    u = User(c, "u", service="noop", k=3, call=False, calls=rounds, think=None, user="u")
    u.begin()
    w.sim.run(until=w.sim.now + 100.0)
    got = len(w.discoveries)
    return {name: {"kind": node.kind, "msgs": node.n_msgs / got, "items": node.n_items / got}
            for name, node in nodes.items()}


def fit(study: dict, suite: dict | None = None, *, max_load: float = 15.0,
        progress=lambda s: None) -> Costs:
    rows: dict[str, list] = {"ma": [], "la": [], "sed": []}
    samples = []
    for run in study["runs"]:
        cnt = count(run["shape"], run["n"])
        meas = measured_cpu(run)
        for el, y in meas.items():
            c = cnt.get(el)
            if c is None:
                continue
            rows[c["kind"]].append(([c["msgs"], c["items"]], y))
        samples.append({"n": run["n"], "shape": run["shape"], "load": run.get("loadavg_before")})
        progress(f"  counted {run['shape']:6s} {run['n']:4d} SeDs")
    msgs, items, quality = {}, {}, {}
    for kind, rs in rows.items():
        x = _nnls([r for r, _ in rs], [y for _, y in rs])
        msgs[kind], items[kind] = x
        pred = [r[0] * x[0] + r[1] * x[1] for r, _ in rs]
        ys = [y for _, y in rs]
        err = [abs(p - y) / y for p, y in zip(pred, ys) if y > 0]
        quality[kind] = {"rows": len(rs), "median_rel_error": statistics.median(err) if err else None}
    costs = Costs(msgs=dict(msgs), items=dict(items))
    # clients: the blocking client of the study (suite: discover alone, 2 messages per discovery);
    # the load generator (locust): its CPU per call at the load steps, 4 messages per call
    if suite and "discover_4" in suite.get("results", {}):
        costs.msgs["client"] = suite["results"]["discover_4"]["cpu_us_per_call"]["client"] * 1e-6 / 2
    else:
        costs.msgs["client"] = 180e-6
    per_call = []
    for run in study["runs"]:
        for step in run.get("load", []):
            if step.get("rps") and "locust" in step.get("cpu", {}):
                per_call.append(step["cpu"]["locust"] / 100.0 / step["rps"])
    costs.msgs["locust"] = statistics.median(per_call) / 4 if per_call else 90e-6
    if suite and "call_bound" in suite.get("results", {}):
        cb = suite["results"]["call_bound"]["cpu_us_per_call"]
        costs.exec_cpu = cb.get("workers", 50.0) * 1e-6
        costs.call_cpu = max(0.0, cb.get("sed", 283.0) * 1e-6 - 2 * costs.msgs["sed"])
    # what part of a message's CPU is off the critical path (zmq's I/O thread), and the latency of one
    # local hop: simulated medians without the latency, then least squares on the slope, per share
    import math
    runs = [r for r in study["runs"] if (r.get("loadavg_before") or 0.0) <= max_load]
    best = None
    for share in (0.0, 0.2, 0.4, 0.6):
        costs.io_share = share
        xs, ys = [], []
        for run in runs:
            base = _median(run, costs, 0.0)
            slope = (_median(run, costs, 1e-4) - base) / 1e-4       # hops on the critical path
            xs.append(slope)
            ys.append(run["discovery"]["median_ms"] / 1e3 - base)
        # the median is linear in the latency (base + hops * L): pick L minimising the squared log
        # error over a fine grid (a relative fit: small and large trees count alike)
        bases = [r["discovery"]["median_ms"] / 1e3 - y for r, y in zip(runs, ys)]
        meas = [r["discovery"]["median_ms"] / 1e3 for r in runs]
        sse, lat = min((sum(math.log((b + x * L) / mm) ** 2 for b, x, mm in zip(bases, xs, meas)), L)
                       for L in (i * 5e-6 for i in range(0, 301)))
        progress(f"  io share {share:.1f}: local latency {lat * 1e6:6.1f} us, log-error {sse:.3f}")
        if best is None or sse < best[0]:
            best = (sse, share, lat)
    _, costs.io_share, costs.local_latency = best
    xs = runs
    costs.fit = {"quality": quality, "latency_runs": len(xs), "max_load": max_load, "runs": samples}
    costs.source = (f"gridrpc sim calibrate: {len(study['runs'])} trees of {study['meta'].get('command', '?')} "
                    f"({study['meta'].get('date', '?')}, {study['meta'].get('cpus', '?')} CPUs)")
    return costs


def _median(run: dict, costs: Costs, latency: float) -> float:
    c = Costs(**{**costs.__dict__, "local_latency": latency})
    w = World(costs=c, seed=1).build(elements_for(run["shape"], run["n"]))
    w.wait_registered()
    return discovery_series(w, rounds=60, warmup=5)["discovery_median_ms"] / 1e3


def load_inputs(study: str = STUDY, suite: str = SUITE) -> tuple[dict, dict | None]:
    s = json.loads(Path(study).read_text())
    try:
        b = json.loads(Path(suite).read_text())
    except OSError:
        b = None
    return s, b


def cmd_calibrate(a) -> int:
    study, suite = load_inputs(a.study, a.suite)
    costs = fit(study, suite, max_load=a.max_load, progress=lambda s: print(s, file=sys.stderr, flush=True))
    for k in ("ma", "la", "sed", "client", "locust"):
        print(f"  {k:7s} {costs.msgs.get(k, 0) * 1e6:8.1f} us/message {costs.items.get(k, 0) * 1e6:7.2f} us/item",
              file=sys.stderr)
    print(f"  local latency {costs.local_latency * 1e6:.1f} us; fit quality {costs.fit['quality']}", file=sys.stderr)
    text = costs.to_json()
    if a.output:
        Path(a.output).write_text(text + "\n")
        print(f"wrote {a.output}", file=sys.stderr)
    else:
        print(text)
    return 0
