"""Launchers: start, watch and stop one long-running element process on one host.

A launcher is bound to one host (this machine, an SSH host, a Slurm node) and
knows nothing about what it starts: ``gridrpc deploy`` hands it a command such
as ``[python, "-m", "gridrpc", "sed", "--name", ..., "--parent", ...]``.

::

    Launcher (Protocol)     start(command) -> Started; alive; stop; logs
    ├── LocalLauncher       detached process on this machine
    ├── SSHLauncher         ``nohup`` over the ``ssh`` client, key-only   (ssh.py)
    └── SlurmLauncher       one ``srun --overlap`` step per node, in an allocation   (slurm_launcher.py)

    LaunchError(GridRPCError)       .host, .log_tail
    ├── HostUnreachable             no TCP/SSH connection to the host
    ├── AuthenticationFailed        the host refused our key
    ├── HostKeyMismatch             the host key is unknown or has changed
    ├── PythonMissing               interpreter (or the gridrpc package) missing there
    ├── ExitedImmediately           the command died within the check window; .returncode
    └── NotReady                    no readiness line in the log in time (or it died first)

Beyond the protocol, every launcher here also offers ``wait_ready`` (wait for
a line in the element's log, e.g. ``READY {...}``; one ssh round trip for
SSH), ``alive_many`` and ``stop_many`` (one ssh session per host for a whole
batch), and ``close`` (ends the ssh connection master, if any).

All calls are synchronous (they run short ``ssh``/``srun`` client processes);
an asyncio caller should run them in a thread. Every ``stop()`` acts by PID
only, guarded against PID reuse by the process start time recorded in
:class:`Started`. ``stop()`` signals the element's PID, not its process group:
elements are expected to stop their own workers on SIGTERM.
"""
from __future__ import annotations

import logging
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from gridrpc.errors import GridRPCError

log = logging.getLogger(__name__)

__all__ = [
    "AuthenticationFailed", "ExitedImmediately", "HostKeyMismatch", "HostUnreachable",
    "LaunchError", "Launcher", "LocalLauncher", "PythonMissing", "SSHHostConfig",
    "SSHLauncher", "SlurmLauncher", "Started", "StopResult", "NotReady",
]

StopResult = Literal["not-running", "terminated", "killed"]
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class LaunchError(GridRPCError):
    """An element could not be started, watched or stopped on ``host``."""

    def __init__(self, message: str, *, host: str = "", log_tail: str = "") -> None:
        super().__init__(message)
        self.host = host
        self.log_tail = log_tail


class HostUnreachable(LaunchError):
    pass


class AuthenticationFailed(LaunchError):
    pass


class HostKeyMismatch(LaunchError):
    pass


class PythonMissing(LaunchError):
    pass


class ExitedImmediately(LaunchError):
    def __init__(self, message: str, *, host: str = "", log_tail: str = "",
                 returncode: int | None = None) -> None:
        super().__init__(message, host=host, log_tail=log_tail)
        self.returncode = returncode


class NotReady(LaunchError):
    """The element did not print its readiness line in time, or exited first."""

    def __init__(self, message: str, *, host: str = "", log_tail: str = "",
                 exited: bool = False) -> None:
        super().__init__(message, host=host, log_tail=log_tail)
        self.exited = exited


def _read_head(path: str | os.PathLike, limit: int = 1 << 20) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode(errors="replace")
    except FileNotFoundError:
        return ""


def wait_ready_file(launcher, started: "Started", pattern: str, timeout: float,
                     interval: float = 0.05) -> str:
    """Shared by the local and Slurm launchers: poll the local log file."""
    rx = re.compile(pattern, re.M)
    deadline = time.monotonic() + timeout
    while True:
        m = rx.search(_read_head(started.log_path))
        if m:
            return m.group(0)
        if not launcher.alive(started):
            m = rx.search(_read_head(started.log_path))
            if m:
                return m.group(0)
            tail = tail_file(started.log_path, 30)
            raise NotReady(f"{started.name or 'element'} (pid {started.pid}) exited on {launcher.host} "
                           f"before it was ready; log tail:\n{tail}", host=launcher.host,
                           log_tail=tail, exited=True)
        if time.monotonic() >= deadline:
            tail = tail_file(started.log_path, 30)
            raise NotReady(f"{started.name or 'element'} (pid {started.pid}) on {launcher.host} not ready "
                           f"after {timeout:.0f}s; log tail:\n{tail}", host=launcher.host, log_tail=tail)
        time.sleep(interval)


@dataclass
class BatchResult:
    """Outcome of one element of ``start_many``: ``started`` (None if it could
    not be started), the readiness line, or the error."""
    name: str
    started: "Started | None" = None
    ready_line: str = ""
    error: "LaunchError | None" = None


def start_each(launcher, items, pattern: str, timeout: float, on_started=None,
                max_workers: int = 16) -> dict[str, BatchResult]:
    """Generic ``start_many``: start and wait for each element in threads."""
    import concurrent.futures as cf
    out: dict[str, BatchResult] = {}

    def one(item):
        name, command = item
        res = BatchResult(name)
        try:
            res.started = launcher.start(command, name=name)
            if on_started:
                on_started(name, res.started)
            res.ready_line = launcher.wait_ready(res.started, pattern, timeout)
        except LaunchError as exc:
            res.error = exc
        out[name] = res

    items = list(items)
    if items:
        with cf.ThreadPoolExecutor(max_workers=min(max_workers, len(items))) as pool:
            list(pool.map(one, items))
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Started:
    """What a launcher returns for a started element; plain data, JSON-friendly.

    ``pid_start`` identifies the process beyond its PID (local: psutil create
    time; SSH: ``/proc/PID/stat`` start time; empty when unknown) so a reused
    PID is never signalled. ``step`` and ``job_id`` are the Slurm step name
    and allocation, if any (kept so another shell can ``scancel`` the step).
    """
    launcher: str
    host: str
    pid: int
    log_path: str
    command: tuple[str, ...]
    name: str = ""
    workdir: str = ""
    pid_start: str = ""
    started_at: float = 0.0
    step: str = ""
    job_id: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["command"] = list(self.command)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> Started:
        return cls(**{**d, "command": tuple(d["command"])})


@runtime_checkable
class Launcher(Protocol):
    """Starts and controls element processes on one host."""

    host: str

    def start(self, command: Sequence[str], *, name: str = "",
              env: Mapping[str, str] | None = None) -> Started:
        """Start ``command`` detached; raise :class:`LaunchError` if it cannot
        be started or exits within the launcher's check window."""
        ...

    def alive(self, started: Started) -> bool:
        ...

    def stop(self, started: Started, timeout: float = 10.0) -> StopResult:
        """SIGTERM, then SIGKILL after ``timeout`` seconds."""
        ...

    def logs(self, started: Started, lines: int = 50) -> str:
        """The last ``lines`` lines of the element's stdout+stderr."""
        ...


def log_name(name: str, command: Sequence[str]) -> str:
    base = name or (Path(command[0]).name if command else "cmd")
    base = re.sub(r"[^A-Za-z0-9_.-]", "_", base)[:60] or "cmd"
    return f"{base}-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}.log"


def tail_file(path: str | os.PathLike, lines: int = 50, *, block: int = 8192) -> str:
    """Last ``lines`` lines of a file, reading backwards by blocks."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            pos, data = fh.tell(), b""
            while pos > 0 and data.count(b"\n") <= lines:
                step = min(block, pos)
                pos -= step
                fh.seek(pos)
                data = fh.read(step) + data
    except FileNotFoundError:
        return ""
    out = data.decode(errors="replace").splitlines()[-lines:] if lines > 0 else []
    return "\n".join(out) + ("\n" if out else "")


# -- local ---------------------------------------------------------------------

class LocalLauncher:
    """Start elements as detached processes on this machine.

    Each process runs in a new session (so a Ctrl-C to ``deploy`` does not
    reach it), with stdin from ``/dev/null`` and stdout+stderr appended to
    ``WORKDIR/logs/NAME-STAMP-RAND.log``. ``start`` waits up to
    ``check_window`` seconds for an early exit and raises
    :class:`ExitedImmediately` with the log tail if the process died (0
    disables the check: use it only for commands that are allowed to finish).

    Trade-offs: processes outlive the launcher (by design); the launcher reaps
    the children it started itself, and for a :class:`Started` coming from
    elsewhere (a state file) it checks the PID with psutil and the recorded
    create time.
    """

    launcher_name = "local"

    def __init__(self, workdir: str | os.PathLike, *, env: Mapping[str, str] | None = None,
                 check_window: float = 0.5, host: str = "localhost") -> None:
        self.workdir = Path(workdir).expanduser().resolve()
        self.env = dict(env or {})
        self.check_window = check_window
        self.host = host
        self._procs: dict[int, subprocess.Popen] = {}

    def start(self, command: Sequence[str], *, name: str = "",
              env: Mapping[str, str] | None = None) -> Started:
        if not command:
            raise LaunchError("empty command", host=self.host)
        logdir = self.workdir / "logs"
        logdir.mkdir(parents=True, exist_ok=True)
        log_path = logdir / log_name(name, command)
        full_env = {**os.environ, **self.env, **(env or {})}
        with open(log_path, "ab") as out:
            try:
                proc = subprocess.Popen(
                    list(command), cwd=self.workdir, env=full_env, stdin=subprocess.DEVNULL,
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
            except OSError as exc:
                raise LaunchError(f"cannot start {command[0]!r} on {self.host}: {exc}",
                                  host=self.host) from exc
        self._procs[proc.pid] = proc
        pid_start = ""
        try:
            import psutil
            pid_start = repr(psutil.Process(proc.pid).create_time())
        except Exception:  # already gone, or psutil missing: the check below tells
            pass
        started = Started(launcher=self.launcher_name, host=self.host, pid=proc.pid,
                          log_path=str(log_path), command=tuple(command), name=name,
                          workdir=str(self.workdir), pid_start=pid_start, started_at=time.time())
        if self.check_window > 0:
            try:
                rc = proc.wait(timeout=self.check_window)
            except subprocess.TimeoutExpired:
                rc = None
            if rc is not None:
                self._procs.pop(proc.pid, None)
                tail = tail_file(log_path, 20)
                raise ExitedImmediately(
                    f"{name or command[0]} exited immediately on {self.host} with code {rc}; "
                    f"log {log_path}:\n{tail}", host=self.host, log_tail=tail, returncode=rc)
        log.info("started %s on %s: pid %d, log %s", name or command[0], self.host, proc.pid, log_path)
        return started

    def alive(self, started: Started) -> bool:
        proc = self._procs.get(started.pid)
        if proc is not None:
            return proc.poll() is None
        try:
            import psutil
            p = psutil.Process(started.pid)
            if started.pid_start and repr(p.create_time()) != started.pid_start:
                return False  # PID reused by another process
            return p.status() != psutil.STATUS_ZOMBIE
        except Exception:
            return False

    def _wait_gone(self, started: Started, timeout: float) -> bool:
        proc = self._procs.get(started.pid)
        if proc is not None:
            try:
                proc.wait(timeout=max(timeout, 0))
                return True
            except subprocess.TimeoutExpired:
                return False
        deadline = time.monotonic() + timeout
        while self.alive(started):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def stop(self, started: Started, timeout: float = 10.0) -> StopResult:
        if not self.alive(started):
            self._procs.pop(started.pid, None)
            return "not-running"
        result: StopResult = "terminated"
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.kill(started.pid, sig)
            except ProcessLookupError:
                break
            if self._wait_gone(started, wait):
                break
            result = "killed"
        else:
            raise LaunchError(f"pid {started.pid} on {self.host} survived SIGKILL", host=self.host)
        self._procs.pop(started.pid, None)
        return result

    def logs(self, started: Started, lines: int = 50) -> str:
        return tail_file(started.log_path, lines)

    def wait_ready(self, started: Started, pattern: str, timeout: float) -> str:
        """Wait until a line of the log matches ``pattern``; return it.
        Raises :class:`NotReady` (with the log tail) on exit or timeout."""
        return wait_ready_file(self, started, pattern, timeout)

    def start_many(self, items, pattern: str, timeout: float, on_started=None) -> dict[str, "BatchResult"]:
        """Start each (name, command) and wait until its log matches ``pattern``."""
        return start_each(self, items, pattern, timeout, on_started)

    def alive_many(self, started: Sequence[Started]) -> dict[int, bool]:
        return {st.pid: self.alive(st) for st in started}

    def stop_many(self, started: Sequence[Started], timeout: float = 10.0) -> dict[int, str]:
        """SIGTERM all, wait for all, then SIGKILL the survivors."""
        out: dict[int, str] = {}
        live = []
        for st in started:
            if not self.alive(st):
                self._procs.pop(st.pid, None)
                out[st.pid] = "not-running"
                continue
            try:
                os.kill(st.pid, signal.SIGTERM)
                live.append(st)
            except ProcessLookupError:
                out[st.pid] = "not-running"
        deadline = time.monotonic() + timeout
        for st in live:
            if self._wait_gone(st, max(0.0, deadline - time.monotonic())):
                out[st.pid] = "terminated"
        for st in live:
            if st.pid not in out:
                try:
                    os.kill(st.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                out[st.pid] = ("killed" if self._wait_gone(st, 5.0)
                               else f"error: pid {st.pid} on {self.host} survived SIGKILL")
            self._procs.pop(st.pid, None)
        return out

    def close(self) -> None:
        pass


# the remote launchers live in their own modules (which import this one);
# re-exported here lazily, so that any of them can be imported first
_REMOTE = {"SlurmLauncher": "slurm_launcher", "SSHHostConfig": "ssh", "SSHLauncher": "ssh"}


def __getattr__(name: str):
    mod = _REMOTE.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(f"{__package__}.{mod}"), name)
