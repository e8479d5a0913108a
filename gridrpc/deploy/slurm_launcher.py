"""The Slurm launcher: one ``srun --overlap`` step per element inside an
allocation. See :mod:`gridrpc.deploy.launchers`."""
from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

from .launchers import (  # noqa: F401 - shared launcher machinery
    BatchResult,
    LaunchError,
    LocalLauncher,
    Started,
    StopResult,
    start_each,
    wait_ready_file,
)

log = logging.getLogger(__name__)


class SlurmLauncher:
    """Start elements on one node of the current Slurm allocation.

    Runs ``srun --jobid=J --nodes=1 --ntasks=1 -w NODE --overlap
    --job-name=STEP [extra_args] CMD`` as a local detached process (through
    :class:`LocalLauncher`, so the step's output lands in the local log file).
    ``alive`` is the srun process; ``stop`` sends SIGTERM to srun (which
    forwards it to the step), and if srun or the step outlive ``timeout``,
    ``scancel`` the step (found by its unique name) and SIGKILL srun.

    Needs ``SLURM_JOB_ID`` (or ``job_id``): outside an allocation it raises
    :class:`LaunchError`. ``--overlap`` (Slurm >= 20.11) lets elements share
    the allocation's CPUs with the jobs the batch SeDs submit.
    """

    launcher_name = "slurm"

    def __init__(self, node: str, workdir: str | os.PathLike, *, job_id: str | None = None,
                 srun: str = "srun", scancel: str = "scancel", squeue: str = "squeue",
                 extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 check_window: float = 1.0) -> None:
        self.host = node
        self.job_id = job_id or os.environ.get("SLURM_JOB_ID", "")
        self.srun, self.scancel, self.squeue = srun, scancel, squeue
        self.extra_args = tuple(extra_args)
        self._local = LocalLauncher(workdir, env=env, check_window=check_window, host=node)

    def srun_argv(self, command: Sequence[str], step: str) -> list[str]:
        return [self.srun, f"--jobid={self.job_id}", "--nodes=1", "--ntasks=1", "-w", self.host,
                "--overlap", f"--job-name={step}", "--kill-on-bad-exit=1", *self.extra_args,
                *command]

    def start(self, command: Sequence[str], *, name: str = "",
              env: Mapping[str, str] | None = None) -> Started:
        if not self.job_id:
            raise LaunchError("not inside a Slurm allocation (SLURM_JOB_ID is not set); "
                              "run 'gridrpc deploy' from salloc/sbatch", host=self.host)
        if shutil.which(self.srun) is None:
            raise LaunchError(f"{self.srun!r} not found on PATH", host=self.host)
        step = f"gridrpc-{re.sub(r'[^A-Za-z0-9_.-]', '_', name or 'element')}-{secrets.token_hex(3)}"
        started = self._local.start(self.srun_argv(command, step), name=name, env=env)
        return Started(**{**started.to_dict(), "launcher": self.launcher_name, "host": self.host,
                          "command": tuple(command), "step": step, "job_id": self.job_id})

    def alive(self, started: Started) -> bool:
        return self._local.alive(started)

    def _step_ids(self, step: str, job_id: str = "") -> list[str]:
        job_id = job_id or self.job_id
        if not job_id or not step:
            return []
        try:
            res = subprocess.run([self.squeue, "--steps", f"--jobs={job_id}", "--noheader",
                                  "--format=%i %j"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return []
        return [line.split()[0] for line in res.stdout.splitlines()
                if len(line.split()) >= 2 and line.split()[1] == step]

    def stop(self, started: Started, timeout: float = 10.0) -> StopResult:
        if not self.alive(started):
            return "not-running"
        try:
            os.kill(started.pid, signal.SIGTERM)
        except ProcessLookupError:
            return "terminated"
        if self._local._wait_gone(started, timeout):
            return "terminated"
        for step_id in self._step_ids(started.step, started.job_id):
            subprocess.run([self.scancel, step_id], capture_output=True, timeout=30)
        self._local.stop(started, timeout=0)  # SIGKILL the srun client
        return "killed"

    def logs(self, started: Started, lines: int = 50) -> str:
        return self._local.logs(started, lines)

    def wait_ready(self, started: Started, pattern: str, timeout: float) -> str:
        return wait_ready_file(self, started, pattern, timeout)

    def start_many(self, items, pattern: str, timeout: float, on_started=None) -> dict[str, "BatchResult"]:
        return start_each(self, items, pattern, timeout, on_started)

    def alive_many(self, started: Sequence[Started]) -> dict[int, bool]:
        return {st.pid: self.alive(st) for st in started}

    def stop_many(self, started: Sequence[Started], timeout: float = 10.0) -> dict[int, str]:
        """SIGTERM every srun (forwarded to its step), wait, then scancel the
        steps still there and SIGKILL their srun."""
        out: dict[int, str] = {}
        live = []
        for st in started:
            if not self.alive(st):
                out[st.pid] = "not-running"
                continue
            try:
                os.kill(st.pid, signal.SIGTERM)
                live.append(st)
            except ProcessLookupError:
                out[st.pid] = "terminated"
        deadline = time.monotonic() + timeout
        for st in live:
            if self._local._wait_gone(st, max(0.0, deadline - time.monotonic())):
                out[st.pid] = "terminated"
        for st in live:
            if st.pid not in out:
                for step_id in self._step_ids(st.step, st.job_id):
                    subprocess.run([self.scancel, step_id], capture_output=True, timeout=30)
                try:
                    self._local.stop(st, timeout=0)
                    out[st.pid] = "killed"
                except LaunchError as exc:
                    out[st.pid] = f"error: {exc}"
        return out

    def close(self) -> None:
        pass
