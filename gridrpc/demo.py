"""``gridrpc demo``: a small tree on this machine (1 MA, 2 LAs, 4 SeDs as
separate processes on free loopback ports), a sample workload through it,
a report of what happened, then everything stopped."""
from __future__ import annotations

import socket
import statistics
import tempfile
import time

import numpy as np


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_demo(calls: int = 40) -> int:
    import gridrpc
    from .deploy.runner import Deployment
    from .deploy.spec import parse

    spec = parse({
        "master_agent": {"name": "MA", "host": "localhost", "port": _free_port(), "http_port": _free_port()},
        "local_agents": [{"name": "LA1", "parent": "MA"}, {"name": "LA2", "parent": "MA"}],
        "seds": [{"name": f"sed-{i}", "parent": f"LA{1 + (i - 1) // 2}", "examples": True,
                  "max_concurrent": 1} for i in range(1, 5)],
        "heartbeat": {"interval": 0.5, "timeout": 2.0},
    }, name="demo")
    with tempfile.TemporaryDirectory(prefix="gridrpc-demo-") as state:
        print("== starting a tree: 1 MA, 2 LAs, 4 SeDs (separate processes) ==", flush=True)
        dep = Deployment(spec, state_dir=state, progress=lambda s: print(s, flush=True))
        try:
            dep.up()
        except gridrpc.GridRPCError as exc:
            print(f"demo failed to start the tree: {exc}")
            return 1
        ma = dep.addresses["MA"]
        http = f"http://127.0.0.1:{spec.ma.http_port}"
        ok = True
        try:
            with gridrpc.Client(ma, user="demo") as c:
                print("\n== services ==")
                for name, meta in sorted(c.services().items()):
                    print(f"  {name:7s} on {len(meta['servers'])} server(s): {meta['doc'].splitlines()[0] if meta['doc'] else ''}")
                print("\n== sequential calls with discovery ==")
                lat = []
                for i in range(calls):
                    t = time.perf_counter()
                    assert c.call("add", i, i) == 2 * i
                    lat.append((time.perf_counter() - t) * 1000)
                print(f"  {calls} x add: median {statistics.median(lat):.2f} ms, max {max(lat):.2f} ms")
                print("\n== 8 concurrent sleep(0.5) calls over 4 single-slot SeDs ==")
                t = time.perf_counter()
                batch = [c.submit("sleep", 0.5) for _ in range(8)]
                done, _ = gridrpc.wait(batch, timeout=30)
                per_server: dict[str, int] = {}
                for b in batch:
                    per_server[b.server] = per_server.get(b.server, 0) + 1
                print(f"  {len(done)}/8 done in {time.perf_counter() - t:.2f} s; spread: {per_server}")
                print("\n== a numpy dgemm ==")
                a = np.random.default_rng(0).random((200, 200))
                r = c.call("dgemm", a, a, alpha=2.0)
                print(f"  dgemm(200x200): max error {float(np.abs(r - 2 * a @ a).max()):.2e}")
                print("\n== a failing service and a crashing worker: the SeD keeps serving ==")
                try:
                    c.call("fail", "this service always fails")
                except gridrpc.RemoteError as exc:
                    print(f"  RemoteError from {exc.server}: {exc.remote_type}: {exc.remote_message}")
                try:
                    c.call("exit", 7)
                except gridrpc.RemoteError as exc:
                    print(f"  {type(exc).__name__} from {exc.server}: {exc.remote_message}")
                print(f"  next call: add(20, 22) = {c.call('add', 20, 22)}")
                print("\n== cancel a running call ==")
                slow = c.submit("sleep", 30)
                t = time.perf_counter()
                while not slow.server and time.perf_counter() - t < 5:
                    time.sleep(0.01)
                time.sleep(0.3)
                slow.cancel()
                try:
                    slow.result(5)
                except gridrpc.CallCancelled:
                    print(f"  sleep(30) on {slow.server} cancelled after {time.perf_counter() - t:.2f} s "
                          "(its worker was killed)")
                print("\n== the tree, as the MA sees it (also at " + http + "/api/tree) ==")
                for e in c.tree():
                    print(f"  {e['name']:6s} {e['kind']:3s} parent={e.get('parent') or '-':4s} "
                          f"pid={e.get('pid')} services={len(e.get('services') or [])}")
        except Exception as exc:  # noqa: BLE001 - report, then stop the tree
            print(f"demo workload failed: {type(exc).__name__}: {exc}")
            ok = False
        finally:
            print("\n== stopping the tree ==")
            dep.down()
        print("demo finished" + ("" if ok else " with errors"))
        return 0 if ok else 1
