"""Parsers of Grid Engine output (gridrpc.sed.batch.sge_parsers) against
output recorded from Son of Grid Engine 8.1.9 on a private cell
(tests/sge_cluster.py, 2 slots; the ``qacct`` records keep the fields the
parser reads), and the qsub options and job script for a JobSpec."""
from __future__ import annotations

from datetime import datetime

import pytest

from gridrpc.sed.batch import JobSpec, JobState, SgeBackend, get_scheduler, make_backend
from gridrpc.sed.batch.sge import job_slots, qsub_options, render_job_script
from gridrpc.sed.batch.sge_parsers import (
    accounting_is_immediate, format_h_rt, live_job_info, parse_error_reason, parse_qacct, parse_qstat_jobs,
    parse_qstat_queues, parse_qsub_terse, parse_queue_limits, parse_sge_time, qacct_job_info, sge_state,
    summarize_queues)

# qstat -xml -s prsz -g t: job 3 runs on 2 slots (MASTER + SLAVE lines), job 1 could not
# chdir (Eqw), 4 pends, 2 ended, 5 was qdel'd while pending.
QSTAT_LIVE = """<?xml version='1.0'?>
<job_info  xmlns:xsd="http://arc.liv.ac.uk/repos/darcs/sge/source/dist/util/resources/schemas/qstat/qstat.xsd">
  <queue_info>
    <job_list state="running">
      <JB_job_number>3</JB_job_number>
      <JAT_prio>0.60500</JAT_prio>
      <JB_name>par</JB_name>
      <JB_owner>root</JB_owner>
      <state>r</state>
      <JAT_start_time>2026-11-28T09:15:35</JAT_start_time>
      <queue_name>all.q@vm</queue_name>
      <master>MASTER</master>
      <slots>1</slots>
    </job_list>
    <job_list state="running">
      <JB_job_number>3</JB_job_number>
      <JAT_prio>0.60500</JAT_prio>
      <JB_name>par</JB_name>
      <JB_owner>root</JB_owner>
      <state>r</state>
      <JAT_start_time>2026-11-28T09:15:35</JAT_start_time>
      <queue_name>all.q@vm</queue_name>
      <master>SLAVE</master>
      <slots>1</slots>
    </job_list>
  </queue_info>
  <job_info>
    <job_list state="pending">
      <JB_job_number>1</JB_job_number>
      <JAT_prio>0.55500</JAT_prio>
      <JB_name>bad</JB_name>
      <JB_owner>root</JB_owner>
      <state>Eqw</state>
      <JB_submission_time>2026-11-28T09:15:32</JB_submission_time>
      <queue_name></queue_name>
      <master></master>
      <slots>1</slots>
    </job_list>
    <job_list state="pending">
      <JB_job_number>4</JB_job_number>
      <JAT_prio>0.50500</JAT_prio>
      <JB_name>pend</JB_name>
      <JB_owner>root</JB_owner>
      <state>qw</state>
      <JB_submission_time>2026-11-28T09:15:35</JB_submission_time>
      <queue_name></queue_name>
      <master></master>
      <slots>1</slots>
    </job_list>
    <job_list state="zombie">
      <JB_job_number>2</JB_job_number>
      <JAT_prio>0.00000</JAT_prio>
      <JB_name>ok3</JB_name>
      <JB_owner>root</JB_owner>
      <state>z</state>
      <JB_submission_time>2026-11-28T09:15:33</JB_submission_time>
      <queue_name></queue_name>
      <master></master>
      <slots>1</slots>
    </job_list>
    <job_list state="zombie">
      <JB_job_number>5</JB_job_number>
      <JAT_prio>0.50500</JAT_prio>
      <JB_name>delp</JB_name>
      <JB_owner>root</JB_owner>
      <state>z</state>
      <JB_submission_time>2026-11-28T09:15:35</JB_submission_time>
      <queue_name></queue_name>
      <master></master>
      <slots>1</slots>
    </job_list>
  </job_info>
</job_info>
"""

# qstat -f -xml with all.q disabled (qmod -d), its 2 slots used by job 3
QSTAT_F_DISABLED = """<?xml version='1.0'?>
<job_info  xmlns:xsd="http://arc.liv.ac.uk/repos/darcs/sge/source/dist/util/resources/schemas/qstat/qstat.xsd">
  <queue_info>
    <Queue-List>
      <name>all.q@vm</name>
      <qtype>BIP</qtype>
      <slots_used>2</slots_used>
      <slots_resv>0</slots_resv>
      <slots_total>2</slots_total>
      <load_avg>2.97754</load_avg>
      <arch>lx-amd64</arch>
      <state>d</state>
      <job_list state="running">
        <JB_job_number>3</JB_job_number>
        <JAT_prio>0.60500</JAT_prio>
        <JB_name>par</JB_name>
        <JB_owner>root</JB_owner>
        <state>r</state>
        <JAT_start_time>2026-11-28T09:15:35</JAT_start_time>
        <slots>2</slots>
      </job_list>
    </Queue-List>
  </queue_info>
  <job_info>
    <job_list state="pending">
      <JB_job_number>1</JB_job_number>
      <JAT_prio>0.55500</JAT_prio>
      <JB_name>bad</JB_name>
      <JB_owner>root</JB_owner>
      <state>Eqw</state>
      <JB_submission_time>2026-11-28T09:15:32</JB_submission_time>
      <slots>1</slots>
    </job_list>
    <job_list state="pending">
      <JB_job_number>4</JB_job_number>
      <JAT_prio>0.50500</JAT_prio>
      <JB_name>pend</JB_name>
      <JB_owner>root</JB_owner>
      <state>qw</state>
      <JB_submission_time>2026-11-28T09:15:35</JB_submission_time>
      <slots>1</slots>
    </job_list>
  </job_info>
</job_info>
"""

# qacct -j 2: the script exited 3
QACCT_EXIT3 = """==============================================================
qname        all.q               
hostname     vm                  
jobname      ok3                 
jobnumber    2                   
account      sge                 
start_time   Sat Nov 28 09:15:33 2026
end_time     Sat Nov 28 09:15:33 2026
granted_pe   NONE                
slots        1                   
failed       0    
exit_status  3                   
ru_wallclock 0s
category     NONE
"""

# qacct -j 3: a 2-slot job killed at its h_rt=4
QACCT_H_RT = """==============================================================
qname        all.q               
hostname     vm                  
jobname      par                 
jobnumber    3                   
account      sge                 
start_time   Sat Nov 28 09:15:35 2026
end_time     Sat Nov 28 09:15:40 2026
granted_pe   smp                 
slots        2                   
failed       37  : qmaster enforced h_rt, h_cpu, or h_vmem limit
exit_status  137                  (Killed)
ru_wallclock 5s
category     -l h_rt=4 -pe smp 2
"""

# qacct -j 4: a running job qdel'd
QACCT_QDEL = """==============================================================
qname        all.q               
hostname     vm                  
jobname      pend                
jobnumber    4                   
account      sge                 
start_time   Sat Nov 28 09:15:42 2026
end_time     Sat Nov 28 09:15:44 2026
granted_pe   NONE                
slots        1                   
failed       100 : assumedly after job
exit_status  137                  (Killed)
ru_wallclock 2s
category     NONE
"""

# qacct -j 1: a running job's host crashed (execd, shepherd and job killed) and its execd started again
QACCT_HOST_CRASH = """==============================================================
qname        all.q               
hostname     vm                  
jobname      t                   
jobnumber    1                   
account      sge                 
start_time   -/-
end_time     -/-
granted_pe   NONE                
slots        1                   
failed       19  : before writing exit_status
exit_status  0                   
ru_wallclock 0s
category     NONE
"""

# qstat -j 1 (a job in error state)
QSTAT_J_ERROR = """job_number:                 1
error reason          1:      11/28/2026 09:15:32 [0:26066]: error: can't chdir to /nonexistent: No such file or directory
scheduling info:            queue instance "all.q@vm" dropped because it is full
                            All queues dropped because of overload or full
                            Job is in error state
"""

# qconf -sconf (part), the private cell's reporting params
QCONF_SCONF = """execd_spool_dir              /tmp/sgerec-mcxbb5l3/spool/execd
mailer                       /bin/true
reporting_params             accounting=true reporting=false \
                             flush_time=00:00:01 \
                             accounting_flush_time=00:00:00 joblog=false \
                             sharelog=00:00:00
finished_jobs                100
"""

# qconf -sq all.q,short.q: all.q as recorded (trimmed); short.q written by hand, with a
# per-host override of h_rt (Grid Engine's "value,[host=value]" syntax)
QCONF_SQ = """qname                 all.q
hostlist              vm
seq_no                0
slots                 2
h_rt                  INFINITY
s_cpu                 INFINITY

qname                 short.q
hostlist              vm
slots                 2
h_rt                  00:30:00,[vm=01:00:00]
"""


def local(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_states_of_live_and_finished_jobs():
    assert [sge_state(s) for s in ("qw", "hqw", "r", "t", "dr", "Rr", "s", "Eqw", "z", "")] == [
        JobState.PENDING, JobState.PENDING, JobState.RUNNING, JobState.RUNNING, JobState.RUNNING,
        JobState.RUNNING, JobState.RUNNING, JobState.FAILED, JobState.UNKNOWN, JobState.UNKNOWN]
    jobs = parse_qstat_jobs(QSTAT_LIVE)
    assert sorted(jobs) == ["1", "2", "3", "4", "5"]
    par = jobs["3"]                       # the MASTER and SLAVE lines merged
    assert (par.raw_state, par.slots, par.name) == ("r", 2, "par")
    assert par.queues == ("all.q@vm", "all.q@vm") and par.start == local("2026-11-28T09:15:35")
    info = live_job_info(par)
    assert info.state is JobState.RUNNING and info.node_list == ("vm",) and info.nb_nodes == 1
    assert info.nb_cpus == 2 and info.partition == "all.q" and info.start_time == par.start
    pend = live_job_info(jobs["4"])
    assert pend.state is JobState.PENDING and pend.node_list == () and pend.start_time is None
    assert live_job_info(jobs["1"]).state is JobState.FAILED            # Eqw: never runs
    assert {jobs[j].raw_state for j in ("2", "5")} == {"z"}
    assert parse_error_reason(QSTAT_J_ERROR) == (
        "11/28/2026 09:15:32 [0:26066]: error: can't chdir to /nonexistent: No such file or directory")


def test_ends_from_accounting():
    exit3 = qacct_job_info(parse_qacct(QACCT_EXIT3), "2")
    assert exit3.state is JobState.FAILED and (exit3.exit_code, exit3.signal) == (3, 0)
    assert exit3.reason == "exit status 3" and exit3.node_list == ("vm",) and exit3.name == "ok3"
    assert exit3.start_time == local("2026-11-28T09:15:33") and exit3.partition == "all.q"
    ok = qacct_job_info(parse_qacct(QACCT_EXIT3.replace("exit_status  3 ", "exit_status  0 ")), "2")
    assert ok.state is JobState.COMPLETED and ok.reason is None
    timeout = qacct_job_info(parse_qacct(QACCT_H_RT), "3")
    assert timeout.state is JobState.TIMEOUT and (timeout.exit_code, timeout.signal) == (0, 9)
    assert timeout.reason == "failed 37: qmaster enforced h_rt, h_cpu, or h_vmem limit"
    assert timeout.time_limit == 4.0 and timeout.nb_cpus == 2
    assert timeout.end_time - timeout.start_time == 5.0
    qdel = qacct_job_info(parse_qacct(QACCT_QDEL), "4")
    assert qdel.state is JobState.CANCELLED and qdel.signal == 9
    assert qdel.reason.startswith("failed 100: assumedly after job; killed by SIGKILL")
    segv = qacct_job_info(parse_qacct(QACCT_QDEL.replace("137                  (Killed)", "139")), "4")
    assert segv.state is JobState.FAILED and segv.signal == 11
    crash = qacct_job_info(parse_qacct(QACCT_HOST_CRASH), "1")
    assert crash.state is JobState.NODE_FAIL and crash.reason == "failed 19: before writing exit_status"
    assert crash.node_list == ("vm",) and crash.start_time is None         # the host, though no times
    lost = qacct_job_info(parse_qacct(QACCT_HOST_CRASH.replace("19  : before writing exit_status",
                                                               "21  : in recognizing job")), "1")
    assert lost.state is JobState.NODE_FAIL and lost.reason == "failed 21: in recognizing job"
    with pytest.raises(ValueError):
        qacct_job_info([], "9")


def test_queues_slots_and_limits():
    instances = parse_qstat_queues(QSTAT_F_DISABLED)
    (q,) = instances
    assert (q.queue, q.host, q.used, q.total, q.state, q.usable) == ("all.q", "vm", 2, 2, "d", False)
    limits = parse_queue_limits(QCONF_SQ)
    assert limits == {"all.q": None, "short.q": 1800.0}
    info = summarize_queues(instances, "all.q", limits=limits, queues=["all.q", "short.q"])
    assert (info.total_cpus, info.free_cpus, info.total_nodes, info.free_nodes) == (2, 0, 1, 0)
    assert not info.available and info.max_walltime is None and info.partitions == ("all.q", "short.q")
    free = parse_qstat_queues(QSTAT_F_DISABLED.replace("<slots_used>2", "<slots_used>0")
                              .replace("<state>d</state>", ""))
    info = summarize_queues(free, None, limits={"short.q": 1800.0}, queues=["all.q"])
    assert (info.partition, info.free_cpus, info.free_nodes, info.available, info.max_walltime) == (
        "*", 2, 1, True, 1800.0)
    with pytest.raises(KeyError):
        summarize_queues(instances, "gpu.q", limits={}, queues=["all.q"])


def test_values_and_config():
    assert parse_sge_time("INFINITY") is None and parse_sge_time("00:30:00") == 1800.0
    assert parse_sge_time("90") == 90.0 and format_h_rt(59.2) == "60" and format_h_rt(0.1) == "1"
    assert parse_qsub_terse("42\n") == "42" and parse_qsub_terse("43.1-10:1\n") == "43"
    with pytest.raises(ValueError):
        parse_qsub_terse("Your job has been submitted")
    assert accounting_is_immediate(QCONF_SCONF)
    assert not accounting_is_immediate(QCONF_SCONF.replace("accounting_flush_time=00:00:00 ", ""))
    assert accounting_is_immediate("reporting_params accounting=true flush_time=00:00:00\n")


def test_qsub_options_and_job_script():
    spec = JobSpec(script="x", name="gridrpc-b1-add", workdir="/s/jobs/1", output="/s/jobs/1/job.out",
                   partition="all.q", account="proj", time_limit=90.5, ntasks=2, cpus_per_task=2,
                   extra_options=("-l h_vmem=1G", "-p -5"))
    assert job_slots(spec) == 4
    opts = qsub_options(spec, pe="smp")
    assert opts == [["-N", "gridrpc-b1-add"], ["-S", "/bin/bash"], ["-V"], ["-wd", "/s/jobs/1"],
                    ["-o", "/s/jobs/1/job.out"], ["-j", "y"], ["-q", "all.q"], ["-A", "proj"],
                    ["-l", "h_rt=91"], ["-pe", "smp", "4"], ["-l", "h_vmem=1G"], ["-p", "-5"]]
    with pytest.raises(ValueError, match="parallel environment"):
        qsub_options(spec)
    assert qsub_options(JobSpec(script="x", name="1 bad/name"))[0] == ["-N", "j1_bad_name"]
    script = render_job_script(spec, ["python", "-m", "gridrpc.sed.batch.run_job", "/s/jobs/1"], pe="smp")
    assert script.startswith("#!/bin/bash\n#$ -N gridrpc-b1-add\n#$ -S /bin/bash\n")
    assert "#$ -pe smp 4\n" in script and "#$ -l h_rt=91\n" in script
    assert 'export GRIDRPC_NB_TASKS="2"' in script and 'export GRIDRPC_CPUS_PER_TASK="2"' in script
    assert script.rstrip().endswith("python -m gridrpc.sed.batch.run_job /s/jobs/1")
    with pytest.raises(ValueError, match="white space"):
        render_job_script(JobSpec(script="x", workdir="/with space"), ["true"])


def test_registered_with_its_options():
    sched = get_scheduler("sge")
    assert sched.backend is SgeBackend and set(sched.options) == {"pe", "shell"}
    backend = make_backend("sge", env={"SGE_CELL": "x"}, pe="mpi")
    assert isinstance(backend, SgeBackend) and backend.pe == "mpi" and backend.extra_env == {"SGE_CELL": "x"}
