"""Real processes for failure tests: ``gridrpc ma|la|sed`` subprocesses on
free loopback ports, each reporting its address through a ready file."""
from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from gridrpc.testing import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, name: str, popen: subprocess.Popen, ready: Path, log: Path) -> None:
        self.name, self.popen, self.ready_path, self.log = name, popen, ready, log
        self.info: dict = {}

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def address(self) -> str:
        return self.info["address"]

    def wait_ready(self, timeout: float = 20) -> "Proc":
        def ready():
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{self.log.read_text()[-2000:]}")
            return self.ready_path.exists()
        wait_for(ready, timeout, f"{self.name} ready")
        self.info = json.loads(self.ready_path.read_text())
        return self

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, sig)

    def stop(self) -> None:
        if self.popen.poll() is None:
            try:
                os.kill(self.popen.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


def _nofile(n: int) -> None:
    import resource
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


class ProcTree:
    """Start elements one by one; ``stop()`` kills all (by PID) in reverse order."""

    def __init__(self, tmp: Path, hb: tuple[float, float] = (0.3, 1.0)) -> None:
        self.tmp = Path(tmp)
        self.hb = hb
        self.procs: list[Proc] = []

    def start(self, kind: str, name: str, *args: str, parent: str | None = None, port: int = 0,
              wait: bool = True, nofile: int | None = None) -> Proc:
        """``nofile``: the daemon starts with this soft limit of open descriptors."""
        ready = self.tmp / f"{name}.{len(self.procs)}.ready"
        log = self.tmp / f"{name}.{len(self.procs)}.log"
        cmd = [sys.executable, "-m", "gridrpc", kind, "--name", name, "--port", str(port),
               "--hb-interval", str(self.hb[0]), "--hb-timeout", str(self.hb[1]), "--ready-file", str(ready),
               *args]
        if parent:
            cmd += ["--parent", parent]
        with open(log, "wb") as out:
            p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 preexec_fn=None if nofile is None else functools.partial(_nofile, nofile))
        proc = Proc(name, p, ready, log)
        self.procs.append(proc)
        return proc.wait_ready() if wait else proc

    def sed(self, name: str, parent: str | None, *args: str, **kw) -> Proc:
        return self.start("sed", name, "--examples", *args, parent=parent, **kw)

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
