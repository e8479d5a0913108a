"""The local side of the SSH launcher (:mod:`.ssh`): how to reach one host
(:class:`SSHHostConfig`), the ``ssh`` client command line, running a script
there, and what an ssh failure means.

Options: ``BatchMode=yes`` (never prompt), ``StrictHostKeyChecking=yes``
(unknown or changed host keys fail), ``IdentitiesOnly=yes`` with
``key_path``. Errors are classified from ssh's exit code (255) and stderr
into :class:`~gridrpc.deploy.launchers.HostUnreachable`,
:class:`~gridrpc.deploy.launchers.AuthenticationFailed`,
:class:`~gridrpc.deploy.launchers.HostKeyMismatch` or a plain
:class:`~gridrpc.deploy.launchers.LaunchError`.
"""
from __future__ import annotations

import shlex
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field

from .launchers import AuthenticationFailed, HostKeyMismatch, HostUnreachable, LaunchError


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


def ssh_argv(c: SSHHostConfig, remote_cmd: str) -> list[str]:
    """The ssh client command running ``remote_cmd`` on ``c.target``."""
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


def script_argv(c: SSHHostConfig, script: str) -> list[str]:
    """The ssh client command running the POSIX sh ``script`` on the host."""
    return ssh_argv(c, "sh -c " + shlex.quote(script))


def classify(c: SSHHostConfig, stderr: str) -> LaunchError:
    """The error an ssh exit status 255 with this ``stderr`` stands for."""
    host = c.target
    err = stderr.strip()
    low = err.lower()
    where = f"{host} (port {c.port})"
    if ("remote host identification has changed" in low or "host key verification failed" in low
            or "host key is known" in low or "no matching host key" in low):
        kind = "changed" if "has changed" in low else "unknown or not matching"
        return HostKeyMismatch(
            f"host key verification failed for {where}: key {kind} in "
            f"{c.known_hosts or '~/.ssh/known_hosts'}\n{err}", host=host)
    if "permission denied" in low or "too many authentication failures" in low:
        return AuthenticationFailed(
            f"authentication failed for {c.target}: the host refused key "
            f"{c.key_path or '(default keys)'}\n{err}", host=host)
    unreachable = ("connection refused", "connection timed out", "no route to host",
                   "network is unreachable", "could not resolve hostname", "operation timed out",
                   "connection reset", "connection closed", "kex_exchange_identification",
                   "name or service not known", "host is down")
    if any(s in low for s in unreachable):
        return HostUnreachable(f"host {where} unreachable: {err}", host=host)
    return LaunchError(f"ssh to {where} failed: {err or 'exit status 255'}", host=host)


def run_script(c: SSHHostConfig, script: str, *, timeout: float | None = None) -> subprocess.CompletedProcess:
    """Run a POSIX sh ``script`` on the host; ssh-level failures raise LaunchError."""
    argv = script_argv(c, script)
    limit = timeout if timeout is not None else c.connect_timeout + c.check_window + 60
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=limit,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise HostUnreachable(f"ssh to {c.target} timed out after {limit:.0f}s "
                              "(host unreachable or hanging)", host=c.target) from exc
    except OSError as exc:
        raise LaunchError(f"cannot run the ssh client {argv[0]!r}: {exc}", host=c.target) from exc
    if res.returncode == 255:
        raise classify(c, res.stderr)
    return res


def open_script(c: SSHHostConfig, script: str) -> subprocess.Popen:
    """Start ``script`` on the host, its output readable as it comes (text)."""
    argv = script_argv(c, script)
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        raise LaunchError(f"cannot run the ssh client {argv[0]!r}: {exc}", host=c.target) from exc


def close_master(c: SSHHostConfig) -> None:
    """End the shared connection (if ``control_path``); never raises."""
    if not c.control_path:
        return
    argv = [*c.wrapper, c.ssh_binary] + (["-F", c.ssh_config] if c.ssh_config else []) + [
        "-o", f"ControlPath={c.control_path}", "-O", "exit", "-p", str(c.port), c.target]
    try:
        subprocess.run(argv, capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        pass
