"""Peers: the same workloads on Ray and Dask distributed, each run in its own
subprocess (``python -m benchmarks.peers ray|dask [--quick]``, one JSON line
on stdout) so that their runtimes start clean and are torn down with it.

- Ray (``ray.init`` on this machine, no dashboard): sequential no-op remote
  call ``ray.get(noop.remote())``; N ``noop.remote()`` then one ``ray.get``;
  8 MB array round trip ``ray.get(echo.remote(arr))``.
- Dask (``LocalCluster(n_workers=1, threads_per_worker=1, processes=True)``):
  ``client.submit(noop, pure=False).result()``; N submits then ``gather``;
  8 MB round trip ``client.submit(echo, arr, pure=False).result()``.

GB/s counts both directions (2 x 8 MiB per round trip), as for gridrpc.
"""
from __future__ import annotations

import json
import os
import sys
import time

from .stats import latency

MB8 = 8 * 1024 * 1024


def noop():
    return None


def echo(x):
    return x


def _seq(fn, warmup, n):
    out = []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            out.append(time.perf_counter() - t0)
    return latency(out)


def _bw(fn, warmup, n):
    lat = _seq(fn, warmup, n)
    lat["gb_per_s"] = 2 * MB8 / (lat["median_ms"] / 1e3) / 1e9
    return lat


def _rate(fn, n, repeat):
    vals = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(n)
        vals.append(n / (time.perf_counter() - t0))
    import statistics
    return {"calls_per_s": {"median": statistics.median(vals), "all": vals}, "n": n}


def run_ray(quick: bool) -> dict:
    import numpy as np
    import ray
    t0 = time.monotonic()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR",
             log_to_driver=False, configure_logging=False)
    setup = time.monotonic() - t0
    try:
        rnoop = ray.remote(noop)
        recho = ray.remote(echo)
        arr = np.random.default_rng(0).random(MB8 // 8)
        ray.get([rnoop.remote() for _ in range(200)])       # warm workers
        res = {"ray_call": _seq(lambda: ray.get(rnoop.remote()), 50, 300 if quick else 2000)}
        _rate(lambda n: ray.get([rnoop.remote() for _ in range(n)]), 500, 1)   # warm-up
        res["ray_throughput"] = _rate(lambda n: ray.get([rnoop.remote() for _ in range(n)]),
                                      1000 if quick else 10000, 1 if quick else 3)

        def rt():
            back = ray.get(recho.remote(arr))
            assert back.shape == arr.shape
        res["ray_8mb"] = _bw(rt, 3, 5 if quick else 30)
        res["_setup_s"] = {"ray_init": setup}
        res["_version"] = {"ray": ray.__version__}
        return res
    finally:
        ray.shutdown()


def run_dask(quick: bool) -> dict:
    import dask
    import distributed
    import numpy as np
    from distributed import Client, LocalCluster
    t0 = time.monotonic()
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None)
    client = Client(cluster)
    setup = time.monotonic() - t0
    try:
        arr = np.random.default_rng(0).random(MB8 // 8)
        client.gather([client.submit(noop, pure=False) for _ in range(100)])
        res = {"dask_call": _seq(lambda: client.submit(noop, pure=False).result(), 20, 100 if quick else 500)}

        def many(n):
            client.gather([client.submit(noop, pure=False) for _ in range(n)])
        res["dask_throughput"] = _rate(many, 500 if quick else 2000, 1 if quick else 3)

        def rt():
            back = client.submit(echo, arr, pure=False).result()
            assert back.shape == arr.shape
        res["dask_8mb"] = _bw(rt, 3, 5 if quick else 30)
        res["_setup_s"] = {"dask_cluster": setup}
        res["_version"] = {"dask": dask.__version__, "distributed": distributed.__version__}
        return res
    finally:
        client.close()
        cluster.close()


def available(name: str) -> str | None:
    """None if the peer can run, else why not."""
    import importlib.util
    mods = {"ray": ["ray"], "dask": ["dask", "distributed"]}[name]
    missing = [m for m in mods if importlib.util.find_spec(m) is None]
    if missing:
        return (f"not installed ({', '.join(missing)}); pip install 'gridrpc[bench]' "
                f"or pip install {'ray' if name == 'ray' else 'dask[distributed]'}")
    return None


if __name__ == "__main__":
    import warnings
    warnings.filterwarnings("ignore")
    which, quick = sys.argv[1], "--quick" in sys.argv[2:]
    out = run_ray(quick) if which == "ray" else run_dask(quick)
    sys.stdout.flush()
    print("RESULT " + json.dumps(out), flush=True)
