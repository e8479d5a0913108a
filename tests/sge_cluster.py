"""A private, throw-away Grid Engine cell for tests (see shared notes/sge-and-oar.md).

``PrivateSge(workdir)`` builds a cell under *workdir* (its own ``SGE_ROOT``
whose ``bin lib util utilbin`` link to the Debian package's, a berkeleydb
spool, free ports), starts ``sge_qmaster`` and one ``sge_execd`` on this host,
and adds a queue ``all.q`` of ``slots`` slots (no load thresholds, 1 s
scheduling interval, immediate accounting) with a parallel environment
``smp`` (all slots on one host)::

    with PrivateSge(tmp_path) as cell:
        cell.run(["qsub", "-b", "y", "true"])
        SgeBackend(env=cell.env, pe="smp")

Nothing outside *workdir* is written (the daemons read the package's
binaries and templates). Both daemons daemonise; they and every process they
start carry a marker variable, so ``stop()`` (``qdel`` of every job, then
SIGKILL) ends exactly them and the job processes below them. Grid Engine's
daemons listen on all addresses of the host (8.1.9 has no setting to bind
one); the tests only talk to 127.0.0.1.

The cluster also answers the questions the scheduler-neutral batch tests ask
(``is_pending``, ``block``, ``job_limits``...) with Grid Engine's own commands.
"""
from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.daemon_procs import free_port, kill_all, marked_processes, proc_stat

__all__ = ["PrivateSge", "SgeClusterError", "sge_installed"]

_PKG = Path("/var/lib/gridengine")
_SHARE = Path("/usr/share/gridengine")
_LIB = Path("/usr/lib/gridengine")


class SgeClusterError(RuntimeError):
    """The private cell could not be started."""


def sge_installed() -> bool:
    return all(shutil.which(b) for b in ("qsub", "qstat", "qacct", "qdel", "qconf")) and \
        all(os.path.exists(p) for p in ("/usr/sbin/sge_qmaster", "/usr/sbin/sge_execd", _LIB / "spoolinit"))


_SCHED = """algorithm default
schedule_interval 0:0:1
maxujobs 0
queue_sort_method load
job_load_adjustments NONE
load_adjustment_decay_time 0:0:0
load_formula np_load_avg
schedd_job_info true
flush_submit_sec 1
flush_finish_sec 1
params none
reprioritize_interval 0:0:0
halftime 168
usage_weight_list cpu=1,mem=0,io=0
compensation_factor 5
weight_user 0.25
weight_project 0.25
weight_department 0.25
weight_job 0.25
weight_tickets_functional 0
weight_tickets_share 0
share_override_tickets true
share_functional_shares true
max_functional_jobs_to_schedule 200
report_pjob_tickets true
max_pending_tasks_per_job 50
halflife_decay_list none
policy_hierarchy OFS
weight_ticket 0.01
weight_waiting_time 0.00000
weight_deadline 3600000
weight_urgency 0.1
weight_priority 1.0
max_reservation 0
default_duration INFINITY
"""

_PE = """pe_name smp
slots 9999
user_lists NONE
xuser_lists NONE
start_proc_args NONE
stop_proc_args NONE
allocation_rule $pe_slots
control_slaves FALSE
job_is_first_task TRUE
urgency_slots min
accounting_summary FALSE
qsort_args NONE
"""


class PrivateSge:
    """A private Grid Engine cell: sge_qmaster + one sge_execd on this host.

    :param workdir: directory for everything (cell, spool, job output).
    :param slots: slots of ``all.q`` (more than the machine's cores is fine:
        no load thresholds).
    """

    scheduler = "sge"
    refused_word = "qsub"           # the command named by a refused submission
    timeout_words = ("failed 37", "h_rt")
    cancel_words = ("failed 100", "SIGKILL")
    bad_queue_words = "unknown queue"
    node_failure_words = ("failed 19", "before writing exit_status")
    short_walltime = 5              # h_rt is in seconds: no need to bring the end forward

    def __init__(self, workdir: str | os.PathLike, name: str = "s1", slots: int = 8,
                 start_timeout: float = 30.0):
        self.workdir = Path(workdir).resolve()
        self.name = name
        self.slots = slots
        self.start_timeout = start_timeout
        self.hostname = socket.gethostname().split(".")[0]
        self.root = self.workdir / "root"
        self.cell = "private"
        self.spool = self.workdir / "spool"
        self.qmaster_port = self.execd_port = 0
        self._marker = f"GRIDRPC_PRIVATE_SGE={self.workdir}#{secrets.token_hex(8)}"
        self._started = False

    # -- what the tests use -------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        """Variables selecting this cell for Grid Engine's commands."""
        return {"SGE_ROOT": str(self.root), "SGE_CELL": self.cell,
                "SGE_QMASTER_PORT": str(self.qmaster_port), "SGE_EXECD_PORT": str(self.execd_port)}

    @property
    def nodes(self) -> list[str]:
        return [self.hostname]

    @property
    def total_cpus(self) -> int:
        return self.slots

    def backend_settings(self) -> dict:
        """Batch SeD settings for this cell (besides ``env``)."""
        return {"scheduler": "sge", "scheduler_options": {"pe": "smp"}}

    def full_env(self) -> dict[str, str]:
        return {**os.environ, **self.env, "PATH": os.environ.get("PATH", "") + ":/usr/sbin:/sbin"}

    def run(self, cmd: list[str], *, check: bool = True, timeout: float = 30.0,
            input: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=self.full_env(), capture_output=True, text=True, check=check,
                              timeout=timeout, input=input, cwd=self.workdir)

    def processes(self) -> list[int]:
        """Live PIDs of this cell: daemons, shepherds, job processes."""
        return marked_processes(self._marker.encode(), set(), children=True)

    def _live_state(self, job_id: str) -> str | None:
        out = self.run(["qstat", "-u", "*"], check=False).stdout
        for line in out.splitlines()[2:]:
            f = line.split()
            if f and f[0] == job_id:
                return f[4]
        return None

    def is_pending(self, job_id: str) -> bool:
        return (self._live_state(job_id) or "").endswith("qw")

    def is_running(self, job_id: str) -> bool:
        return self._live_state(job_id) in ("r", "t")

    def accounting(self, job_id: str) -> str:
        """``qacct -j ID`` ("" while the job has no record)."""
        r = self.run(["qacct", "-j", job_id], check=False)
        return r.stdout if r.returncode == 0 else ""

    def ended_cancelled(self, job_id: str) -> bool:
        """qdel'd: gone from the live queue, and its accounting (if it ran) says killed."""
        if self._live_state(job_id) is not None:
            return False
        acct = self.accounting(job_id)
        return not acct or re.search(r"^failed\s+100\b", acct, re.M) is not None

    def ended_by_time_limit(self, job_id: str) -> bool:
        return re.search(r"^failed\s+37\b", self.accounting(job_id), re.M) is not None

    def job_limits(self, job_id: str) -> tuple[float | None, int]:
        """(time limit in seconds, slots) of a job, from qacct (ended) or qstat -j."""
        acct = self.accounting(job_id)
        text = acct or self.run(["qstat", "-j", job_id], check=False).stdout
        m = re.search(r"h_rt=(\d+)", text)
        slots = re.search(r"^slots\s+(\d+)", acct, re.M) if acct else re.search(r"parallel environment:.*range:\s*(\d+)", text)
        return (float(m.group(1)) if m else None, int(slots.group(1)) if slots else 1)

    def marker_option(self, word: str) -> str:
        """A submit option leaving *word* where :meth:`job_has_marker` finds it."""
        return f"-A {word}"

    def job_has_marker(self, job_id: str, word: str) -> bool:
        return re.search(rf"^account\s+{re.escape(word)}\s*$", self.accounting(job_id), re.M) is not None

    def admin_cancel(self, job_id: str) -> None:
        self.run(["qdel", job_id])

    def rerun_allowed(self, job_id: str) -> bool | None:
        """``restart:`` of ``qstat -j`` (qsub -r y|n); None when the job did not
        say (the queue's ``rerun`` decides)."""
        m = re.search(r"^restart:\s+(\w+)", self.run(["qstat", "-j", job_id]).stdout, re.M)
        return None if m is None else m.group(1) == "y"

    def expire(self, job_id: str) -> None:
        """Nothing to do: a short h_rt is enforced as it is."""

    @contextlib.contextmanager
    def node_failure(self, job_id: str):
        """The host crashes and boots again: its sge_execd, the shepherds
        and the jobs below them are killed (SIGKILL), then sge_execd starts
        again, finds the job's shepherd gone without an exit status and
        reports the job ended (``failed 19``)."""
        execd = self._pid("execd")
        assert execd is not None, "no sge_execd"
        kill_all([*self._job_processes(), execd], signal.SIGKILL)

        def down() -> bool:
            return not self._job_processes() and (proc_stat(execd) or ("Z",))[0] in "ZX"
        _wait(down, 10, "the host's processes gone")
        self._daemon("/usr/sbin/sge_execd")
        try:
            yield
        finally:
            _wait(self._ready, self.start_timeout, "the execution host back", self._log)

    def ended_by_node_failure(self, job_id: str) -> bool:
        """Gone from the queue (Grid Engine reruns a job under the same id),
        with one accounting record, ``failed 19``."""
        records = re.findall(r"^failed\s+(\d+)", self.accounting(job_id), re.M)
        return self._live_state(job_id) is None and records == ["19"]

    def block(self, cpus: int | None = None, minutes: int = 10) -> str:
        """A foreign job holding every slot: later jobs pend."""
        cpus = cpus or self.slots
        jid = self.run(["qsub", "-terse", "-N", "blocker", "-b", "y", "-wd", str(self.workdir), "-o", "/dev/null",
                        "-j", "y", "-pe", "smp", str(cpus), "-l", f"h_rt={minutes * 60}", "sleep", "900"]
                       ).stdout.strip()
        _wait(lambda: self.is_running(jid), 20, "the blocker to run")
        return jid

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> "PrivateSge":
        if self._started:
            return self
        if not sge_installed():
            raise SgeClusterError("Grid Engine not installed (run scripts/install-test-deps)")
        self._started = True
        try:
            self._prepare()
            self._daemon("/usr/sbin/sge_qmaster")
            _wait(lambda: self.run(["qconf", "-sh"], check=False, timeout=5).returncode == 0,
                  self.start_timeout, "sge_qmaster", self._log)
            self._configure()
            self._daemon("/usr/sbin/sge_execd")
            _wait(self._ready, self.start_timeout, "the execution host", self._log)
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> "PrivateSge":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def cancel_all(self, timeout: float = 20.0) -> None:
        """``qdel`` every job and wait (bounded) until the queue is empty and
        the job processes are gone."""
        deadline = time.monotonic() + timeout
        try:
            self.run(["qdel", "-u", "*"], check=False, timeout=10)
            while time.monotonic() < deadline and self.run(["qstat", "-u", "*"], check=False,
                                                           timeout=10).stdout.strip():
                time.sleep(0.2)
        except subprocess.TimeoutExpired:
            pass
        while time.monotonic() < deadline and self._job_processes():
            time.sleep(0.1)

    def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        try:
            if self._pid("qmaster"):
                self.cancel_all(timeout=10)
        finally:
            for _ in range(50):
                left = self.processes()
                if not left:
                    break
                kill_all(left, signal.SIGKILL)
                time.sleep(0.1)

    # -- internals --------------------------------------------------------------
    def _job_processes(self) -> list[int]:
        daemons = {self._pid("qmaster"), self._pid("execd")}
        return [p for p in self.processes() if p not in daemons]

    def _pid(self, which: str) -> int | None:
        path = self.spool / "qmaster" / "qmaster.pid" if which == "qmaster" else \
            next(iter((self.spool / "execd").glob("*/execd.pid")), None)
        try:
            return int(Path(path).read_text().split()[0]) if path else None
        except (OSError, ValueError, IndexError):
            return None

    def _log(self) -> str:
        out = []
        for f in [self.spool / "qmaster" / "messages", *(self.spool / "execd").glob("*/messages")]:
            try:
                out.append(f"{f}:\n{f.read_text(errors='replace')[-1500:]}")
            except OSError:
                pass
        return "\n".join(out)

    def _prepare(self) -> None:
        common = self.root / self.cell / "common"
        for d in (common, self.spool / "qmaster" / "job_scripts", self.spool / "spooldb",
                  self.spool / "execd", self.workdir / "tmpl"):
            d.mkdir(parents=True, exist_ok=True)
        for d in ("bin", "lib", "util", "utilbin"):
            (self.root / d).symlink_to(_PKG / d)
        self.qmaster_port = free_port()
        self.execd_port = free_port()
        while self.execd_port == self.qmaster_port:
            self.execd_port = free_port()
        (common / "bootstrap").write_text(
            "admin_user root\ndefault_domain none\nignore_fqdn true\nspooling_method berkeleydb\n"
            f"spooling_lib libspoolb\nspooling_params {self.spool / 'spooldb'}\nbinary_path /usr/sbin\n"
            f"qmaster_spool_dir {self.spool / 'qmaster'}\nsecurity_mode none\nlistener_threads 2\n"
            "worker_threads 2\nscheduler_threads 1\n")
        (common / "act_qmaster").write_text(self.hostname + "\n")
        # the host name must resolve the same both ways: 127.0.0.1 reads back as "localhost"
        aliases = dict.fromkeys([self.hostname, "localhost", socket.getfqdn()])
        (common / "host_aliases").write_text(" ".join(a for a in aliases if a) + "\n")
        conf = (_SHARE / "default-configuration").read_text()
        for key, value in (("execd_spool_dir", str(self.spool / "execd")), ("mailer", "/bin/true"),
                           ("min_uid", "0"), ("min_gid", "0"), ("load_report_time", "00:00:05"),
                           ("reporting_params", "accounting=true reporting=false flush_time=00:00:01 "
                            "accounting_flush_time=00:00:00 joblog=false sharelog=00:00:00")):
            conf = re.sub(rf"^{key}\s.*$", f"{key} {value}", conf, flags=re.M)
        (self.workdir / "tmpl" / "global").write_text(conf)
        env = {**self.full_env(), "LD_LIBRARY_PATH": str(_LIB)}
        spool = ["berkeleydb", "libspoolb", str(self.spool / "spooldb")]
        steps = [[str(_LIB / "spoolinit"), *spool, "init"],
                 [str(_LIB / "spooldefaults.bin"), "configuration", str(self.workdir / "tmpl" / "global")],
                 [str(_LIB / "spooldefaults.bin"), "complexes", str(_SHARE / "util/resources/centry")],
                 [str(_LIB / "spooldefaults.bin"), "usersets", str(_SHARE / "util/resources/usersets")],
                 [str(_LIB / "spooldefaults.bin"), "managers", "root"]]
        for cmd in steps:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                raise SgeClusterError(f"{' '.join(cmd)} failed: {r.stderr.strip() or r.stdout.strip()}")

    def _daemon(self, path: str) -> None:
        """Start a daemon that forks itself into the background."""
        r = subprocess.run([path], env={**self.full_env(), **dict([self._marker.split("=", 1)])},
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30,
                           cwd=self.workdir, start_new_session=True)
        if r.returncode != 0:
            raise SgeClusterError(f"{path} exited with {r.returncode}: {r.stderr.strip()}")

    def _qconf(self, option: str, text: str | None = None, *args: str) -> None:
        argv = ["qconf", option]
        if text is not None:
            path = self.workdir / "tmpl" / option.strip("-")
            path.write_text(text)
            argv.append(str(path))
        r = self.run([*argv, *args], check=False)
        if r.returncode != 0:
            raise SgeClusterError(f"{' '.join(argv)} failed: {r.stderr.strip() or r.stdout.strip()}")

    def _configure(self) -> None:
        h = self.hostname
        self._qconf("-as", None, h)
        self._qconf("-Msconf", _SCHED)
        self._qconf("-Ae", f"hostname {h}\nload_scaling NONE\ncomplex_values NONE\nuser_lists NONE\n"
                           "xuser_lists NONE\nprojects NONE\nxprojects NONE\nusage_scaling NONE\n"
                           "report_variables NONE\n")
        self._qconf("-Ap", _PE)
        template = self.run(["qconf", "-sq"]).stdout
        q = template
        for key, value in (("qname", "all.q"), ("hostlist", h), ("slots", str(self.slots)), ("pe_list", "smp"),
                           ("load_thresholds", "NONE"), ("shell", "/bin/bash"),
                           ("shell_start_mode", "unix_behavior"), ("tmpdir", "/tmp")):
            q = re.sub(rf"^{key}\s.*$", f"{key} {value}", q, flags=re.M)
        self._qconf("-Aq", q)

    def _ready(self) -> bool:
        """The execd reported: every queue instance has a load and no 'u' state."""
        r = self.run(["qstat", "-f"], check=False, timeout=10)
        lines = [ln for ln in r.stdout.splitlines() if "@" in ln and ln.split()[0].endswith(f"@{self.hostname}")]
        return r.returncode == 0 and len(lines) == 1 and all(
            len(ln.split()) == 5 and ln.split()[3] != "-NA-" for ln in lines)


def _wait(pred, timeout: float, what: str, log=None) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.05
    while not pred():
        if time.monotonic() > deadline:
            raise SgeClusterError(f"timed out after {timeout}s waiting for {what}"
                                  + (f"; logs:\n{log()}" if log else ""))
        time.sleep(delay)
        delay = min(delay * 1.5, 0.3)
