"""LocalLauncher on real processes; SlurmLauncher's command line with a fake srun."""
from __future__ import annotations

import os
import sys
import time

import pytest

from gridrpc.deploy.launchers import (
    ExitedImmediately, LaunchError, Launcher, LocalLauncher, SlurmLauncher, SSHHostConfig,
    SSHLauncher, Started, tail_file,
)

SERVER = ("import signal, sys, time\n"
          "{setup}\n"
          "print('ready', flush=True)\n"
          "while True: time.sleep(0.05)\n")


def _wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


@pytest.fixture
def launcher(tmp_path):
    lau = LocalLauncher(tmp_path, check_window=0.3)
    yield lau
    for proc in list(lau._procs.values()):  # never leak a process
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_protocol():
    for cls in (LocalLauncher, SSHLauncher, SlurmLauncher):
        assert all(hasattr(cls, m) for m in ("start", "alive", "stop", "logs"))
    assert isinstance(LocalLauncher("/tmp"), Launcher)
    assert isinstance(SSHLauncher(SSHHostConfig(target="x")), Launcher)


def test_start_alive_logs_stop(launcher, tmp_path):
    s = launcher.start([sys.executable, "-c", SERVER.format(setup="")], name="sed-1",
                       env={"GRIDRPC_TEST": "1"})
    assert s.launcher == "local" and s.host == "localhost" and s.name == "sed-1"
    assert s.log_path.startswith(str(tmp_path / "logs" / "sed-1-"))
    assert os.getpgid(s.pid) == s.pid  # own session / process group
    assert launcher.alive(s)
    _wait_for(lambda: "ready" in launcher.logs(s))
    assert launcher.stop(s, timeout=5) == "terminated"
    assert not launcher.alive(s)
    assert launcher.stop(s) == "not-running"


def test_stop_escalates_to_sigkill(launcher):
    setup = "signal.signal(signal.SIGTERM, signal.SIG_IGN)"
    s = launcher.start([sys.executable, "-c", SERVER.format(setup=setup)])
    _wait_for(lambda: "ready" in launcher.logs(s))  # the handler is in place
    assert launcher.stop(s, timeout=0.3) == "killed"
    assert not launcher.alive(s)


def test_immediate_exit_is_reported_with_log_tail(launcher):
    cmd = [sys.executable, "-c", "import sys; print('bad config: no parent', file=sys.stderr); sys.exit(2)"]
    with pytest.raises(ExitedImmediately) as ei:
        launcher.start(cmd, name="sed-bad")
    assert ei.value.returncode == 2
    assert "bad config: no parent" in ei.value.log_tail
    assert "exited immediately" in str(ei.value)


def test_missing_executable(launcher):
    with pytest.raises(LaunchError, match="cannot start"):
        launcher.start(["/nonexistent/python3", "-m", "gridrpc"])


def test_started_from_state_file_is_controllable(launcher, tmp_path):
    s = launcher.start([sys.executable, "-c", SERVER.format(setup="")])
    restored = Started.from_dict(s.to_dict())
    assert restored == s
    other = LocalLauncher(tmp_path)  # e.g. a later `deploy down`: no Popen handle
    assert other.alive(restored)
    forged = Started.from_dict({**s.to_dict(), "pid_start": "1.0"})  # PID reused by someone else
    assert not other.alive(forged)
    assert other.stop(forged) == "not-running"
    assert other.stop(restored, timeout=5) == "terminated"
    assert not launcher.alive(s)


def test_tail_file(tmp_path):
    p = tmp_path / "log"
    p.write_text("".join(f"line {i}\n" for i in range(5000)))
    assert tail_file(p, 3, block=100) == "line 4997\nline 4998\nline 4999\n"
    assert tail_file(tmp_path / "missing", 3) == ""


def test_slurm_needs_an_allocation(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(LaunchError, match="SLURM_JOB_ID"):
        SlurmLauncher("node1", tmp_path).start(["true"])


def test_slurm_with_fake_srun(tmp_path):
    fake = tmp_path / "srun"
    fake.write_text('#!/bin/sh\necho "srun $*"\n'
                    'while [ $# -gt 0 ]; do case "$1" in -w) shift 2;; -*) shift;; *) break;; esac; done\n'
                    'exec "$@"\n')
    fake.chmod(0o755)
    lau = SlurmLauncher("node7", tmp_path, job_id="4242", srun=str(fake), squeue="/nonexistent",
                        check_window=0.3)
    s = lau.start([sys.executable, "-c", SERVER.format(setup="")], name="la-1")
    try:
        assert s.launcher == "slurm" and s.host == "node7" and s.step.startswith("gridrpc-la-1-")
        _wait_for(lambda: "ready" in lau.logs(s))
        first = lau.logs(s).splitlines()[0]
        assert "--jobid=4242 --nodes=1 --ntasks=1 -w node7 --overlap" in first
        assert lau.alive(s)
    finally:
        assert lau.stop(s, timeout=5) == "terminated"
    assert not lau.alive(s)
