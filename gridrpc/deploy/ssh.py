"""The SSH launcher: elements started with ``nohup`` over the ``ssh`` client,
key-only, host keys checked. See :mod:`gridrpc.deploy.launchers`.

This module is the launcher itself; how to reach a host and run the ``ssh``
client is :mod:`.ssh_client` (:class:`SSHHostConfig`), and the ``sh``
scripts it runs there are :mod:`.ssh_scripts`. Both are re-exported here.
"""
from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence

from . import ssh_scripts as sh
from .launchers import (
    BatchResult,
    ExitedImmediately,
    LaunchError,
    NotReady,
    PythonMissing,
    Started,
    StopResult,
    ENV_KEY,
    log_name,
)
from .ssh_client import SSHHostConfig, classify, close_master, open_script, run_script, ssh_argv

log = logging.getLogger(__name__)

_STOPPED = ("not-running", "terminated", "killed")

__all__ = ["SSHHostConfig", "SSHLauncher"]


class SSHLauncher:
    """Start elements on a remote host with the ``ssh`` client, key-only.

    ``start`` runs, in one ssh session, ``mkdir -p WORKDIR; cd WORKDIR``, checks
    that the python runs and ``check_module`` imports, then
    ``nohup CMD >LOG 2>&1 </dev/null &`` and watches the new PID for
    ``check_window`` seconds. ``start_many`` starts a batch and waits for
    their readiness lines in one session. ``alive`` is ``kill -0`` plus a
    zombie and start-time check; ``stop`` is TERM, wait, KILL; ``logs`` is
    ``tail -n`` (scripts: :mod:`.ssh_scripts`).

    Options: ``BatchMode=yes`` (never prompt), ``StrictHostKeyChecking=yes``
    (unknown or changed host keys fail), ``IdentitiesOnly=yes`` with
    ``key_path``. Errors are classified from ssh's exit code (255) and stderr
    (:mod:`.ssh_client`). The remote login shell must be able to run ``sh -c '...'``.
    """

    launcher_name = "ssh"

    def __init__(self, host_config: SSHHostConfig) -> None:
        self.config = host_config
        self.host = host_config.target
        self.checked = False  # set by a successful check(): start() then skips the python check
        self._check_env(host_config.env)

    # the ssh client
    def ssh_argv(self, remote_cmd: str) -> list[str]:
        return ssh_argv(self.config, remote_cmd)

    def run(self, script: str, *, timeout: float | None = None) -> subprocess.CompletedProcess:
        """Run a POSIX sh ``script`` on the host; ssh-level failures raise LaunchError."""
        return run_script(self.config, script, timeout=timeout)

    # preflight: workdir, environment, python
    def _check_env(self, env: Mapping[str, str]) -> None:
        for key in env:
            if not ENV_KEY.match(key):
                raise LaunchError(f"invalid environment variable name {key!r}", host=self.host)

    def _prelude(self, extra_env: Mapping[str, str] | None = None) -> str:
        c = self.config
        env = {**c.env, **(extra_env or {})}
        self._check_env(env)
        return sh.prelude(c.workdir, c.venv, env)

    def _check_script(self) -> str:
        """The python check, until a :meth:`check` has passed."""
        return "" if self.checked else sh.check_python(self.config.python_executable, self.config.check_module)

    def _raise_preflight(self, returncode: int, output: str) -> None:
        c, out = self.config, output.strip()
        if returncode == sh.RC_WORKDIR:
            raise LaunchError(f"cannot create or enter workdir {c.workdir!r} on {self.host}", host=self.host)
        if returncode == sh.RC_PYTHON:
            raise PythonMissing(f"python not found on {self.host}: {c.python_executable!r} "
                                "does not exist or is not executable (set python/venv in the host config)",
                                host=self.host)
        if returncode == sh.RC_MODULE:
            detail = out.split(f"{sh.MARK} module", 1)[-1].strip()
            raise PythonMissing(f"python {c.python_executable!r} on {self.host} cannot import "
                                f"{c.check_module!r} (install gridrpc there or set PYTHONPATH/venv):\n{detail}",
                                host=self.host)

    def check(self) -> str:
        """Preflight only: reach the host, enter the workdir, check python; return its version."""
        self.checked = False
        res = self.run(self._prelude() + self._check_script() + sh.REPORT_VERSION)
        self._raise_preflight(res.returncode, res.stdout + res.stderr)
        if res.returncode != 0:
            raise LaunchError(f"preflight on {self.host} failed ({res.returncode}): {res.stderr.strip()}",
                              host=self.host)
        self.checked = True
        m = sh.VERSION_RE.search(res.stdout)
        return m.group(1).strip() if m else ""

    # start, watch, stop
    def _started(self, name: str, command: Sequence[str], pid: int, pid_start: str, log_path: str) -> Started:
        return Started(launcher=self.launcher_name, host=self.host, pid=pid, log_path=log_path,
                       command=tuple(command), name=name, workdir=self.config.workdir, pid_start=pid_start,
                       started_at=time.time())

    def start(self, command: Sequence[str], *, name: str = "",
              env: Mapping[str, str] | None = None) -> Started:
        if not command:
            raise LaunchError("empty command", host=self.host)
        logf = "logs/" + log_name(name, command)
        res = self.run(self._prelude(env) + self._check_script()
                       + sh.start_one(command, logf, self.config.check_window))
        self._raise_preflight(res.returncode, res.stdout + res.stderr)
        m = sh.START_ONE_RE.search(res.stdout)
        if res.returncode != 0 or not m:
            raise LaunchError(f"starting {name or command[0]} on {self.host} failed "
                              f"({res.returncode}): {(res.stdout + res.stderr).strip()}", host=self.host)
        pid, pid_start, log_path = int(m.group(1)), m.group(2), m.group(3).strip()
        ex = sh.EXITED_RE.search(res.stdout)
        if ex:
            tail = res.stdout[ex.end():].lstrip("\n")
            raise ExitedImmediately(
                f"{name or command[0]} exited immediately on {self.host} with code {ex.group(1)}; "
                f"log {log_path}:\n{tail}", host=self.host, log_tail=tail, returncode=int(ex.group(1)))
        log.info("started %s on %s: pid %d, log %s", name or command[0], self.host, pid, log_path)
        return self._started(name, command, pid, pid_start, log_path)

    def alive(self, started: Started) -> bool:
        return self.alive_many([started])[started.pid]

    def stop(self, started: Started, timeout: float = 10.0) -> StopResult:
        got, res = self._stop(started=[started], timeout=timeout)
        r = got.get(started.pid)
        if r not in _STOPPED:
            raise LaunchError(f"could not stop pid {started.pid} on {self.host}: "
                              f"{(res.stdout + res.stderr).strip()}", host=self.host)
        return r  # type: ignore[return-value]

    def logs(self, started: Started, lines: int = 50) -> str:
        return self.run(sh.tail(started.log_path, lines)).stdout

    def _not_ready(self, who: str, started: Started, what: str | None, tail: str, timeout: float,
                   rc: int | None, stderr: str) -> LaunchError:
        """The error for an element that did not report ready (``what``:
        exited, timeout, or None when the script lost track of it)."""
        if what == "exited":
            return NotReady(f"{who} exited on {self.host} before it was ready; log "
                            f"{started.log_path}, tail:\n{tail}", host=self.host, log_tail=tail, exited=True)
        if what == "timeout":
            return NotReady(f"{who} on {self.host} not ready after {timeout:.0f}s; log "
                            f"{started.log_path}, tail:\n{tail}", host=self.host, log_tail=tail)
        return LaunchError(f"lost track of {who} on {self.host} (ssh ended with {rc}): "
                           f"{stderr.strip()[-300:]}", host=self.host)

    def wait_ready(self, started: Started, pattern: str, timeout: float) -> str:
        """Wait (on the host, in one ssh session) until a log line matches the
        extended regex ``pattern``; return it. Raises :class:`NotReady`."""
        res = self.run(sh.wait_ready(started.pid, started.pid_start, started.log_path, pattern, timeout),
                       timeout=self.config.connect_timeout + timeout + 30)
        report = sh.WatchReport()
        for line in res.stdout.splitlines():
            report.feed(line)
        if report.outcome.get(0) == "ready":
            return report.ready_line[0]
        who = f"{started.name or 'element'} (pid {started.pid})"
        raise self._not_ready(who, started, report.outcome.get(0), report.tail(0), timeout,
                              res.returncode, res.stdout + res.stderr)

    def start_many(self, items, pattern: str, timeout: float, on_started=None) -> dict[str, BatchResult]:
        """Start every (name, command) of ``items`` and wait until each log has
        a line matching the extended regex ``pattern`` -- all in ONE ssh
        session. ``on_started(name, Started)`` is called as soon as each pid is
        known (before the waiting), so a caller can record it."""
        items = list(items)
        if not items:
            return {}
        batch = []
        for name, command in items:
            if not command:
                raise LaunchError(f"empty command for {name}", host=self.host)
            batch.append((command, "logs/" + log_name(name, command)))
        script = self._prelude() + self._check_script() + sh.start_many(batch, pattern, timeout)
        results = {name: BatchResult(name) for name, _ in items}
        report = sh.WatchReport()
        proc = open_script(self.config, script)
        timer = threading.Timer(self.config.connect_timeout + timeout + 60, proc.kill)
        timer.start()
        try:
            for raw in proc.stdout:
                i = report.feed(raw.rstrip("\n"))
                if i is not None:
                    name, command = items[i]
                    st = self._started(name, command, *report.started[i])
                    results[name].started = st
                    if on_started:
                        on_started(name, st)
            stderr = proc.stderr.read()
            rc = proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if rc == 255 and not any(r.started for r in results.values()):
            raise classify(self.config, stderr)
        output = "\n".join(report.other) + stderr
        if rc in (sh.RC_WORKDIR, sh.RC_PYTHON, sh.RC_MODULE):
            self._raise_preflight(rc, output)
        for i, (name, _) in enumerate(items):
            r = results[name]
            if r.started is None:
                r.error = LaunchError(f"starting {name} on {self.host} failed ({rc}): "
                                      f"{output.strip()[-500:]}", host=self.host)
            elif report.outcome.get(i) == "ready":
                r.ready_line = report.ready_line[i]
            else:
                r.error = self._not_ready(f"{name} (pid {r.started.pid})", r.started, report.outcome.get(i),
                                          report.tail(i), timeout, rc, stderr)
        return results

    def alive_many(self, started: Sequence[Started]) -> dict[int, bool]:
        """One ssh session for all: {pid: alive}."""
        if not started:
            return {}
        seen = sh.read_alive(self.run(sh.alive_many([(st.pid, st.pid_start) for st in started])).stdout)
        return {st.pid: seen.get(st.pid, False) for st in started}

    def stop_many(self, started: Sequence[Started], timeout: float = 10.0) -> dict[int, str]:
        """TERM all, wait up to ``timeout`` for all, KILL survivors: one ssh session.
        Returns {pid: "not-running" | "terminated" | "killed" | "error: ..."}."""
        if not started:
            return {}
        got, res = self._stop(started, timeout)
        out = {}
        for st in started:
            r = got.get(st.pid)
            out[st.pid] = (r if r in _STOPPED else
                           f"error: pid {st.pid} on {self.host} "
                           + ("survived SIGKILL" if r == "survived" else
                              f"not reported: {(res.stdout + res.stderr).strip()[-300:]}"))
        return out

    def _stop(self, started: Sequence[Started], timeout: float) -> tuple[dict[int, str], subprocess.CompletedProcess]:
        """Run :func:`.ssh_scripts.stop_many`: ({pid: what it reported}, the run)."""
        res = self.run(sh.stop_many([(st.pid, st.pid_start) for st in started], timeout),
                       timeout=self.config.connect_timeout + timeout + 40)
        return sh.read_stop(res.stdout), res

    def close(self) -> None:
        """End the shared connection (if ``control_path``); never raises."""
        close_master(self.config)
