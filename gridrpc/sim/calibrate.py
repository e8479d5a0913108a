"""``gridrpc sim calibrate``: fit the simulator's costs to stored measurements.

Inputs (what is there):

- the scalability study (``benchmarks/scalability/results/latest.json``):
  for 27 real trees (1-500 SeDs, flat, L2-d, L3-d, every element a real
  process on one 2-core host), the CPU each element used during 300
  sequential discoveries (``discovery_cpu``, % of a core, and
  ``idle_cpu``), the discovery latency, and the load steps to saturation;
- the benchmark suite (``benchmarks/results/latest.json``): CPU microseconds
  per call by role (client, SeD, worker) for bound calls and discoveries.

Method: the *simulator itself* counts, for each of those trees, what each
element handles -- the real agent state machines decide who sends what:

- per sequential discovery (one blocking client): wake-ups, messages and
  items (estimation vectors, replica names, subtree elements) of every
  element, against its measured CPU per discovery
  (``(busy - idle) % x mean discovery time``);
- per call at every load step (``users`` closed-loop users, discovery +
  call of ``noop``): the same counts per call, against the element's
  measured CPU per call (``(busy - idle) % / calls/s``; a SeD process's
  CPU includes its worker, whose ``exec_cpu`` is taken off).

Per kind of element (MA, LA, SeD process, load generator) non-negative least
squares fits ``cpu = wakeups * wakeup[kind] + msgs * msg[kind] + items *
item[kind]`` (the load generator: ``+ background / calls/s``, a share of a
core it burns whatever the calls, fitted to keep it out of the per-message
cost; written to ``background`` and simulated from the next pass on: a job
on the load generator's process every 10 ms, whose wake-ups are not counted
as its own). Under load a busy process drains several messages per wake-up,
so the load steps separate the wake-up from the per-message cost.
Wake-ups depend on the costs (a process still busy does not wake up) and on
the host's time slice (``time_slice``, fixed, 3 ms: how long a process keeps
a core for its queued jobs), so the counts are taken with the costs being
fitted, from a neutral start, ``iterations`` times. With ``crowding``, an
exponent ``b`` (``cpu x max(1, processes per core) ** b``) is chosen on a
grid at each pass, by least squares. The blocking client's CPU per discovery
comes from the benchmark suite (``discover_4``: 2 messages). Last, the
one-way latency of a local message (loopback and the receiver's scheduling),
the share of a wake-up spent after the messages left (``wake_tail``) and the
share of CPU on zmq's I/O thread (``io_share``) are fitted so that the
simulated discovery medians match the measured ones (least squares of the
log error on the runs taken at a load average below ``max_load``).

Several studies (``--study`` given more than once, :func:`merge_studies`):
every run of every file is a row of the fit, each against its own measured
CPU; a tree measured in several files is simulated once per pass.

Output (``-o FILE``, the JSON of :class:`gridrpc.sim.model.Costs`):
``wakeups``/``msgs``/``items`` (CPU seconds per kind), ``background``
(share of a core per kind, simulated), ``exec_cpu``,
``call_cpu``, ``local_latency``, ``io_share``, ``wake_tail``,
``time_slice``, ``crowding``, ``source`` and ``fit``: ``quality[kind]``
(``rows``, ``discovery_rows``, ``load_rows``, ``median_rel_error`` over all
rows, ``discovery_median_rel_error``, ``load_median_rel_error``),
``background`` (share of a core per kind), ``iterations`` (the costs after
each pass, with ``crowding`` and ``sse``, the squared residual),
``latency_runs``, ``max_load``, ``runs``. Takes ~10-20 minutes of one core
(3 passes over 27 trees and 156 load steps).
"""
from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

from ..cli.values import write_or_print
from ..errors import ConfigError
from .counts import count_discovery, count_load
from .model import Costs
from .world import World, discovery_series, elements_for

STUDY = "benchmarks/scalability/results/latest.json"
SUITE = "benchmarks/results/latest.json"
#: the kinds fitted on the study, and the columns of each
FITTED = {"ma": ("wakeups", "msgs", "items"), "la": ("wakeups", "msgs", "items"),
          "sed": ("wakeups", "msgs", "items"), "locust": ("wakeups", "msgs", "background")}
#: the host's time slice (engine.Host) the costs are fitted with
TIME_SLICE = 3e-3
#: crowding exponents tried (engine.Host: costs x max(1, processes per core) ** crowding)
CROWDING_GRID = tuple(i * 0.025 for i in range(13))


#: what a fit says where scipy is missing (it is in the ``sim`` extra, not a core dependency)
NEEDS_SCIPY = "fitting the simulator's costs needs scipy, which is not installed: pip install 'gridrpc[sim]'"


def _scipy_nnls():
    """scipy's ``nnls``, or a :class:`~gridrpc.errors.ConfigError` naming the extra that brings it."""
    try:
        from scipy.optimize import nnls
    except ImportError:
        raise ConfigError(NEEDS_SCIPY) from None
    return nnls


def _nnls(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Non-negative least squares (scipy's Lawson-Hanson: costs cannot be negative)."""
    import numpy as np
    x, _ = _scipy_nnls()(np.array(rows), np.array(ys))
    return [float(v) for v in x]


def neutral_costs(time_slice: float = TIME_SLICE) -> Costs:
    """Where the iterations start: the same cost for every kind, no wake-up."""
    return Costs(msgs={k: 100e-6 for k in FITTED} | {"client": 180e-6},
                 items={k: 2e-6 for k in ("ma", "la", "sed")}, wakeups={}, exec_cpu=50e-6, call_cpu=0.0,
                 local_latency=15e-6, time_slice=time_slice)


def measured_cpu(run: dict) -> dict[str, float]:
    """CPU seconds per discovery of each element of a study run."""
    mean_s = run["discovery"]["mean_ms"] / 1e3
    idle = run.get("idle_cpu", {})
    return {el: max(0.0, (pct - idle.get(el, 0.0)) / 100.0 * mean_s) for el, pct in run["discovery_cpu"].items()}


def load_steps(run: dict) -> list[dict]:
    """The load steps of a study run that completed calls."""
    return [st for st in run.get("load", []) if st.get("rps") and "error" not in st and st.get("cpu")]


def measured_step_cpu(run: dict, step: dict) -> dict[str, float]:
    """CPU seconds per call of each element (and of ``locust``) at a load step."""
    idle = run.get("idle_cpu", {})
    return {el: max(0.0, (pct - idle.get(el, 0.0)) / 100.0 / step["rps"]) for el, pct in step["cpu"].items()}


def study_views(study: dict) -> bool:
    """Whether a study's trees answered discoveries from pushed views
    (``meta.discovery_mode`` ``view``, ``python -m benchmarks.scalability``
    without ``--fanout``): then it is fitted with views and the load
    generator's reuse window. Studies that do not say are of fan-out trees
    (they predate the views)."""
    return study.get("meta", {}).get("discovery_mode") == "view"


def fit_rows(study: dict, costs: Costs, progress=lambda s: None, cores: int = 2) -> dict[str, list]:
    """``{kind: [(counts, measured seconds, "discovery" | "load", processes
    per core), ...]}``: every element of every run (per discovery) and of
    every load step (per call), counted by the simulator with ``costs``."""
    rows: dict[str, list] = {k: [] for k in FITTED}

    def add(cnt: dict, meas: dict, what: str, extra=lambda c: 0.0) -> None:
        for el, y in meas.items():
            c = cnt.get(el)
            if c is None or c["kind"] not in rows:
                continue
            rows[c["kind"]].append(([c[col] for col in FITTED[c["kind"]]], max(0.0, y - extra(c)), what,
                                    c["crowd"]))
    # a tree measured in several studies (merge_studies) is counted once per pass: the counts
    # depend only on the tree, the users and the costs (the simulation is deterministic)
    disc_counts: dict = {}
    load_counts: dict = {}
    views = study_views(study)
    for run in study["runs"]:
        key = (run["shape"], run["n"])
        if key not in disc_counts:
            disc_counts[key] = count_discovery(run["shape"], run["n"], costs, views=views, cores=cores)
        add(disc_counts[key], measured_cpu(run), "discovery")
        for step in load_steps(run):
            lkey = key + (step["users"],)
            if lkey not in load_counts:
                load_counts[lkey] = count_load(run["shape"], run["n"], step["users"], costs, views=views,
                                               cores=cores)[0]
            cnt = {el: dict(c) for el, c in load_counts[lkey].items()}
            for c in cnt.values():          # a share of a core whatever the calls: seconds per call
                c["background"] = 1.0 / step["rps"]
            add(cnt, measured_step_cpu(run, step), "load", lambda c: c["execs"] * costs.exec_cpu)
        progress(f"  counted {run['shape']:6s} {run['n']:4d} SeDs ({len(load_steps(run))} load steps)")
    return rows


def _rel(pred: list[float], ys: list[float]) -> float | None:
    err = [abs(p - y) / y for p, y in zip(pred, ys) if y > 0]
    return statistics.median(err) if err else None


def _scaled(rows: list, kind: str, crowding: float) -> list[list[float]]:
    """The columns of ``rows`` with the crowding factor on what it multiplies
    (not the load generator's background share)."""
    cols = FITTED[kind]
    out = []
    for r, _, _, crowd in rows:
        f = max(1.0, crowd) ** crowding
        out.append([v if col == "background" else v * f for col, v in zip(cols, r)])
    return out


def solve(rows: dict[str, list], crowding: float = 0.0) -> tuple[dict[str, dict], dict]:
    """NNLS per kind: ``({column: {kind: seconds}}, quality)``; ``quality``
    also has ``sse``, the sum of squared residuals (s^2) over every kind."""
    out: dict[str, dict] = {col: {} for cols in FITTED.values() for col in cols}
    quality: dict = {}
    sse = 0.0
    for kind, rs in rows.items():
        if not rs:
            continue
        xs = _scaled(rs, kind, crowding)
        ys = [y for _, y, _, _ in rs]
        x = _nnls(xs, ys)
        for col, v in zip(FITTED[kind], x):
            out[col][kind] = v
        pred = [sum(a * b for a, b in zip(r, x)) for r in xs]
        sse += sum((p - y) ** 2 for p, y in zip(pred, ys))
        q = {"rows": len(rs), "median_rel_error": _rel(pred, ys)}
        for what in ("discovery", "load"):
            sel = [i for i, r in enumerate(rs) if r[2] == what]
            q[f"{what}_rows"] = len(sel)
            q[f"{what}_median_rel_error"] = _rel([pred[i] for i in sel], [ys[i] for i in sel])
        quality[kind] = q
    quality["sse"] = sse
    return out, quality


def solve_crowding(rows: dict[str, list], grid=CROWDING_GRID) -> tuple[float, dict, dict]:
    """The crowding exponent of ``grid`` whose fit leaves the least squared
    residual, with that fit."""
    best = None
    for beta in grid:
        cols, quality = solve(rows, beta)
        if best is None or quality["sse"] < best[2]["sse"]:
            best = (beta, cols, quality)
    return best


def _client_costs(costs: Costs, suite: dict | None) -> None:
    """The blocking client (suite: discover alone, 2 messages per discovery)
    and the worker / SeD per-call figures of the suite's bound call."""
    res = (suite or {}).get("results", {})
    if "discover_4" in res:
        costs.msgs["client"] = res["discover_4"]["cpu_us_per_call"]["client"] * 1e-6 / 2
    if "call_bound" in res:
        cb = res["call_bound"]["cpu_us_per_call"]
        costs.exec_cpu = cb.get("workers", 50.0) * 1e-6
        # a bound call, one at a time: the SeD process wakes for the CALL and for the worker's answer
        costs.call_cpu = max(0.0, cb.get("sed", 283.0) * 1e-6 - 2 * (costs.msg("sed") + costs.wake("sed")))


def fit(study: dict, suite: dict | None = None, *, max_load: float = 15.0, iterations: int = 3,
        time_slice: float = TIME_SLICE, crowding: bool = False, progress=lambda s: None, cores: int = 2) -> Costs:
    """Fit the costs to ``study`` (measured on one host of ``cores`` cores,
    every process on it; the built-in costs: 2)."""
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, not {iterations}")
    if not time_slice >= 0.0:
        raise ValueError(f"time slice must be >= 0 seconds, not {time_slice}")
    costs = neutral_costs(time_slice)
    _client_costs(costs, suite)
    passes = []
    for it in range(iterations):
        rows = fit_rows(study, costs, progress, cores)
        costs.crowding, cols, quality = solve_crowding(rows, CROWDING_GRID if crowding else (0.0,))
        costs.wakeups = {k: v for k, v in cols["wakeups"].items()}
        costs.msgs = {**costs.msgs, **cols["msgs"]}
        costs.items = {**costs.items, **cols["items"]}
        costs.background = dict(cols["background"])        # simulated from the next pass on (ClientNode)
        _client_costs(costs, suite)
        passes.append({"wakeups": dict(costs.wakeups), "msgs": dict(costs.msgs), "items": dict(costs.items),
                       "background": dict(cols["background"]), "crowding": costs.crowding, "sse": quality["sse"]})
        progress(f"  pass {it + 1}: " + "; ".join(
            f"{k} {costs.wake(k) * 1e6:.0f}+{costs.msg(k) * 1e6:.0f}+{costs.item(k) * 1e6:.2f} us" for k in FITTED)
            + f" (wake-up + message + item), crowding {costs.crowding:.3f}")
    _fit_latency(study, costs, max_load, progress, cores)
    quality.pop("sse")
    costs.fit = {"quality": quality, "iterations": passes, "max_load": max_load,
                 "background": dict(cols["background"]),
                 "latency_runs": sum(1 for r in study["runs"] if (r.get("loadavg_before") or 0.0) <= max_load),
                 "runs": [{"n": r["n"], "shape": r["shape"], "load": r.get("loadavg_before"),
                           "load_steps": len(load_steps(r))} for r in study["runs"]]}
    costs.source = f"gridrpc sim calibrate: {_describe(study)}, discoveries and load steps"
    return costs


def _describe(study: dict) -> str:
    """What the fit was made from, for ``Costs.source``."""
    parts = study["meta"].get("merged")
    if not parts:
        m = study["meta"]
        return (f"{len(study['runs'])} trees of {m.get('command', '?')} "
                f"({m.get('date', '?')}, {m.get('cpus', '?')} CPUs)")
    trees = len({(r["shape"], r["n"]) for r in study["runs"]})
    return (f"{len(study['runs'])} runs of {trees} trees from {len(parts)} studies: "
            + "; ".join(f"{p['runs']} trees of {p['file']} ({p['command']}, {p['date']}, {p['cpus']} CPUs)"
                        for p in parts))


def merge_studies(studies: list[tuple[str, dict]]) -> dict:
    """Several measurements of the study as one (``[(file, study), ...]``):
    every run of every study is a row of the fit (a tree measured twice
    gives two rows, each counted against its own CPU figures); one study is
    returned as it is."""
    if len(studies) == 1:
        return studies[0][1]
    runs = []
    parts = []
    for i, (name, s) in enumerate(studies):
        runs.extend(dict(r, study=i) for r in s["runs"])
        m = s.get("meta", {})
        parts.append({"file": name, "runs": len(s["runs"]), "command": m.get("command", "?"),
                      "date": m.get("date", "?"), "cpus": m.get("cpus", "?")})
    views = {study_views(s) for _, s in studies}
    if len(views) > 1:
        raise ValueError("the studies were measured in different discovery modes (views and fan-out): "
                         "fit them apart")
    meta: dict = {"merged": parts}
    if views == {True}:
        meta["discovery_mode"] = "view"
    return {"meta": meta, "runs": runs}


def _fit_latency(study: dict, costs: Costs, max_load: float, progress, cores: int = 2) -> None:
    """The latency of one local hop, with the share of a wake-up spent after
    the messages left (``wake_tail``) and the share of a message's CPU on
    zmq's I/O thread (``io_share``): for each pair of shares, the simulated
    medians are linear in the latency (base + hops on the critical path x
    latency); the latency minimising the squared log error of the medians
    (small and large trees count alike) on a fine grid; the best triple wins."""
    runs = [r for r in study["runs"] if (r.get("loadavg_before") or 0.0) <= max_load]
    meas = [r["discovery"]["median_ms"] / 1e3 for r in runs]
    best = None
    for share in (0.0, 0.3):
        for tail in (0.0, 0.25, 0.5, 0.75, 1.0):
            costs.io_share, costs.wake_tail = share, tail
            bases, xs = [], []
            sims: dict = {}             # a tree measured in several studies is simulated once
            views = study_views(study)
            for run in runs:
                key = (run["shape"], run["n"])
                if key not in sims:
                    base = _median(run, costs, 0.0, views, cores)
                    sims[key] = (base, (_median(run, costs, 1e-4, views, cores) - base) / 1e-4)
                bases.append(sims[key][0])
                xs.append(sims[key][1])
            sse, lat = min((sum(math.log(max(b + x * L, 1e-9) / mm) ** 2 for b, x, mm in zip(bases, xs, meas)), L)
                           for L in (i * 5e-6 for i in range(0, 301)))
            progress(f"  io share {share:.1f}, wake tail {tail:.2f}: local latency {lat * 1e6:6.1f} us, "
                     f"log-error {sse:.3f}")
            if best is None or sse < best[0]:
                best = (sse, share, tail, lat)
    _, costs.io_share, costs.wake_tail, costs.local_latency = best


def _median(run: dict, costs: Costs, latency: float, views: bool = False, cores: int = 2) -> float:
    c = Costs(**{**costs.__dict__, "local_latency": latency})
    w = World(costs=c, seed=1, views=views, cores=cores, sed_cores=cores).build(elements_for(run["shape"], run["n"]))
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
    try:
        _scipy_nnls()       # before the inputs are read and counted
    except ConfigError as exc:
        print(f"gridrpc sim calibrate: {exc}", file=sys.stderr)
        return 2
    files = a.study if isinstance(a.study, list) else [a.study] if a.study else []
    files = files or [STUDY]
    loaded = [load_inputs(f, a.suite) for f in files]
    suite = loaded[0][1]
    study = merge_studies([(Path(f).name, s) for f, (s, _) in zip(files, loaded)])
    costs = fit(study, suite, max_load=a.max_load, iterations=a.iterations, time_slice=a.time_slice / 1e3,
                crowding=a.crowding, cores=a.cores or 2,
                progress=lambda s: print(s, file=sys.stderr, flush=True))
    for k in ("ma", "la", "sed", "client", "locust"):
        print(f"  {k:7s} {costs.wake(k) * 1e6:8.1f} us/wake-up {costs.msg(k) * 1e6:8.1f} us/message "
              f"{costs.item(k) * 1e6:7.2f} us/item", file=sys.stderr)
    print(f"  local latency {costs.local_latency * 1e6:.1f} us, wake tail {costs.wake_tail:.2f}, io share "
          f"{costs.io_share:.1f}, time slice {costs.time_slice * 1e3:.1f} ms, crowding {costs.crowding:.3f}; "
          f"fit quality {costs.fit['quality']}", file=sys.stderr)
    text = costs.to_json()
    write_or_print(text, a.output)
    return 0
