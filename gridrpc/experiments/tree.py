"""A local tree for experiments: one MA process and K SeD processes holding
the N SeDs as replicas (``--replicas``), each call in a killable worker
process (one per replica, forked before the experiment starts). Separate processes so that the clients (in the experiment's own
process) do not share an interpreter lock with the servers, and so that the
CPU use of every element can be measured (psutil).

``python -m gridrpc.experiments.tree sed ...`` is the SeD entry point used
here: like ``gridrpc sed`` but it accepts any queue option as JSON
(``--queue-options '{"accounting": "virtual"}'``).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

SLEEP_SERVICE = "gridrpc.examples.services:sleep"


@dataclass
class Element:
    name: str
    kind: str
    proc: subprocess.Popen
    address: str = ""
    replicas: int = 0
    ps: psutil.Process | None = None

    def cpu_seconds(self) -> float:
        """CPU of the process and its reaped children (the SeD's workers)."""
        try:
            t = self.ps.cpu_times()
        except (psutil.Error, AttributeError):
            return float("nan")
        total = t.user + t.system + t.children_user + t.children_system
        try:                                 # live workers
            for c in self.ps.children(recursive=True):
                ct = c.cpu_times()
                total += ct.user + ct.system
        except psutil.Error:
            pass
        return total


@dataclass
class ExperimentTree:
    """``with ExperimentTree(n_seds=10, queue="ethic") as tree: tree.ma_address``."""
    n_seds: int
    queue: str = "fcfs"
    queue_options: dict = field(default_factory=dict)
    sed_processes: int = 1
    hb_interval: float = 1.0
    hb_timeout: float = 5.0
    ready_timeout: float = 30.0
    # every replica runs calls at once in a burst: fork their workers before the experiment, not in it
    # (68 forks on the SeD's loop cost ~0.2 s of a burst's dispatch, benchmarks/burst.py)
    prestart_workers: bool = True
    elements: list[Element] = field(default_factory=list)
    workdir: str = ""

    @property
    def ma_address(self) -> str:
        return self.elements[0].address

    def _spawn(self, name: str, kind: str, args: list[str], replicas: int = 0) -> Element:
        ready = os.path.join(self.workdir, f"{name}.ready")
        log = open(os.path.join(self.workdir, f"{name}.log"), "wb")
        cmd = [sys.executable, "-m", *args, "--name", name, "--port", "0", "--ready-file", ready,
               "--hb-interval", str(self.hb_interval), "--hb-timeout", str(self.hb_timeout),
               "--log-level", "WARNING"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        log.close()
        el = Element(name=name, kind=kind, proc=proc, replicas=replicas, ps=psutil.Process(proc.pid))
        self.elements.append(el)
        deadline = time.monotonic() + self.ready_timeout
        while not os.path.exists(ready):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = Path(self.workdir, f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{kind} {name} did not start (exit {proc.poll()}):\n{tail}")
            time.sleep(0.02)
        el.address = json.loads(Path(ready).read_text())["address"]
        return el

    def start(self) -> "ExperimentTree":
        self.workdir = tempfile.mkdtemp(prefix="gridrpc-exp-")
        try:
            self._spawn("MA", "ma", ["gridrpc", "ma"])
            k = max(1, min(self.sed_processes, self.n_seds))
            sizes = [self.n_seds // k + (1 if i < self.n_seds % k else 0) for i in range(k)]
            for i, n in enumerate(sizes):
                args = ["gridrpc.experiments.tree", "sed", "--parent", self.ma_address,
                        "--queue", self.queue, "--queue-options", json.dumps(self.queue_options),
                        "--replicas", str(n), "--prestart-workers", str(n if self.prestart_workers else 1)]
                self._spawn(f"sed{i}" if k > 1 else "sed", "sed", args, replicas=n)
        except BaseException:
            self.stop()
            raise
        return self

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far: ``ma`` and ``seds`` (all SeD processes and their workers)."""
        return {"ma": self.elements[0].cpu_seconds(),
                "seds": sum(e.cpu_seconds() for e in self.elements if e.kind == "sed")}

    def stop(self) -> None:
        for el in reversed(self.elements):
            if el.proc.poll() is None:
                try:
                    os.killpg(el.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for el in reversed(self.elements):
            try:
                el.proc.wait(10)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(el.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                el.proc.wait(5)
        self.elements.clear()

    def __enter__(self) -> "ExperimentTree":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _sed_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m gridrpc.experiments.tree sed")
    ap.add_argument("--name", required=True)
    ap.add_argument("--parent", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--queue", default="fcfs")
    ap.add_argument("--queue-options", default="{}")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--service", default=SLEEP_SERVICE)
    ap.add_argument("--ready-file")
    ap.add_argument("--hb-interval", type=float, default=1.0)
    ap.add_argument("--hb-timeout", type=float, default=5.0)
    ap.add_argument("--log-level", default="WARNING")
    ap.add_argument("--prestart-workers", type=int, default=1)
    a = ap.parse_args(argv)
    from ..cli import ready_writer, setup_logging
    from .._run import run_daemon
    from ..sed import SeD
    setup_logging(a.log_level)
    sed = SeD(a.name, a.parent, address=f"tcp://{a.host}:{a.port}", queue=a.queue,
              queue_options=json.loads(a.queue_options), replicas=a.replicas, prestart_workers=a.prestart_workers,
              hb_interval=a.hb_interval, hb_timeout=a.hb_timeout)
    sed.add_service("sleep", a.service)
    run_daemon(sed, ready=ready_writer(a.ready_file))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "sed":
        sys.exit(_sed_main(sys.argv[2:]))
    sys.exit("usage: python -m gridrpc.experiments.tree sed ...")
