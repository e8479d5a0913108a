"""How good are the batch SeD's estimates? The measurement behind the table
in docs/batch.md ("Accuracy").

Runs only with ``GRIDRPC_BATCH_ACCURACY=1`` (about 1.5 minutes; not part of
the regular suite)::

    GRIDRPC_BATCH_ACCURACY=1 python -m pytest tests/test_batch_sed_accuracy.py -s

For each call it compares what the SeD predicted when it submitted the job
(``est_wait`` and ``tcomp``, with their sources) with what happened (wait:
submission to the job script's start; run: script start to the service's
end, both measured inside the job). Writes a Markdown table to stdout and,
with ``GRIDRPC_BATCH_ACCURACY_OUT=path``, to a file.
"""
from __future__ import annotations

import os
import time

import pytest

from tests.conftest_slurm import require_slurm
from tests.requirements import opt_in
from tests.slurm_cluster import PrivateSlurm


def squeue_state(cluster, job_id) -> str:
    """Slurm's state and reason of a job, as ``squeue`` prints them."""
    r = cluster.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T|%r"], check=False)
    return r.stdout.strip()
from tests.batch_clusters import wait_until
from tests.test_batch_sed import addr, client, running_sed

pytestmark = [pytest.mark.slurm, pytest.mark.real, pytest.mark.slow,
              opt_in("GRIDRPC_BATCH_ACCURACY", "measurement (about 1.5 minutes)")]


def _row(scenario, rec) -> str:
    def f(v):
        return "–" if v is None else f"{v:.1f}"
    return (f"| {scenario} | {f(rec['predicted_est_wait_scheduler'])} | {f(rec['predicted_est_wait'])} "
            f"({rec['predicted_est_wait_source']}) | {f(rec['actual_wait'])} | "
            f"{f(rec['predicted_tcomp'])} ({rec['predicted_tcomp_source']}) | {f(rec['actual_run'])} |")


def test_estimate_accuracy(tmp_path_factory):
    require_slurm()
    rows = ["| scenario | Slurm's wait estimate s | SeD's est_wait s (source) | actual wait s "
            "| predicted run s (source) | actual run s |",
            "|---|---|---|---|---|---|"]
    with PrivateSlurm(tmp_path_factory.mktemp("slurm-acc-"), name="acc", cpus=4,
                      extra_conf="SlurmdParameters=config_overrides") as cluster:
        tmp = tmp_path_factory.mktemp("acc-shared")
        with running_sed(cluster, tmp, time_limit=120, estimate_interval=1.0) as sed, client() as c:
            def run(scenario, *calls):
                n = len(sed.records)
                for call in calls:
                    call.result(timeout=300)
                wait_until(lambda: len(sed.records) >= n + len(calls), 10, "records")
                for rec in sed.records[n:n + len(calls)]:
                    rows.append(_row(scenario, rec))

            def settle():       # a fresh snapshot after the last change
                t = time.time()
                wait_until(lambda: sed.snapshot.taken > t + 0.1, 10, "a fresh snapshot")

            # A. idle cluster: the first call knows nothing, later ones use the user's history
            for i in range(3):
                settle()
                run(f"A{i + 1}. idle cluster, sleep(4), call {i + 1}", c.submit("sleep", 4, server=addr(sed)))
            # B. a foreign job holds all CPUs: time limit 2 min, ends after 15 s
            blocker = block_cluster_for(cluster, cpus=4, minutes=2, seconds=15)
            settle()
            run("B. foreign job (limit 2 min, runs 15 s) holds all CPUs", c.submit("sleep", 4, server=addr(sed)))
            wait_until(lambda: not squeue_state(cluster, blocker).startswith(("RUNNING", "PENDING")), 30,
                       "the blocker to end")
            # C. our own jobs fill the cluster (limit 120 s each, run 8 s); a fifth call waits for them
            settle()
            n_own = len(sed.records)
            own = [c.submit("sleep", 8, server=addr(sed)) for _ in range(4)]
            wait_until(lambda: sum(1 for j in sed.test_loop.call(sed.jobs).values()
                                   if j["state"] == "running") == 4, 30, "4 running jobs")
            settle()
            fifth = c.submit("sleep", 4, server=addr(sed))
            for call in own:
                call.result(timeout=60)
            wait_until(lambda: len(sed.records) >= n_own + 4, 10, "records")
            rows.extend(_row("C0. 4 own jobs sleep(8) fill the 4 CPUs", rec)
                        for rec in sed.records[n_own:n_own + 4])
            run("C. a 5th call waits for them (their limit 120 s)", fifth)
            # D. per-call walltime, no history for this user: predicted run = walltime
            with client(user="newcomer") as c2:
                settle()
                run("D. another user (no own history), sleep(2), walltime 30 s",
                    c2.submit("sleep", 2, _batch={"walltime": 30}, server=addr(sed)))
    table = "\n".join(rows)
    print("\n" + table)
    out = os.environ.get("GRIDRPC_BATCH_ACCURACY_OUT")
    if out:
        with open(out, "w") as fh:
            fh.write(table + "\n")


def block_cluster_for(cluster, cpus, minutes, seconds) -> str:
    jid = cluster.run(["sbatch", "--parsable", f"--cpus-per-task={cpus}", f"--time={minutes}",
                       "-o", "/dev/null", "--wrap", f"sleep {seconds}"]).stdout.strip()
    wait_until(lambda: squeue_state(cluster, jid).startswith("RUNNING"), 20, "the blocker to run")
    return jid

