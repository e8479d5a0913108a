"""The scalability study: for trees of growing size and several shapes,
discovery latency, call throughput under locust load until saturation, and
the CPU use of every element. See docs/scalability.md.

    python -m benchmarks.scalability                       # the full study (24 min here)
    python -m benchmarks.scalability --quick               # sizes 1, 10, 50; 2 load steps
    python -m benchmarks.scalability --fanout              # MA and LAs --no-view: every discovery a fan-out
    python -m benchmarks.scalability --workers auto        # each load step: a locust master + a worker per core but one
    python -m benchmarks.scalability --sizes 500 --shapes flat,L2-4
    python -m benchmarks.scalability --plot-only           # redraw the PNGs from the JSON
    python -m benchmarks.scalability --compare 500 --shapes flat,L2-2,L2-4,L3-2
                                # those shapes at once, discoveries interleaved (noise-fair)

Each configuration: start the tree as real processes (``gridrpc ma|la|sed``,
SeDs as ``--replicas``), wait until the MA sees every SeD, sample idle CPU,
run sequential discoveries from one client (median, p99), then locust load
steps (``gridrpc loadtest``, mix ``noop``: a call with its discovery) with
more and more users until the throughput stops growing, sampling the CPU of
every element (a SeD process with its workers) and of every locust process.
Each step records the elements above 90 % of a core (``saturated``) and
whether a locust process was one (``load_generator_saturated``: the step
measured the load generator; the configuration's best rate is then flagged
as a lower bound, not the tree's capacity). Results go to JSON after each
configuration (``--resume`` skips the ones done); plots to PNG.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

from gridrpc.loadtest.cli import workers_arg

from .measure import (CpuMeter, discovery_cost, discovery_latency, element_kind, load_step, profile,
                      step_saturation, tmpdir)
from .tree import Shape, TreeProcs, default_shapes

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "benchmarks" / "scalability" / "results" / "latest.json"
DEFAULT_PLOTS = ROOT / "docs" / "scalability"
FULL_SIZES = (1, 10, 50, 100, 200, 500)
QUICK_SIZES = (1, 10, 50)


def shapes_for(n: int, spec: str | None, max_procs: int) -> list[Shape]:
    if spec and spec != "auto":
        shapes = [Shape.parse(s.strip()) for s in spec.split(",") if s.strip()]
    else:
        shapes = default_shapes(n)
        if n >= 200:       # the shapes that matter on 2 cores, and DIET's complete d-ary tree
            for extra in ("L2-4", f"L3-{max(2, round(n ** (1 / 3)))}"):
                s = Shape.parse(extra)
                if s not in shapes:
                    shapes.append(s)
    out = []
    for s in shapes:
        procs = len(s.elements(n)) if s.fits(n) else 0
        if s.fits(n) and procs <= max_procs:
            out.append(s)
    return out


def run_config(n: int, shape: Shape, a, log) -> dict:
    res: dict = {"n": n, "shape": shape.name, "levels": shape.levels, "d": shape.d,
                 "started": datetime.datetime.now().isoformat(timespec="seconds"),
                 "loadavg_before": os.getloadavg()[0], "git": git_version()}
    work = tmpdir(f"gridrpc-scal-{shape.name}-{n}-")
    t0 = time.monotonic()
    with TreeProcs(shape, n, work, hb=(a.hb_interval, a.hb_timeout), fanout=a.fanout) as tree:
        tree.start(timeout=240)
        res["procs"] = len(tree.procs)
        res["start_s"] = round(time.monotonic() - t0, 1)
        log(f"  {len(tree.procs)} processes up and {n} SeDs registered in {res['start_s']}s")
        meter = CpuMeter(tree.pids())
        meter.start()
        time.sleep(3.0)
        res["idle_cpu"] = meter.stop()
        before = tree.ma_counters()
        meter.start()
        res["discovery"] = discovery_latency(tree.ma_address, a.rounds, k=3,
                                             max_seconds=a.discovery_seconds)
        res["discovery_cpu"] = meter.stop()
        after = tree.ma_counters()
        d = res["discovery"]
        d["ma_counters"] = _delta(before, after)     # the mode check: view_answers 0 with --fanout
        log(f"  discovery: median {d['median_ms']:.1f} ms, p99 {d['p99_ms']:.1f} ms ({d['rounds']} rounds; "
            f"{d['ma_counters']['view_answers']} of {d['ma_counters']['discoveries']} from the MA's view)")
        if a.profile and n >= a.profile_min:
            res["profile"] = _profiles(tree, n, a, work, log)
        steps = []
        best = 0.0
        flat_steps = 0
        for users in a.users:
            st = load_step(tree.ma_address, users, a.step_seconds, a.max_requests, "noop", work, meter,
                           workers=a.workers)
            steps.append(st)
            if "error" in st:
                log(f"  {users:3d} users: locust failed: {st['error'][-300:]}")
                break
            log(f"  {users:3d} users: {st['rps']:7.1f} calls/s, median {st['median_ms']} ms, "
                f"p99 {st['p99_ms']} ms, failures {st['failures']}/{st['requests']}, "
                f"busiest {_busiest(st['cpu'])}"
                + (f"; LOAD GENERATOR SATURATED ({', '.join(st['saturated'])})"
                   if st["load_generator_saturated"] else ""))
            if st["requests"] and st["failures"] / st["requests"] > 0.05:
                break
            if st["rps"] > best * 1.1:
                best, flat_steps = st["rps"], 0
            else:
                flat_steps += 1
                if flat_steps >= 2:
                    break
            if (st["p99_ms"] or 0) > 5000:
                break
        res["load"] = steps
        res["load_ma_counters"] = _delta(after, tree.ma_counters())
        res["saturation"] = saturation(steps)
        res["loadavg_after"] = os.getloadavg()[0]
    return res


def _profiles(tree: TreeProcs, n: int, a, work: Path, log) -> dict:
    """py-spy on the MA and the busiest other element while discoveries run."""
    import threading
    meter = CpuMeter(tree.pids())
    meter.start()
    discovery_latency(tree.ma_address, 30, k=3, warmup=0, max_seconds=5)
    cpu = meter.stop()
    others = sorted((v, k) for k, v in cpu.items() if k != "MA")
    targets = ["MA"] + ([others[-1][1]] if others else [])
    out: dict = {}

    def rec(name: str) -> None:
        out[name] = profile(tree.by_name[name].pid, a.profile_seconds, work / f"profile-{name}.txt")

    threads = [threading.Thread(target=rec, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    time.sleep(0.5)
    discovery_latency(tree.ma_address, 100000, k=3, warmup=0, max_seconds=a.profile_seconds)
    for t in threads:
        t.join()
    for name, p in out.items():
        if p:
            log(f"  profile {name}: " + ", ".join(f"{f} {s}%" for f, s in p["own"][:5]))
    return out


def _delta(before: dict, after: dict) -> dict:
    """Counters grown between two :meth:`TreeProcs.ma_counters` (the view's
    size, ``view_snapshots``, as it is after)."""
    return {k: (v if k == "view_snapshots" or before.get(k) is None or v is None else v - before[k])
            for k, v in after.items()}


def _busiest(cpu: dict) -> str:
    if not cpu:
        return "-"
    name, v = max(cpu.items(), key=lambda kv: kv[1])
    return f"{name} {v:.0f}% (total {sum(cpu.values()):.0f}%)"


def saturation(steps: list[dict]) -> dict:
    """The best step (highest rate): its CPU by kind of element, its busiest
    element, the elements above ``SATURATED_PCT`` of a core, and whether a
    locust process was one of them (``load_generator_saturated``: then
    ``max_rps`` is what the load generator could send, a lower bound of the
    tree's capacity, not the capacity)."""
    ok = [s for s in steps if "rps" in s]
    if not ok:
        return {}
    top = max(ok, key=lambda s: s["rps"])
    cpu = top["cpu"]
    kinds = {"MA": 0.0, "LAs": 0.0, "SeDs": 0.0, "locust": 0.0}
    for name, v in cpu.items():
        kinds[element_kind(name)] += v
    name, busiest = max(cpu.items(), key=lambda kv: kv[1])
    sat = step_saturation(cpu)
    return {"max_rps": top["rps"], "users": top["users"], "median_ms": top["median_ms"], "p99_ms": top["p99_ms"],
            "cpu_by_kind": kinds, "busiest": name, "busiest_cpu": busiest, "total_cpu": sum(cpu.values()),
            "saturated": sat["saturated"], "load_generator_saturated": sat["load_generator_saturated"],
            "steps_load_generator_saturated": [s["users"] for s in ok if step_saturation(s["cpu"])[
                "load_generator_saturated"]]}


def best_shapes(runs: list[dict]) -> dict[int, dict]:
    """Per size: the shape with the lowest discovery p99 and the one with the
    highest throughput."""
    out: dict[int, dict] = {}
    for n in sorted({r["n"] for r in runs}):
        rs = [r for r in runs if r["n"] == n and r.get("discovery", {}).get("p99_ms") is not None]
        if not rs:
            continue
        lat = min(rs, key=lambda r: r["discovery"]["p99_ms"])
        thr = max(rs, key=lambda r: r.get("saturation", {}).get("max_rps", 0))
        out[n] = {"latency": lat["shape"], "p99_ms": lat["discovery"]["p99_ms"],
                  "throughput": thr["shape"], "max_rps": thr.get("saturation", {}).get("max_rps")}
    return out


def table(runs: list[dict]) -> str:
    lines = [f"{'SeDs':>5s} {'shape':7s} {'procs':>5s} {'disc med':>9s} {'disc p99':>9s} {'disc cpu':>9s} {'calls/s':>8s} "
             f"{'@users':>6s} {'call p99':>9s} {'MA%':>5s} {'LAs%':>5s} {'SeDs%':>6s} {'locust%':>7s} {'busiest':>18s}"
             "  note"]
    for r in sorted(runs, key=lambda r: (r["n"], r["levels"], r["d"])):
        d = r.get("discovery", {})
        s = r.get("saturation", {})
        k = s.get("cpu_by_kind", {})
        cost = discovery_cost(r)
        lines.append(f"{r['n']:5d} {r['shape']:7s} {r.get('procs', 0):5d} {_n(d.get('median_ms')):>9s} "
                     f"{_n(d.get('p99_ms')):>9s} {_n(sum(cost.values()) if cost else None):>9s} "
                     f"{_n(s.get('max_rps'), 1):>8s} {s.get('users', '-')!s:>6s} "
                     f"{_n(s.get('p99_ms'), 0):>9s} {_n(k.get('MA'), 0):>5s} {_n(k.get('LAs'), 0):>5s} "
                     f"{_n(k.get('SeDs'), 0):>6s} {_n(k.get('locust'), 0):>7s} "
                     f"{(s.get('busiest', '-') + ' ' + _n(s.get('busiest_cpu'), 0) + '%'):>18s}"
                     + ("  load generator saturated: calls/s is a lower bound" if s.get("load_generator_saturated")
                        else ""))
    return "\n".join(lines)


def _n(v, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scalability", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=None, help=f"SeD counts (default {','.join(map(str, FULL_SIZES))})")
    ap.add_argument("--shapes", default="auto",
                    help="flat, L2-D, L3-D, comma-separated, or auto (flat, L2-2, L2-sqrt(N), L3-2; "
                         "from 200 SeDs also L2-4 and L3-cbrt(N))")
    ap.add_argument("--users", default="1,2,4,8,16,32", help="locust users per load step (default 1,2,4,8,16,32)")
    ap.add_argument("--step-seconds", type=float, default=6.0, help="length of one load step (default 6)")
    ap.add_argument("--workers", type=workers_arg, default=0, metavar="N|auto",
                    help="locust workers of each load step (gridrpc loadtest --workers): N, or auto (one per core "
                         "but one); default 0: one locust process")
    ap.add_argument("--max-requests", type=int, default=20000, help="bound of one load step (default 20000)")
    ap.add_argument("--rounds", type=int, default=300, help="sequential discoveries measured (default 300)")
    ap.add_argument("--discovery-seconds", type=float, default=25.0,
                    help="at most this long measuring discoveries (default 25)")
    ap.add_argument("--max-procs", type=int, default=140, help="skip shapes needing more processes (default 140)")
    ap.add_argument("--hb-interval", type=float, default=1.0)
    ap.add_argument("--hb-timeout", type=float, default=5.0)
    ap.add_argument("--profile", action="store_true", help="py-spy the MA and the busiest element (large sizes)")
    ap.add_argument("--profile-min", type=int, default=500, help="profile from this many SeDs (default 500)")
    ap.add_argument("--profile-seconds", type=float, default=6.0)
    ap.add_argument("--fanout", action="store_true",
                    help="start the MA and the LAs with --no-view: every discovery is a fan-out, as before "
                         "discovery from pushed state (the stored study; the simulator's validation)")
    ap.add_argument("--quick", action="store_true", help=f"sizes {','.join(map(str, QUICK_SIZES))}, users 1,4")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help=f"results JSON (default {DEFAULT_OUT.relative_to(ROOT)})")
    ap.add_argument("--plots", default=str(DEFAULT_PLOTS), help="directory for the PNGs (default docs/scalability)")
    ap.add_argument("--resume", action="store_true", help="keep the configurations already in --out")
    ap.add_argument("--plot-only", action="store_true", help="only redraw the plots from --out")
    ap.add_argument("--compare", type=int, metavar="N",
                    help="run --shapes with N SeDs all at once and interleave discoveries between them "
                         "(results in compare-N.json next to --out; plot compare-N.png)")
    ap.add_argument("--blocks", type=int, default=8, help="--compare: rounds over the shapes (default 8)")
    ap.add_argument("--per-block", type=int, default=40, help="--compare: discoveries per shape and round (default 40)")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    out = Path(a.out)
    if a.quick:
        a.sizes = a.sizes or ",".join(map(str, QUICK_SIZES))
        a.users = "1,4"
        a.rounds = min(a.rounds, 100)
        a.step_seconds = min(a.step_seconds, 5.0)
    sizes = [int(x) for x in (a.sizes or ",".join(map(str, FULL_SIZES))).split(",")]
    a.users = [int(x) for x in str(a.users).split(",")]
    if a.plot_only:
        data = json.loads(out.read_text())
        _plot(data, a)
        print(table(data["runs"]))
        return 0
    if a.compare:
        return _compare(a, out)
    data = {"meta": meta(argv), "runs": []}
    data["meta"]["discovery_mode"] = "fanout" if a.fanout else "view"     # fanout: MA and LAs --no-view
    data["meta"]["locust_workers"] = a.workers                            # 0: one locust process per step
    timing = data["meta"]          # where this invocation's elapsed_s goes
    if a.resume and out.exists():
        old = json.loads(out.read_text())
        mode = old.get("meta", {}).get("discovery_mode", "view")
        if mode != data["meta"]["discovery_mode"]:
            print(f"--resume: {out} was measured with discovery_mode {mode!r}; "
                  f"{'give' if mode == 'fanout' else 'drop'} --fanout", file=sys.stderr)
            return 2
        data["runs"] = old.get("runs", [])
        if "meta" in old:          # the first run's meta stays; each resume is listed
            resumed = dict(data["meta"])
            data["meta"] = old["meta"]
            data["meta"]["resumes"] = old["meta"].get("resumes", []) + [
                {k: resumed[k] for k in ("date", "git", "command", "loadavg_start")}]
            timing = data["meta"]["resumes"][-1]
    done = {(r["n"], r["shape"]) for r in data["runs"]}
    out.parent.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, flush=True)

    t_all = time.monotonic()
    for n in sizes:
        for shape in shapes_for(n, a.shapes, a.max_procs):
            if (n, shape.name) in done:
                continue
            log(f"[{time.strftime('%H:%M:%S')}] {n} SeDs, {shape.name} (load avg {os.getloadavg()[0]:.1f})")
            try:
                r = run_config(n, shape, a, log)
            except Exception as exc:   # noqa: BLE001 - record and go on with the next configuration
                log(f"  failed: {type(exc).__name__}: {exc}")
                r = {"n": n, "shape": shape.name, "levels": shape.levels, "d": shape.d,
                     "error": f"{type(exc).__name__}: {exc}"[:2000]}
            data["runs"] = [x for x in data["runs"] if (x["n"], x["shape"]) != (n, shape.name)] + [r]
            timing["elapsed_s"] = round(time.monotonic() - t_all)
            data["best"] = {str(k): v for k, v in best_shapes([x for x in data["runs"] if "error" not in x]).items()}
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1))
            os.replace(tmp, out)
    print(table([r for r in data["runs"] if "error" not in r]))
    for n, b in sorted(data.get("best", {}).items(), key=lambda kv: int(kv[0])):
        print(f"{n:>5s} SeDs: lowest discovery p99 {b['latency']} ({b['p99_ms']:.1f} ms), "
              f"highest throughput {b['throughput']} ({b['max_rps']:.1f} calls/s)")
    _plot(data, a)
    print(f"results: {out}")
    return 0


def _compare(a, out: Path) -> int:
    from .compare import compare, plot_compare
    shapes = shapes_for(a.compare, a.shapes, a.max_procs)
    print(f"[{time.strftime('%H:%M:%S')}] {a.compare} SeDs, side by side: {', '.join(s.name for s in shapes)} "
          f"(load avg {os.getloadavg()[0]:.1f})", flush=True)
    t0 = time.monotonic()
    res = compare(a.compare, shapes, blocks=a.blocks, per_block=a.per_block, hb=(a.hb_interval, a.hb_timeout),
                  log=lambda m: print(m, flush=True))
    res["meta"] = meta(sys.argv[1:])
    res["meta"]["elapsed_s"] = round(time.monotonic() - t0)
    path = out.with_name(f"compare-{a.compare}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1))
    print(f"results: {path}")
    print(f"{'shape':8s} {'median':>8s} {'p90':>8s} {'p99':>8s} {'max':>8s}  block medians (ms)")
    for name, r in res["results"].items():
        print(f"{name:8s} {r['median_ms']:8.1f} {r['p90_ms']:8.1f} {r['p99_ms']:8.1f} {r['max_ms']:8.1f}  "
              + " ".join(f"{x:.0f}" for x in r["block_medians"]))
    print("idle CPU of each tree (heartbeats), % of one core: "
          + ", ".join(f"{k} {v:.0f}" for k, v in res["idle_cpu"].items()))
    try:
        print(f"plot: {plot_compare(res, Path(a.plots) / f'compare-{a.compare}.png')}")
    except ImportError as exc:
        print(f"no plot: {exc}", file=sys.stderr)
    return 0


def _plot(data: dict, a) -> None:
    try:
        from .plots import plot_all
    except ImportError as exc:     # matplotlib missing
        print(f"no plots: {exc}", file=sys.stderr)
        return
    for p in plot_all(data, Path(a.plots)):
        print(f"plot: {p}")


def git_version() -> str:
    """HEAD, and whether gridrpc/ differs from it: the tree's processes run
    the working copy, which others may be editing."""
    import subprocess
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "gridrpc"], cwd=ROOT, capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+uncommitted gridrpc/ changes" if dirty else "")


def meta(argv) -> dict:
    import zmq
    import psutil
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "git": git_version(),
            "command": "python -m benchmarks.scalability " + " ".join(argv if argv is not None else sys.argv[1:]),
            "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version(),
            "mem_gb": round(psutil.virtual_memory().total / 2 ** 30, 1), "loadavg_start": os.getloadavg()}


if __name__ == "__main__":
    sys.exit(main())
