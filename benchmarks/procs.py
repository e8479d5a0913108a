"""Processes for the benchmarks: gridrpc daemons and helper servers started as
real subprocesses, each in its own session, all tagged with one environment
token so that nothing outlives the run.

``Procs`` starts ``python -m gridrpc ma|la|sed`` on free loopback ports (port
0, address read back from ``--ready-file``), waits for the MA to see every
SeD, and on ``stop()`` terminates every process it started (SIGTERM, then
SIGKILL to the process group) and finally sweeps any process still carrying
the token (worker processes, Ray's raylet ...), by PID.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOKEN_VAR = "GRIDRPC_BENCH_TOKEN"
TOKEN = os.environ.get(TOKEN_VAR) or uuid.uuid4().hex


def cpu_seconds(proc, children: bool = True) -> float:
    """User + system CPU seconds of ``proc`` (a pid or a psutil.Process), with its descendants'
    when ``children`` (a SeD with its workers); 0 for a process that is gone."""
    import psutil
    try:
        p = proc if isinstance(proc, psutil.Process) else psutil.Process(proc)
        procs = [p, *(p.children(recursive=True) if children else ())]
    except psutil.Error:
        return 0.0
    total = 0.0
    for q in procs:
        try:
            t = q.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def child_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env[TOKEN_VAR] = TOKEN
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("GRIDRPC_LOG", "WARNING")
    env.update(extra or {})
    return env


class Proc:
    def __init__(self, name: str, popen: subprocess.Popen, log: Path, ready: Path | None = None) -> None:
        self.name, self.popen, self.log, self.ready_path = name, popen, log, ready
        self.info: dict = {}

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def address(self) -> str:
        return self.info["address"]

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def wait_ready(self, timeout: float = 30.0) -> "Proc":
        deadline = time.monotonic() + timeout
        while not (self.ready_path and self.ready_path.exists()):
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.popen.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready after {timeout}s:\n{self.log_tail()}")
            time.sleep(0.02)
        self.info = json.loads(self.ready_path.read_text())
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is None:
            try:
                self.popen.terminate()
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        # the element's own children (SeD workers) share its process group
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(5)


class Procs:
    """Start processes; ``stop()`` (or leaving the ``with``) stops them all."""

    def __init__(self, hb: tuple[float, float] = (1.0, 3.0)) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="gridrpc-bench-"))
        self.hb = hb
        self.procs: list[Proc] = []

    def spawn(self, name: str, cmd: list[str], ready: Path | None = None) -> Proc:
        log = self.tmp / f"{name}.{len(self.procs)}.log"
        with open(log, "wb") as out:
            p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=child_env(), cwd=str(REPO), start_new_session=True)
        proc = Proc(name, p, log, ready)
        self.procs.append(proc)
        return proc

    def daemon(self, kind: str, name: str, *args: str, parent: str | None = None,
               keys: Path | None = None, parent_key: str | None = None) -> Proc:
        """Start ``gridrpc KIND`` (not waiting: call ``wait_ready``). With
        ``keys`` (a key directory, see :meth:`keys`): ``--secure --keys DIR``
        and, under a parent, ``--parent-key PARENT_KEY`` (its element name)."""
        ready = self.tmp / f"{name}.{len(self.procs)}.ready"
        cmd = [sys.executable, "-m", "gridrpc", kind, "--name", name, "--port", "0",
               "--hb-interval", str(self.hb[0]), "--hb-timeout", str(self.hb[1]),
               "--ready-file", str(ready), "--log-level", "WARNING", *args]
        if keys:
            cmd += ["--secure", "--keys", str(keys)]
        if parent:
            cmd += ["--parent", parent]
            if keys:
                cmd += ["--parent-key", parent_key]
        return self.spawn(name, cmd, ready)

    def keys(self, elements: list[str], users: tuple[str, ...] = ("bench",)) -> Path:
        """A CURVE key directory in the temp dir with a key pair per element
        and per user (``gridrpc.transport.security.KeyStore``)."""
        from gridrpc.transport.security import KeyStore
        store = KeyStore(self.tmp / "keys")
        for name in elements:
            store.create(name, "element", overwrite=True)
        for name in users:
            store.create(name, "user", overwrite=True)
        return store.dir

    def tree(self, las: int, seds_per_la: int, sed_args: tuple[str, ...] = ("--examples",),
             replicas: int = 1, timeout: float = 60.0, secure: bool = False) -> dict:
        """MA -> ``las`` LAs -> ``seds_per_la`` SeD processes each (each with
        ``replicas`` SeDs). Returns {ma, las, seds (Proc), sed_names, client_kw}.
        ``secure``: CURVE on every link (element keys for all, a user key
        ``bench``); ``client_kw`` holds the client's ``keys=`` and ``user=``."""
        la_names = [f"LA{i + 1}" for i in range(las)]
        sed_names = [[f"sed-{i + 1}-{j + 1}" for j in range(seds_per_la)] for i in range(las)]
        keys = self.keys(["MA", *la_names, *(n for ns in sed_names for n in ns)]) if secure else None
        client_kw = {"keys": str(keys), "user": "bench"} if keys else {}
        ma = self.daemon("ma", "MA", keys=keys).wait_ready(timeout)
        la_procs = [self.daemon("la", n, parent=ma.address, keys=keys, parent_key="MA") for n in la_names]
        for p in la_procs:
            p.wait_ready(timeout)
        rep = ("--replicas", str(replicas)) if replicas > 1 else ()
        seds = [self.daemon("sed", n, *sed_args, *rep, parent=la.address, keys=keys, parent_key=la.name)
                for la, ns in zip(la_procs, sed_names) for n in ns]
        for p in seds:
            p.wait_ready(timeout)
        names = wait_registered(ma.address, len(seds) * replicas, timeout, **client_kw)
        return {"ma": ma, "las": la_procs, "seds": seds, "sed_names": names, "client_kw": client_kw}

    def stop(self, keep_logs: bool = False) -> None:
        for p in reversed(self.procs):
            try:
                p.stop()
            except Exception:  # noqa: BLE001 - keep stopping the others
                pass
        self.procs.clear()
        sweep()
        if not keep_logs:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> "Procs":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.stop(keep_logs=exc_type is not None)      # logs of a failed run stay for a look


def wait_registered(ma: str, n: int, timeout: float, **client_kw) -> list[str]:
    """Wait until the MA's tree shows ``n`` SeDs; return their names.
    ``client_kw``: the client's ``keys=``/``user=`` for a secure tree."""
    from gridrpc import Client, GridRPCError
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    with Client(ma, discovery_timeout=5, **client_kw) as c:
        while True:
            try:
                seen = sorted(e["name"] for e in c.tree()
                              if e.get("kind") == "sed" and e.get("state", "alive") == "alive")
            except GridRPCError:
                seen = []
            if len(seen) >= n:
                return seen
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(seen)}/{n} SeDs registered at the MA after {timeout}s")
            time.sleep(0.1)


def sweep() -> list[int]:
    """Kill (by PID) every process still carrying this run's token, except us.
    Returns the PIDs killed (normally none)."""
    import psutil
    me = psutil.Process()
    spare = {me.pid, *(a.pid for a in me.parents())}
    killed = []
    for p in psutil.process_iter(["pid"]):
        if p.pid in spare:
            continue
        try:
            if p.environ().get(TOKEN_VAR) == TOKEN:
                p.kill()
                killed.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return killed
