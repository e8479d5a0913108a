"""Measurements: CPU of each element (psutil), sequential discovery latency,
locust load steps (``gridrpc loadtest``), py-spy profiles."""
from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil


class CpuMeter:
    """CPU use of processes (with their children: a SeD's workers, locust)
    between ``start()`` and ``stop()``, by name, in percent of one core.

    Cheap on purpose — the meter shares the two cores with what it measures:
    the process tree is read once per ``rescan`` seconds (one pass over
    /proc), each sample reads one /proc/PID/stat per process. With
    ``interval`` a thread samples meanwhile, so a process that exits before
    ``stop()`` (locust) still counts with its last sample; children born
    during the window count from zero. Without it, only the two ends are read."""

    def __init__(self, pids: dict[str, int], interval: float | None = None, rescan: float = 3.0) -> None:
        self.roots = dict(pids)
        self.interval = interval
        self.rescan = rescan
        self._members: dict[int, tuple[str, psutil.Process]] = {}
        self._scanned = 0.0
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._t0 = 0.0
        self._wall0 = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _scan(self) -> None:
        children: dict[int, list[int]] = {}
        for p in psutil.process_iter(["pid", "ppid"]):
            children.setdefault(p.info["ppid"], []).append(p.info["pid"])
        for name, root in self.roots.items():
            todo = [root]
            while todo:
                pid = todo.pop()
                if pid not in self._members:
                    try:
                        self._members[pid] = (name, psutil.Process(pid))
                    except psutil.NoSuchProcess:
                        continue
                todo.extend(children.get(pid, ()))
        self._scanned = time.monotonic()

    def _sample(self) -> None:
        if time.monotonic() - self._scanned > self.rescan:
            self._scan()
        for pid, (name, q) in list(self._members.items()):
            try:
                t = q.cpu_times()
            except psutil.NoSuchProcess:
                continue
            v = t.user + t.system
            if pid not in self._first:
                try:
                    born_inside = q.create_time() >= self._wall0
                except psutil.NoSuchProcess:
                    born_inside = False
                self._first[pid] = 0.0 if born_inside else v
            self._last[pid] = v

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> None:
        self._first, self._last = {}, {}
        self._t0 = time.monotonic()
        self._wall0 = time.time()
        self._scan()
        self._sample()
        self._stop.clear()
        if self.interval:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def stop(self) -> dict[str, float]:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self._scanned = 0.0           # catch children born since the last scan
        self._sample()
        dt = max(1e-6, time.monotonic() - self._t0)
        out = {n: 0.0 for n in self.roots}
        for pid, v in self._last.items():
            out[self._members[pid][0]] += max(0.0, v - self._first[pid])
        return {n: 100.0 * v / dt for n, v in out.items()}


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def discovery_latency(ma: str, rounds: int, *, service: str = "noop", k: int = 3,
                      warmup: int = 20, max_seconds: float | None = None) -> dict:
    """Sequential discoveries from one client (gridrpc.Client): ms per
    discovery, ``rounds`` of them or as many as fit in ``max_seconds``."""
    import gridrpc
    lat = []
    errors = 0
    found = []
    stop = None if max_seconds is None else time.monotonic() + max_seconds
    with gridrpc.Client(ma, discovery_timeout=10) as c:
        for i in range(warmup + rounds):
            if stop is not None and i >= warmup and time.monotonic() > stop:
                break
            t0 = time.perf_counter()
            try:
                servers = c.discover(service, k)
            except gridrpc.GridRPCError:
                errors += 1
                continue
            ms = (time.perf_counter() - t0) * 1000
            if i >= warmup:
                lat.append(ms)
                found.append(len(servers))
    return {"rounds": len(lat), "errors": errors, "median_ms": pct(lat, 0.5), "p90_ms": pct(lat, 0.9),
            "p99_ms": pct(lat, 0.99), "max_ms": max(lat) if lat else None,
            "mean_ms": sum(lat) / len(lat) if lat else None, "found_min": min(found) if found else 0}


#: a process above this share of one core (percent) is taken as saturated
SATURATED_PCT = 90.0


def locust_names(kids: list, workers: int) -> dict[str, int]:
    """Names for the locust processes of one ``gridrpc loadtest`` run (its
    children): ``locust`` alone, or ``locust-master`` and ``locust-w1``...
    (in the order they started)."""
    if not workers:
        return {"locust": kids[0].pid} if kids else {}
    out: dict[str, int] = {}
    n = 0
    for k in sorted(kids, key=lambda k: (k.create_time(), k.pid)):
        try:
            master = "--master" in k.cmdline()
        except psutil.Error:
            continue
        if master:
            out["locust-master"] = k.pid
        else:
            n += 1
            out[f"locust-w{n}"] = k.pid
    return out


def step_saturation(cpu: dict[str, float]) -> dict:
    """Which elements of a load step were saturated (above ``SATURATED_PCT``
    of a core): every such process, the busiest, and whether a locust
    process was among them (then the step measured the load generator, not
    the tree)."""
    if not cpu:
        return {"saturated": [], "busiest": None, "load_generator_saturated": False}
    busiest = max(cpu, key=cpu.get)
    saturated = sorted((n for n, v in cpu.items() if v >= SATURATED_PCT), key=lambda n: -cpu[n])
    return {"saturated": saturated, "busiest": busiest, "busiest_cpu": cpu[busiest],
            "load_generator_saturated": any(element_kind(n) == "locust" for n in saturated)}


def load_step(ma: str, users: int, seconds: float, max_requests: int, mix: str, workdir: Path,
              meter: CpuMeter, workers: int = 0) -> dict:
    """One bounded locust run (``gridrpc loadtest``, ``workers`` locust
    workers and a master, or one process) with CPU sampled meanwhile: every
    element of the tree and every locust process on its own."""
    out = Path(workdir) / f"step-{users}.json"
    cmd = [sys.executable, "-m", "gridrpc", "loadtest", ma, "-u", str(users), "-t", f"{seconds:g}s",
           "-n", str(max_requests), "--mix", mix, "--fail-ratio", "1", "--timeout", "20", "--json", str(out)]
    if workers:
        cmd += ["--workers", str(workers)]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    # wait for locust to be up before sampling (its start-up is not load)
    locust: dict[str, int] = {}
    want = 1 + workers if workers else 1
    t_end = time.monotonic() + 30
    while time.monotonic() < t_end and p.poll() is None:
        try:
            kids = psutil.Process(p.pid).children()
        except psutil.NoSuchProcess:
            break
        if len(kids) >= want:
            locust = locust_names(kids, workers)
            break
        time.sleep(0.05)
    # CPU is sampled in the middle of the run: locust needs ~2 s to import and
    # connect (users start at once: spawn rate = users); the last second is wind-down
    time.sleep(2.5)
    m = CpuMeter({**meter.roots, **locust}, interval=1.0)
    m.start()
    time.sleep(max(1.0, seconds - 2.5))
    cpu = m.stop()
    try:
        _, err = p.communicate(timeout=seconds + 90)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    sat = step_saturation(cpu)
    try:
        s = json.loads(out.read_text())
    except (OSError, ValueError):
        return {"users": users, "workers": workers, "error": (err or b"").decode(errors="replace")[-1500:],
                "cpu": cpu, **sat}
    tot = s["total"]
    calls = [e for e in s["locust"].values() if e["type"] == "call"]
    c = calls[0] if calls else tot
    return {"users": users, "workers": workers, "requests": tot["requests"], "failures": tot["failures"],
            "rps": tot["rps"], "median_ms": c["median_ms"], "p99_ms": c["p99_ms"], "avg_ms": c["avg_ms"],
            "client_avg_ms": (s.get("client", {}).get(f"call {c['name']}", {}) or {}).get("avg_ms"),
            "errors": s.get("errors", [])[:3], "cpu": cpu, **sat}


def profile(pid: int, seconds: float, out_raw: Path, rate: int = 250) -> dict | None:
    """py-spy record (raw collapsed stacks) of ``pid``; returns the top
    functions by own time and by inclusive time (share of samples)."""
    if not shutil.which("py-spy"):
        return None
    cmd = ["py-spy", "record", "--pid", str(pid), "-d", f"{max(1, int(seconds))}", "-r", str(rate),
           "--format", "raw", "-o", str(out_raw), "--nonblocking"]
    try:
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=seconds + 30)
    except subprocess.TimeoutExpired:
        return None
    if not out_raw.exists():
        return None
    return summarise_collapsed(out_raw.read_text())


def summarise_collapsed(text: str, top: int = 15) -> dict:
    own: collections.Counter = collections.Counter()
    incl: collections.Counter = collections.Counter()
    total = 0
    idle = 0
    for line in text.splitlines():
        stack, _, n = line.rpartition(" ")
        try:
            n = int(n)
        except ValueError:
            continue
        frames = stack.split(";")
        total += n
        leaf = frames[-1]
        if "select (selectors.py" in leaf or "poll (selectors.py" in leaf or "_run_once" in leaf and "select" in leaf:
            idle += n
        own[_short(leaf)] += n
        for f in set(_short(f) for f in frames):
            incl[f] += n
    share = (lambda c: [(f, round(100.0 * k / total, 1)) for f, k in c.most_common(top)]) if total else (lambda c: [])
    return {"samples": total, "idle_pct": round(100.0 * idle / total, 1) if total else None,
            "own": share(own), "inclusive": share(incl)}


def _short(frame: str) -> str:
    # "func (path/to/file.py:123)" -> "func (file.py:123)"
    name, _, loc = frame.partition(" (")
    return f"{name} ({os.path.basename(loc.rstrip(')'))})" if loc else name


def element_kind(name: str) -> str:
    if name == "MA":
        return "MA"
    if name.startswith("LA"):
        return "LAs"
    if name.startswith("locust"):
        return "locust"
    return "SeDs"


def discovery_cost(r: dict) -> dict[str, float] | None:
    """CPU milliseconds one discovery costs each kind of element (MA, LAs,
    SeDs): CPU during the sequential discoveries minus idle CPU (heartbeats),
    times the mean wall time of one discovery."""
    d, busy, idle = r.get("discovery") or {}, r.get("discovery_cpu"), r.get("idle_cpu") or {}
    if not busy or not d.get("mean_ms"):
        return None
    out = {"MA": 0.0, "LAs": 0.0, "SeDs": 0.0}
    for name, v in busy.items():
        out[element_kind(name)] += max(0.0, v - idle.get(name, 0.0)) / 100.0 * d["mean_ms"]
    return out


def tmpdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
