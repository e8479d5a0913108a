"""``gridrpc sed --batch NAME ...``: build a :class:`~gridrpc.sed.batch.sed.BatchSeD`
from the command line. Each flag is a key of
:class:`~gridrpc.sed.batch.config.BatchConfig` (the same keys as a deployment
file's ``kind: batch`` entry); see ``docs/batch.md``.
"""
from __future__ import annotations

import argparse

from ...errors import ConfigError
from .config import _CLI_FLAGS, parse_batch_config
from .registry import scheduler_names

_HELP = {
    "partition": "partition (queue) of the jobs (default: the cluster's default)",
    "account": "account charged for the jobs",
    "time_limit": "default walltime of a call's job: seconds or [D-]HH:MM:SS (default: partition's)",
    "max_time_limit": "largest walltime a call may ask for with _batch={'walltime': ...}",
    "nodes": "nodes per job (default shape; calls may ask for more with _batch)",
    "ntasks": "tasks per job (default shape)",
    "cpus_per_task": "CPUs per task (default shape)",
    "submit_options": "extra option of the scheduler's submit command, verbatim (repeatable; write "
                      "--submit-option=--mem=2G; --sbatch-option is the same)",
    "scheduler_options": "KEY=VALUE setting of the scheduler itself (repeatable; see docs/batch.md)",
    "shared_dir": "directory shared with the compute nodes for arguments, results and state "
                  "(default ~/.gridrpc/batch)",
    "remote_python": "Python with gridrpc on the compute nodes (default: this one)",
    "poll_interval": "seconds between polls of the jobs' states, one query for all (default 2)",
    "estimate_interval": "seconds between refreshes of the cluster snapshot for estimates (default 5)",
    "max_jobs": "jobs of this SeD in the scheduler at once; more calls wait in the SeD (default 1000)",
    "env": "KEY=VALUE for the scheduler commands and the jobs, e.g. which cluster they talk to (repeatable)",
    "job_env": "KEY=VALUE exported to the jobs only (repeatable)",
    "bin_dir": "directory of the scheduler's commands if not on PATH",
    "command_timeout": "seconds a scheduler command may take (default 30)",
    "cancel_timeout": "seconds a cancel waits for the job to be gone (default 30)",
    "cancel_on_exit": "cancel the running jobs when the SeD stops (default: keep them for a restart)",
    "restart_grace": "seconds clients wait for a silent (restarting) batch SeD (default 120)",
    "result_retention": "seconds an answer nobody fetched is kept on disk (default 7 days)",
    "lost_after": "seconds a job unknown to the scheduler, without result, is waited for (default 60)",
}


def add_batch_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("batch SeD", "each call runs as one batch job (see docs/batch.md)")
    g.add_argument("--batch", metavar="SCHEDULER",
                   help=f"run a batch SeD on this scheduler: {', '.join(scheduler_names())}")
    for name, flag in _CLI_FLAGS.items():
        if name == "scheduler":
            continue
        dest = f"batch_{name}"
        if name == "submit_options":
            g.add_argument(flag, "--sbatch-option", dest=dest, action="append", default=[], metavar="OPTION",
                           help=_HELP[name])
        elif name in ("env", "job_env", "scheduler_options"):
            g.add_argument(flag, dest=dest, action="append", default=[], metavar="KEY=VALUE", help=_HELP[name])
        elif name == "cancel_on_exit":
            g.add_argument(flag, dest=dest, action="store_true", default=None, help=_HELP[name])
        else:
            g.add_argument(flag, dest=dest, default=None, metavar=name.split("_")[-1].upper(),
                           help=_HELP[name])


def wants_batch(a: argparse.Namespace) -> bool:
    return bool(getattr(a, "batch", None))


def batch_settings_from_args(a: argparse.Namespace) -> dict:
    data: dict = {"scheduler": a.batch}
    for name in _CLI_FLAGS:
        if name == "scheduler":
            continue
        v = getattr(a, f"batch_{name}", None)
        if v is None or v == []:
            continue
        data[name] = v
    return data


def make_batch_sed(a: argparse.Namespace, address: str, hb: dict):
    """The BatchSeD the ``gridrpc sed`` arguments ``a`` describe."""
    from .sed import BatchSeD
    config = parse_batch_config(batch_settings_from_args(a), what=f"batch SeD {a.name}")
    specs = list(a.service)
    if getattr(a, "examples", False):
        from ...examples.services import ALL
        specs += [f"gridrpc.examples.services:{s}" for s in ALL if s != "exit"]
    if not specs:
        raise ConfigError(f"batch SeD {a.name}: give at least one --service MODULE:FUNC (or --examples)")
    sed = BatchSeD(a.name, a.parent, config=config, address=address, orphan_timeout=a.orphan_timeout,
                   max_message_size=a.max_message_size, result_cache_bytes=a.result_cache_bytes, **hb)
    from ..services import split_spec_options
    for spec in specs:
        spec, options = split_spec_options(spec)     # [NAME=]MODULE:FUNC[,idempotent=false][,on_orphan=kill]
        name, _, target = spec.rpartition("=")
        sed.add_service(name or target.rsplit(":", 1)[-1], target, **options)
    return sed
