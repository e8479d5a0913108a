"""Targets (issues 2 and 5, and the cost of CURVE) and the printed tables."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


def _get(res: dict, item: str, *path: str):
    v = res.get(item)
    for p in path:
        if not isinstance(v, dict):
            return None
        v = v.get(p)
    return v


def med(res, item):
    return _get(res, item, "median_ms")


def rate(res, item):
    return _get(res, item, "calls_per_s", "median")


def gbs(res, item):
    return _get(res, item, "gb_per_s")


# CURVE items: (item, kind, target on secure / plain time per call or None). The
# plain item is the name without ``_curve``, measured in the same run.
SECURITY = [("call_discovery_curve", "lat", None), ("call_bound_curve", "lat", 1.15),
            ("throughput_bound_curve", "rate", None), ("array_8mb_curve", "bw", 1.50)]


def plain_of(item: str) -> str:
    return item.removesuffix("_curve")


def ms_per_call(res, item, kind):
    """Time per call in ms: the median latency / round trip, or 1000 / rate."""
    if kind == "rate":
        r = rate(res, item)
        return 1e3 / r if r else None
    return med(res, item)


def security_ratio(res, item, kind="lat"):
    """Secure / plain time per call (> 1: CURVE is slower); None if either is missing."""
    s, p = ms_per_call(res, item, kind), ms_per_call(res, plain_of(item), kind)
    return s / p if s and p else None


def _cpu_total(res, item):
    c = _get(res, item, "cpu_us_per_call")
    return sum(c.values()) if c else None


def security_cost(res: dict) -> dict:
    """The JSON section: per CURVE item, plain and secure time per call, ratio, CPU."""
    out = {}
    for item, kind, limit in SECURITY:
        ratio = security_ratio(res, item, kind)
        if ratio is None:
            continue
        cs, cp = _cpu_total(res, item), _cpu_total(res, plain_of(item))
        out[item] = {"plain_item": plain_of(item), "plain_ms_per_call": ms_per_call(res, plain_of(item), kind),
                     "curve_ms_per_call": ms_per_call(res, item, kind), "ratio": round(ratio, 4),
                     "cost_pct": round((ratio - 1) * 100, 1),
                     "cpu_us_per_call": {"plain": cp, "curve": cs} if cs and cp else None,
                     "cpu_ratio": round(cs / cp, 4) if cs and cp else None,
                     "target_ratio": limit, "met": None if limit is None else ratio <= limit}
    return out


SILENT_NOISE_MS = 0.5      # "adds nothing": within this of the same requests with every child alive


def stale_worst(res):
    """Worst trial of the staleness row (view): ms until the view shows the
    busy SeD busy; inf when a trial never saw it busy within its polls."""
    st = _get(res, "view_staleness", "view")
    if not isinstance(st, dict):
        return None
    if st.get("never_seen_busy"):
        return float("inf")
    return _get(st, "busy_seen_ms", "max") if isinstance(st.get("busy_seen_ms"), dict) else None


def silent_added(res, kind, mode="view", what="added_median_ms"):
    """Added median (ms) with the child frozen; for the view the worse of the
    whole window and its phases (snapshot still fresh / stale), when measured."""
    whole = _get(res, "view_silent", kind, mode, what)
    if mode != "view" or what != "added_median_ms" or whole is None:
        return whole
    phases = [_get(res, "view_silent", kind, mode, f"added_median_{p}_ms") for p in ("fresh", "stale")]
    return max([whole, *(x for x in phases if x is not None)])


@dataclass(frozen=True)
class Target:
    key: str
    text: str
    item: str
    check: Callable[[dict], bool | None]    # None: cannot tell (something missing)
    value: Callable[[dict], str]


def _ok(*xs):
    return all(x is not None for x in xs)


def _t(fn):
    def wrapped(r):
        try:
            return fn(r)
        except TypeError:       # a None in the arithmetic: missing measurement
            return None
    return wrapped


TARGETS = [
    Target("discovery_call_3ms", "call with discovery: median <= 3 ms", "call_discovery",
           _t(lambda r: med(r, "call_discovery") <= 3.0), lambda r: f"{med(r, 'call_discovery'):.2f} ms"),
    Target("discovery_call_vs_ray", "call with discovery faster than Ray's no-op call", "call_discovery",
           _t(lambda r: med(r, "call_discovery") < med(r, "ray_call")),
           lambda r: f"{med(r, 'call_discovery'):.2f} vs {med(r, 'ray_call'):.2f} ms"),
    Target("discovery_call_vs_dask", "call with discovery >= 4x faster than Dask", "call_discovery",
           _t(lambda r: med(r, "dask_call") / med(r, "call_discovery") >= 4.0),
           lambda r: f"{med(r, 'dask_call') / med(r, 'call_discovery'):.1f}x faster"),
    Target("bound_call_floor", "bound call: median <= 1.5x the pyzmq floor", "call_bound",
           _t(lambda r: med(r, "call_bound") <= 1.5 * med(r, "floor_latency")),
           lambda r: f"{med(r, 'call_bound') / med(r, 'floor_latency'):.2f}x floor"),
    Target("bound_throughput", ">= 3,000 bound calls/s from one client", "throughput_bound",
           _t(lambda r: rate(r, "throughput_bound") >= 3000), lambda r: f"{rate(r, 'throughput_bound'):,.0f}/s"),
    # the second wave's targets (issue #12), same run as the peers
    Target("discovery_call_06_ray", "call with discovery <= 0.6x Ray's sequential no-op call", "call_discovery",
           _t(lambda r: med(r, "call_discovery") <= 0.6 * med(r, "ray_call")),
           lambda r: f"{med(r, 'call_discovery') / med(r, 'ray_call'):.2f}x Ray"),
    Target("bound_throughput_5000", ">= 5,000 bound calls/s from one client", "throughput_bound",
           _t(lambda r: rate(r, "throughput_bound") >= 5000), lambda r: f"{rate(r, 'throughput_bound'):,.0f}/s"),
    Target("discovery_throughput_2x_ray", "throughput with discovery >= 2x Ray's", "throughput_discovery",
           _t(lambda r: rate(r, "throughput_discovery") >= 2 * rate(r, "ray_throughput")),
           lambda r: f"{rate(r, 'throughput_discovery') / rate(r, 'ray_throughput'):.2f}x Ray"),
    Target("array_8mb_15", "8 MB round trip through a worker >= 1.5 GB/s", "array_8mb",
           _t(lambda r: gbs(r, "array_8mb") >= 1.5), lambda r: f"{gbs(r, 'array_8mb'):.2f} GB/s"),
    Target("discovery_throughput", ">= 800 calls/s with discovery from one client", "throughput_discovery",
           _t(lambda r: rate(r, "throughput_discovery") >= 800),
           lambda r: f"{rate(r, 'throughput_discovery'):,.0f}/s"),
    Target("discovery_throughput_peers", "throughput with discovery above Ray and Dask", "throughput_discovery",
           _t(lambda r: rate(r, "throughput_discovery") > max(rate(r, "ray_throughput"), rate(r, "dask_throughput"))),
           lambda r: f"{rate(r, 'throughput_discovery'):,.0f} vs {rate(r, 'ray_throughput'):,.0f} / "
                     f"{rate(r, 'dask_throughput'):,.0f}/s"),
    Target("array_8mb", "8 MB round trip >= 1 GB/s", "array_8mb",
           _t(lambda r: gbs(r, "array_8mb") >= 1.0), lambda r: f"{gbs(r, 'array_8mb'):.2f} GB/s"),
    Target("curve_bound_call", "CURVE bound call: <= 1.15x the plain bound call (same run)", "call_bound_curve",
           _t(lambda r: security_ratio(r, "call_bound_curve") <= 1.15),
           lambda r: f"{security_ratio(r, 'call_bound_curve'):.2f}x plain"),
    Target("curve_8mb", "CURVE 8 MB round trip: <= 1.5x the plain round trip (same run)", "array_8mb_curve",
           _t(lambda r: security_ratio(r, "array_8mb_curve", "bw") <= 1.50),
           lambda r: f"{security_ratio(r, 'array_8mb_curve', 'bw'):.2f}x plain"),
    Target("blocking_discovery_call", "blocking Client, call with discovery: <= 1.1x the AsyncClient's "
           "(same run)", "call_discovery_sync",
           _t(lambda r: med(r, "call_discovery_sync") <= 1.1 * med(r, "call_discovery")),
           lambda r: f"{med(r, 'call_discovery_sync') / med(r, 'call_discovery'):.2f}x AsyncClient"),
    Target("blocking_bound_call", "blocking Client, bound call: <= 1.1x the AsyncClient's (same run)",
           "call_bound_sync", _t(lambda r: med(r, "call_bound_sync") <= 1.1 * med(r, "call_bound")),
           lambda r: f"{med(r, 'call_bound_sync') / med(r, 'call_bound'):.2f}x AsyncClient"),
    Target("discovery_100", "discovery with 100 SeDs: median <= 15 ms", "discovery_100",
           _t(lambda r: med(r, "discovery_100") <= 15.0), lambda r: f"{med(r, 'discovery_100'):.2f} ms"),
    # discovery from pushed state (issue #12, benchmarks/view.py)
    Target("view_stale_50ms", "staleness: a busy SeD stops being chosen (the view shows it busy) within 50 ms, worst trial",
           "view_staleness", _t(lambda r: stale_worst(r) <= 50.0),
           lambda r: f"median {_get(r, 'view_staleness', 'view', 'busy_seen_ms', 'median'):.1f}, "
                     f"worst {stale_worst(r):.1f} ms"),
    Target("view_silent_child", f"one silent child: adds nothing, view median <= all alive + {SILENT_NOISE_MS} ms "
           "(SeD, LA frozen; worst phase)", "view_silent",
           _t(lambda r: max(silent_added(r, "sed"), silent_added(r, "la")) <= SILENT_NOISE_MS),
           lambda r: f"SeD {silent_added(r, 'sed'):+.2f} ms, LA {silent_added(r, 'la'):+.2f} ms"),
    Target("view_scale_2000", "discovery over 2,000 SeDs: p99 <= 10 ms (view)", "view_scale_2000",
           _t(lambda r: _get(r, "view_scale_2000", "view", "p99_ms") <= 10.0),
           lambda r: f"p99 {_get(r, 'view_scale_2000', 'view', 'p99_ms'):.2f} ms"),
    # many independent load-test clients (benchmarks/green_load.py), same run
    Target("load_discovery_08", "64 independent clients: with discovery >= 0.8x bound (same run)", "load_discovery",
           _t(lambda r: rate(r, "load_discovery") >= 0.8 * rate(r, "load_bound")),
           lambda r: f"{rate(r, 'load_discovery') / rate(r, 'load_bound'):.2f}x bound"),
    Target("load_no_failure", "64 independent clients: no failed call", "load_discovery",
           _t(lambda r: _get(r, "load_bound", "failed") + _get(r, "load_discovery", "failed") == 0),
           lambda r: f"{_get(r, 'load_bound', 'failed')} bound, {_get(r, 'load_discovery', 'failed')} with discovery"),
    Target("idle_sed_rss", "idle SeD <= 60 MB RSS", "memory_sed",
           _t(lambda r: _get(r, "memory_sed", "rss_mb") <= 60.0),
           lambda r: f"{_get(r, 'memory_sed', 'rss_mb'):.1f} MB"),
]


def evaluate(res: dict) -> list[dict]:
    out = []
    for t in TARGETS:
        ok = t.check(res)
        try:
            val = t.value(res)
        except TypeError:
            val = "-"
        out.append({"key": t.key, "target": t.text, "item": t.item, "measured": val,
                    "status": "n/a" if ok is None else "PASS" if ok else "SHORT"})
    return out


def _speed(ours: float | None, theirs: float | None, lower_is_better: bool) -> str:
    """'2.1x faster' / '3.4x slower' (ours compared with theirs)."""
    if not ours or not theirs:
        return ""
    f = theirs / ours if lower_is_better else ours / theirs
    return f"{f:.2f}x faster" if f >= 1 else f"{1 / f:.2f}x slower"


def _marks(targets: list[dict], item: str) -> str:
    ts = [t for t in targets if t["item"] == item]
    return " ".join(t["status"] for t in ts)


def _target_texts(targets, item):
    return "; ".join(t["target"].split(": ", 1)[-1] for t in targets if t["item"] == item)


ROWS = [
    # item, label, kind ("lat" | "rate" | "bw" | "mem" | "rep"), comparisons (floor, ray, dask items)
    ("floor_latency", "floor: pyzmq asyncio DEALER->ROUTER echo, 1 in flight", "lat", (None, None, None)),
    ("floor_throughput", "floor: same, 64 in flight", "rate", (None, None, None)),
    ("floor_8mb", "floor: 8 MB array echo, copy=False", "bw", (None, None, None)),
    ("floor_hop_latency", "diagnostic: floor echo through a worker process (pipe), 1 in flight", "lat",
     ("floor_latency", None, None)),
    ("floor_rpc_latency", "diagnostic: least Python RPC through a worker (orjson, pickle), 1 in flight", "lat",
     ("floor_latency", None, None)),
    ("call_discovery", "gridrpc: add with discovery (MA->2 LAs->4 SeDs), AsyncClient", "lat",
     ("floor_latency", "ray_call", "dask_call")),
    ("call_discovery_curve", "gridrpc CURVE: add with discovery, AsyncClient", "lat",
     ("floor_latency", "ray_call", "dask_call")),
    ("call_bound", "gridrpc: add through a bound handle, AsyncClient", "lat",
     ("floor_latency", "ray_call", "dask_call")),
    ("call_bound_curve", "gridrpc CURVE: add through a bound handle, AsyncClient", "lat",
     ("floor_latency", "ray_call", "dask_call")),
    ("call_discovery_sync", "gridrpc: add with discovery, blocking Client", "lat",
     ("floor_latency", "ray_call", "dask_call")),
    ("call_bound_sync", "gridrpc: add through a bound handle, blocking Client", "lat",
     ("floor_latency", "ray_call", "dask_call")),
    ("throughput_bound", "gridrpc: async throughput, bound (256 in flight)", "rate",
     ("floor_throughput", "ray_throughput", "dask_throughput")),
    ("throughput_bound_curve", "gridrpc CURVE: async throughput, bound (256 in flight)", "rate",
     ("floor_throughput", "ray_throughput", "dask_throughput")),
    ("throughput_discovery", "gridrpc: async throughput, with discovery (256 in flight)", "rate",
     ("floor_throughput", "ray_throughput", "dask_throughput")),
    ("array_8mb", "gridrpc: 8 MB numpy echo, bound", "bw", ("floor_8mb", "ray_8mb", "dask_8mb")),
    ("array_8mb_curve", "gridrpc CURVE: 8 MB numpy echo, bound", "bw", ("floor_8mb", "ray_8mb", "dask_8mb")),
    ("discover_4", "diagnostic: discover(add) alone, 4 SeDs", "lat", ("floor_latency", None, None)),
    ("discover_4_fanout", "diagnostic: discover(add) alone, 4 SeDs, fan-out (max_age=0)", "lat",
     ("floor_latency", None, None)),
    ("call_discovery_ask", "diagnostic: add with discovery, every call asks the MA (reuse_discovery=0)", "lat",
     ("floor_latency", "ray_call", "dask_call")),
    ("throughput_discovery_ask", "diagnostic: throughput with discovery, every call asks the MA", "rate",
     ("floor_throughput", "ray_throughput", "dask_throughput")),
    ("call_bound_pinned", "diagnostic: bound add, SeD --cpus (one CPU), client on the other", "lat",
     ("floor_latency", "ray_call", "dask_call")),
    ("throughput_bound_pinned", "diagnostic: bound throughput, SeD --cpus (one CPU), client on the other", "rate",
     ("floor_throughput", "ray_throughput", "dask_throughput")),
    ("call_bound_inline", "diagnostic: bound add, SeD --isolation inline", "lat",
     ("floor_latency", "ray_call", "dask_call")),
    ("throughput_bound_inline", "diagnostic: bound throughput, SeD --isolation inline", "rate",
     ("floor_throughput", "ray_throughput", "dask_throughput")),
    ("array_8mb_inline", "diagnostic: 8 MB echo, SeD --isolation inline", "bw", ("floor_8mb", "ray_8mb", "dask_8mb")),
    ("load_bound", "gridrpc: 64 independent GreenClients, closed loop, bound, tree A", "rate",
     ("floor_throughput", "ray_throughput", "dask_throughput")),
    ("load_discovery", "gridrpc: 64 independent GreenClients (own reuse windows), closed loop, with discovery", "rate",
     ("floor_throughput", "ray_throughput", "dask_throughput")),
    ("discovery_100", "gridrpc: discover(add) over 100 SeDs (10 LAs x 10)", "lat", (None, None, None)),
    ("memory_sed", "gridrpc: idle SeD process (--examples)", "mem", (None, None, None)),
    ("memory_replicas", "gridrpc: cost per extra replica (--replicas 100)", "rep", (None, None, None)),
    ("ray_call", "Ray: sequential no-op remote call", "lat", ("floor_latency", None, None)),
    ("ray_throughput", "Ray: N no-op calls then get", "rate", ("floor_throughput", None, None)),
    ("ray_8mb", "Ray: 8 MB echo", "bw", ("floor_8mb", None, None)),
    ("dask_call", "Dask: submit(noop).result(), 1 worker", "lat", ("floor_latency", None, None)),
    ("dask_throughput", "Dask: N submits then gather", "rate", ("floor_throughput", None, None)),
    ("dask_8mb", "Dask: 8 MB echo", "bw", ("floor_8mb", None, None)),
]


def _fmt_main(res, item, kind):
    r = res[item]
    if kind == "lat":
        return f"{r['median_ms']:.3f} ms", f"p99 {r['p99_ms']:.2f} ms"
    if kind == "rate":
        detail = f"n={r['n']}"
        if "failed" in r:           # many clients (benchmarks/green_load.py)
            detail += (f", {r['failed']} failed, {r['clients']} clients in {r['load_processes']} processes "
                       f"(busiest at {r['load_process_cpu_pct_max']:.0f} % of a core)")
        return f"{r['calls_per_s']['median']:,.0f} calls/s", detail
    if kind == "bw":
        return f"{r['gb_per_s']:.2f} GB/s", f"{r['median_ms']:.1f} ms/rt"
    if kind == "mem":
        return f"{r['rss_mb']:.1f} MB RSS", f"PSS {r['pss_mb']:.1f} MB, +{r['workers']} worker"
    if kind == "rep":
        return f"{r['per_replica_kb']:.0f} KB", f"RSS {r['rss_mb']:.1f} MB for {r['replicas']}"
    return "", ""


def _value(res, item, kind):
    if item not in res:
        return None
    return {"lat": med, "rate": rate, "bw": gbs}.get(kind, lambda r, i: None)(res, item)


def table(res: dict, targets: list[dict], skipped: dict) -> str:
    head = "| measurement | value | detail | vs floor | vs Ray | vs Dask | target | mark |"
    lines = [head, "|" + "---|" * 8]
    for item, label, kind, (fl, ray, dask) in ROWS:
        if item not in res:
            if item in skipped:
                lines.append(f"| {label} | skipped | {skipped[item]} | | | | {_target_texts(targets, item)} | n/a |")
            continue
        val, detail = _fmt_main(res, item, kind)
        if item.endswith("_curve") and security_ratio(res, item, kind):
            detail += f", {security_ratio(res, item, kind):.2f}x plain"
        ours = _value(res, item, kind)
        lower = kind == "lat"
        cmp = [_speed(ours, _value(res, c, kind), lower) if c else "" for c in (fl, ray, dask)]
        lines.append(f"| {label} | {val} | {detail} | {cmp[0]} | {cmp[1]} | {cmp[2]} | "
                     f"{_target_texts(targets, item)} | {_marks(targets, item)} |")
    return "\n".join(lines)


def security_table(res: dict, cost: dict, targets: list[dict]) -> str:
    """CURVE rows next to their plain rows of the same run (``security_cost``);
    the ratio is secure / plain time per call (latency, 1 / rate, round trip)."""
    if not cost:
        return ""
    rows = {item: (label, kind) for item, label, kind, _c in ROWS}
    lines = ["| security cost | plain | CURVE | secure / plain time | CPU µs per call, plain -> CURVE "
             "| target | mark |", "|---|---|---|---|---|---|---|"]
    for item, c in cost.items():
        label, kind = rows[item]
        cpu = c["cpu_us_per_call"]
        cpu = f"{cpu['plain']:.0f} -> {cpu['curve']:.0f} ({c['cpu_ratio']:.2f}x)" if cpu else ""
        lines.append(f"| {label.removeprefix('gridrpc CURVE: ')} | {_fmt_main(res, plain_of(item), kind)[0]} "
                     f"| {_fmt_main(res, item, kind)[0]} | {c['ratio']:.2f}x ({c['cost_pct']:+.0f} %) | {cpu} "
                     f"| {_target_texts(targets, item)} | {_marks(targets, item)} |")
    return "\n".join(lines)


def _lat2(d) -> str:
    return f"{d['median_ms']:.2f} / {d['p99_ms']:.2f} ms" + (f" ({d['errors']} failed)" if d.get("errors") else "")


def _view_rows(res: dict) -> list[tuple[str, str, str, str]]:
    """(item, label, view, fan-out) for the rows of benchmarks/view.py present in ``res``."""
    rows = []
    d = res.get("view_discovery_4")
    if d:
        rows.append(("view_discovery_4", "discover(add, 3), MA -> 2 LAs -> 4 SeDs, sequential: median / p99",
                     _lat2(d["view"]), _lat2(d["fanout"])))
    h = res.get("view_herd")
    if h:
        def herd(x):
            return (f"max {x['max_on_one']['max']} on one server (median {x['max_on_one']['median']:g}), "
                    f"{x['servers_used']['min']}-{x['servers_used']['max']}/8 servers used, done in "
                    f"{x['completion_s']['median']:.2f} s (worst {x['completion_s']['max']:.2f}), "
                    f"{x['extra_attempts']['median']:g} busy retries")
        ideal = h["ideal"]
        rows.append(("view_herd", f"herd: 16 clients x sleep at once on 8 single-slot SeDs, {len(h['view']['rounds'])} "
                     f"rounds (ideal: {ideal['max_on_one']} on one, 8 used, {ideal['completion_s']:.2f} s)",
                     herd(h["view"]), herd(h["fanout"])))
    st = res.get("view_staleness")
    if st:
        def stale(x):
            b = x.get("busy_seen_ms")
            txt = f"median {b['median']:.1f} ms, worst {b['max']:.1f} ms" if b else "never"
            if x.get("never_seen_busy"):
                txt += f", {x['never_seen_busy']} trial(s) never"
            return txt + f" ({len(x['trials'])} trials)"
        rows.append(("view_staleness", "staleness: a bound call makes SeD X busy; polled discovery shows X busy after",
                     stale(st["view"]), stale(st["fanout"])))
    si = res.get("view_silent")
    if si:
        for kind, what in (("sed", "a SeD process"), ("la", "an LA")):
            if kind not in si:
                continue

            def added(x):
                txt = (f"{x['added_median_ms']:+.2f} ms median, {x['added_p99_ms']:+.1f} ms p99 "
                       f"(frozen {x['frozen']['median_ms']:.2f} / {x['frozen']['p99_ms']:.1f} ms, n={x['frozen']['n']})")
                if "frozen_stale" in x:
                    txt += (f"; first 1.5 s {x['added_median_fresh_ms']:+.2f} ms median, after "
                            f"{x['added_median_stale_ms']:+.2f} ms median (n={x['frozen_stale']['n']})")
                return txt
            rows.append(("view_silent", f"one silent child: {what} frozen (SIGSTOP), added vs all alive",
                         added(si[kind]["view"]), added(si[kind]["fanout"])))
    for n in (500, 2000):
        x = res.get(f"view_scale_{n}")
        if x:
            rows.append((f"view_scale_{n}", f"discover(add, 10) over {n:,} SeDs (4 LAs x --replicas {n // 4}): "
                         "median / p99", _lat2(x["view"]), _lat2(x["fanout"])))
    return rows


def view_table(res: dict, targets: list[dict], skipped: dict | None = None) -> str:
    """Discovery from pushed state (issue #12): the view against the forced
    fan-out (``max_age=0``), same run, with the targets next to the rows."""
    rows = _view_rows(res)
    skipped = {k: v for k, v in (skipped or {}).items() if k.startswith("view_")}
    if not rows and not skipped:
        return ""
    lines = ["| discovery from pushed state | view (default) | fan-out (max_age=0) | target | mark |",
             "|---|---|---|---|---|"]
    marked: set[str] = set()
    for item, label, v, f in rows:
        first = item not in marked        # the two silent-child rows share one target
        marked.add(item)
        lines.append(f"| {label} | {v} | {f} | {_target_texts(targets, item) if first else ''} "
                     f"| {_marks(targets, item) if first else ''} |")
    for item, why in skipped.items():
        lines.append(f"| {item} | skipped | {why} | {_target_texts(targets, item)} | n/a |")
    return "\n".join(lines)


def targets_table(targets: list[dict]) -> str:
    lines = ["| target | measured | mark |", "|---|---|---|"]
    lines += [f"| {t['target']} | {t['measured']} | {t['status']} |" for t in targets]
    return "\n".join(lines)


def cpu_table(res: dict) -> str:
    """CPU microseconds per call, by process role (idle rate subtracted)."""
    roles = ("client", "ma", "la", "sed", "workers")
    rows = [(item, label) for item, label, _k, _c in ROWS if isinstance(res.get(item), dict)
            and res[item].get("cpu_us_per_call")]
    if not rows:
        return ""
    lines = ["| CPU µs per call | " + " | ".join(roles) + " | total |", "|---" * (len(roles) + 2) + "|"]
    for item, label in rows:
        c = res[item]["cpu_us_per_call"]
        lines.append(f"| {label} | " + " | ".join(f"{c.get(r, 0):.0f}" for r in roles)
                     + f" | {sum(c.get(r, 0) for r in roles):.0f} |")
    return "\n".join(lines)
