"""``gridrpc sim validate`` with several measurements of the same trees: the
comparison itself (pure: predictions and stored studies in, verdicts out).

Per tree, the prediction against each measurement: its error, whether it is
within :data:`TOLERANCE` of at least one of them, and whether it lies within
the measured range widened by the tolerance (from 0.85 x the lowest to
1.15 x the highest: the criterion that fits a host whose own run-to-run
spread is the size of the tolerance). Each measurement's throughput error at
its own users is split (:func:`cpu_split`) into the CPU used (simulated /
measured, the tree and the load generator, at the saturation step) and the
CPU per call (measured / simulated, in total and per kind of element), with
medians over small and large trees (:func:`cpu_summary`). The simulation
that makes the predictions is :func:`gridrpc.sim.validate.validate_many`.
"""
from __future__ import annotations

import statistics
from pathlib import Path


def by_kind(cpu: dict) -> dict[str, float]:
    """CPU of every element summed by kind, as the study names them (MA, LAs,
    SeDs with their workers, locust): the study's per-element figures and
    the simulator's ``busy`` alike."""
    out: dict[str, float] = {}
    for name, v in cpu.items():
        k = ("MA" if name == "MA" else "LAs" if name.startswith("LA") else
             "locust" if name.startswith("locust") else "SeDs")
        out[k] = out.get(k, 0.0) + v
    return out


#: how far the simulation may be from the measurement to count as validated (15 %)
TOLERANCE = 0.15


def study_labels(files: list[str]) -> list[str]:
    """A short, distinct label per study file (its name without ``.json``)."""
    labels = []
    for f in files:
        base = Path(f).name.removesuffix(".json")
        label = base
        i = 2
        while label in labels:
            label, i = f"{base}#{i}", i + 1
        labels.append(label)
    return labels


def measurements(studies: list[tuple[str, dict]], max_load: float | None = None) -> dict[tuple, list[dict]]:
    """``{(n, shape): [measurement, ...]}`` over ``[(label, study), ...]``,
    trees by size, and in the order first seen within a size: each measurement is ``study`` (its label),
    ``median_ms`` (discovery), ``rps`` (saturation), ``users`` (where it
    saturated) and ``load`` (load average before the tree). With
    ``max_load``, the measurements taken above it are left out (and a tree
    left with none)."""
    trees: dict[tuple, list[dict]] = {}
    for label, study in studies:
        for run in study["runs"]:
            load = run.get("loadavg_before") or 0.0
            if max_load is not None and load > max_load:
                continue
            m = {"study": label, "median_ms": run["discovery"]["median_ms"],
                 "rps": run["saturation"]["max_rps"], "users": run["saturation"]["users"],
                 "load": round(load, 1)}
            cpu = saturation_cpu(run)
            if cpu is not None:
                m["cpu_total"] = sum(cpu.values())
                m["cpu_by_kind"] = by_kind(cpu)
            trees.setdefault((run["n"], run["shape"]), []).append(m)
    return dict(sorted(trees.items(), key=lambda kv: kv[0][0]))     # by size; within one, as first seen


def saturation_cpu(run: dict) -> dict | None:
    """The CPU (% of one core per element, the load generator's included)
    the measured run used at its saturation step, or None when not recorded."""
    users = run.get("saturation", {}).get("users")
    for st in run.get("load") or ():
        if st.get("users") == users and st.get("cpu") and st.get("rps"):
            return dict(st["cpu"])
    return None


def cpu_split(m: dict, rps: float, busy_total: float, busy_kinds: dict | None = None) -> dict:
    """Why a simulated throughput differs from a measured one at the same
    users: ``rps_ratio`` (simulated / measured calls/s) is ``share_ratio``
    (the CPU the simulation used / the CPU the measured tree and load
    generator got, both in % of one core) times ``per_call_ratio`` (the
    measured CPU per call / the simulated one); ``us_per_call`` per kind
    of element: ``[measured, simulated]``."""
    meas_us = m["cpu_total"] / 100.0 / m["rps"] * 1e6
    sim_us = busy_total / rps * 1e6
    out = {"study": m["study"], "users": m["users"], "measured_cpu_pct": m["cpu_total"],
           "simulated_cpu_pct": 100.0 * busy_total, "measured_us_per_call": meas_us,
           "simulated_us_per_call": sim_us, "rps_ratio": rps / m["rps"],
           "share_ratio": 100.0 * busy_total / m["cpu_total"], "per_call_ratio": meas_us / sim_us}
    if busy_kinds and m.get("cpu_by_kind"):
        out["us_per_call"] = {k: [m["cpu_by_kind"].get(k, 0.0) / 100.0 / m["rps"] * 1e6,
                                  busy_kinds.get(k, 0.0) / rps * 1e6]
                              for k in ("MA", "LAs", "SeDs", "locust") if k in m["cpu_by_kind"] or k in busy_kinds}
    return out


def judge(predicted: float, measured: list[float], tol: float = TOLERANCE) -> dict:
    """One prediction against several measurements of one figure:
    ``errors`` (predicted / measured - 1, in the order given), ``best_error``
    (the smallest in size), ``within_one`` (within ``tol`` of at least one),
    ``low``/``high`` (the measured range), ``spread`` (high / low - 1),
    ``in_range`` (low x (1 - tol) <= predicted <= high x (1 + tol)) and
    ``range_error`` (0 inside the measured range, else the error against
    its nearer end)."""
    if not measured:
        raise ValueError("no measurement to compare with")
    if any(m <= 0 for m in measured):
        raise ValueError(f"measurements must be positive: {measured}")
    errors = [predicted / m - 1 for m in measured]
    low, high = min(measured), max(measured)
    range_error = predicted / low - 1 if predicted < low else predicted / high - 1 if predicted > high else 0.0
    return {"errors": errors, "best_error": min(errors, key=abs),
            "within_one": any(abs(e) <= tol for e in errors),
            "low": low, "high": high, "spread": high / low - 1,
            "in_range": low * (1 - tol) <= predicted <= high * (1 + tol), "range_error": range_error}


def summarise(rows: list[dict], key: str, labels: list[str], tol: float = TOLERANCE) -> dict:
    """Counts over the trees for one figure (``key``: ``median`` or ``rps``):
    ``within_one`` and ``in_range`` (of ``of`` trees), the median of
    ``|best_error|`` and of ``|range_error|``; ``several`` the trees measured
    more than once, ``spread_over_tol`` those of them whose measurements
    differ by more than ``tol``, and ``in_range_several`` / ``within_one_several``
    the counts on those trees; ``per_study[label]``: within ``tol`` of that
    study's measurement (``within``, of ``of``, ``median_abs_error``), as a
    single-study validation against it would count (apart from the
    throughput, predicted here at the users of every measurement)."""
    js = [r[key] for r in rows]
    several = [(r, j) for r, j in zip(rows, js) if len(r["measurements"]) > 1]
    per_study = {}
    for label in labels:
        errs = [abs(e) for r, j in zip(rows, js)
                for m, e in zip(r["measurements"], j["errors"]) if m["study"] == label]
        per_study[label] = {"within": sum(1 for e in errs if e <= tol), "of": len(errs),
                            "median_abs_error": statistics.median(errs) if errs else None}
    return {"of": len(js), "within_one": sum(1 for j in js if j["within_one"]),
            "in_range": sum(1 for j in js if j["in_range"]),
            "median_abs_best_error": statistics.median(abs(j["best_error"]) for j in js) if js else None,
            "median_abs_range_error": statistics.median(abs(j["range_error"]) for j in js) if js else None,
            "several": len(several), "spread_over_tol": sum(1 for _, j in several if j["spread"] > tol),
            "within_one_several": sum(1 for _, j in several if j["within_one"]),
            "in_range_several": sum(1 for _, j in several if j["in_range"]),
            "per_study": per_study}


def compare(trees: dict[tuple, list[dict]], predictions: dict[tuple, dict], labels: list[str],
            tol: float = TOLERANCE) -> dict:
    """The rows and counts of a comparison with several measurements:
    ``predictions[(n, shape)]`` has ``median_ms`` and ``rps_by_users``
    (simulated calls/s per number of users; the prediction is the highest
    of those at the users where a measurement of the tree saturated)."""
    rows = []
    for key, ms in trees.items():
        p = predictions[key]
        by_users = {int(u): v for u, v in p["rps_by_users"].items()}
        missing = {m["users"] for m in ms} - set(by_users)
        if missing:
            raise ValueError(f"{key}: no prediction at {sorted(missing)} users")
        rps = max(by_users[m["users"]] for m in ms)
        busy = {int(u): v for u, v in (p.get("busy_by_users") or {}).items()}
        kinds = {int(u): v for u, v in (p.get("busy_kinds_by_users") or {}).items()}
        split = [cpu_split(m, by_users[m["users"]], busy[m["users"]], kinds.get(m["users"])) for m in ms
                 if m.get("cpu_total") and m["users"] in busy]
        rows.append({"n": key[0], "shape": key[1], "measurements": ms,
                     "predicted_median_ms": p["median_ms"], "predicted_rps": rps,
                     "predicted_rps_by_users": {str(u): by_users[u] for u in sorted({m["users"] for m in ms})},
                     "median": judge(p["median_ms"], [m["median_ms"] for m in ms], tol),
                     "rps": judge(rps, [m["rps"] for m in ms], tol),
                     **({"cpu": split} if split else {}),
                     **{k: v for k, v in p.items()
                        if k not in ("median_ms", "rps_by_users", "busy_by_users", "busy_kinds_by_users")}})
    # the best shape by discovery per size and study, measured and predicted among the trees it measured
    best_shape: dict = {}
    for r in rows:
        for m in r["measurements"]:
            b = best_shape.setdefault(r["n"], {}).setdefault(m["study"], {"_m": None, "_p": None})
            if b["_m"] is None or m["median_ms"] < b["_m"]:
                b["measured"], b["_m"] = r["shape"], m["median_ms"]
            if b["_p"] is None or r["predicted_median_ms"] < b["_p"]:
                b["predicted"], b["_p"] = r["shape"], r["predicted_median_ms"]
    best_shape = {n: {s: {"measured": b["measured"], "predicted": b["predicted"]} for s, b in by.items()}
                  for n, by in best_shape.items()}
    out = {"studies": labels, "tolerance": tol, "rows": rows,
           "median": summarise(rows, "median", labels, tol), "throughput": summarise(rows, "rps", labels, tol),
           "best_shape": best_shape}
    cpu = cpu_summary(rows)
    if cpu:
        out["cpu"] = cpu
    return out


#: trees up to this many SeDs are "small" in :func:`cpu_summary`
SMALL_TREE = 50


def cpu_summary(rows: list[dict]) -> dict:
    """Medians of :func:`cpu_split` over every measurement, and over those
    of trees up to / over :data:`SMALL_TREE` SeDs: ``of`` (measurements),
    ``rps_ratio``, ``share_ratio``, ``per_call_ratio``, and the measured CPU
    (``measured_cpu_pct``)."""
    out = {}
    for name, sel in (("all", lambda r: True), ("small", lambda r: r["n"] <= SMALL_TREE),
                      ("large", lambda r: r["n"] > SMALL_TREE)):
        xs = [c for r in rows if sel(r) for c in r.get("cpu", ())]
        if xs:
            out[name] = {"of": len(xs), **{k: statistics.median(c[k] for c in xs) for k in (
                "rps_ratio", "share_ratio", "per_call_ratio", "measured_cpu_pct")}}
            kinds = {}
            for kind in ("MA", "LAs", "SeDs", "locust"):
                r = [c["us_per_call"][kind][0] / c["us_per_call"][kind][1] for c in xs
                     if kind in c.get("us_per_call", {}) and c["us_per_call"][kind][1] > 0]
                if r:
                    kinds[kind] = statistics.median(r)
            if kinds:
                out[name]["per_call_ratio_by_kind"] = kinds
    return out


def _pct(x: float) -> str:
    return f"{x:+.0%}"


def format_many(res: dict) -> str:
    """The comparison with several measurements as text: a table per figure
    and the counts."""
    labels = res["studies"]
    tol = res["tolerance"]
    width = max(14, *(len(s) for s in labels))
    out = []
    for key, title, unit, fmt in (("median", "discovery median", "ms", "{:.2f}"),
                                  ("rps", "throughput at saturation", "calls/s", "{:.0f}")):
        pk = "predicted_median_ms" if key == "median" else "predicted_rps"
        out.append(f"{title} ({unit}): predicted, and each measurement (prediction's error against it); "
                   f"spread = highest / lowest measurement - 1; one = within {tol:.0%} of at least one; "
                   f"range = within the measured range widened by {tol:.0%}")
        out.append(f"{'SeDs':>5s} {'shape':6s} {'predicted':>9s} | "
                   + " ".join(f"{s:>{width}s}" for s in labels) + f" | {'spread':>6s} {'one':>3s} {'range':>5s}")
        for r in res["rows"]:
            by = {m["study"]: (m, e) for m, e in zip(r["measurements"], r[key]["errors"])}
            cells = []
            for s in labels:
                if s in by:
                    m, e = by[s]
                    v = m["median_ms"] if key == "median" else m["rps"]
                    cells.append(f"{fmt.format(v) + ' (' + _pct(e) + ')':>{width}s}")
                else:
                    cells.append(f"{'-':>{width}s}")
            j = r[key]
            spread = f"{j['spread']:.0%}" if len(r["measurements"]) > 1 else "-"
            out.append(f"{r['n']:5d} {r['shape']:6s} {fmt.format(r[pk]):>9s} | " + " ".join(cells)
                       + f" | {spread:>6s} {'yes' if j['within_one'] else 'no':>3s} "
                         f"{'yes' if j['in_range'] else 'no':>5s}")
        sm = res["median" if key == "median" else "throughput"]
        out.append(f"{title}: within {tol:.0%} of at least one measurement {sm['within_one']}/{sm['of']} "
                   f"(median |error| against the nearest {sm['median_abs_best_error']:.0%}); within the measured "
                   f"range widened by {tol:.0%}: {sm['in_range']}/{sm['of']}")
        out.append(f"  trees measured more than once: {sm['several']}, whose measurements differ by more than "
                   f"{tol:.0%}: {sm['spread_over_tol']}; on them: within {tol:.0%} of one {sm['within_one_several']}"
                   f"/{sm['several']}, in the widened range {sm['in_range_several']}/{sm['several']}")
        out.append("  against each study alone: " + "; ".join(
            f"{s} {v['within']}/{v['of']} within {tol:.0%} (median |error| "
            f"{'-' if v['median_abs_error'] is None else format(v['median_abs_error'], '.0%')})"
            for s, v in sm["per_study"].items()))
        out.append("")
    if res.get("cpu"):
        out.append("throughput at the users each measurement saturated: simulated / measured calls/s = CPU used "
                   "(simulated % / measured %, tree and load generator) x CPU per call (measured / simulated)")
        for r in res["rows"]:
            for c in r.get("cpu", ()):
                out.append(f"{r['n']:5d} {r['shape']:6s} {c['study']:>{width}s} {c['users']:3d} users: "
                           f"{c['rps_ratio']:5.2f} = {c['simulated_cpu_pct']:4.0f}% / {c['measured_cpu_pct']:4.0f}% "
                           f"({c['share_ratio']:4.2f}) x {c['measured_us_per_call']:6.0f} / "
                           f"{c['simulated_us_per_call']:6.0f} us ({c['per_call_ratio']:4.2f})")
        for name, what in (("all", "every measurement"), ("small", f"trees of <= {SMALL_TREE} SeDs"),
                           ("large", f"trees of > {SMALL_TREE} SeDs")):
            c = res["cpu"].get(name)
            if c:
                kinds = c.get("per_call_ratio_by_kind") or {}
                out.append(f"  medians, {what} ({c['of']}): calls/s ratio {c['rps_ratio']:.2f}, CPU used "
                           f"{c['share_ratio']:.2f} (measured {c['measured_cpu_pct']:.0f}% of 200%), CPU per call "
                           f"{c['per_call_ratio']:.2f}"
                           + (" (" + ", ".join(f"{k} {v:.2f}" for k, v in kinds.items()) + ")" if kinds else ""))
        out.append("")
    out.append("best shape by discovery median, among the trees each study measured:")
    for n, by in res["best_shape"].items():
        out.append(f"{n:5d} SeDs: " + "; ".join(
            f"{s} measured {by[s]['measured']}, predicted {by[s]['predicted']}" for s in labels if s in by))
    return "\n".join(out)
