"""Run one batch call on a compute node: ``python -m gridrpc.sed.batch.run_job DIR``.

The batch SeD's job script runs this in the call's directory (see
:mod:`.jobfiles`). It writes ``started.json``, imports the service
(``module:function``), decodes the arguments, runs the service (a coroutine
function through ``asyncio.run``), and writes ``result.json``/``result.bin``
or ``error.json`` with the traceback. Exit status: 0 on success, 1 when the
service raised, 2 when the call could not be run at all (bad directory,
service not importable: also reported in ``error.json`` when possible).

The service sees the job's meta variables (``GRIDRPC_JOB_ID``,
``GRIDRPC_NODELIST``, ``GRIDRPC_NODEFILE``, ``GRIDRPC_NB_NODES``,
``GRIDRPC_NB_TASKS``, ``GRIDRPC_CPUS_PER_TASK``, set by the job script) plus
``GRIDRPC_CALL_ID``, ``GRIDRPC_SERVICE`` and ``GRIDRPC_CALL_DIR``.
"""
from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import socket
import sys
import time
import traceback


def _load(target: str):
    mod, _, attr = target.partition(":")
    if not mod or not attr:
        raise ImportError(f"service target {target!r} is not 'package.module:function'")
    obj = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{target} is not callable")
    return obj


def run(d: str) -> int:
    from .jobfiles import read_call, write_error, write_json, write_result
    host = socket.gethostname()
    t0 = time.time()
    try:
        write_json(os.path.join(d, "started.json"), {
            "job_id": os.environ.get("GRIDRPC_JOB_ID"),      # exported by every scheduler's job script
            "host": host, "pid": os.getpid(), "started": t0, "job_started": _job_started(t0),
            "python": sys.executable})
        meta, args, kwargs = read_call(d)
        os.environ["GRIDRPC_CALL_ID"] = str(meta.get("call_id") or "")
        os.environ["GRIDRPC_SERVICE"] = str(meta.get("service") or "")
        os.environ["GRIDRPC_CALL_DIR"] = d
        fn = _load(meta["target"])
    except BaseException as exc:  # noqa: BLE001 - reported to the SeD
        try:
            write_error(d, "BatchSetupError", f"cannot start the call on {host}: "
                        f"{type(exc).__name__}: {exc}", traceback.format_exc(),
                        started=t0, ended=time.time(), host=host)
        except OSError:
            pass
        traceback.print_exc()
        return 2
    started = time.time()
    try:
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = asyncio.run(_await(value))
    except BaseException as exc:  # noqa: BLE001 - SystemExit too: the caller gets it
        ended = time.time()
        traceback.print_exc()
        write_error(d, type(exc).__name__, str(exc), traceback.format_exc(), started=started,
                    ended=ended, host=host)
        return 1
    ended = time.time()
    try:
        write_result(d, value, started=started, ended=ended, host=host)
    except Exception as exc:  # noqa: BLE001 - e.g. a value the codec refuses
        traceback.print_exc()
        write_error(d, type(exc).__name__, f"the result cannot be sent: {exc}", traceback.format_exc(),
                    started=started, ended=ended, host=host)
        return 1
    return 0


def _job_started(default: float) -> float:
    """When the job script began (``GRIDRPC_JOB_STARTED``), else *default*."""
    try:
        t = float(os.environ.get("GRIDRPC_JOB_STARTED", ""))
    except ValueError:
        return default
    return t if 0 < t <= default + 1 else default


async def _await(aw):
    return await aw


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m gridrpc.sed.batch.run_job CALL_DIR", file=sys.stderr)
        return 2
    return run(os.path.abspath(argv[0]))


if __name__ == "__main__":
    sys.exit(main())
