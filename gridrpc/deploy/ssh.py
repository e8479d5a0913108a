"""The SSH launcher: elements started with ``nohup`` over the ``ssh`` client,
key-only, host keys checked. See :mod:`gridrpc.deploy.launchers`."""
from __future__ import annotations

import logging
import re
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .launchers import (  # noqa: F401 - shared launcher machinery
    AuthenticationFailed,
    BatchResult,
    ExitedImmediately,
    HostKeyMismatch,
    HostUnreachable,
    LaunchError,
    NotReady,
    PythonMissing,
    Started,
    StopResult,
    _ENV_KEY,
    _log_name,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class SSHHostConfig:
    """How to reach one SSH host and run Python there.

    ``target`` is ``user@host`` or ``host``. ``python`` is the interpreter on
    that host (``venv`` overrides it with ``VENV/bin/python`` and puts the venv
    first on PATH). ``workdir`` holds ``logs/``; relative paths and ``~/`` are
    relative to the remote home. ``ssh_config`` is passed as ``-F`` (tests use
    ``/dev/null`` to ignore the user's config). Each ``ssh_options`` entry is
    either ``Key=Value`` (passed as ``-o Key=Value``) or a raw ssh argument
    starting with ``-``. ``wrapper`` prefixes the local
    ssh client command (e.g. ``["ip", "netns", "exec", "h1"]``).
    ``check_module`` is imported with the configured python and env before
    starting (None to skip). ``check_window`` is how long the remote side
    watches the new process for an immediate exit. ``control_path`` turns on
    connection sharing (``ControlMaster=auto``, ``ControlPersist``): later
    sessions skip the key exchange; :meth:`SSHLauncher.close` ends the master.
    """
    target: str
    port: int = 22
    key_path: str | None = None
    known_hosts: str | None = None
    python: str = "python3"
    venv: str | None = None
    workdir: str = "gridrpc-work"
    env: Mapping[str, str] = field(default_factory=dict)
    ssh_options: tuple[str, ...] = ()
    ssh_config: str | None = None
    wrapper: tuple[str, ...] = ()
    connect_timeout: float = 10.0
    check_module: str | None = "gridrpc"
    check_window: float = 1.0
    ssh_binary: str = "ssh"
    control_path: str | None = None
    control_persist: int = 30

    @property
    def python_executable(self) -> str:
        return f"{self.venv.rstrip('/')}/bin/python" if self.venv else self.python

    @property
    def hostname(self) -> str:
        return self.target.rsplit("@", 1)[-1]


def _rpath(path: str) -> str:
    """Quote a remote path for sh, keeping a leading ``~/`` expandable."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


# Remote helpers: is PID alive (not a zombie, same start time)?
_SH_ALIVE = r"""
pstart() { [ -r /proc/$1/stat ] && sed 's/^.*) //' /proc/$1/stat 2>/dev/null | awk '{print $20}'; }
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  if [ -r /proc/$1/stat ]; then
    st=$(sed 's/^.*) //' /proc/$1/stat 2>/dev/null | awk '{print $1}')
    [ "$st" = Z ] && return 1
    [ -n "$2" ] && [ "$(pstart "$1")" != "$2" ] && return 1
  fi
  return 0
}
"""

_MARK = "@@gridrpc"
_RC_WORKDIR, _RC_PYTHON, _RC_MODULE = 97, 98, 99


class SSHLauncher:
    """Start elements on a remote host with the ``ssh`` client, key-only.

    ``start`` runs, in one ssh session, ``mkdir -p WORKDIR; cd WORKDIR``, checks
    that the python runs and ``check_module`` imports, then
    ``nohup CMD >LOG 2>&1 </dev/null &`` and watches the new PID for
    ``check_window`` seconds. Each list element is its own statement (never
    ``a && b && nohup c &``, which backgrounds the whole list and keeps ssh's
    stdout open). ``alive`` is ``kill -0`` plus a zombie and start-time check;
    ``stop`` is TERM, wait, KILL; ``logs`` is ``tail -n``.

    Options: ``BatchMode=yes`` (never prompt), ``StrictHostKeyChecking=yes``
    (unknown or changed host keys fail), ``IdentitiesOnly=yes`` with
    ``key_path``. Errors are classified from ssh's exit code (255) and stderr.
    The remote login shell must be able to run ``sh -c '...'``.
    """

    launcher_name = "ssh"

    def __init__(self, host_config: SSHHostConfig) -> None:
        self.config = host_config
        self.host = host_config.target
        self.checked = False  # set by a successful check(): start() then skips the python check
        for key in host_config.env:
            if not _ENV_KEY.match(key):
                raise LaunchError(f"invalid environment variable name {key!r}", host=self.host)

    # the ssh client
    def ssh_argv(self, remote_cmd: str) -> list[str]:
        c = self.config
        argv = [*c.wrapper, c.ssh_binary]
        if c.ssh_config:
            argv += ["-F", c.ssh_config]
        if c.key_path:
            argv += ["-i", c.key_path, "-o", "IdentitiesOnly=yes"]
        if c.known_hosts:
            argv += ["-o", f"UserKnownHostsFile={c.known_hosts}"]
        argv += ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                 "-o", "PasswordAuthentication=no", "-o", "KbdInteractiveAuthentication=no",
                 "-o", f"ConnectTimeout={max(1, int(c.connect_timeout))}",
                 "-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3",
                 "-p", str(c.port)]
        if c.control_path:
            argv += ["-o", "ControlMaster=auto", "-o", f"ControlPath={c.control_path}",
                     "-o", f"ControlPersist={int(c.control_persist)}"]
        for opt in c.ssh_options:
            argv += [opt] if opt.startswith("-") else ["-o", opt]
        argv += ["-T", c.target, remote_cmd]
        return argv

    def run(self, script: str, *, timeout: float | None = None) -> subprocess.CompletedProcess:
        """Run a POSIX sh ``script`` on the host; ssh-level failures raise LaunchError."""
        c = self.config
        argv = self.ssh_argv("sh -c " + shlex.quote(script))
        limit = timeout if timeout is not None else c.connect_timeout + c.check_window + 60
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=limit,
                                 stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise HostUnreachable(f"ssh to {self.host} timed out after {limit:.0f}s "
                                  "(host unreachable or hanging)", host=self.host) from exc
        except OSError as exc:
            raise LaunchError(f"cannot run the ssh client {argv[0]!r}: {exc}", host=self.host) from exc
        if res.returncode == 255:
            raise self._classify(res.stderr)
        return res

    def _classify(self, stderr: str) -> LaunchError:
        err = stderr.strip()
        low = err.lower()
        where = f"{self.host} (port {self.config.port})"
        if ("remote host identification has changed" in low or "host key verification failed" in low
                or "host key is known" in low or "no matching host key" in low):
            kind = "changed" if "has changed" in low else "unknown or not matching"
            return HostKeyMismatch(
                f"host key verification failed for {where}: key {kind} in "
                f"{self.config.known_hosts or '~/.ssh/known_hosts'}\n{err}", host=self.host)
        if "permission denied" in low or "too many authentication failures" in low:
            return AuthenticationFailed(
                f"authentication failed for {self.config.target}: the host refused key "
                f"{self.config.key_path or '(default keys)'}\n{err}", host=self.host)
        unreachable = ("connection refused", "connection timed out", "no route to host",
                       "network is unreachable", "could not resolve hostname", "operation timed out",
                       "connection reset", "connection closed", "kex_exchange_identification",
                       "name or service not known", "host is down")
        if any(s in low for s in unreachable):
            return HostUnreachable(f"host {where} unreachable: {err}", host=self.host)
        return LaunchError(f"ssh to {where} failed: {err or 'exit status 255'}", host=self.host)

    def _prelude(self, extra_env: Mapping[str, str] | None = None) -> str:
        c = self.config
        env = {**c.env, **(extra_env or {})}
        for key in env:
            if not _ENV_KEY.match(key):
                raise LaunchError(f"invalid environment variable name {key!r}", host=self.host)
        lines = [f'mkdir -p {_rpath(c.workdir)} 2>/dev/null; cd {_rpath(c.workdir)} || '
                 f'{{ echo "{_MARK} workdir"; exit {_RC_WORKDIR}; }}']
        if c.venv:
            lines += [f"VIRTUAL_ENV={_rpath(c.venv.rstrip('/'))}; export VIRTUAL_ENV",
                      'PATH="$VIRTUAL_ENV/bin:$PATH"; export PATH']
        lines += [f"{k}={shlex.quote(v)}; export {k}" for k, v in env.items()]
        return "\n".join(lines) + "\n"

    def _check_script(self) -> str:
        """One python run: the interpreter exists (126/127 otherwise) and
        imports ``check_module``; leaves its version in ``$pyver``."""
        c = self.config
        if self.checked:
            return ""
        py = _rpath(c.python_executable)
        imp = f"; import {c.check_module}" if c.check_module else ""
        return (f'out=$({py} -c "import sys; print(sys.version.split()[0]){imp}" 2>&1); rc=$?\n'
                f'if [ $rc -eq 126 ] || [ $rc -eq 127 ]; then echo "{_MARK} python"; exit {_RC_PYTHON}; fi\n'
                f'if [ $rc -ne 0 ]; then echo "{_MARK} module"; printf "%s\\n" "$out" | tail -n 5; '
                f'exit {_RC_MODULE}; fi\n'
                'pyver=$(printf "%s\\n" "$out" | head -n 1)\n')

    def _raise_preflight(self, res: subprocess.CompletedProcess) -> None:
        c, out = self.config, (res.stdout + res.stderr).strip()
        if res.returncode == _RC_WORKDIR:
            raise LaunchError(f"cannot create or enter workdir {c.workdir!r} on {self.host}", host=self.host)
        if res.returncode == _RC_PYTHON:
            raise PythonMissing(f"python not found on {self.host}: {c.python_executable!r} "
                                "does not exist or is not executable (set python/venv in the host config)",
                                host=self.host)
        if res.returncode == _RC_MODULE:
            detail = out.split(f"{_MARK} module", 1)[-1].strip()
            raise PythonMissing(f"python {c.python_executable!r} on {self.host} cannot import "
                                f"{c.check_module!r} (install gridrpc there or set PYTHONPATH/venv):\n{detail}",
                                host=self.host)

    def check(self) -> str:
        """Preflight only: reach the host, enter the workdir, check python; return its version."""
        self.checked = False
        script = self._prelude() + self._check_script() + f'echo "{_MARK} version $pyver"\n'
        res = self.run(script)
        self._raise_preflight(res)
        if res.returncode != 0:
            raise LaunchError(f"preflight on {self.host} failed ({res.returncode}): {res.stderr.strip()}",
                              host=self.host)
        self.checked = True
        m = re.search(rf"^{_MARK} version (.*)$", res.stdout, re.M)
        return m.group(1).strip() if m else ""

    def _rpy(self) -> str:
        return _rpath(self.config.python_executable)

    def start(self, command: Sequence[str], *, name: str = "",
              env: Mapping[str, str] | None = None) -> Started:
        if not command:
            raise LaunchError("empty command", host=self.host)
        c = self.config
        logf = "logs/" + _log_name(name, command)
        steps = max(1, int(c.check_window * 10))
        script = (self._prelude(env) + self._check_script() + _SH_ALIVE +
                  "mkdir -p logs\n"
                  f"nohup {shlex.join(command)} >{logf} 2>&1 </dev/null &\n"
                  "pid=$!\n"
                  f'echo "{_MARK} pid=$pid start=$(pstart $pid) log=$PWD/{logf}"\n'
                  f"i=0; while [ $i -lt {steps} ]; do\n"
                  "  if ! alive $pid; then wait $pid; rc=$?\n"
                  f'    echo "{_MARK} exited rc=$rc"; tail -n 20 {logf}; exit 0; fi\n'
                  "  sleep 0.1; i=$((i+1))\n"
                  "done\n"
                  f'echo "{_MARK} running"\n')
        res = self.run(script)
        self._raise_preflight(res)
        m = re.search(rf"^{_MARK} pid=(\d+) start=(\S*) log=(.*)$", res.stdout, re.M)
        if res.returncode != 0 or not m:
            raise LaunchError(f"starting {name or command[0]} on {self.host} failed "
                              f"({res.returncode}): {(res.stdout + res.stderr).strip()}", host=self.host)
        pid, pid_start, log_path = int(m.group(1)), m.group(2), m.group(3).strip()
        ex = re.search(rf"^{_MARK} exited rc=(\d+)$", res.stdout, re.M)
        if ex:
            tail = res.stdout[ex.end():].lstrip("\n")
            raise ExitedImmediately(
                f"{name or command[0]} exited immediately on {self.host} with code {ex.group(1)}; "
                f"log {log_path}:\n{tail}", host=self.host, log_tail=tail, returncode=int(ex.group(1)))
        log.info("started %s on %s: pid %d, log %s", name or command[0], self.host, pid, log_path)
        return Started(launcher=self.launcher_name, host=self.host, pid=pid, log_path=log_path,
                       command=tuple(command), name=name, workdir=c.workdir, pid_start=pid_start,
                       started_at=time.time())

    def alive(self, started: Started) -> bool:
        res = self.run(_SH_ALIVE + f"alive {started.pid} {shlex.quote(started.pid_start)}\n")
        return res.returncode == 0

    def stop(self, started: Started, timeout: float = 10.0) -> StopResult:
        pid, st = started.pid, shlex.quote(started.pid_start)
        steps = max(1, int(timeout * 10))
        script = _SH_ALIVE + (
            f'alive {pid} {st} || {{ echo "{_MARK} not-running"; exit 0; }}\n'
            f"kill -TERM {pid} 2>/dev/null\n"
            f"i=0; while [ $i -lt {steps} ]; do\n"
            f'  alive {pid} {st} || {{ echo "{_MARK} terminated"; exit 0; }}\n'
            "  sleep 0.1; i=$((i+1))\n"
            "done\n"
            f"kill -KILL {pid} 2>/dev/null\n"
            "i=0; while [ $i -lt 50 ]; do\n"
            f'  alive {pid} {st} || {{ echo "{_MARK} killed"; exit 0; }}\n'
            "  sleep 0.1; i=$((i+1))\n"
            "done\n"
            f'echo "{_MARK} survived"; exit 1\n')
        res = self.run(script, timeout=self.config.connect_timeout + timeout + 30)
        m = re.search(rf"^{_MARK} (\S+)$", res.stdout, re.M)
        if res.returncode != 0 or not m or m.group(1) == "survived":
            raise LaunchError(f"could not stop pid {pid} on {self.host}: "
                              f"{(res.stdout + res.stderr).strip()}", host=self.host)
        return m.group(1)  # type: ignore[return-value]

    def logs(self, started: Started, lines: int = 50) -> str:
        res = self.run(f"tail -n {int(lines)} {shlex.quote(started.log_path)} 2>/dev/null; exit 0\n")
        return res.stdout

    def wait_ready(self, started: Started, pattern: str, timeout: float) -> str:
        """Wait (on the host, in one ssh session) until a log line matches the
        extended regex ``pattern``; return it. Raises :class:`NotReady`."""
        pid, st, logf = started.pid, shlex.quote(started.pid_start), shlex.quote(started.log_path)
        steps = max(1, int(timeout * 10))
        pat = shlex.quote(pattern)
        script = _SH_ALIVE + (
            f"i=0; while :; do\n"
            f"  line=$(grep -m1 -E {pat} {logf} 2>/dev/null) && {{ echo \"{_MARK} ready\"; printf '%s\\n' \"$line\"; exit 0; }}\n"
            f"  if ! alive {pid} {st}; then\n"
            f"    line=$(grep -m1 -E {pat} {logf} 2>/dev/null) && {{ echo \"{_MARK} ready\"; printf '%s\\n' \"$line\"; exit 0; }}\n"
            f"    echo \"{_MARK} exited\"; tail -n 30 {logf} 2>/dev/null; exit 0; fi\n"
            f"  [ $i -ge {steps} ] && {{ echo \"{_MARK} timeout\"; tail -n 30 {logf} 2>/dev/null; exit 0; }}\n"
            "  sleep 0.1; i=$((i+1))\n"
            "done\n")
        res = self.run(script, timeout=self.config.connect_timeout + timeout + 30)
        m = re.search(rf"^{_MARK} (ready|exited|timeout)$", res.stdout, re.M)
        if not m:
            raise LaunchError(f"waiting for {started.name or pid} on {self.host} failed ({res.returncode}): "
                              f"{(res.stdout + res.stderr).strip()}", host=self.host)
        rest = res.stdout[m.end():].lstrip("\n")
        if m.group(1) == "ready":
            return rest.splitlines()[0] if rest else ""
        who = f"{started.name or 'element'} (pid {pid})"
        if m.group(1) == "exited":
            raise NotReady(f"{who} exited on {self.host} before it was ready; log {started.log_path}, "
                           f"tail:\n{rest}", host=self.host, log_tail=rest, exited=True)
        raise NotReady(f"{who} on {self.host} not ready after {timeout:.0f}s; log {started.log_path}, "
                       f"tail:\n{rest}", host=self.host, log_tail=rest)

    def start_many(self, items, pattern: str, timeout: float, on_started=None) -> dict[str, BatchResult]:
        """Start every (name, command) of ``items`` and wait until each log has
        a line matching the extended regex ``pattern`` -- all in ONE ssh
        session. ``on_started(name, Started)`` is called as soon as each pid is
        known (before the waiting), so a caller can record it."""
        items = list(items)
        if not items:
            return {}
        c = self.config
        steps = max(1, int(timeout * 10))
        pat = shlex.quote(pattern)
        lines = [self._prelude() + self._check_script() + _SH_ALIVE, "mkdir -p logs"]
        logs = []
        for i, (name, command) in enumerate(items):
            if not command:
                raise LaunchError(f"empty command for {name}", host=self.host)
            logf = "logs/" + _log_name(name, command)
            logs.append(logf)
            lines += [f"nohup {shlex.join(command)} >{logf} 2>&1 </dev/null &",
                      f"p{i}=$!; s{i}=$(pstart $p{i}); d{i}=0",
                      f'echo "{_MARK} started {i} pid=$p{i} start=$s{i} log=$PWD/{logf}"']
        lines += ["i=0", "while :; do", "  all=1"]
        for i, logf in enumerate(logs):
            lf = shlex.quote(logf)
            lines += [
                f"  if [ $d{i} = 0 ]; then",
                f"    if line=$(grep -m1 -E {pat} {lf} 2>/dev/null); then "
                f"printf '%s\\n' \"{_MARK} ready {i} $line\"; d{i}=1",
                f"    elif ! alive $p{i} $s{i}; then",
                f"      if line=$(grep -m1 -E {pat} {lf} 2>/dev/null); then "
                f"printf '%s\\n' \"{_MARK} ready {i} $line\"",
                f"      else echo \"{_MARK} exited {i}\"; tail -n 30 {lf} 2>/dev/null | sed 's/^/{_MARK}+{i} /'; fi",
                f"      d{i}=1",
                "    else all=0; fi",
                "  fi"]
        lines += ["  [ $all = 1 ] && break", f"  if [ $i -ge {steps} ]; then"]
        for i, logf in enumerate(logs):
            lines.append(f"    [ $d{i} = 0 ] && {{ echo \"{_MARK} timeout {i}\"; tail -n 30 {shlex.quote(logf)} "
                         f"2>/dev/null | sed 's/^/{_MARK}+{i} /'; }}")
        lines += ["    break", "  fi", "  sleep 0.1; i=$((i+1))", "done", "exit 0"]
        script = "\n".join(lines) + "\n"
        argv = self.ssh_argv("sh -c " + shlex.quote(script))
        results = {name: BatchResult(name) for name, _ in items}
        tails: dict[int, list[str]] = {}
        outcome: dict[int, str] = {}
        limit = c.connect_timeout + timeout + 60
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        except OSError as exc:
            raise LaunchError(f"cannot run the ssh client {argv[0]!r}: {exc}", host=self.host) from exc
        import threading
        timer = threading.Timer(limit, proc.kill)
        timer.start()
        other = []
        try:
            for raw in proc.stdout:
                line = raw.rstrip("\n")
                m = re.match(rf"^{_MARK} started (\d+) pid=(\d+) start=(\S*) log=(.*)$", line)
                if m:
                    i = int(m.group(1))
                    name, command = items[i]
                    st = Started(launcher=self.launcher_name, host=self.host, pid=int(m.group(2)),
                                 log_path=m.group(4).strip(), command=tuple(command), name=name,
                                 workdir=c.workdir, pid_start=m.group(3), started_at=time.time())
                    results[name].started = st
                    if on_started:
                        on_started(name, st)
                    continue
                m = re.match(rf"^{_MARK} (ready|exited|timeout) (\d+) ?(.*)$", line)
                if m:
                    i = int(m.group(2))
                    outcome[i] = m.group(1)
                    if m.group(1) == "ready":
                        results[items[i][0]].ready_line = m.group(3)
                    continue
                m = re.match(rf"^{_MARK}\+(\d+) ?(.*)$", line)
                if m:
                    tails.setdefault(int(m.group(1)), []).append(m.group(2))
                    continue
                other.append(line)
            stderr = proc.stderr.read()
            rc = proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if rc == 255 and not any(r.started for r in results.values()):
            raise self._classify(stderr)
        if rc in (_RC_WORKDIR, _RC_PYTHON, _RC_MODULE):
            self._raise_preflight(subprocess.CompletedProcess(argv, rc, "\n".join(other), stderr))
        for i, (name, _) in enumerate(items):
            r = results[name]
            if r.started is None:
                r.error = LaunchError(f"starting {name} on {self.host} failed ({rc}): "
                                      f"{(chr(10).join(other) + stderr).strip()[-500:]}", host=self.host)
            elif outcome.get(i) == "ready":
                pass
            else:
                tail = "\n".join(tails.get(i, [])) + ("\n" if tails.get(i) else "")
                what = outcome.get(i)
                who = f"{name} (pid {r.started.pid})"
                if what == "exited":
                    r.error = NotReady(f"{who} exited on {self.host} before it was ready; log "
                                       f"{r.started.log_path}, tail:\n{tail}", host=self.host, log_tail=tail,
                                       exited=True)
                elif what == "timeout":
                    r.error = NotReady(f"{who} on {self.host} not ready after {timeout:.0f}s; log "
                                       f"{r.started.log_path}, tail:\n{tail}", host=self.host, log_tail=tail)
                else:
                    r.error = LaunchError(f"lost track of {who} on {self.host} (ssh ended with {rc}): "
                                          f"{stderr.strip()[-300:]}", host=self.host)
        return results

    def alive_many(self, started: Sequence[Started]) -> dict[int, bool]:
        """One ssh session for all: {pid: alive}."""
        if not started:
            return {}
        script = _SH_ALIVE + "".join(
            f'alive {st.pid} {shlex.quote(st.pid_start)} && echo "{_MARK} {st.pid} 1" || '
            f'echo "{_MARK} {st.pid} 0"\n' for st in started)
        res = self.run(script)
        seen = {int(p): f == "1" for p, f in re.findall(rf"^{_MARK} (\d+) ([01])$", res.stdout, re.M)}
        return {st.pid: seen.get(st.pid, False) for st in started}

    def stop_many(self, started: Sequence[Started], timeout: float = 10.0) -> dict[int, str]:
        """TERM all, wait up to ``timeout`` for all, KILL survivors: one ssh session.
        Returns {pid: "not-running" | "terminated" | "killed" | "error: ..."}."""
        if not started:
            return {}
        pairs = " ".join(f"{st.pid}:{st.pid_start or '-'}" for st in started)
        steps = max(1, int(timeout * 10))
        script = _SH_ALIVE + f"""
pairs={shlex.quote(pairs)}
st_of() {{ s=${{1#*:}}; [ "$s" = - ] && s=; printf '%s' "$s"; }}
live=
for pp in $pairs; do
  p=${{pp%%:*}}
  if alive "$p" "$(st_of "$pp")"; then kill -TERM "$p" 2>/dev/null; live="$live $pp"
  else echo "{_MARK} $p not-running"; fi
done
i=0
while [ -n "$live" ] && [ $i -lt {steps} ]; do
  sleep 0.1; i=$((i+1)); next=
  for pp in $live; do
    p=${{pp%%:*}}
    if alive "$p" "$(st_of "$pp")"; then next="$next $pp"; else echo "{_MARK} $p terminated"; fi
  done
  live=$next
done
for pp in $live; do kill -KILL "${{pp%%:*}}" 2>/dev/null; done
i=0
while [ -n "$live" ] && [ $i -lt 50 ]; do
  next=
  for pp in $live; do
    p=${{pp%%:*}}
    if alive "$p" "$(st_of "$pp")"; then next="$next $pp"; else echo "{_MARK} $p killed"; fi
  done
  live=$next; [ -n "$live" ] && sleep 0.1; i=$((i+1))
done
for pp in $live; do echo "{_MARK} ${{pp%%:*}} survived"; done
exit 0
"""
        res = self.run(script, timeout=self.config.connect_timeout + timeout + 40)
        got = {int(p): r for p, r in re.findall(rf"^{_MARK} (\d+) (\S+)$", res.stdout, re.M)}
        out = {}
        for st in started:
            r = got.get(st.pid)
            out[st.pid] = (r if r in ("not-running", "terminated", "killed") else
                           f"error: pid {st.pid} on {self.host} "
                           + ("survived SIGKILL" if r == "survived" else
                              f"not reported: {(res.stdout + res.stderr).strip()[-300:]}"))
        return out

    def close(self) -> None:
        """End the shared connection (if ``control_path``); never raises."""
        c = self.config
        if not c.control_path:
            return
        argv = [*c.wrapper, c.ssh_binary] + (["-F", c.ssh_config] if c.ssh_config else []) + [
            "-o", f"ControlPath={c.control_path}", "-O", "exit", "-p", str(c.port), c.target]
        try:
            subprocess.run(argv, capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            pass


# -- slurm -------------------------------------------------------------------------
