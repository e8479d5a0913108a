"""Three-stage pipeline on big float64 arrays: produce -> transform -> reduce,
each stage on a different SeD. Through the client (every array comes back and
goes out again) vs server to server (references and pending calls as
arguments). Ray (ObjectRef passing) and Dask (futures) when installed.

    PYTHONPATH=. python -m benchmarks.data_pipeline [--mb 32] [--repeat 3] [--json PATH]

Rows: wall time (median of ``--repeat``) and bytes through the client.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np


def _gridrpc(n: int, repeat: int, isolation: str = "process") -> list[dict]:
    import gridrpc
    from gridrpc.examples import services as S
    from gridrpc.sed.data.store import DataConfig
    from gridrpc.testing import LocalTree
    rows = []
    with LocalTree(las=1, seds_per_la=3, services=S.ALL + S.DATA, http=False,
                   sed_options={"data": DataConfig(memory_bytes=4 << 30), "max_message_size": 1 << 31,
                                "isolation": isolation}) as t, \
            gridrpc.Client(t.ma_address, user="bench", timeout=300, max_message_size=1 << 31) as c:
        s1, s2, s3 = t.sed_names()[:3]
        c.call("produce", 10, server=s1), c.call("transform", [1.0], server=s2), c.call("reduce_sum", [1], server=s3)

        def via_client():
            a = c.call("produce", n, server=s1)
            b = c.call("transform", a, server=s2)
            return c.call("reduce_sum", b, server=s3), 2 * a.nbytes + 2 * b.nbytes

        def s2s():
            d = c.aclient.data
            before = d.bytes_sent + d.bytes_received
            p = c.submit("produce", n, keep_result=True, server=s1)
            q = c.submit("transform", p, keep_result="volatile", server=s2)
            r = c.call("reduce_sum", q, server=s3)
            c.free(p.result())
            return r, d.bytes_sent + d.bytes_received - before     # data requests; calls carry only headers

        for name, fn in (("through the client", via_client), ("server to server", s2s)):
            times, moved, val = [], 0, None
            for _ in range(repeat):
                t0 = time.perf_counter()
                val, moved = fn()
                times.append(time.perf_counter() - t0)
            rows.append({"system": f"gridrpc/{isolation}", "mode": name, "wall_s": statistics.median(times),
                         "client_bytes": moved, "result": val})
    return rows


def _ray(n: int, repeat: int) -> list[dict]:
    try:
        import ray
    except ImportError:
        return [{"system": "ray", "mode": "ObjectRef passing", "skipped": "ray not installed"}]
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    produce = ray.remote(lambda n: np.full(n, 1.0))
    transform = ray.remote(lambda a: a * 2.0 + 1.0)
    reduce_ = ray.remote(lambda a: float(np.sum(a)))
    ray.get(reduce_.remote(transform.remote(produce.remote(10))))
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        v = ray.get(reduce_.remote(transform.remote(produce.remote(n))))
        times.append(time.perf_counter() - t0)
    ray.shutdown()
    return [{"system": "ray", "mode": "ObjectRef passing", "wall_s": statistics.median(times), "client_bytes": 0,
             "result": v}]


def _dask(n: int, repeat: int) -> list[dict]:
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        return [{"system": "dask", "mode": "futures", "skipped": "dask.distributed not installed"}]
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None) as cl, \
            Client(cl) as c:
        w = list(c.scheduler_info()["workers"])
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            a = c.submit(np.full, n, 1.0, workers=w[0], pure=False)
            b = c.submit(lambda x: x * 2.0 + 1.0, a, workers=w[1], pure=False)
            v = c.submit(lambda x: float(np.sum(x)), b, workers=w[2], pure=False).result()
            times.append(time.perf_counter() - t0)
    return [{"system": "dask", "mode": "futures", "wall_s": statistics.median(times), "client_bytes": 0,
             "result": v}]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=int, default=32, help="array size in MB (the issue asks 100; 32 on a shared box)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--only", default="gridrpc,ray,dask")
    p.add_argument("--json", default=None)
    p.add_argument("--isolation", default="process,inline", help="SeD back-ends to measure")
    a = p.parse_args(argv)
    n = a.mb * 1_000_000 // 8
    rows = []
    for name, fn in (("gridrpc", _gridrpc), ("ray", _ray), ("dask", _dask)):
        if name in a.only.split(","):
            if name == "gridrpc":
                for iso in a.isolation.split(","):
                    rows += fn(n, a.repeat, iso)
            else:
                rows += fn(n, a.repeat)
    print(f"pipeline produce -> transform -> reduce, {a.mb} MB float64, 3 SeDs/workers, median of {a.repeat}")
    print(f"{'system':16} {'mode':20} {'wall s':>8} {'MB via client':>14}")
    for r in rows:
        if "skipped" in r:
            print(f"{r['system']:16} {r['mode']:20} {'-':>8} {'-':>14}  ({r['skipped']})")
        else:
            print(f"{r['system']:16} {r['mode']:20} {r['wall_s']:8.3f} {r['client_bytes'] / 1e6:14.1f}")
    for iso in a.isolation.split(","):
        g = {r["mode"]: r["wall_s"] for r in rows if r["system"] == f"gridrpc/{iso}"}
        if len(g) == 2:
            print(f"gridrpc/{iso}: server to server speed-up {g['through the client'] / g['server to server']:.2f}x")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"mb": a.mb, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
