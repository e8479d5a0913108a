"""Pure tests of the Slurm output parsers against RECORDED real output.

Every ``*_OUT``/``*_ERR`` constant below was printed by Slurm 22.05.8 on a
private cluster (tests/slurm_cluster.py: node ``recnode1``, 2 CPUs, partitions
``debug`` (default, MaxTime=INFINITE) and ``short`` (MaxTime=30:00)), with the
exact command lines the backend uses (SQUEUE_FORMAT, SINFO_FORMAT,
SACCT_FIELDS). Jobs: 2 ``sleep 1`` (COMPLETED), 3 ``exit 3`` (FAILED),
4 ``kill -9 $$`` (FAILED by signal), 5 ``sleep 300`` cancelled while running,
6 ``-c 2 -t 1 sleep 300`` (RUNNING, then TIMEOUT), 7 ``-c 1 -t 1`` pending
behind 6 (then COMPLETED), 8 ``-p short -c 2 -t 5`` cancelled while pending.
Timestamps are the cluster's local time; expectations go through
``datetime.fromisoformat(...).timestamp()`` so the tests hold in any time zone.
"""
from __future__ import annotations

from datetime import datetime

import pytest

from gridrpc.errors import GridRPCError
from gridrpc.sed.batch import (BatchBackend, BatchError, JobInfo, JobSpec, JobState,
                               SlurmBackend, get_scheduler, make_backend)
from gridrpc.sed.batch.slurm import (
    SACCT_FIELDS, SQUEUE_FORMAT, decode_wait_status, expand_hostlist, format_time_limit,
    parse_sacct, parse_sbatch_parsable, parse_sbatch_test_only, parse_scontrol_job,
    parse_scontrol_jobs, parse_sinfo, parse_squeue, parse_time_limit, parse_timestamp,
    render_job_script, sbatch_options, slurm_state, summarize_partition)


def ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


# "now" of the busy snapshot and of the final snapshot
NOW_BUSY = ts("2026-11-22T00:01:18")
NOW_FINAL = ts("2026-11-22T00:02:42")

# --------------------------------------------------------------------------
# recorded output (generated from a recording run; do not edit by hand)
# --------------------------------------------------------------------------

# `sinfo idle` (rc=0) at 2026-11-22T00:01:11
SINFO_IDLE_OUT = """\
debug*|up|infinite|1|0/1/0/1|0/2/0/2
short|up|30:00|1|0/1/0/1|0/2/0/2
"""

# `test-only idle` (rc=0) at 2026-11-22T00:01:11
TEST_ONLY_IDLE_ERR = (
    'sbatch: Job 1 to start at 2026-11-22T00:01:11 using 1 processors on nodes recnode1 in '
    'partition debug\n'
)

# `sbatch parsable` (rc=0) at 2026-11-22T00:01:11
SBATCH_PARSABLE_OUT = '2\n'

# `sinfo busy` (rc=0) at 2026-11-22T00:01:18
SINFO_BUSY_OUT = """\
debug*|up|infinite|1|1/0/0/1|2/0/0/2
short|up|30:00|1|1/0/0/1|2/0/0/2
"""

# `test-only busy` (rc=0) at 2026-11-22T00:01:18
TEST_ONLY_BUSY_ERR = (
    'sbatch: Job 9 to start at 2026-11-22T00:03:15 using 1 processors on nodes recnode1 in '
    'partition debug\n'
)

# `test-only impossible` (rc=1) at 2026-11-22T00:01:18
TEST_ONLY_IMPOSSIBLE_ERR = 'allocation failure: Requested node configuration is not available\n'

# `test-only bad partition` (rc=1) at 2026-11-22T00:01:18
TEST_ONLY_BAD_PARTITION_ERR = """\
sbatch: error: invalid partition specified: nope
allocation failure: Invalid partition name specified
"""

# `queue length` (rc=0) at 2026-11-22T00:01:18
QUEUE_LENGTH_OUT = """\
7
8
"""

# `squeue busy` (rc=0) at 2026-11-22T00:01:18
SQUEUE_BUSY_OUT = """\
5|CANCELLED|None|15|2026-11-22T00:01:14|2026-11-22T00:01:14|recnode1|1|1|365-00:00:00|debug|runcancel
2|COMPLETED|None|0|2026-11-22T00:01:12|2026-11-22T00:01:13|recnode1|1|1|365-00:00:00|debug|ok
3|FAILED|NonZeroExitCode|768|2026-11-22T00:01:12|2026-11-22T00:01:12|recnode1|1|1|365-00:00:00|debug|fail
4|FAILED|JobLaunchFailure|9|2026-11-22T00:01:13|2026-11-22T00:01:13|recnode1|1|1|365-00:00:00|debug|sig
7|PENDING|Resources|0|2026-11-22T00:02:15|2026-11-22T00:03:15||1|1|1:00|debug|pend
6|RUNNING|None|0|2026-11-22T00:01:15|2026-11-22T00:02:15|recnode1|1|2|1:00|debug|blocker
8|PENDING|Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions|0|2026-11-22T00:03:00|2026-11-22T00:08:00||1|2|5:00|short|pendcancel
"""

# `scontrol pending` (rc=0) at 2026-11-22T00:01:18
SCONTROL_PENDING_OUT = (
    'JobId=7 JobName=pend UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901753 '
    'Nice=0 Account=(null) QOS=(null) JobState=PENDING Reason=Resources Dependency=(null) '
    'Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 '
    'TimeLimit=00:01:00 TimeMin=N/A SubmitTime=2026-11-22T00:01:15 '
    'EligibleTime=2026-11-22T00:01:15 AccrueTime=2026-11-22T00:01:15 '
    'StartTime=2026-11-22T00:02:15 EndTime=2026-11-22T00:03:15 Deadline=N/A SuspendTime=None '
    'SecsPreSuspend=0 LastSchedEval=2026-11-22T00:01:17 Scheduler=Backfill:* Partition=debug '
    'AllocNode:Sid=localhost:2718 ReqNodeList=(null) ExcNodeList=(null) NodeList= '
    'SchedNodeList=recnode1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* '
    'TRES=cpu=1,mem=24105M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* '
    'MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 '
    'OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) '
    'WorkDir=/tmp/exp/rec/jobs StdErr=/tmp/exp/rec/jobs/slurm-7.out StdIn=/dev/null '
    'StdOut=/tmp/exp/rec/jobs/slurm-7.out Power= \n'
)

# `scontrol running` (rc=0) at 2026-11-22T00:01:18
SCONTROL_RUNNING_OUT = (
    'JobId=6 JobName=blocker UserId=root(0) GroupId=root(0) MCS_label=N/A '
    'Priority=4294901754 Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None '
    'Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 '
    'RunTime=00:00:03 TimeLimit=00:01:00 TimeMin=N/A SubmitTime=2026-11-22T00:01:14 '
    'EligibleTime=2026-11-22T00:01:14 AccrueTime=2026-11-22T00:01:14 '
    'StartTime=2026-11-22T00:01:15 EndTime=2026-11-22T00:02:15 Deadline=N/A SuspendTime=None '
    'SecsPreSuspend=0 LastSchedEval=2026-11-22T00:01:15 Scheduler=Backfill Partition=debug '
    'AllocNode:Sid=localhost:2718 ReqNodeList=(null) ExcNodeList=(null) NodeList=recnode1 '
    'BatchHost=recnode1 NumNodes=1 NumCPUs=2 NumTasks=1 CPUs/Task=2 ReqB:S:C:T=0:0:*:* '
    'TRES=cpu=2,node=1,billing=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* '
    'MinCPUsNode=2 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 '
    'OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) '
    'WorkDir=/tmp/exp/rec/jobs StdErr=/tmp/exp/rec/jobs/slurm-6.out StdIn=/dev/null '
    'StdOut=/tmp/exp/rec/jobs/slurm-6.out Power= \n'
)

# `squeue unknown id` (rc=1) at 2026-11-22T00:01:18
SQUEUE_UNKNOWN_ID_ERR = 'slurm_load_jobs error: Invalid job id specified\n'

# `scontrol unknown id` (rc=1) at 2026-11-22T00:01:18
SCONTROL_UNKNOWN_ID_ERR = 'slurm_load_jobs error: Invalid job id specified\n'

# `squeue final` (rc=0) at 2026-11-22T00:02:42
SQUEUE_FINAL_OUT = """\
5|CANCELLED|None|15|2026-11-22T00:01:14|2026-11-22T00:01:14|recnode1|1|1|365-00:00:00|debug|runcancel
2|COMPLETED|None|0|2026-11-22T00:01:12|2026-11-22T00:01:13|recnode1|1|1|365-00:00:00|debug|ok
7|COMPLETED|None|0|2026-11-22T00:02:40|2026-11-22T00:02:42|recnode1|1|1|1:00|debug|pend
3|FAILED|NonZeroExitCode|768|2026-11-22T00:01:12|2026-11-22T00:01:12|recnode1|1|1|365-00:00:00|debug|fail
4|FAILED|JobLaunchFailure|9|2026-11-22T00:01:13|2026-11-22T00:01:13|recnode1|1|1|365-00:00:00|debug|sig
6|TIMEOUT|TimeLimit|15|2026-11-22T00:01:15|2026-11-22T00:02:40|recnode1|1|2|1:00|debug|blocker
8|CANCELLED|Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions|0|2026-11-22T00:01:18|2026-11-22T00:01:18||1|2|5:00|short|pendcancel
"""

# `scontrol completed` (rc=0) at 2026-11-22T00:02:42
SCONTROL_COMPLETED_OUT = (
    'JobId=2 JobName=ok UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901758 '
    'Nice=0 Account=(null) QOS=(null) JobState=COMPLETED Reason=None Dependency=(null) '
    'Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:01 '
    'TimeLimit=365-00:00:00 TimeMin=N/A SubmitTime=2026-11-22T00:01:11 '
    'EligibleTime=2026-11-22T00:01:11 AccrueTime=2026-11-22T00:01:11 '
    'StartTime=2026-11-22T00:01:12 EndTime=2026-11-22T00:01:13 Deadline=N/A SuspendTime=None '
    'SecsPreSuspend=0 LastSchedEval=2026-11-22T00:01:12 Scheduler=Backfill Partition=debug '
    'AllocNode:Sid=localhost:2718 ReqNodeList=(null) ExcNodeList=(null) NodeList=recnode1 '
    'BatchHost=recnode1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* '
    'TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* '
    'MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 '
    'OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) '
    'WorkDir=/tmp/exp/rec/jobs StdErr=/tmp/exp/rec/jobs/slurm-2.out StdIn=/dev/null '
    'StdOut=/tmp/exp/rec/jobs/slurm-2.out Power= \n'
)

# `scontrol failed` (rc=0) at 2026-11-22T00:02:42
SCONTROL_FAILED_OUT = (
    'JobId=3 JobName=fail UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901757 '
    'Nice=0 Account=(null) QOS=(null) JobState=FAILED Reason=NonZeroExitCode '
    'Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=3:0 '
    'RunTime=00:00:00 TimeLimit=365-00:00:00 TimeMin=N/A SubmitTime=2026-11-22T00:01:11 '
    'EligibleTime=2026-11-22T00:01:11 AccrueTime=2026-11-22T00:01:11 '
    'StartTime=2026-11-22T00:01:12 EndTime=2026-11-22T00:01:12 Deadline=N/A SuspendTime=None '
    'SecsPreSuspend=0 LastSchedEval=2026-11-22T00:01:12 Scheduler=Backfill Partition=debug '
    'AllocNode:Sid=localhost:2718 ReqNodeList=(null) ExcNodeList=(null) NodeList=recnode1 '
    'BatchHost=recnode1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* '
    'TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* '
    'MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 '
    'OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) '
    'WorkDir=/tmp/exp/rec/jobs StdErr=/tmp/exp/rec/jobs/slurm-3.out StdIn=/dev/null '
    'StdOut=/tmp/exp/rec/jobs/slurm-3.out Power= \n'
)

# `scontrol signal` (rc=0) at 2026-11-22T00:02:42
SCONTROL_SIGNAL_OUT = (
    'JobId=4 JobName=sig UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901756 '
    'Nice=0 Account=(null) QOS=(null) JobState=FAILED Reason=JobLaunchFailure '
    'Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:9 '
    'RunTime=00:00:00 TimeLimit=365-00:00:00 TimeMin=N/A SubmitTime=2026-11-22T00:01:11 '
    'EligibleTime=2026-11-22T00:01:11 AccrueTime=2026-11-22T00:01:11 '
    'StartTime=2026-11-22T00:01:13 EndTime=2026-11-22T00:01:13 Deadline=N/A SuspendTime=None '
    'SecsPreSuspend=0 LastSchedEval=2026-11-22T00:01:13 Scheduler=Backfill Partition=debug '
    'AllocNode:Sid=localhost:2718 ReqNodeList=(null) ExcNodeList=(null) NodeList=recnode1 '
    'BatchHost=recnode1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* '
    'TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* '
    'MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 '
    'OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) '
    'WorkDir=/tmp/exp/rec/jobs StdErr=/tmp/exp/rec/jobs/slurm-4.out StdIn=/dev/null '
    'StdOut=/tmp/exp/rec/jobs/slurm-4.out Power= \n'
)

# `scontrol cancelled running` (rc=0) at 2026-11-22T00:02:42
SCONTROL_CANCELLED_RUNNING_OUT = (
    'JobId=5 JobName=runcancel UserId=root(0) GroupId=root(0) MCS_label=N/A '
    'Priority=4294901755 Nice=0 Account=(null) QOS=(null) JobState=CANCELLED Reason=None '
    'Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:15 '
    'RunTime=00:00:00 TimeLimit=365-00:00:00 TimeMin=N/A SubmitTime=2026-11-22T00:01:11 '
    'EligibleTime=2026-11-22T00:01:11 AccrueTime=2026-11-22T00:01:11 '
    'StartTime=2026-11-22T00:01:14 EndTime=2026-11-22T00:01:14 Deadline=N/A SuspendTime=None '
    'SecsPreSuspend=0 LastSchedEval=2026-11-22T00:01:14 Scheduler=Backfill Partition=debug '
    'AllocNode:Sid=localhost:2718 ReqNodeList=(null) ExcNodeList=(null) NodeList=recnode1 '
    'BatchHost=recnode1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* '
    'TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* '
    'MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 '
    'OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) '
    'WorkDir=/tmp/exp/rec/jobs StdErr=/tmp/exp/rec/jobs/slurm-5.out StdIn=/dev/null '
    'StdOut=/tmp/exp/rec/jobs/slurm-5.out Power= \n'
)

# `scontrol cancelled pending` (rc=0) at 2026-11-22T00:02:42
SCONTROL_CANCELLED_PENDING_OUT = (
    'JobId=8 JobName=pendcancel UserId=root(0) GroupId=root(0) MCS_label=N/A '
    'Priority=4294901752 Nice=0 Account=(null) QOS=(null) JobState=CANCELLED '
    'Reason=Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved_for_jobs_in_higher_priority_partitions '
    'Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 '
    'RunTime=00:00:00 TimeLimit=00:05:00 TimeMin=N/A SubmitTime=2026-11-22T00:01:15 '
    'EligibleTime=2026-11-22T00:01:15 AccrueTime=2026-11-22T00:01:15 '
    'StartTime=2026-11-22T00:01:18 EndTime=2026-11-22T00:01:18 Deadline=N/A SuspendTime=None '
    'SecsPreSuspend=0 LastSchedEval=2026-11-22T00:01:17 Scheduler=Backfill Partition=short '
    'AllocNode:Sid=localhost:2718 ReqNodeList=(null) ExcNodeList=(null) NodeList= '
    'SchedNodeList=recnode1 NumNodes=1 NumCPUs=2 NumTasks=N/A CPUs/Task=2 ReqB:S:C:T=0:0:*:* '
    'TRES=cpu=2,mem=24105M,node=1,billing=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* '
    'MinCPUsNode=2 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 '
    'OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) '
    'WorkDir=/tmp/exp/rec/jobs StdErr=/tmp/exp/rec/jobs/slurm-8.out StdIn=/dev/null '
    'StdOut=/tmp/exp/rec/jobs/slurm-8.out Power= \n'
)

# `scontrol timeout` (rc=0) at 2026-11-22T00:02:42
SCONTROL_TIMEOUT_OUT = (
    'JobId=6 JobName=blocker UserId=root(0) GroupId=root(0) MCS_label=N/A '
    'Priority=4294901754 Nice=0 Account=(null) QOS=(null) JobState=TIMEOUT Reason=TimeLimit '
    'Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:15 '
    'RunTime=00:01:25 TimeLimit=00:01:00 TimeMin=N/A SubmitTime=2026-11-22T00:01:14 '
    'EligibleTime=2026-11-22T00:01:14 AccrueTime=2026-11-22T00:01:14 '
    'StartTime=2026-11-22T00:01:15 EndTime=2026-11-22T00:02:40 Deadline=N/A SuspendTime=None '
    'SecsPreSuspend=0 LastSchedEval=2026-11-22T00:01:15 Scheduler=Backfill Partition=debug '
    'AllocNode:Sid=localhost:2718 ReqNodeList=(null) ExcNodeList=(null) NodeList=recnode1 '
    'BatchHost=recnode1 NumNodes=1 NumCPUs=2 NumTasks=1 CPUs/Task=2 ReqB:S:C:T=0:0:*:* '
    'TRES=cpu=2,node=1,billing=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* '
    'MinCPUsNode=2 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 '
    'OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) '
    'WorkDir=/tmp/exp/rec/jobs StdErr=/tmp/exp/rec/jobs/slurm-6.out StdIn=/dev/null '
    'StdOut=/tmp/exp/rec/jobs/slurm-6.out Power= \n'
)

# `sacct no accounting` (rc=1) at 2026-11-22T00:02:42
SACCT_NO_ACCOUNTING_ERR = 'Slurm accounting storage is disabled\n'

# `sacct -c` (rc=0) at 2026-11-22T00:02:42
SACCT_C_OUT = """\
3|FAILED|3:0|2026-11-22T00:01:12|2026-11-22T00:01:12|recnode1|1|1|debug|525600|fail
2|COMPLETED|0:0|2026-11-22T00:01:12|2026-11-22T00:01:13|recnode1|1|1|debug|525600|ok
4|FAILED|0:9|2026-11-22T00:01:13|2026-11-22T00:01:13|recnode1|1|1|debug|525600|sig
5|CANCELLED|0:0|2026-11-22T00:01:14|2026-11-22T00:01:14|recnode1|1|1|debug|525600|runcancel
8|CANCELLED|0:0|2026-11-22T00:01:18|2026-11-22T00:01:18|(null)|0|2|short|5|pendcancel
6|TIMEOUT|0:0|2026-11-22T00:01:15|2026-11-22T00:02:40|recnode1|1|2|debug|1|blocker
7|COMPLETED|0:0|2026-11-22T00:02:40|2026-11-22T00:02:42|recnode1|1|1|debug|1|pend
"""

# From an earlier session on the same machine (node ``h1node1``), at
# 2026-11-21T23:57:07: a job asking 2 CPUs behind a job with no time limit.
# Slurm has no estimate: StartTime is "now + 1 year" ...
SCONTROL_PENDING_NO_ESTIMATE_OUT = (
    'JobId=4 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901756 '
    'Nice=0 Account=(null) QOS=(null) JobState=PENDING Reason=Resources Dependency=(null) '
    'Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED '
    'TimeMin=N/A SubmitTime=2026-11-21T23:57:03 EligibleTime=2026-11-21T23:57:03 '
    'AccrueTime=2026-11-21T23:57:03 StartTime=2027-11-21T23:57:05 EndTime=Unknown Deadline=N/A '
    'SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-21T23:57:07 Scheduler=Main '
    'Partition=debug AllocNode:Sid=localhost:2718 ReqNodeList=(null) ExcNodeList=(null) '
    'NodeList= NumNodes=1 NumCPUs=2 NumTasks=1 CPUs/Task=2 ReqB:S:C:T=0:0:*:* '
    'TRES=cpu=2,mem=24105M,node=1,billing=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* '
    'MinCPUsNode=2 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 '
    'OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) '
    'WorkDir=/tmp/exp/jobs StdErr=/tmp/exp/jobs/slurm-4.out StdIn=/dev/null '
    'StdOut=/tmp/exp/jobs/slurm-4.out Power= \n'
)
NOW_NO_ESTIMATE = ts("2026-11-21T23:57:07")
# ... and `sbatch --test-only` behind a job with no time limit prints a garbage date
TEST_ONLY_NO_ESTIMATE_ERR = (
    'sbatch: Job 6 to start at 6109-12-15T02:04:24 using 1 processors on nodes h1node1 in '
    'partition debug\n'
)
# `squeue ... -O SQUEUE_FORMAT` for a job pending on Priority (same session)
SQUEUE_PENDING_PRIORITY_OUT = (
    '15|PENDING|Priority|0|2026-11-22T00:00:00|2026-11-22T00:01:00||1|1|1:00|debug|tlimit\n')

# --------------------------------------------------------------------------
# squeue
# --------------------------------------------------------------------------

def test_squeue_format_is_parsable_field_list():
    assert SQUEUE_FORMAT.startswith("JobID:0|,State:0|,")
    assert SQUEUE_FORMAT.endswith(",Name:0")


def test_parse_squeue_busy_snapshot():
    jobs = parse_squeue(SQUEUE_BUSY_OUT, now=NOW_BUSY)
    assert sorted(jobs, key=int) == ["2", "3", "4", "5", "6", "7", "8"]

    ok = jobs["2"]
    assert ok.state is JobState.COMPLETED and ok.state.is_final
    assert (ok.exit_code, ok.signal) == (0, 0)
    assert ok.start_time == ts("2026-11-22T00:01:12") and ok.end_time == ts("2026-11-22T00:01:13")
    assert ok.node_list == ("recnode1",) and ok.nb_nodes == 1 and ok.nb_cpus == 1
    assert ok.name == "ok" and ok.partition == "debug" and ok.reason is None
    assert ok.time_limit == 365 * 86400.0

    fail = jobs["3"]
    assert fail.state is JobState.FAILED and fail.reason == "NonZeroExitCode"
    assert (fail.exit_code, fail.signal) == (3, 0)          # raw wait status 768

    sig = jobs["4"]
    assert sig.state is JobState.FAILED and (sig.exit_code, sig.signal) == (0, 9)

    cancelled = jobs["5"]
    assert cancelled.state is JobState.CANCELLED and (cancelled.exit_code, cancelled.signal) == (0, 15)
    assert cancelled.start_time == ts("2026-11-22T00:01:14")

    running = jobs["6"]
    assert running.state is JobState.RUNNING and not running.state.is_final
    assert running.exit_code is None and running.signal is None
    assert running.start_time == ts("2026-11-22T00:01:15") and running.end_time is None
    assert running.nb_cpus == 2 and running.time_limit == 60.0 and running.name == "blocker"

    pending = jobs["7"]
    assert pending.state is JobState.PENDING and pending.reason == "Resources"
    assert pending.start_time is None and pending.end_time is None and pending.node_list == ()
    assert pending.expected_start == ts("2026-11-22T00:02:15")   # the backfill estimate
    assert pending.exit_code is None

    other = jobs["8"]
    assert other.state is JobState.PENDING and other.partition == "short"
    assert other.reason.startswith("Nodes required for job are DOWN, DRAINED")
    assert other.time_limit == 300.0


def test_parse_squeue_final_snapshot_timeout_and_cancelled_pending():
    jobs = parse_squeue(SQUEUE_FINAL_OUT, now=NOW_FINAL)
    timeout = jobs["6"]
    assert timeout.state is JobState.TIMEOUT and timeout.reason == "TimeLimit"
    assert (timeout.exit_code, timeout.signal) == (0, 15)
    assert timeout.end_time - timeout.start_time == 85.0
    assert jobs["7"].state is JobState.COMPLETED
    never_ran = jobs["8"]
    assert never_ran.state is JobState.CANCELLED
    assert never_ran.start_time is None and never_ran.node_list == ()
    assert never_ran.end_time == ts("2026-11-22T00:01:18")
    assert all(j.state.is_final for j in jobs.values())


def test_parse_squeue_pending_on_priority():
    job = parse_squeue(SQUEUE_PENDING_PRIORITY_OUT, now=ts("2026-11-21T23:58:56"))["15"]
    assert job.state is JobState.PENDING and job.reason == "Priority"
    assert job.expected_start == ts("2026-11-22T00:00:00")


def test_parse_squeue_empty_and_garbage():
    assert parse_squeue("") == {}
    with pytest.raises(ValueError):
        parse_squeue("42|RUNNING\n")


def test_squeue_name_with_pipe_stays_whole():
    line = "9|RUNNING|None|0|2026-11-22T00:01:15|2026-11-22T00:02:15|n1|1|1|1:00|debug|a|b\n"
    assert parse_squeue(line, now=NOW_BUSY)["9"].name == "a|b"


# --------------------------------------------------------------------------
# scontrol
# --------------------------------------------------------------------------

@pytest.mark.parametrize("text,job_id,state,exit_code,signal,reason", [
    (SCONTROL_COMPLETED_OUT, "2", JobState.COMPLETED, 0, 0, None),
    (SCONTROL_FAILED_OUT, "3", JobState.FAILED, 3, 0, "NonZeroExitCode"),
    (SCONTROL_SIGNAL_OUT, "4", JobState.FAILED, 0, 9, "JobLaunchFailure"),
    (SCONTROL_CANCELLED_RUNNING_OUT, "5", JobState.CANCELLED, 0, 15, None),
    (SCONTROL_TIMEOUT_OUT, "6", JobState.TIMEOUT, 0, 15, "TimeLimit"),
    (SCONTROL_CANCELLED_PENDING_OUT, "8", JobState.CANCELLED, 0, 0,
     "Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved_for_jobs_in_higher_priority_partitions"),
])
def test_parse_scontrol_final_states(text, job_id, state, exit_code, signal, reason):
    job = parse_scontrol_job(text, now=NOW_FINAL)
    assert job.job_id == job_id and job.state is state and job.state.is_final
    assert (job.exit_code, job.signal) == (exit_code, signal)
    assert job.reason == reason
    assert job.raw_state == state.value


def test_parse_scontrol_details():
    timeout = parse_scontrol_job(SCONTROL_TIMEOUT_OUT, now=NOW_FINAL)
    assert timeout.name == "blocker" and timeout.partition == "debug"
    assert timeout.time_limit == 60.0 and timeout.nb_cpus == 2 and timeout.nb_nodes == 1
    assert timeout.node_list == ("recnode1",)
    assert timeout.start_time == ts("2026-11-22T00:01:15")
    assert timeout.end_time == ts("2026-11-22T00:02:40")
    never_ran = parse_scontrol_job(SCONTROL_CANCELLED_PENDING_OUT, now=NOW_FINAL)
    assert never_ran.node_list == () and never_ran.start_time is None
    assert never_ran.partition == "short" and never_ran.time_limit == 300.0


def test_parse_scontrol_running_and_pending():
    running = parse_scontrol_job(SCONTROL_RUNNING_OUT, now=NOW_BUSY)
    assert running.state is JobState.RUNNING and running.exit_code is None
    assert running.end_time is None and running.node_list == ("recnode1",)
    pending = parse_scontrol_job(SCONTROL_PENDING_OUT, now=NOW_BUSY)
    assert pending.state is JobState.PENDING and pending.reason == "Resources"
    assert pending.expected_start == ts("2026-11-22T00:02:15")
    assert pending.node_list == ()     # SchedNodeList is only a plan


def test_parse_scontrol_pending_without_estimate():
    job = parse_scontrol_job(SCONTROL_PENDING_NO_ESTIMATE_OUT, now=NOW_NO_ESTIMATE)
    assert job.state is JobState.PENDING
    assert job.expected_start is None      # "now + 1 year" means "no idea"
    assert job.time_limit is None          # UNLIMITED


def test_parse_scontrol_unknown_and_multi():
    assert parse_scontrol_job(SCONTROL_UNKNOWN_ID_ERR) is None
    assert parse_scontrol_job("") is None
    both = parse_scontrol_jobs(SCONTROL_COMPLETED_OUT + SCONTROL_FAILED_OUT, now=NOW_FINAL)
    assert list(both) == ["2", "3"]


def test_unknown_id_messages_are_what_the_backend_matches():
    assert "Invalid job id" in SQUEUE_UNKNOWN_ID_ERR
    assert "Invalid job id" in SCONTROL_UNKNOWN_ID_ERR
    assert "accounting storage is disabled" in SACCT_NO_ACCOUNTING_ERR.lower()


# --------------------------------------------------------------------------
# sacct (job-completion log, no slurmdbd)
# --------------------------------------------------------------------------

def test_parse_sacct_jobcomp():
    assert SACCT_FIELDS[0] == "JobID"
    jobs = parse_sacct(SACCT_C_OUT, now=NOW_FINAL)
    assert sorted(jobs, key=int) == ["2", "3", "4", "5", "6", "7", "8"]
    assert jobs["2"].state is JobState.COMPLETED and jobs["2"].exit_code == 0
    assert (jobs["3"].state, jobs["3"].exit_code) == (JobState.FAILED, 3)
    assert (jobs["4"].exit_code, jobs["4"].signal) == (0, 9)
    assert jobs["5"].state is JobState.CANCELLED
    assert jobs["6"].state is JobState.TIMEOUT and jobs["6"].time_limit == 60.0
    assert jobs["8"].node_list == () and jobs["8"].start_time is None and jobs["8"].nb_nodes == 0
    assert jobs["7"].name == "pend" and jobs["2"].time_limit == 525600 * 60.0


def test_parse_sacct_skips_steps_and_reads_cancelled_by():
    text = ("42|CANCELLED by 0|0:15|2026-11-22T00:01:14|2026-11-22T00:01:20|n1|1|1|debug|5|x\n"
            "42.batch|CANCELLED|0:15|2026-11-22T00:01:14|2026-11-22T00:01:20|n1|1|1||||\n")
    jobs = parse_sacct(text, now=NOW_FINAL)
    assert list(jobs) == ["42"] and jobs["42"].state is JobState.CANCELLED
    assert jobs["42"].signal == 15


# --------------------------------------------------------------------------
# sinfo
# --------------------------------------------------------------------------

def test_parse_sinfo_idle():
    rows = parse_sinfo(SINFO_IDLE_OUT)
    assert [r.partition for r in rows] == ["debug", "short"]
    assert rows[0].default and not rows[1].default
    assert rows[0].max_walltime is None and rows[1].max_walltime == 1800.0
    info = summarize_partition(rows)
    assert info.partition == "debug" and info.default_partition == "debug"
    assert (info.total_cpus, info.free_cpus, info.total_nodes, info.free_nodes) == (2, 2, 1, 1)
    assert info.max_walltime is None and info.available
    assert info.partitions == ("debug", "short")
    assert summarize_partition(rows, "short").max_walltime == 1800.0


def test_parse_sinfo_busy():
    info = summarize_partition(parse_sinfo(SINFO_BUSY_OUT), "debug")
    assert (info.total_cpus, info.free_cpus, info.total_nodes, info.free_nodes) == (2, 0, 1, 0)


def test_parse_sinfo_mixed_node_and_unknown_partition():
    # recorded on h1node1 with one 1-CPU job running on the 2-CPU node
    rows = parse_sinfo("debug*|up|infinite|1|1/0/0/1|1/1/0/2\n")
    info = summarize_partition(rows)
    assert (info.free_cpus, info.free_nodes) == (1, 0)   # a mixed node is not free
    with pytest.raises(KeyError):
        summarize_partition(rows, "nope")


# --------------------------------------------------------------------------
# sbatch
# --------------------------------------------------------------------------

def test_parse_sbatch_parsable():
    assert parse_sbatch_parsable(SBATCH_PARSABLE_OUT) == "2"
    assert parse_sbatch_parsable("1234;cluster2\n") == "1234"
    with pytest.raises(ValueError):
        parse_sbatch_parsable("")
    with pytest.raises(ValueError):
        parse_sbatch_parsable("sbatch: error: Batch job submission failed\n")


def test_parse_sbatch_test_only():
    now = ts("2026-11-22T00:01:11")
    assert parse_sbatch_test_only(TEST_ONLY_IDLE_ERR, now=now) == now
    start = parse_sbatch_test_only(TEST_ONLY_BUSY_ERR, now=NOW_BUSY)
    assert start == ts("2026-11-22T00:03:15") and start - NOW_BUSY == 117.0
    assert parse_sbatch_test_only(TEST_ONLY_NO_ESTIMATE_ERR, now=NOW_NO_ESTIMATE) is None
    for refused in (TEST_ONLY_IMPOSSIBLE_ERR, TEST_ONLY_BAD_PARTITION_ERR):
        with pytest.raises(ValueError):
            parse_sbatch_test_only(refused)


def test_queue_length_output_is_one_id_per_line():
    assert len(QUEUE_LENGTH_OUT.split()) == 2


# --------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------

@pytest.mark.parametrize("text,seconds", [
    ("1:00", 60), ("30:00", 1800), ("5", 300), ("00:02:00", 120), ("1:02:03", 3723),
    ("365-00:00:00", 365 * 86400), ("2-3", 2 * 86400 + 3 * 3600), ("1-00:30", 86400 + 1800),
    ("525600", 525600 * 60),
    ("UNLIMITED", None), ("infinite", None), ("INFINITE", None), ("NOT_SET", None), ("N/A", None),
])
def test_parse_time_limit(text, seconds):
    assert parse_time_limit(text) == (None if seconds is None else float(seconds))


def test_parse_time_limit_rejects_garbage():
    for bad in ("abc", "1:2:3:4", "1-2:3:4:5"):
        with pytest.raises(ValueError):
            parse_time_limit(bad)


def test_format_time_limit_rounds_up_to_minutes():
    assert format_time_limit(1) == "0-00:01:00"
    assert format_time_limit(60) == "0-00:01:00"
    assert format_time_limit(61) == "0-00:02:00"
    assert format_time_limit(86400 + 3600) == "1-01:00:00"
    assert parse_time_limit(format_time_limit(7260)) == 7260.0


def test_parse_timestamp():
    assert parse_timestamp("2026-11-22T00:01:12") == ts("2026-11-22T00:01:12")
    for unset in ("N/A", "NONE", "Unknown", "None", "", "(null)"):
        assert parse_timestamp(unset) is None


def test_decode_wait_status():
    assert decode_wait_status(0) == (0, 0)
    assert decode_wait_status(768) == (3, 0)
    assert decode_wait_status(9) == (0, 9)
    assert decode_wait_status(15) == (0, 15)


@pytest.mark.parametrize("raw,state", [
    ("PENDING", JobState.PENDING), ("RUNNING", JobState.RUNNING),
    ("COMPLETING", JobState.RUNNING), ("CONFIGURING", JobState.RUNNING),
    ("SUSPENDED", JobState.RUNNING), ("COMPLETED", JobState.COMPLETED),
    ("FAILED", JobState.FAILED), ("CANCELLED by 0", JobState.CANCELLED),
    ("TIMEOUT", JobState.TIMEOUT), ("NODE_FAIL", JobState.NODE_FAIL),
    ("BOOT_FAIL", JobState.NODE_FAIL), ("PREEMPTED", JobState.PREEMPTED),
    ("OUT_OF_MEMORY", JobState.OUT_OF_MEMORY), ("DEADLINE", JobState.TIMEOUT),
    ("REQUEUED", JobState.PENDING), ("RUNNING+", JobState.RUNNING), ("WEIRD", JobState.UNKNOWN),
])
def test_slurm_state(raw, state):
    assert slurm_state(raw) is state


def test_final_states():
    final = {s for s in JobState if s.is_final}
    assert final == {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT,
                     JobState.NODE_FAIL, JobState.PREEMPTED, JobState.OUT_OF_MEMORY}


@pytest.mark.parametrize("text,hosts", [
    ("recnode1", ("recnode1",)),
    ("", ()), ("(null)", ()),
    ("n[1-3]", ("n1", "n2", "n3")),
    ("n[08-10,12],gpu1", ("n08", "n09", "n10", "n12", "gpu1")),
    ("r[1-2]-n[0-1]", ("r1-n0", "r1-n1", "r2-n0", "r2-n1")),
])
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


# --------------------------------------------------------------------------
# JobSpec, options, script, interface
# --------------------------------------------------------------------------

def test_jobspec_validation_and_defaults():
    spec = JobSpec(script="#!/bin/sh\ntrue\n", extra_options=["--mem=1M"], env={"A": "1"})
    assert spec.extra_options == ("--mem=1M",) and spec.env == {"A": "1"}
    with pytest.raises(ValueError):
        JobSpec(script="")
    with pytest.raises(ValueError):
        JobSpec(script="x", nodes=0)
    with pytest.raises(ValueError):
        JobSpec(script="x", time_limit=0)
    with pytest.raises(TypeError):
        JobSpec("positional script")   # keyword-only


def test_sbatch_options():
    spec = JobSpec(script="x", name="svc", workdir="/w", partition="short", account="acc",
                   time_limit=90, nodes=2, ntasks=4, cpus_per_task=2, output="o.txt",
                   extra_options=("--exclusive",))
    assert sbatch_options(spec) == [
        "--job-name=svc", "--chdir=/w", "--partition=short", "--account=acc",
        "--time=0-00:02:00", "--nodes=2", "--ntasks=4", "--cpus-per-task=2",
        "--output=o.txt", "--exclusive"]
    assert sbatch_options(JobSpec(script="x")) == ["--job-name=gridrpc"]
    with pytest.raises(ValueError):
        sbatch_options(JobSpec(script="x", extra_options=("--comment=a\nb",)))


def test_render_job_script():
    spec = JobSpec(script="unused", name="dgemm", partition="debug", time_limit=120, ntasks=2)
    text = render_job_script(spec, ["python3", "-c", "print('a b')"])
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert "#SBATCH --job-name=dgemm" in lines and "#SBATCH --time=0-00:02:00" in lines
    assert "#SBATCH --partition=debug" in lines and "#SBATCH --ntasks=2" in lines
    for var in ("GRIDRPC_JOB_ID", "GRIDRPC_NODELIST", "GRIDRPC_NB_NODES", "GRIDRPC_NB_TASKS",
                "GRIDRPC_NODEFILE"):
        assert f"export {var}" in text
    assert "scontrol show hostnames" in text
    assert lines[-1] == "python3 -c 'print('\"'\"'a b'\"'\"')'"
    # all #SBATCH lines come before the first command
    first_cmd = next(i for i, l in enumerate(lines) if l and not l.startswith("#"))
    assert all(i < first_cmd for i, l in enumerate(lines) if l.startswith("#SBATCH"))
    with pytest.raises(ValueError):
        render_job_script(spec, [])
    with pytest.raises(ValueError):
        render_job_script(JobSpec(script="x", name="two words"), ["true"])


def test_backend_conforms_to_protocol_and_registry():
    backend = SlurmBackend(env={"SLURM_CONF": "/nonexistent"})
    assert isinstance(backend, BatchBackend)
    assert get_scheduler("slurm").backend is SlurmBackend
    assert isinstance(make_backend("slurm", env={}), SlurmBackend)
    with pytest.raises(GridRPCError):
        make_backend("pbs-does-not-exist")


def test_batch_error_carries_command_and_stderr(tmp_path):
    backend = SlurmBackend(bin_dir=str(tmp_path))        # no Slurm commands there
    with pytest.raises(BatchError) as exc:
        backend.queue_length()
    assert isinstance(exc.value, GridRPCError)
    assert exc.value.cmd[0].endswith("squeue") and "squeue" in str(exc.value)
    fake = tmp_path / "sinfo"
    fake.write_text("#!/bin/sh\necho 'sinfo: error: boom' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(BatchError) as exc:
        backend.cluster_info()
    assert exc.value.returncode == 1 and "boom" in exc.value.stderr and "boom" in str(exc.value)


def test_command_timeout_raises_batch_timeout(tmp_path):
    from gridrpc.sed.batch import BatchTimeout
    fake = tmp_path / "squeue"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(0o755)
    backend = SlurmBackend(bin_dir=str(tmp_path), command_timeout=0.3)
    with pytest.raises(BatchTimeout):
        backend.queue_length()


def test_jobinfo_is_frozen():
    info = JobInfo(job_id="1", state=JobState.PENDING)
    with pytest.raises(AttributeError):
        info.state = JobState.RUNNING
