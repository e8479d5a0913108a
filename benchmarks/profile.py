"""Profile the hot paths with py-spy, on the same real processes as the suite.

    python -m benchmarks.profile WORKLOAD [--seconds 10] [--rate 200] [--targets client,ma,la,sed]

WORKLOAD: ``bound_seq`` (sequential bound ``add``), ``discovery_seq``
(sequential ``add`` with discovery), ``bound_tp`` / ``discovery_tp`` (256 in
flight), ``array_8mb`` (bound ``echo`` of 8 MB), ``discovery_100`` (discover
over 100 SeDs; targets ma, la = LA1, sed = the first 10-replica process).

Each target process gets its own ``py-spy record --nonblocking`` (the SeD's
with ``--subprocesses`` so its worker processes count too); at the end the
collapsed stacks are summed per function: *self* (the leaf) and *inclusive*
(anywhere on the stack) as a percentage of that process's samples, and
*busy* = samples / (rate x seconds), i.e. the share of one core it used.
Needs ``pip install py-spy`` and ptrace rights (root or ptrace_scope 0).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import gridrpc

from .procs import Procs, child_env

WORKLOADS = ("bound_seq", "discovery_seq", "bound_tp", "discovery_tp", "array_8mb", "discovery_100")


def start_spy(pid: int, out: Path, rate: int, subprocesses: bool, gil: bool = False) -> subprocess.Popen:
    cmd = ["py-spy", "record", "--pid", str(pid), "--format", "raw", "--nolineno", "--nonblocking",
           "--rate", str(rate), "--output", str(out)]
    if gil:
        cmd.append("--gil")
    if subprocesses:
        cmd.append("--subprocesses")
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env(),
                            start_new_session=True)


def stop_spy(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


IDLE_LEAVES = ("EpollSelector.select (selectors.py)", "Connection._recv (multiprocessing/connection.py)",
               "_read (gridrpc/sed/worker_link.py)",      # a worker waiting for its next call (its pipe read)
               "select (selectors.py)", "poll (selectors.py)")


def analyse(path: Path, rate: int, seconds: float, top: int, ops: int = 0) -> str:
    """Per-function self and inclusive shares of the *busy* samples (samples
    whose leaf is not a wait in epoll or in a worker's pipe read)."""
    inclusive: collections.Counter = collections.Counter()
    self_: collections.Counter = collections.Counter()
    total = busy = 0
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        return f"  (no profile: {exc})"
    for line in lines:
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        n = int(n)
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        total += n
        if not frames or frames[-1] in IDLE_LEAVES:
            continue
        busy += n
        self_[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n
    if not busy:
        return f"  samples {total}, none busy"
    per_op = busy / rate / ops * 1e6 if ops else 0.0     # sampled CPU microseconds per operation
    out = [f"  samples {total}, busy {busy} = {100 * busy / (rate * seconds):.0f}% of one core"
           + (f", ~{per_op:.0f} us per operation" if ops else "")
           + " (shares below are of the busy samples; us = incl share x us per operation)",
           f"  {'incl%':>6} {'self%':>6} {'incl us':>8}  function"]
    shown = 0
    for f, n in inclusive.most_common():
        if n >= 0.985 * busy:       # the common roots (<module>, run_forever ...)
            continue
        out.append(f"  {100 * n / busy:6.1f} {100 * self_[f] / busy:6.1f} {per_op * n / busy:8.1f}  {f}")
        shown += 1
        if shown >= top:
            break
    out.append("  -- top self --")
    for f, n in self_.most_common(top // 2):
        out.append(f"  {100 * inclusive[f] / busy:6.1f} {100 * n / busy:6.1f} {per_op * inclusive[f] / busy:8.1f}  {f}")
    return "\n".join(out)


async def _workload(name: str, ma: str, bound_to: str, seconds: float) -> int:
    n = 0
    async with gridrpc.AsyncClient(ma) as c:
        h = c.handle("add", server=await c.resolve(bound_to))
        e = c.handle("echo", server=await c.resolve(bound_to))
        arr = np.random.default_rng(0).random(1 << 20)
        end = time.monotonic() + seconds
        if name in ("bound_tp", "discovery_tp"):
            sem = asyncio.Semaphore(256)
            fn = h if name == "bound_tp" else (lambda *a: c.call("add", *a))

            async def one():
                async with sem:
                    await fn(1, 2)
            while time.monotonic() < end:
                await asyncio.gather(*(one() for _ in range(1000)))
                n += 1000
            return n
        while time.monotonic() < end:
            if name == "bound_seq":
                await h(1, 2)
            elif name == "discovery_seq":
                await c.call("add", 1, 2)
            elif name == "array_8mb":
                await e(arr)
            elif name == "discovery_100":
                await c.discover("add", 10)
            n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", choices=WORKLOADS)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rate", type=int, default=200)
    ap.add_argument("--targets", default="client,ma,la,sed")
    ap.add_argument("--top", type=int, default=24)
    ap.add_argument("--out", default=None, help="keep the raw profiles in this directory")
    ap.add_argument("--gil", action="store_true",
                    help="only samples holding the GIL: Python work, without time in zmq/pipe calls "
                         "(which release the GIL) nor waits for the CPU")
    a = ap.parse_args(argv)
    if shutil.which("py-spy") is None:
        print("py-spy not found: pip install py-spy", file=sys.stderr)
        return 2
    out = Path(a.out) if a.out else None
    with Procs() as procs:
        if a.workload == "discovery_100":
            tree = procs.tree(las=10, seds_per_la=1, replicas=10, timeout=120)
        else:
            tree = procs.tree(las=2, seds_per_la=2)
        out = out or Path(tempfile.mkdtemp(prefix="gridrpc-profile-"))
        out.mkdir(parents=True, exist_ok=True)
        pids = {"client": os.getpid(), "ma": tree["ma"].pid, "la": tree["las"][0].pid, "sed": tree["seds"][0].pid}
        bound_to = tree["sed_names"][0]
        # warm up before sampling
        asyncio.run(_workload(a.workload, tree["ma"].address, bound_to, 1.0))
        spies = {t: start_spy(pids[t], out / f"{a.workload}-{t}.txt", a.rate, t == "sed", a.gil)
                 for t in a.targets.split(",")}
        time.sleep(1.0)         # let py-spy attach
        t0 = time.monotonic()
        n = asyncio.run(_workload(a.workload, tree["ma"].address, bound_to, a.seconds))
        elapsed = time.monotonic() - t0
        for p in spies.values():
            stop_spy(p)
        print(f"workload {a.workload}: {n} operations in {elapsed:.1f}s = {n / elapsed:,.0f}/s "
              f"({1e3 * elapsed / max(n, 1):.3f} ms each); bound to {bound_to}")
        for t in spies:
            print(f"\n== {t} (pid {pids[t]}) ==")
            print(analyse(out / f"{a.workload}-{t}.txt", a.rate, elapsed + 1.0, a.top, n))
        print(f"\nraw profiles in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
