"""What every command-line scheduler backend shares: running the scheduler's
commands with a timeout and an environment, and the second half of a cancel
(polling until the job is final or gone: no scheduler's cancel command says
so by its exit status).

A backend module subclasses :class:`CommandBackend` and implements the seven
methods of :class:`~gridrpc.sed.batch.base.BatchBackend` with ``self._run``.
"""
from __future__ import annotations

import logging
import os
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence

from .base import BatchError, BatchTimeout, JobInfo, JobState

__all__ = ["CommandBackend"]

log = logging.getLogger(__name__)


class CommandBackend:
    """Plumbing of a backend whose scheduler is driven by commands.

    :param env: variables added to the environment of every command (e.g. the
        variables that select a cluster); the SeD's own environment is inherited.
    :param bin_dir: directory of the scheduler's commands (default: found on PATH).
    :param command_timeout: seconds each command may take before :class:`BatchTimeout`.
    :param poll_interval: longest pause between polls while a cancel waits.
    """

    name = ""

    def __init__(self, env: Mapping[str, str] | None = None, *, bin_dir: str | None = None,
                 command_timeout: float = 30.0, poll_interval: float = 0.5):
        self.extra_env = dict(env or {})
        self.bin_dir = bin_dir
        self.command_timeout = command_timeout
        self.poll_interval = poll_interval

    def _cmd(self, name: str) -> str:
        return os.path.join(self.bin_dir, name) if self.bin_dir else name

    def _run(self, args: Sequence[str], *, input: str | None = None,
             job_env: Mapping[str, str] | None = None, check: bool = True,
             timeout: float | None = None) -> subprocess.CompletedProcess:
        """Run one command; :class:`BatchError` when it cannot start or (with
        *check*) exits non-zero, :class:`BatchTimeout` when it takes too long."""
        cmd = [self._cmd(args[0]), *args[1:]]
        env = {**os.environ, **self.extra_env, **(job_env or {})}
        timeout = self.command_timeout if timeout is None else timeout
        log.debug("running %s", shlex.join(cmd))
        try:
            r = subprocess.run(cmd, input=input, env=env, capture_output=True, text=True,
                               timeout=timeout, stdin=None if input is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise BatchTimeout(f"{args[0]} did not answer within {timeout:g}s", cmd=cmd,
                               stderr=(exc.stderr or b"").decode(errors="replace")
                               if isinstance(exc.stderr, bytes) else (exc.stderr or "")) from exc
        except OSError as exc:
            raise BatchError(f"cannot run {args[0]}: {exc}", cmd=cmd) from exc
        if check and r.returncode != 0:
            raise BatchError(f"{args[0]} failed", cmd=cmd, returncode=r.returncode,
                             stderr=r.stderr)
        return r

    def _wait_gone(self, job_id: str, timeout: float, cmd: Sequence[str]) -> JobInfo:
        """Poll ``states`` (backing off to ``poll_interval``) until the job is
        final or unknown; :class:`BatchTimeout` after *timeout* seconds."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            info = self.states([job_id])[job_id]
            if info.state.is_final or info.state is JobState.UNKNOWN:
                log.info("%s job %s cancelled: %s", self.name, job_id, info.raw_state or info.state.value)
                return info
            if time.monotonic() >= deadline:
                raise BatchTimeout(f"job {job_id} still {info.raw_state or info.state.value} {timeout:g}s "
                                   f"after {cmd[0]}", cmd=cmd)
            time.sleep(delay)
            delay = min(delay * 2, self.poll_interval)

    def states(self, job_ids):  # pragma: no cover - each backend defines it
        raise NotImplementedError
