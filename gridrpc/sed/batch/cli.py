"""``gridrpc sed --batch NAME ...``: build a :class:`~gridrpc.sed.batch.sed.BatchSeD`
from the command line. Each flag is a key of
:class:`~gridrpc.sed.batch.config.BatchConfig` (the same keys as a deployment
file's ``kind: batch`` entry); see ``docs/batch.md``. This module registers
the ``batch`` kind (:mod:`gridrpc.sed.backends.registry`): these flags, that
deployment kind and its command line.
"""
from __future__ import annotations

import argparse

from ...errors import ConfigError
from ..backends.plain import add_service_specs, service_specs
from ..backends.registry import BackendKind, register_kind
from .config import CLI_FLAGS, BATCH_KEYS, batch_settings, config_to_cli, parse_batch_config
from .pilot_config import PILOT_FLAGS
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
    "pilot": "run the calls on pilots: jobs that each start a SeD serving many calls (see the --pilot-* flags)",
}

_PILOT_HELP = {
    "min_pilots": "pilots kept even when idle (default 0)",
    "max_pilots": "pilot jobs in the scheduler at once, pending, running or draining (default 4)",
    "backlog": "calls without a slot, counting the pilots on their way, that submit one more pilot (default 1)",
    "cores": "CPUs per pilot job = calls a pilot runs at once (default 1)",
    "idle_timeout": "seconds a pilot without calls stays before it leaves, down to --pilot-min (default 60)",
    "walltime": "walltime of a pilot job: seconds or [D-]HH:MM:SS (default 3600)",
    "max_call_time": "declared longest call, s: a pilot takes a call only if this fits before its walltime "
                     "(default: the service's estimated time)",
    "drain_margin": "seconds kept between a call's expected end and its pilot's walltime (default 5)",
    "start_timeout": "seconds a running pilot job may take to register its SeD before it is cancelled (default 300)",
    "start_guess": "seconds from a job's start to its SeD registered, until one was measured (default 10)",
    "max_submit_failures": "failed submissions or starts in a row that pause the pilot manager (default 3)",
    "pause": "seconds a paused pilot manager submits nothing (default 300)",
    "host": "address a pilot's SeD binds on its node (default 0.0.0.0, advertised by host name)",
    "sed_args": "more gridrpc sed arguments of the pilots (repeatable; write --pilot-sed-arg=--insecure); "
                "a pilot host that is not loopback needs --insecure (the pilots' link has no CURVE yet)",
    "listen": "address the pilots register at, tcp://HOST:PORT (default: this SeD's host, a free port)",
}


def add_batch_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("batch SeD", "each call runs as one batch job (see docs/batch.md)")
    g.add_argument("--batch", metavar="SCHEDULER",
                   help=f"run a batch SeD on this scheduler: {', '.join(scheduler_names())}")
    for name, flag in CLI_FLAGS.items():
        if name == "scheduler":
            continue
        dest = f"batch_{name}"
        if name == "pilot":
            g.add_argument(flag, dest=dest, action="store_true", default=None, help=_HELP[name])
            for key, pflag in PILOT_FLAGS.items():
                if key == "sed_args":
                    g.add_argument(pflag, dest=f"pilot_{key}", action="append", default=None, metavar="ARG",
                                   help=_PILOT_HELP[key])
                    continue
                g.add_argument(pflag, dest=f"pilot_{key}", default=None, metavar=key.split("_")[-1].upper(),
                               help=_PILOT_HELP[key])
            g.add_argument("--pilot-dry-run", dest="pilot_dry_run", action="store_true",
                           help="print the script of a pilot job and exit (nothing is submitted)")
        elif name == "submit_options":
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
    for name in CLI_FLAGS:
        if name == "scheduler":
            continue
        v = getattr(a, f"batch_{name}", None)
        if v is None or v == []:
            continue
        data[name] = v
    pilot = {key: getattr(a, f"pilot_{key}") for key in PILOT_FLAGS if getattr(a, f"pilot_{key}", None) is not None}
    if data.get("pilot"):
        data["pilot"] = pilot
    elif pilot or getattr(a, "pilot_dry_run", False):
        raise ConfigError("the --pilot-* flags need --pilot")
    return data


def _dry_run(sed) -> None:
    """Print the script of the SeD's next pilot job (``--pilot-dry-run``)."""
    import sys
    from .pilots import pilot_job_spec
    ex = sed.execution
    spec = pilot_job_spec(sed.config, ex.scheduler, pilot=f"{sed.name}.pXXXX-1", manager=sed.name,
                          parent="tcp://<this SeD's pilot agent>", services=ex.targets,
                          workdir=f"{ex.pilots_dir}/{sed.name}.pXXXX-1")
    sys.stdout.write(f"# pilot job of batch SeD {sed.name} on {sed.config.scheduler} "
                     f"(dry run: nothing submitted)\n{spec.script}")
    if not spec.script.endswith("\n"):
        sys.stdout.write("\n")


def make_batch_sed(a: argparse.Namespace, address: str, hb: dict):
    """The BatchSeD the ``gridrpc sed`` arguments ``a`` describe."""
    from .sed import BatchSeD
    config = parse_batch_config(batch_settings_from_args(a), what=f"batch SeD {a.name}")
    specs = service_specs(a, skip=("exit",))      # every example but exit (it ends the process running a call)
    if not specs:
        raise ConfigError(f"batch SeD {a.name}: give at least one --service MODULE:FUNC (or --examples)")
    sed = BatchSeD(a.name, a.parent, config=config, address=address, orphan_timeout=a.orphan_timeout,
                   max_message_size=a.max_message_size, result_cache_bytes=a.result_cache_bytes, **hb)
    add_service_specs(sed, specs)
    if getattr(a, "pilot_dry_run", False):
        _dry_run(sed)
        raise SystemExit(0)
    return sed


def check_batch_entry(settings, what: str) -> None:
    """Check the batch settings of a deployment file's ``kind: batch`` entry (ConfigError)."""
    parse_batch_config(batch_settings(settings), what=what)


def batch_entry_args(settings, what: str) -> list[str]:
    """``gridrpc sed`` arguments of a deployment file's ``kind: batch`` entry."""
    return config_to_cli(parse_batch_config(batch_settings(settings), what=what))


#: estimation tags of batch SeDs besides the standard ones: a job per call (batch_tags), then pilots
ESTIMATION_TAGS = frozenset({
    "tcomp_source", "est_wait_source", "est_wait_scheduler", "slowdown", "batch_scheduler", "batch_available",
    "batch_error", "partition", "walltime", "max_walltime", "nb_total_resources", "nb_free_resources",
    "nb_total_nodes", "nb_free_nodes", "queue_length", "estimate_age",
    "pilot", "pilot_start_estimate", "pilot_walltime", "pilots_paused", "max_pilots", "pilots_ready",
    "pilots_draining", "pilots_starting", "pilot_free_slots", "calls_waiting_for_pilot", "calls_on_pilots"})

register_kind(BackendKind(name="batch", summary="each call a job of a batch scheduler, or calls on pilot jobs",
                          backends=("batch", "pilot"), server_type="batch", tags=ESTIMATION_TAGS,
                          selected=wants_batch,
                          add_arguments=add_batch_arguments, build=make_batch_sed,
                          keys=BATCH_KEYS | {"options"}, check_entry=check_batch_entry,
                          entry_args=batch_entry_args))
