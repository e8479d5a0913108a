"""CPU binding of a daemon process (``gridrpc ma|la|sed --cpus LIST``,
deployment key ``cpus``): every thread of the process (zmq's I/O thread
included) and every process it forks afterwards (a SeD's workers) run on
the given CPUs only, as Slurm's ``--cpu-bind`` or ``taskset`` would do.

Why: waking a process that sleeps on another CPU is dear on virtual
machines (an inter-processor interrupt, often a VM exit): on the 2-vCPU test
VM a bound call's SeD -> worker -> SeD hop cost ~70 µs of the SeD's CPU in
the pipe write alone. A SeD and its workers on one CPU, the clients on
another, ran 3,900-4,700 bound calls/s against 1,700-3,050 unbound
(docs/performance.md, "CPU binding"). On hosts with many cores, binding
each SeD to its own cores keeps SeDs from disturbing each other; a SeD with
``max_concurrent`` > 1 needs as many CPUs to run its calls in parallel.
"""
from __future__ import annotations

import os

from .errors import ConfigError

__all__ = ["parse_cpus", "bind_cpus", "format_cpus", "usable_cores"]

MAX_CPU = 1 << 16


def parse_cpus(text) -> list[int]:
    """``"0,2-3"`` (or a list of ints) -> ``[0, 2, 3]``; a clear ConfigError
    for anything else (empty, negative, reversed ranges, not numbers)."""
    if isinstance(text, (list, tuple)):
        items = list(text)
        if not items or not all(type(c) is int and 0 <= c < MAX_CPU for c in items):
            raise ConfigError(f"cpus must be a non-empty list of CPU numbers (0..{MAX_CPU - 1}), not {text!r}")
        return sorted(set(items))
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"cpus must look like 0,2-3, not {text!r}")
    out: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise ConfigError(f"cpus: {part.strip()!r} is not a CPU number or a range like 2-3") from None
        if not 0 <= a <= b < MAX_CPU:
            raise ConfigError(f"cpus: {part.strip()!r} is not a CPU number or an increasing range")
        out.update(range(a, b + 1))
    return sorted(out)


def usable_cores() -> int:
    """How many CPUs this process may run on: its affinity (``taskset``,
    ``--cpus``, a cgroup's cpuset count), else every CPU of the machine
    where the platform has no affinity; at least 1."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):     # no sched_getaffinity (not Linux), or the kernel refused
        return os.cpu_count() or 1


def format_cpus(cpus) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def bind_cpus(cpus, check: bool = True) -> list[int]:
    """Bind every thread of this process, and what it forks later, to
    ``cpus`` (a list or ``"0,2-3"``); returns the list. A CPU this process
    may not use (absent, or outside its cgroup/affinity) is a ConfigError
    naming the usable ones (``check=False``: no such check, to give a
    process back the CPUs it had before)."""
    cpus = parse_cpus(cpus)
    allowed = os.sched_getaffinity(0)
    missing = [c for c in cpus if c not in allowed]
    if missing and check:
        raise ConfigError(f"cpus {format_cpus(missing)} not usable here (this process may run on "
                          f"{format_cpus(allowed)})")
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:       # a thread that ended meanwhile
            pass
    return cpus
