"""A private, throw-away OAR 2.5.9 server for tests (see shared notes/sge-and-oar.md).

``PrivateOar()`` starts, under a fresh directory of its own (outside pytest's
0700 temporary directories: PostgreSQL runs as ``postgres``):

- a PostgreSQL cluster (``initdb``, trust authentication, 127.0.0.1 and a
  free port) holding OAR's database (``oar-database --create``);
- the node side: an sshd on 127.0.0.1 (a free port, OAR's own
  ``sshd_config``) through which the server starts jobs as user ``oar``;
- the server, ``Almighty``; then ``cpus`` resources on host ``localhost``
  (properties ``cpuset`` and ``core``).

OAR reads one system-wide ``/etc/oar/oar.conf`` (its path is built into the
setuid wrappers), so only one private server runs at a time on a machine (a
lock file serialises them); ``start`` saves the file and ``stop`` puts it back
(a copy left by a killed run is restored at the next start). The private
server schedules at every event (``SCHEDULER_MIN_TIME_BETWEEN_2_CALLS=0``:
a job starts ~0.5 s after ``oarsub``, not up to 10 s).

The tests submit as root, like the other schedulers' tests (the SeD and its
jobs are then the same user, as on a real site): this server disables OAR's
admission rule refusing root's jobs, and empties ``~oar/.batch_job_bashrc``
(saved and put back like ``oar.conf``), through which OAR makes a job's bash
read the user's ``~/.bashrc`` -- root's may start a shell that reads it again.

Every process started carries a marker variable (sshd passes it to its
sessions with ``SetEnv``, so OAR's detached job executors and the jobs have
it too): ``stop`` deletes the jobs, then ends exactly those processes.
Almighty listens on all addresses (OAR 2.5.9 has no setting to bind one);
PostgreSQL and sshd listen on 127.0.0.1 only.
"""
from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.daemon_procs import free_port, kill_all, marked_processes

__all__ = ["PrivateOar", "OarClusterError"]

#: system files a private server changes, and where their originals wait meanwhile
OAR_CONF = Path("/etc/oar/oar.conf")
JOB_BASHRC = Path("/var/lib/oar/.batch_job_bashrc")
SAVED = {OAR_CONF: Path("/etc/oar/oar.conf.gridrpc-saved"),
         JOB_BASHRC: Path("/var/lib/oar/.batch_job_bashrc.gridrpc-saved")}
LOCK = Path(tempfile.gettempdir()) / "gridrpc-private-oar.lock"
COMMANDS = ("oarsub", "oarstat", "oardel", "oarnodes", "oarnotify")


class OarClusterError(RuntimeError):
    """The private OAR server could not be started."""


class PrivateOar:
    """A private OAR server with ``cpus`` resources on host ``localhost``."""

    scheduler = "oar"
    refused_word = "oarsub"
    timeout_words = ("WALLTIME",)
    cancel_words = ("FRAG_JOB_REQUEST", "requested to frag the job")
    bad_queue_words = "does not exist"
    node_failure_words = ("FRAG_JOB_REQUEST", "localhost (Dead)")
    short_walltime = 5

    def __init__(self, cpus: int = 8, start_timeout: float = 60.0):
        # PostgreSQL (user postgres) must reach it: not under pytest's 0700 temporary directories
        self.base = Path(tempfile.mkdtemp(prefix="gridrpc-oar-"))
        self.cpus = cpus
        self.start_timeout = start_timeout
        self.pg_port = self.ssh_port = self.server_port = 0
        self._marker = f"GRIDRPC_PRIVATE_OAR={self.base}#{secrets.token_hex(8)}"
        self._procs: dict[str, subprocess.Popen] = {}
        self._lock = None
        self._started = False
        self._saved: list[Path] = []

    # -- what the tests use -------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        return {}

    @property
    def nodes(self) -> list[str]:
        return ["localhost"]

    @property
    def total_cpus(self) -> int:
        return self.cpus

    def backend_settings(self) -> dict:
        """OAR jobs start from the user's login environment: give them this
        PYTHONPATH. OAR's commands are Perl scripts (~0.2 s of CPU each):
        poll every 0.5 s, and take a snapshot (5 commands) every 3 s."""
        pythonpath = os.environ.get("PYTHONPATH")
        return {"scheduler": "oar", "job_env": {"PYTHONPATH": pythonpath} if pythonpath else {},
                "poll_interval": 0.5, "estimate_interval": 3.0}

    def run(self, cmd: list[str], *, check: bool = True, timeout: float = 30.0,
            input: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=timeout, input=input,
                              cwd=self.base)

    def job(self, job_id: str) -> dict:
        out = self.run(["oarstat", "-fJ", "-j", job_id], check=False).stdout
        return json.loads(out).get(job_id, {}) if out.strip() else {}

    def is_pending(self, job_id: str) -> bool:
        return self.job(job_id).get("state") == "Waiting"

    def is_running(self, job_id: str) -> bool:
        return self.job(job_id).get("state") == "Running"

    def _events(self, job_id: str) -> set[str]:
        return {e.get("type") for e in self.job(job_id).get("events") or []}

    def ended_cancelled(self, job_id: str) -> bool:
        return self.job(job_id).get("state") == "Error" and "FRAG_JOB_REQUEST" in self._events(job_id)

    def ended_by_time_limit(self, job_id: str) -> bool:
        return self.job(job_id).get("state") == "Error" and "WALLTIME" in self._events(job_id)

    def job_limits(self, job_id: str) -> tuple[float | None, int]:
        job = self.job(job_id)
        m = re.search(r"/core=(\d+)", job.get("wanted_resources", ""))
        return float(job["walltime"]), int(m.group(1)) if m else 1

    def marker_option(self, word: str) -> str:
        return f"--project {word}"

    def job_has_marker(self, job_id: str, word: str) -> bool:
        return self.job(job_id).get("project") == word

    def admin_cancel(self, job_id: str) -> None:
        self.run(["oardel", job_id])

    def rerun_allowed(self, job_id: str) -> bool | None:
        """OAR resubmits only jobs of type ``idempotent`` (exit code 99, or a
        besteffort job killed); any other job never runs twice."""
        return "idempotent" in (self.job(job_id).get("types") or [])

    def expire(self, job_id: str) -> None:
        """Nothing to do: a 5 s walltime is enforced as it is."""

    def _node_states(self) -> set[str]:
        out = self.run(["oarnodes", "-J"]).stdout
        return {r.get("state") for r in json.loads(out).values()} if out.strip() else set()

    @contextlib.contextmanager
    def node_failure(self, job_id: str):
        """The job's node turns ``Dead`` (what OAR's ``sarko`` makes of a node
        Suspected for too long; here ``oarnodesetting -s Dead``): OAR frags
        (kills) its jobs; ``Alive`` again at the exit."""
        hosts = self.job(job_id).get("assigned_network_address") or ["localhost"]
        for host in hosts:
            self.run(["oarnodesetting", "-s", "Dead", "-h", host])
        try:
            yield
        finally:
            for host in hosts:
                self.run(["oarnodesetting", "-s", "Alive", "-h", host], check=False)
            _wait(lambda: self._node_states() == {"Alive"}, 30, "the node Alive again")

    def ended_by_node_failure(self, job_id: str) -> bool:
        """Fragged (state ``Error``), and no job of OAR's runs or waits: OAR
        resubmits a job it runs again under a new id."""
        out = self.run(["oarstat", "-J"], check=False).stdout
        live = json.loads(out) if out.strip() else {}
        return self.job(job_id).get("state") == "Error" and "FRAG_JOB_REQUEST" in self._events(job_id) \
            and not live

    def block(self, cpus: int | None = None, minutes: int = 10) -> str:
        """A foreign job holding every resource: later jobs wait."""
        out = self.run(["oarsub", "-n", "blocker", "-d", str(self.base), "-O", "/dev/null", "-E", "/dev/null",
                        "-l", f"/core={cpus or self.cpus},walltime=0:{minutes}:0", "sleep 900"]).stdout
        jid = re.search(r"OAR_JOB_ID=(\d+)", out).group(1)
        _wait(lambda: self.is_running(jid), 60, "the blocker to run")
        return jid

    def processes(self) -> list[int]:
        return marked_processes(self._marker.encode(), set(), children=True)

    def cancel_all(self, timeout: float = 40.0) -> None:
        """``oardel`` every job and wait (bounded) until none is left running."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.run(["oarstat", "-J"], check=False).stdout
            jobs = json.loads(out) if out.strip() else {}
            if not jobs:
                return
            todo = [j for j, v in jobs.items() if v.get("state") not in ("Finishing", "toError")]
            if todo:
                self.run(["oardel", *todo], check=False)
            time.sleep(0.5)

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> "PrivateOar":
        if self._started:
            return self
        self._started = True
        try:
            self._take_lock()
            self._check_installed()
            for sub in ("log", "pg", "pgsock"):
                (self.base / sub).mkdir()
            self.base.chmod(0o755)
            self._start_postgres()
            self._write_conf()
            self._run(["oar-database", "--create", "--db-admin-user", "postgres", "--db-admin-pass", "x"])
            self._psql("UPDATE admission_rules SET enabled = 'NO' "
                       "WHERE rule LIKE '%root and oar users are not allowed to submit%'")
            self._start_sshd()
            self._spawn("almighty", ["/usr/sbin/Almighty"], self.base / "log" / "almighty.out")
            _wait(self._server_up, self.start_timeout, "Almighty", self._log)
            self._add_resources()
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> "PrivateOar":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        try:
            if "almighty" in self._procs and self._procs["almighty"].poll() is None:
                self.cancel_all(timeout=30)
        finally:
            try:
                self._kill_everything()
            finally:
                self._restore()

    # -- internals --------------------------------------------------------------
    def _check_installed(self) -> None:
        missing = [c for c in (*COMMANDS, "oar-database", "oarnodesetting", "oarproperty", "runuser")
                   if not shutil.which(c)]
        if missing or not os.path.exists("/usr/sbin/Almighty") or not glob.glob("/usr/lib/postgresql/*/bin/initdb"):
            raise OarClusterError(f"OAR/PostgreSQL not installed ({missing}): run scripts/install-test-deps")

    def _take_lock(self) -> None:
        self._lock = open(LOCK, "w")
        deadline = time.monotonic() + 300
        while True:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise OarClusterError(f"another private OAR server holds {LOCK}") from None
                time.sleep(1)

    def _run(self, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=self.base,
                           env={**os.environ, **dict([self._marker.split("=", 1)])}, **kw)
        if r.returncode != 0:
            raise OarClusterError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")
        return r

    def _psql(self, sql: str) -> None:
        self._run(["runuser", "-u", "postgres", "--", f"{self._pgbin}/psql", "-q", "-h", str(self.base / "pgsock"),
                   "-p", str(self.pg_port), "-d", "oar", "-c", sql])

    def _start_postgres(self) -> None:
        self._pgbin = sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1]
        data, sock = self.base / "pg", self.base / "pgsock"
        for d in (data, sock):
            shutil.chown(d, "postgres", "postgres")
        self.pg_port = free_port()
        self._run(["runuser", "-u", "postgres", "--", f"{self._pgbin}/initdb", "-D", str(data / "db"),
                   "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
        self._run(["runuser", "-u", "postgres", "--", f"{self._pgbin}/pg_ctl", "-D", str(data / "db"), "-w",
                   "-l", str(data / "pg.log"), "-o", f"-p {self.pg_port} -c listen_addresses=127.0.0.1 "
                   f"-k {sock} -c fsync=off", "start"])
        self._pg_started = True

    def _stop_postgres(self) -> None:
        if getattr(self, "_pg_started", False):
            self._pg_started = False
            subprocess.run(["runuser", "-u", "postgres", "--", f"{self._pgbin}/pg_ctl", "-D",
                            str(self.base / "pg" / "db"), "-m", "fast", "-w", "stop"],
                           capture_output=True, timeout=60)

    def _save(self, path: Path) -> None:
        saved = SAVED[path]
        if saved.exists():                      # a killed run left its copy: the original
            shutil.copy2(saved, path)
        shutil.copy2(path, saved)
        self._saved.append(path)

    def _write_conf(self) -> None:
        self._save(OAR_CONF)
        self._save(JOB_BASHRC)
        JOB_BASHRC.write_text("# emptied by gridrpc's tests/oar_cluster.py while its private server runs\n")
        self.ssh_port, self.server_port = free_port(), free_port()
        conf = OAR_CONF.read_text()
        for key, value in (("DB_HOSTNAME", "127.0.0.1"), ("DB_PORT", str(self.pg_port)),
                           ("DB_BASE_PASSWD", "oarpw"), ("DB_BASE_PASSWD_RO", "oarropw"),
                           ("SERVER_HOSTNAME", "localhost"), ("SERVER_PORT", str(self.server_port)),
                           ("LOG_FILE", str(self.base / "log" / "oar.log")),
                           ("OPENSSH_CMD", f"/usr/bin/ssh -p {self.ssh_port} -e none -o UserKnownHostsFile=/dev/null "
                                           "-o LogLevel=ERROR")):
            conf, n = re.subn(rf"^{key}=.*$", f'{key}="{value}"', conf, flags=re.M)
            if n != 1:
                raise OarClusterError(f"{OAR_CONF}: no single {key}= line")
        conf = re.sub(r"^JOB_RESOURCE_MANAGER_PROPERTY_DB_FIELD=", "#JOB_RESOURCE_MANAGER_PROPERTY_DB_FIELD=",
                      conf, flags=re.M)      # no cpuset manager
        conf += '\n# private test server (tests/oar_cluster.py)\nSCHEDULER_MIN_TIME_BETWEEN_2_CALLS="0"\n'
        (self.base / "log").chmod(0o777)     # OAR's daemons (user oar) write the log
        OAR_CONF.write_text(conf)

    def _start_sshd(self) -> None:
        lines = [ln for ln in Path("/etc/oar/sshd_config").read_text().splitlines()
                 if ln.strip() and not ln.lstrip().startswith("#")
                 and ln.split()[0] not in ("Port", "UsePrivilegeSeparation", "Protocol", "KeepAlive")]
        lines += [f"Port {self.ssh_port}", "ListenAddress 127.0.0.1", f"PidFile {self.base / 'sshd.pid'}",
                  f"SetEnv {self._marker}"]
        (self.base / "sshd_config").write_text("\n".join(lines) + "\n")
        Path("/run/sshd").mkdir(exist_ok=True)
        self._spawn("sshd", ["/usr/sbin/sshd", "-D", "-e", "-f", str(self.base / "sshd_config")],
                    self.base / "log" / "sshd.log")

    def _spawn(self, name: str, argv: list[str], log: Path) -> None:
        with open(log, "ab") as out:
            self._procs[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=self.base,
                env={**os.environ, **dict([self._marker.split("=", 1)])}, start_new_session=True)

    def _server_up(self) -> bool:
        import socket
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", self.server_port)) == 0

    def _add_resources(self) -> None:
        self._run(["oarproperty", "-a", "core"])
        for i in range(self.cpus):
            self._run(["oarnodesetting", "-a", "-h", "localhost", "-p", f"cpuset={i}", "-p", f"core={i + 1}"])

    def _log(self) -> str:
        out = []
        for f in sorted((self.base / "log").glob("*")):
            try:
                out.append(f"{f.name}:\n{f.read_text(errors='replace')[-1500:]}")
            except OSError:
                pass
        return "\n".join(out)

    def _kill_everything(self) -> None:
        for name in ("almighty", "sshd"):
            p = self._procs.get(name)
            if p is not None and p.poll() is None:
                p.terminate()                      # Almighty ends its own children
        for p in self._procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        self._stop_postgres()
        for _ in range(50):
            left = self.processes()
            if not left:
                break
            kill_all(left, signal.SIGKILL)
            time.sleep(0.1)
        for p in self._procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        self._procs.clear()

    def _restore(self) -> None:
        try:
            for path in self._saved:
                shutil.copy2(SAVED[path], path)
                SAVED[path].unlink()
            self._saved.clear()
            shutil.rmtree(self.base, ignore_errors=True)
        finally:
            if self._lock is not None:
                self._lock.close()
                self._lock = None


def _wait(pred, timeout: float, what: str, log=None) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.05
    while not pred():
        if time.monotonic() > deadline:
            raise OarClusterError(f"timed out after {timeout}s waiting for {what}" + (f"; logs:\n{log()}" if log else ""))
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)
