"""The Grid Engine backend against a private cell (tests/sge_cluster.py),
for what the batch SeD's tests (tests/test_batch_sed.py, run on every
scheduler) cannot reach: a job Grid Engine cannot start, and a shape no
queue can hold."""
from __future__ import annotations

import pytest

from gridrpc.sed.batch import BatchSubmitError, JobSpec, JobState, SgeBackend
from tests.batch_clusters import wait_until
from tests.conftest_sge import sge_cluster  # noqa: F401

pytestmark = [pytest.mark.sge, pytest.mark.real]


def test_a_job_in_error_state_fails_with_the_reason(sge_cluster, tmp_path):  # noqa: F811
    """A job whose directory is missing on the node stays in state Eqw
    forever: the backend reports it FAILED with Grid Engine's error reason,
    and deletes it."""
    backend = SgeBackend(env=sge_cluster.env, pe="smp")
    job = backend.submit(JobSpec(script="#!/bin/bash\ntrue\n", name="eqw", workdir=str(tmp_path / "missing"),
                                 output="/dev/null"))
    seen = []
    wait_until(lambda: seen.append(backend.states([job])[job]) or seen[-1].state.is_final, 30, "an end")
    assert seen[-1].state is JobState.FAILED and seen[-1].raw_state == "Eqw", seen[-1]
    assert f"can't chdir to {tmp_path / 'missing'}" in seen[-1].reason and "(job deleted)" in seen[-1].reason
    wait_until(lambda: sge_cluster._live_state(job) is None, 10, "the job deleted")


def test_shapes_no_queue_can_hold_are_refused(sge_cluster, tmp_path):  # noqa: F811
    """``qsub -w v`` says a 64-slot job can never run on 8 slots; a 2-slot
    job without a parallel environment is refused before any command."""
    spec = JobSpec(script="#!/bin/bash\ntrue\n", name="big", workdir=str(tmp_path), ntasks=64)
    with pytest.raises(BatchSubmitError, match="could never run") as exc:
        SgeBackend(env=sge_cluster.env, pe="smp").estimate_start(spec)
    assert "qsub -w v" in str(exc.value) and "-pe smp 64" in str(exc.value)
    with pytest.raises(BatchSubmitError, match="needs a parallel environment"):
        SgeBackend(env=sge_cluster.env).submit(JobSpec(script="#!/bin/bash\ntrue\n", ntasks=2))
    assert SgeBackend(env=sge_cluster.env, pe="smp").estimate_start(
        JobSpec(script="#!/bin/bash\ntrue\n", workdir=str(tmp_path), ntasks=2)) == 0.0
