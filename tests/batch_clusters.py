"""One private test cluster per scheduler, behind the same small interface,
so the batch SeD's real tests (tests/test_batch_sed.py) run unchanged on
Slurm, Grid Engine and OAR.

Each cluster answers, with its scheduler's *own* commands (never through the
backend under test): ``scheduler``, ``env``, ``nodes``, ``total_cpus``,
``backend_settings()`` (the batch SeD settings it needs besides ``env``),
``is_pending(id)``, ``is_running(id)``, ``ended_cancelled(id)``,
``ended_by_time_limit(id)``, ``job_limits(id)`` -> (time limit s, CPUs),
``marker_option(word)`` / ``job_has_marker(id, word)`` (a submit option the
test can find again), ``admin_cancel(id)``, ``block()`` (a foreign job
holding every CPU), ``expire(id)`` (bring a running job's time limit
forward, where the scheduler allows it), ``cancel_all()``;
``node_failure(id)`` (a context manager: the node running the job fails the
way the scheduler sees a failed node, and is back at the exit) and
``ended_by_node_failure(id)`` (the job ended for it and is neither pending
nor running again); and the words its errors use: ``refused_word`` (the
submit command), ``timeout_words``, ``cancel_words``, ``bad_queue_words``,
``node_failure_words``, ``short_walltime`` (the shortest walltime a
time-limit test can use); ``rerun_allowed(id)``: may the scheduler run the
job again on its own (True, False, None: the queue's default).
"""
from __future__ import annotations

import contextlib
import re
import time

from tests.slurm_cluster import PrivateSlurm

__all__ = ["SlurmCluster", "start_cluster", "wait_until"]


def wait_until(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


class SlurmCluster(PrivateSlurm):
    scheduler = "slurm"
    refused_word = "sbatch"
    timeout_words = ("TIMEOUT", "TimeLimit")
    cancel_words = ("CANCELLED",)
    bad_queue_words = "invalid partition"
    node_failure_words = ("NODE_FAIL",)
    short_walltime = 60          # whole minutes; expire() brings the end forward

    @property
    def nodes(self) -> list[str]:
        return [self.node_name]

    @property
    def total_cpus(self) -> int:
        return self.cpus

    def backend_settings(self) -> dict:
        return {"scheduler": "slurm"}

    def _squeue(self, job_id: str) -> str:
        return self.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T|%r"], check=False).stdout.strip()

    def is_pending(self, job_id: str) -> bool:
        return self._squeue(job_id).startswith("PENDING")

    def is_running(self, job_id: str) -> bool:
        return self._squeue(job_id).startswith("RUNNING")

    def ended_cancelled(self, job_id: str) -> bool:
        return self._squeue(job_id).startswith("CANCELLED")

    def ended_by_time_limit(self, job_id: str) -> bool:
        return self._squeue(job_id).startswith("TIMEOUT")

    def _show(self, job_id: str) -> str:
        return self.run(["scontrol", "-o", "show", "job", job_id]).stdout

    def job_limits(self, job_id: str) -> tuple[float | None, int]:
        show = self._show(job_id)
        h, m, s = (int(x) for x in re.search(r"TimeLimit=(\d+:\d+:\d+)", show).group(1).split(":"))
        return float(h * 3600 + m * 60 + s), int(re.search(r"NumCPUs=(\d+)", show).group(1))

    def marker_option(self, word: str) -> str:
        return f"--comment={word}"

    def job_has_marker(self, job_id: str, word: str) -> bool:
        return f"Comment={word}" in self._show(job_id)

    def admin_cancel(self, job_id: str) -> None:
        self.run(["scancel", job_id])

    def rerun_allowed(self, job_id: str) -> bool | None:
        """Would Slurm requeue the job after a node failure or preemption
        (``Requeue=`` of ``scontrol show job``: the job's flag or JobRequeue)?"""
        return re.search(r"\bRequeue=(\d)", self._show(job_id)).group(1) == "1"

    def expire(self, job_id: str) -> None:
        """slurmctld's time-limit check (every 30 s) then ends the job
        TIMEOUT/TimeLimit, the same path as at its real limit."""
        self.run(["scontrol", "update", f"JobId={job_id}", "EndTime=now"])

    @contextlib.contextmanager
    def node_failure(self, job_id: str):
        """The node is marked DOWN (as slurmctld does when slurmd stops
        answering): Slurm kills its jobs, ends them NODE_FAIL and requeues
        those that allow it; RESUME at the exit."""
        self.run(["scontrol", "update", f"NodeName={self.node_name}", "State=DOWN", "Reason=gridrpc-test"])
        try:
            yield
        finally:
            self.run(["scontrol", "update", f"NodeName={self.node_name}", "State=RESUME"], check=False)
            wait_until(lambda: "idle" in self.run(["sinfo", "-h", "-n", self.node_name, "-o", "%T"]).stdout,
                       30, "the node back")

    def ended_by_node_failure(self, job_id: str) -> bool:
        """NODE_FAIL, the job's final state (a requeued job is PENDING again)."""
        return self._squeue(job_id).startswith("NODE_FAIL")

    def block(self, cpus: int | None = None, minutes: int = 10) -> str:
        jid = self.run(["sbatch", "--parsable", f"--cpus-per-task={cpus or self.cpus}", f"--time={minutes}",
                        "-o", "/dev/null", "--wrap", "sleep 900"]).stdout.strip()
        wait_until(lambda: self.is_running(jid), 20, "the blocker to run")
        return jid


def start_cluster(scheduler: str, tmp_path_factory):
    """Generator: a started private cluster of *scheduler* for one test
    module (8 CPUs on this machine's cores), stopped at the end."""
    from tests.requirements import require
    require(scheduler)
    if scheduler == "slurm":
        with SlurmCluster(tmp_path_factory.mktemp("slurm-b1-"), name="b1", cpus=8,
                          extra_conf="SlurmdParameters=config_overrides") as cluster:
            yield cluster
    elif scheduler == "sge":
        from tests.sge_cluster import PrivateSge
        with PrivateSge(tmp_path_factory.mktemp("sge-b1-"), name="b1", slots=8) as cluster:
            yield cluster
    elif scheduler == "oar":
        from tests.oar_cluster import PrivateOar
        with PrivateOar(cpus=8) as cluster:
            yield cluster
    else:
        raise ValueError(scheduler)
