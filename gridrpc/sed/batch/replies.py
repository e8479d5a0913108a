"""How a batch call ends: the job's result or exception read back from its
directory, or a clear error naming the job when it ended without one (time
limit, node failure, preemption, out of memory, cancelled by someone else,
failure); and what the run taught the estimates. A mixin of
:class:`~gridrpc.sed.batch.jobs.BatchJobs`."""
from __future__ import annotations

import os
import time

from ...core import messages as m
from ...core.messages import MsgType
from ..backends import Outcome
from . import jobfiles
from .base import JobInfo, JobState
from .estimate import RunRecord
from .state import CallJob

#: remote_type of the errors a batch call may end with (besides the service's own exceptions)
ERROR_TYPES = {
    JobState.FAILED: "BatchJobFailed",
    JobState.CANCELLED: "BatchJobCancelled",
    JobState.TIMEOUT: "BatchJobTimeout",
    JobState.NODE_FAIL: "BatchNodeFailure",
    JobState.PREEMPTED: "BatchJobPreempted",
    JobState.OUT_OF_MEMORY: "BatchOutOfMemory",
    JobState.UNKNOWN: "BatchJobLost",
}
_WHAT = {
    JobState.FAILED: "failed",
    JobState.CANCELLED: "was cancelled outside gridrpc",
    JobState.TIMEOUT: "reached its time limit and was killed",
    JobState.NODE_FAIL: "was lost to a node failure",
    JobState.PREEMPTED: "was preempted",
    JobState.OUT_OF_MEMORY: "ran out of memory and was killed",
    JobState.UNKNOWN: "vanished: the scheduler no longer knows it and it left no result",
}


class JobOutcomeMixin:
    result_grace = 5.0      # seconds a COMPLETED job's result file may take to appear (NFS caches)

    def _collect(self, job: CallJob, info: JobInfo) -> tuple[jobfiles.Outcome | None, str, float | None]:
        """(thread) The job's result/error, the tail of its output if it has
        no result, and when it began (``started.json``); waits a little for a
        COMPLETED job's files (attribute caches of shared file systems)."""
        deadline = time.monotonic() + self.result_grace
        while True:
            try:
                outcome = jobfiles.read_outcome(job.dir)
            except (OSError, ValueError) as exc:
                outcome = jobfiles.Outcome(ok=False, type="BatchResultError",
                                           message=f"cannot read the result of job {job.job_id} in "
                                                   f"{job.dir}: {exc}")
            if outcome is not None or info.state is not JobState.COMPLETED or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        out_tail = "" if outcome is not None and outcome.ok else jobfiles.tail(os.path.join(job.dir, "job.out"))
        began = jobfiles.read_started(job.dir).get("job_started")
        return outcome, out_tail, began if isinstance(began, (int, float)) else None

    def _reply(self, call_id: str, job: CallJob, info: JobInfo, outcome: jobfiles.Outcome | None,
               out_tail: str) -> Outcome:
        """The answer to the call (the runtime adds the server and the timing)."""
        batch = {"job_id": job.job_id, "state": info.state.value, "raw_state": info.raw_state,
                 "reason": info.reason, "exit_code": info.exit_code, "signal": info.signal,
                 "nodes": list(info.node_list), "scheduler": self.config.scheduler}
        if outcome is not None and outcome.ok:
            self.batch_stats["completed"] += 1
            return Outcome(ok=True, header=m.make(MsgType.RESULT, call_id, value=outcome.value,
                                                  backend={self.name: batch}),
                           buffers=list(outcome.buffers))
        self.batch_stats["failed"] += 1
        if outcome is not None:      # the service raised (or could not start): its own error
            return Outcome(ok=False, header=m.error_header(call_id, "remote", outcome.message, type_=outcome.type,
                                                           traceback=outcome.traceback, backend={self.name: batch}))
        type_ = ERROR_TYPES.get(info.state, "BatchJobFailed")
        what = _WHAT.get(info.state, f"ended in state {info.raw_state or info.state.value}")
        if info.state is JobState.COMPLETED:
            what = (f"completed but left no result in {job.dir} (is the shared directory visible "
                    f"from the compute nodes?)")
        detail = [f"{self.config.scheduler} state {info.raw_state or info.state.value}"]
        if info.reason:
            detail.append(f"reason {info.reason}")
        if info.exit_code is not None:
            detail.append(f"exit code {info.exit_code}:{info.signal or 0}")
        if info.state is JobState.TIMEOUT and job.walltime:
            detail.append(f"time limit {job.walltime:g}s")
        if info.node_list:
            detail.append(f"nodes {','.join(info.node_list)}")
        message = f"batch job {job.job_id} of {job.service} {what} ({'; '.join(detail)})"
        tb = f"output of job {job.job_id} ({job.dir}/job.out), last lines:\n{out_tail}" if out_tail else ""
        return Outcome(ok=False, header=m.error_header(call_id, "remote", message, type_=type_, traceback=tb,
                                                       backend={self.name: batch}))

    def _observe(self, job: CallJob, info: JobInfo, outcome: jobfiles.Outcome | None,
                 began: float | None) -> None:
        """Learn the run time; keep predicted vs actual for the accuracy table.
        Times written by the job itself (``started.json``, the result's end)
        are preferred to the scheduler's whole seconds."""
        start, end = info.start_time or job.started, info.end_time or job.ended
        if began is not None:
            start = began
        if outcome is not None and outcome.ended:
            end = outcome.ended
        if start is not None:
            job.started = start
        if end is not None:
            job.ended = end
        run = (end - start) if start is not None and end is not None else None
        wait = (start - job.submitted) if start is not None and job.submitted is not None else None
        ran = outcome is not None and outcome.type != "BatchSetupError"
        if run is not None and ran:
            self._append_history(RunRecord(service=job.service, user=job.user, run=max(0.0, run),
                                           wait=wait, walltime=job.walltime,
                                           nodes=job.options.get("nodes", self.config.nodes),
                                           time=end or time.time()))
        self.records.append({"call_id": job.call_id, "job_id": job.job_id, "service": job.service,
                             "user": job.user, "state": info.state.value, **{
                                 f"predicted_{k}": v for k, v in job.predicted.items()},
                             "actual_wait": wait, "actual_run": run})
        del self.records[:-1000]
