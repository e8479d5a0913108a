"""Parsers of OAR output (gridrpc.sed.batch.oar_parsers) against output
recorded from OAR 2.5.9 on a private server (tests/oar_cluster.py, 2
resources; fields the parser does not read removed from the JSON), and the
oarsub options and job script for a JobSpec."""
from __future__ import annotations

import pytest

from gridrpc.sed.batch import JobSpec, JobState, OarBackend, get_scheduler, make_backend
from gridrpc.sed.batch.oar import oarsub_options, render_job_script, resource_request
from gridrpc.sed.batch.oar_parsers import (decode_wait_status, down_nodes, format_walltime, oar_job_info,
                                           oar_state, parse_oarnodes, parse_oarstat, parse_oarsub, parse_queues,
                                           summarize_resources)

# oarstat -fJ -j 1 -j 2 -j 3 -j 4: 1 ran "exit 3"; 2 was killed at its 3 s walltime; 3 was
# oardel'd while running, 4 while waiting
OARSTAT_ENDED = """{
   "2": {
      "Job_Id": 2,
      "state": "Error",
      "exit_code": null,
      "startTime": 1795858323,
      "stopTime": 1795858331,
      "scheduledStart": null,
      "events": [
         {
            "type": "FRAG_JOB_REQUEST",
            "description": "User root requested to frag the job 2",
            "date": 1795858330
         },
         {
            "type": "WALLTIME",
            "description": "[sarko] Job [2] from 1795858323 with 3; current time=1795858330 (Elapsed)",
            "date": 1795858330
         },
         {
            "type": "SEND_KILL_JOB",
            "description": "[Leon] Send the kill signal to oarexec on localhost for job 2",
            "date": 1795858330
         },
         {
            "type": "SWITCH_INTO_ERROR_STATE",
            "description": "[bipbip 2] Ask to change the job state",
            "date": 1795858331
         }
      ],
      "assigned_network_address": [
         "localhost"
      ],
      "assigned_resources": [
         1
      ],
      "walltime": 3,
      "name": "wt",
      "queue": "default",
      "project": "default",
      "message": "R=1,W=0:0:3,J=B,N=wt (Karma=0.000,quota_ok)"
   },
   "4": {
      "Job_Id": 4,
      "state": "Error",
      "exit_code": null,
      "startTime": 0,
      "stopTime": 0,
      "scheduledStart": null,
      "events": [
         {
            "type": "FRAG_JOB_REQUEST",
            "description": "User root requested to frag the job 4",
            "date": 1795858327
         }
      ],
      "assigned_network_address": [],
      "assigned_resources": [],
      "walltime": null,
      "name": "wait",
      "queue": "default",
      "project": "default",
      "message": "Job killed by Leon directly"
   },
   "3": {
      "Job_Id": 3,
      "state": "Error",
      "exit_code": null,
      "startTime": 1795858323,
      "stopTime": 1795858328,
      "scheduledStart": null,
      "events": [
         {
            "type": "FRAG_JOB_REQUEST",
            "description": "User root requested to frag the job 3",
            "date": 1795858327
         },
         {
            "type": "SEND_KILL_JOB",
            "description": "[Leon] Send the kill signal to oarexec on localhost for job 3",
            "date": 1795858327
         },
         {
            "type": "SWITCH_INTO_ERROR_STATE",
            "description": "[bipbip 3] Ask to change the job state",
            "date": 1795858328
         }
      ],
      "assigned_network_address": [
         "localhost"
      ],
      "assigned_resources": [
         2
      ],
      "walltime": 300,
      "name": "run",
      "queue": "default",
      "project": "default",
      "message": "R=1,W=0:5:0,J=B,N=run (Karma=0.000,quota_ok)"
   },
   "1": {
      "Job_Id": 1,
      "state": "Terminated",
      "exit_code": 768,
      "startTime": 1795858319,
      "stopTime": 1795858320,
      "scheduledStart": null,
      "events": [
         {
            "type": "SWITCH_INTO_TERMINATE_STATE",
            "description": "[bipbip 1] Ask to change the job state",
            "date": 1795858320
         }
      ],
      "assigned_network_address": [
         "localhost"
      ],
      "assigned_resources": [
         1
      ],
      "walltime": 60,
      "name": "exit3",
      "queue": "default",
      "project": "default",
      "message": "R=1,W=0:1:0,J=B,N=exit3 (Karma=0.000,quota_ok)"
   }
}"""

# oarstat -fJ -j 3 -j 4: 3 runs on resource 2, 4 waits for both resources (scheduledStart)
OARSTAT_LIVE = """{
   "3": {
      "Job_Id": 3,
      "state": "Running",
      "exit_code": null,
      "startTime": 1795858323,
      "stopTime": 0,
      "scheduledStart": 1795858323,
      "events": [],
      "assigned_network_address": [
         "localhost"
      ],
      "assigned_resources": [
         2
      ],
      "walltime": 300,
      "name": "run",
      "queue": "default",
      "project": "default",
      "message": "R=1,W=0:5:0,J=B,N=run (Karma=0.000,quota_ok)"
   },
   "4": {
      "Job_Id": 4,
      "state": "Waiting",
      "exit_code": null,
      "startTime": 0,
      "stopTime": 0,
      "scheduledStart": 1795858684,
      "events": [],
      "assigned_network_address": [],
      "assigned_resources": [],
      "walltime": 300,
      "name": "wait",
      "queue": "default",
      "project": "default",
      "message": "R=2,W=0:5:0,J=B,N=wait (Karma=0.000,quota_ok)"
   }
}"""

# oarnodes -J while jobs 2 and 3 ran
OARNODES = """{
   "1": {
      "resource_id": 1,
      "network_address": "localhost",
      "state": "Alive",
      "cpuset": "0",
      "core": 1,
      "jobs": "2",
      "type": "default"
   },
   "2": {
      "resource_id": 2,
      "network_address": "localhost",
      "state": "Alive",
      "cpuset": "1",
      "core": 2,
      "jobs": "3",
      "type": "default"
   }
}"""

OARSUB_OK = """[ADMISSION RULE] Modify resource description with type constraints
OAR_JOB_ID=1
"""

# oarsub -l /core=9 on 2 resources: exit status 8, the refusal on stderr
OARSUB_TOO_BIG = """[ADMISSION RULE] Set default walltime to 7200.
[ADMISSION RULE] Modify resource description with type constraints
OAR_JOB_ID=-5
"""

OARNOTIFY = """default
	priority = 2
	scheduler = oar_sched_gantt_with_timesharing_and_fairsharing_and_quotas
	state = Active
admin
	priority = 10
	scheduler = oar_sched_gantt_with_timesharing_and_fairsharing_and_quotas
	state = Active
besteffort
	priority = 0
	scheduler = oar_sched_gantt_with_timesharing_and_fairsharing_and_quotas
	state = Active
"""


def test_ends_of_jobs():
    jobs = {j: oar_job_info(v) for j, v in parse_oarstat(OARSTAT_ENDED).items()}
    ok3 = jobs["1"]
    assert ok3.state is JobState.FAILED and (ok3.exit_code, ok3.signal) == (3, 0) and ok3.reason == "exit status 3"
    assert ok3.node_list == ("localhost",) and ok3.start_time == 1795858319.0 and ok3.end_time == 1795858320.0
    walltime = jobs["2"]                 # FRAG_JOB_REQUEST too, but the walltime is why
    assert walltime.state is JobState.TIMEOUT and walltime.time_limit == 3.0
    assert walltime.reason.startswith("WALLTIME: [sarko] Job [2] from 1795858323 with 3")
    assert walltime.exit_code is None and walltime.nb_cpus == 1
    running = jobs["3"]
    assert running.state is JobState.CANCELLED and running.node_list == ("localhost",)
    assert running.reason == "FRAG_JOB_REQUEST: User root requested to frag the job 3"
    waiting = jobs["4"]
    assert waiting.state is JobState.CANCELLED and waiting.start_time is None and waiting.node_list == ()
    assert all(j.state.is_final for j in jobs.values())


def test_a_job_fragged_while_its_node_is_down_was_lost_to_the_node():
    """OAR frags the jobs of a node that turns Dead or Absent with the same
    FRAG_JOB_REQUEST event as an oardel: the state of the job's resources
    (oarnodes -J) tells them apart."""
    jobs = parse_oarstat(OARSTAT_ENDED)
    resources = parse_oarnodes(OARNODES)
    assert oar_job_info(jobs["3"], resources).state is JobState.CANCELLED      # its node is Alive
    dead = [{**r, "state": "Dead"} if r["resource_id"] == 2 else r for r in resources]
    assert down_nodes(jobs["3"], dead) == ["localhost (Dead)"] and down_nodes(jobs["1"], dead) == []
    lost = oar_job_info(jobs["3"], dead)
    assert lost.state is JobState.NODE_FAIL and lost.node_list == ("localhost",)
    assert lost.reason == "FRAG_JOB_REQUEST: User root requested to frag the job 3; node localhost (Dead)"
    absent = [{**r, "state": "Absent"} for r in resources]
    assert oar_job_info(jobs["3"], absent).reason.endswith("; node localhost (Absent)")
    assert oar_job_info(jobs["4"], absent).state is JobState.CANCELLED         # never ran: no node
    assert oar_job_info(jobs["2"], absent).state is JobState.TIMEOUT           # its walltime came first
    assert oar_job_info(jobs["1"], absent).state is JobState.FAILED
    state, reason = oar_state("Error", None, [("FRAG_JOB_REQUEST", "User root requested to frag the job 5"),
                                              ("BESTEFFORT_KILL", "[oar_meta_sched] kill the besteffort job 5")])
    assert state is JobState.PREEMPTED and reason == "BESTEFFORT_KILL: [oar_meta_sched] kill the besteffort job 5"


def test_live_jobs_and_the_schedulers_start_estimate():
    jobs = {j: oar_job_info(v) for j, v in parse_oarstat(OARSTAT_LIVE).items()}
    run, wait = jobs["3"], jobs["4"]
    assert run.state is JobState.RUNNING and run.node_list == ("localhost",) and run.end_time is None
    assert run.exit_code is None and run.time_limit == 300.0 and run.name == "run" and run.partition == "default"
    assert wait.state is JobState.PENDING and wait.expected_start == 1795858684.0     # OAR's Gantt
    assert wait.start_time is None and wait.node_list == ()
    assert parse_oarstat("") == {}           # oarstat -fJ -j 999 prints nothing


def test_states_and_values():
    assert oar_state("Waiting", None, []) == (JobState.PENDING, None)
    assert oar_state("Finishing", None, [])[0] is JobState.RUNNING
    assert oar_state("Terminated", 0, []) == (JobState.COMPLETED, None)
    assert oar_state("Terminated", 9, []) == (JobState.FAILED, "killed by signal 9")
    state, reason = oar_state("Error", None, [("PING_CHECKER_NODE_SUSPECTED", "node n1 suspected"),
                                              ("SWITCH_INTO_ERROR_STATE", "...")])
    assert state is JobState.NODE_FAIL and reason == "PING_CHECKER_NODE_SUSPECTED: node n1 suspected"
    assert oar_state("Error", None, [("CANNOT_WRITE_NODE_FILE", "x")]) == (
        JobState.FAILED, "CANNOT_WRITE_NODE_FILE: x")
    assert oar_state("Zombie", None, [])[0] is JobState.UNKNOWN
    assert decode_wait_status(768) == (3, 0) and decode_wait_status(32512) == (127, 0)
    assert format_walltime(3600) == "1:00:00" and format_walltime(61.2) == "0:01:02"


def test_submission_resources_and_queues():
    assert parse_oarsub(OARSUB_OK) == "1"
    with pytest.raises(ValueError):
        parse_oarsub(OARSUB_TOO_BIG)             # a negative id: refused
    resources = parse_oarnodes(OARNODES)
    info = summarize_resources(resources, partition=None, queues=parse_queues(OARNOTIFY))
    assert (info.total_cpus, info.free_cpus, info.total_nodes, info.free_nodes) == (2, 0, 1, 0)
    assert info.partition == "default" and set(info.partitions) == {"default", "admin", "besteffort"}
    idle = [{**r, "jobs": None} for r in resources]
    info = summarize_resources(idle, partition="besteffort", queues=[])
    assert (info.free_cpus, info.free_nodes, info.available, info.partition) == (2, 1, True, "besteffort")


def test_oarsub_options_and_job_script():
    spec = JobSpec(script="x", name="gridrpc-b1-add", workdir="/s/jobs/1", output="/s/jobs/1/job.out",
                   partition="default", account="proj", time_limit=90.5, nodes=2, ntasks=3, cpus_per_task=2,
                   extra_options=("-t besteffort",), env={"GRIDRPC_CALL_ID": "c1"})
    assert resource_request(spec) == "/nodes=2/core=3,walltime=0:01:31"
    assert resource_request(JobSpec(script="x", ntasks=4), core="cpu") == "/cpu=4"
    assert oarsub_options(spec) == ["-n", "gridrpc-b1-add", "-l", "/nodes=2/core=3,walltime=0:01:31",
                                    "-d", "/s/jobs/1", "-O", "/s/jobs/1/job.out", "-E", "/s/jobs/1/job.out",
                                    "-q", "default", "--project", "proj", "-t", "besteffort"]
    script = render_job_script(spec, ["python", "-m", "gridrpc.sed.batch.run_job", "/s/jobs/1"],
                               env={"PYTHONPATH": "/opt/my lib"})
    assert script.startswith("#!/bin/bash\n#OAR -n gridrpc-b1-add\n#OAR -l /nodes=2/core=3,walltime=0:01:31\n")
    assert "#OAR -t besteffort\n" in script
    assert "export PYTHONPATH='/opt/my lib'\n" in script and "export GRIDRPC_CALL_ID=c1\n" in script
    assert 'export GRIDRPC_NB_TASKS="3"' in script and 'export GRIDRPC_CPUS_PER_TASK="2"' in script
    assert script.rstrip().endswith("python -m gridrpc.sed.batch.run_job /s/jobs/1")


def test_registered_with_its_options(tmp_path):
    sched = get_scheduler("oar")
    assert sched.backend is OarBackend and set(sched.options) == {"core", "shell"}
    backend = make_backend("oar", env={"A": "1"}, core="cpu")
    assert isinstance(backend, OarBackend) and backend.core == "cpu"
    # the script is a file next to the job's output: OAR runs a command, it reads no stdin
    spec = JobSpec(script="#!/bin/bash\ntrue\n", workdir=str(tmp_path))
    path = backend._write_script(spec)
    assert path == str(tmp_path / "oar_job.sh") and open(path).read() == spec.script
    assert oct((tmp_path / "oar_job.sh").stat().st_mode & 0o777) == "0o755"


def test_a_fragged_job_stays_cancelled_when_oarnodes_fails(tmp_path):
    """A job read as fragged makes the backend ask oarnodes whether its node died; when oarnodes
    fails, the good oarstat answer stands (the job CANCELLED), it is not thrown away."""
    import os
    import stat
    for name, body in (("oarstat", "cat <<'JSON'\n" + OARSTAT_ENDED + "\nJSON\n"),
                       ("oarnodes", "echo 'oarnodes: cannot connect' >&2; exit 3\n")):
        p = tmp_path / name
        p.write_text("#!/bin/sh\n" + body)
        os.chmod(p, p.stat().st_mode | stat.S_IEXEC)
    states = OarBackend(bin_dir=str(tmp_path)).states(["3", "1"])
    assert states["3"].state is JobState.CANCELLED and states["3"].reason.startswith("FRAG_JOB_REQUEST")
    assert states["1"].state is JobState.FAILED
