"""A private, throw-away Slurm cluster for tests (see shared notes/slurm.md).

``PrivateSlurm(workdir)`` writes a ``slurm.conf`` under *workdir*, starts its
own ``munged`` (random key, private socket), ``slurmctld`` and one ``slurmd``
as children in new sessions, and waits until the node is idle. Nothing outside
*workdir* is written; no system daemon, pid file or ``/etc`` file is touched.
Several instances can run side by side (distinct ports, sockets and node
names)::

    with PrivateSlurm(tmp_path, name="c1") as cluster:
        cluster.run(["sbatch", "--parsable", "--wrap", "true"])
        SlurmBackend(env=cluster.env)

``stop()`` cancels every job, waits (bounded) for an empty queue, then ends
only the processes it started: the daemons (each in a session and process
group of its own), then any leftover ``slurmstepd`` -- found by a marker
variable that only our daemons' environment holds -- with the job processes
of its session (``slurmstepd`` calls ``setsid``). It never kills by name.
"""
from __future__ import annotations

import getpass
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.daemon_procs import free_port as _free_port
from tests.daemon_procs import marked_processes
from tests.daemon_procs import proc_stat as _stat

__all__ = ["PrivateSlurm", "SlurmClusterError", "slurm_installed"]

class SlurmClusterError(RuntimeError):
    """The private cluster could not be started."""


def slurm_installed() -> bool:
    """True when the Slurm daemons, client commands and munged are on PATH.
    (PATH only, like the code under test: no hidden fallback to /usr/sbin, so
    a PATH without Slurm really means "no Slurm"; tests/requirements.py says
    where a binary missing from PATH lives.)"""
    return all(_which(b) for b in ("slurmctld", "slurmd", "munged", "sbatch", "sinfo"))


def _which(binary: str) -> str | None:
    return shutil.which(binary)


def _total_memory_mb() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 1024


def _descendants(marker: bytes, sids: set[int]) -> list[int]:
    """Live PIDs started by our daemons: those whose environment holds
    *marker* (given only to the daemons, inherited by ``slurmstepd``), and every
    process in their sessions or in *sids* (the sessions we created).
    ``slurmstepd`` double-forks and calls ``setsid``; the job processes stay in
    its session. Our own session is never included."""
    return marked_processes(marker, sids)


class PrivateSlurm:
    """A private Slurm instance: munged + slurmctld + one slurmd.

    :param workdir: directory for everything (config, state, spool, logs).
    :param name: instance name; the node is ``f"{name}node1"``.
    :param cpus: CPUs the node advertises (default: ``max(2, os.cpu_count())``).
    :param real_memory: MB the node advertises (default: the machine's memory).
    :param max_time: partition ``MaxTime`` (``"INFINITE"`` or a Slurm time).
    :param extra_conf: lines appended to ``slurm.conf`` (e.g. another
        ``PartitionName=... Nodes={node}``; ``{node}`` is replaced by the node name).
    :param start_timeout: seconds ``start()`` waits for an idle node.
    """

    def __init__(self, workdir: str | os.PathLike, name: str = "c1", cpus: int | None = None,
                 *, real_memory: int | None = None, max_time: str = "INFINITE",
                 partition: str = "debug", extra_conf: str = "",
                 start_timeout: float = 30.0):
        self.workdir = Path(workdir).resolve()
        self.name = name
        self.cpus = cpus or max(2, os.cpu_count() or 1)
        self.real_memory = real_memory or _total_memory_mb()
        self.max_time = max_time
        self.partition = partition
        self.node_name = f"{name}node1"
        self.extra_conf = extra_conf.replace("{node}", self.node_name)
        self.start_timeout = start_timeout
        self.hostname = socket.gethostname().split(".")[0]
        self.user = getpass.getuser()
        self.conf_path = self.workdir / "slurm.conf"
        self.munge_socket = self.workdir / "run" / "munge.sock"
        self.ctld_port = 0
        self.slurmd_port = 0
        self._procs: dict[str, subprocess.Popen] = {}
        self._sessions: set[int] = set()   # sessions we created (daemon pids)
        # given to the daemons only: finds slurmstepd/job processes at stop()
        self._marker = f"GRIDRPC_PRIVATE_SLURM={self.workdir}#{secrets.token_hex(8)}"
        self._started = False

    # -- public -----------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        """Variables to add to the environment of Slurm client commands.

        ``slurm.conf`` carries ``AuthInfo=socket=...``, so the commands find
        the private munged through ``SLURM_CONF`` alone; ``MUNGE_SOCKET`` is
        informative (for ``munge``/``unmunge`` called by hand with ``-S``).
        """
        return {"SLURM_CONF": str(self.conf_path), "MUNGE_SOCKET": str(self.munge_socket)}

    def full_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.env)
        env["PATH"] = env.get("PATH", "") + ":/usr/sbin:/sbin"
        return env

    def run(self, cmd: list[str], *, check: bool = True, timeout: float = 30.0,
            input: str | None = None) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster; text output."""
        return subprocess.run(cmd, env=self.full_env(), capture_output=True, text=True,
                              check=check, timeout=timeout, input=input,
                              cwd=self.workdir)

    @property
    def pids(self) -> dict[str, int]:
        return {k: p.pid for k, p in self._procs.items()}

    def processes(self) -> list[int]:
        """Live PIDs this instance started: daemons, their sessions,
        ``slurmstepd`` and job processes. Empty after ``stop()``."""
        return _descendants(self._marker.encode(), self._sessions)

    def log(self, daemon: str) -> str:
        path = self.workdir / "log" / f"{daemon}.log"
        try:
            return path.read_text(errors="replace")
        except OSError:
            return ""

    def start(self) -> "PrivateSlurm":
        """Start munged, slurmctld and slurmd; return once the node is idle.
        Retried (new ports) if a daemon lost the race for its free port."""
        if self._started:
            return self
        if not slurm_installed():
            raise SlurmClusterError("Slurm/munge not installed (run scripts/install-test-deps)")
        for attempt in range(3):
            try:
                return self._start_once()
            except SlurmClusterError as exc:
                if "Address already in use" not in str(exc) or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _start_once(self) -> "PrivateSlurm":
        self._started = True
        self._sessions.clear()
        try:
            self._prepare()
            self._spawn("munged", [_which("munged"), "-F", "--force",
                                   f"--socket={self.munge_socket}",
                                   f"--key-file={self.workdir / 'etc' / 'munge.key'}",
                                   f"--pid-file={self.workdir / 'run' / 'munged.pid'}",
                                   f"--log-file={self.workdir / 'log' / 'munged.log'}",
                                   f"--seed-file={self.workdir / 'state' / 'munged.seed'}"])
            self._wait_for(lambda: self.munge_socket.exists(), "munged socket", 10.0)
            self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(self.conf_path)])
            self._spawn("slurmd", [_which("slurmd"), "-D", "-N", self.node_name,
                                   "-f", str(self.conf_path)])
            self._wait_for(self._node_idle, f"node {self.node_name} idle", self.start_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        try:
            if self._alive("slurmctld"):
                self.cancel_all(timeout=30.0)
        finally:
            self._kill_everything()

    def __enter__(self) -> "PrivateSlurm":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- internals --------------------------------------------------------
    def _prepare(self) -> None:
        # slurmd's step sockets are <spool>/<node>_<job>.<step>; sun_path holds 108 bytes
        longest = f"{self.workdir}/spool/{self.node_name}_9999999.4294967294"
        if len(longest) > 107:
            raise SlurmClusterError(
                f"workdir {self.workdir} is too long: slurmd's unix socket paths under it "
                f"would exceed 107 bytes ({len(longest)}); use a shorter directory")
        for sub in ("etc", "run", "log", "state", "spool"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.workdir, 0o700)
        for stale in (self.munge_socket, self.workdir / "run" / "munge.sock.lock"):
            stale.unlink(missing_ok=True)      # from an earlier start in this workdir
        key = self.workdir / "etc" / "munge.key"
        if key.exists():
            key.chmod(0o600)
        key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o400)
        self.ctld_port = _free_port()
        self.slurmd_port = _free_port()
        while self.slurmd_port == self.ctld_port:
            self.slurmd_port = _free_port()
        d = self.workdir
        conf = f"""\
# private test cluster {self.name!r}, written by tests/slurm_cluster.py
ClusterName=gridrpc{self.name.lower()}
SlurmctldHost={self.hostname}(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmdPort={self.slurmd_port}
SlurmUser={self.user}
SlurmdUser={self.user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={d}/log/jobcomp.log
ReturnToService=2
MinJobAge=3600
KillWait=2
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName={self.node_name} NodeHostname={self.hostname} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.real_memory} State=UNKNOWN
PartitionName={self.partition} Nodes={self.node_name} Default=YES MaxTime={self.max_time} State=UP
{self.extra_conf}
"""
        self.conf_path.write_text(conf)

    def _spawn(self, name: str, argv: list) -> None:
        out = open(self.workdir / "log" / f"{name}.stdout", "ab")
        try:
            self._procs[name] = subprocess.Popen(
                [str(a) for a in argv], stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, cwd=self.workdir,
                env={**self.full_env(), **dict([self._marker.split("=", 1)])},
                start_new_session=True)
            self._sessions.add(self._procs[name].pid)
        finally:
            out.close()

    def _alive(self, name: str) -> bool:
        p = self._procs.get(name)
        return p is not None and p.poll() is None

    def _wait_for(self, predicate, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            for name, p in self._procs.items():
                if p.poll() is not None:
                    raise SlurmClusterError(
                        f"{name} of cluster {self.name!r} exited with {p.returncode} while "
                        f"waiting for {what}; log tail:\n{self.log(name)[-3000:]}"
                        f"{self._stdout_tail(name)}")
            if predicate():
                return
            if time.monotonic() > deadline:
                raise SlurmClusterError(
                    f"cluster {self.name!r}: timed out after {timeout}s waiting for {what}; "
                    f"slurmctld log tail:\n{self.log('slurmctld')[-2000:]}\n"
                    f"slurmd log tail:\n{self.log('slurmd')[-2000:]}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _stdout_tail(self, name: str) -> str:
        try:
            return "\nstdout:\n" + (self.workdir / "log" / f"{name}.stdout").read_text(
                errors="replace")[-2000:]
        except OSError:
            return ""

    def _node_idle(self) -> bool:
        try:
            r = self.run(["sinfo", "-h", "-N", "-n", self.node_name, "-o", "%t"],
                         check=False, timeout=10)
        except subprocess.TimeoutExpired:
            return False
        # one line per partition holding the node
        return r.returncode == 0 and set(r.stdout.split()) == {"idle"}

    def _queue(self) -> list[str]:
        r = self.run(["squeue", "-h", "-o", "%i"], check=False, timeout=10)
        if r.returncode != 0:
            raise SlurmClusterError(f"squeue failed: {r.stderr.strip()}")
        return r.stdout.split()

    def cancel_all(self, timeout: float = 30.0) -> None:
        """``scancel`` every job and wait (bounded) for an empty queue and for
        the job processes to be gone. Used between tests and by ``stop()``."""
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                ids = self._queue()
                if not ids:
                    break
                self.run(["scancel", *ids], check=False, timeout=10)
                time.sleep(0.2)
        except (subprocess.TimeoutExpired, SlurmClusterError):
            pass  # controller unreachable: stop() kills what is left
        # let slurmstepd and the job processes finish exiting
        while time.monotonic() < deadline and self._strays():
            time.sleep(0.1)

    def _strays(self) -> list[int]:
        """Processes our daemons started (slurmstepd, jobs), daemons excluded."""
        daemons = {p.pid for p in self._procs.values()}
        return [pid for pid in _descendants(self._marker.encode(), set())
                if pid not in daemons and (_stat(pid) or ("", 0, 0, 0))[2] not in daemons]

    def _kill_everything(self) -> None:
        sids = {p.pid for p in self._procs.values()}
        marker = self._marker.encode()
        # reverse order of start: slurmd, slurmctld, munged
        for name in reversed(list(self._procs)):
            p = self._procs[name]
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)
        for sid in sids:  # the process groups we created
            try:
                os.killpg(sid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        # whatever is left (slurmstepd ignores SIGTERM)
        for _ in range(50):
            left = _descendants(marker, sids)
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        self._procs.clear()
