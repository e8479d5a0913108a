"""Finding the processes a private test scheduler started (Slurm, Grid Engine,
OAR), so that its ``stop()`` ends exactly those and nothing else.

A test cluster gives its daemons a marker variable that only their
environment holds; :func:`marked_processes` finds every live process carrying
it, every process in their sessions (and in sessions the cluster created),
and, with ``children=True``, their descendants (job processes whose
environment the scheduler rebuilt). Nothing is ever found by name.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

__all__ = ["free_port", "proc_stat", "proc_environ", "marked_processes", "kill_all", "processes_under"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_environ(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgid, sid) from /proc/PID/stat, None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3])
    except (OSError, IndexError, ValueError):
        return None


def marked_processes(marker: bytes, sids: set[int], *, children: bool = False) -> list[int]:
    """Live PIDs whose environment holds *marker*, every process in their
    sessions or in *sids*, and (*children*) all their descendants. Our own
    session and process are never included."""
    me, my_sid = os.getpid(), os.getsid(0)
    procs: dict[int, tuple[int, int]] = {}  # live (non-zombie) pid -> (ppid, sid)
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            st = proc_stat(int(entry))
            if st is not None and st[0] not in "ZX":
                procs[int(entry)] = (st[1], st[3])
    marked = {pid for pid, (_, sid) in procs.items() if sid != my_sid and marker in proc_environ(pid)}
    sessions = (set(sids) | {procs[pid][1] for pid in marked}) - {my_sid}
    found = marked | {pid for pid, (_, sid) in procs.items() if sid in sessions}
    while children:
        more = {pid for pid, (ppid, _) in procs.items() if ppid in found and pid not in found}
        if not more:
            break
        found |= more
    return sorted(found)


def processes_under(command: bytes, under: str, *, by_cwd: bool = False) -> list[int]:
    """Live PIDs whose command line holds ``command`` and that belong to
    *under* (a test session's temporary directory; other sessions may run
    the same programs): their working directory is below it (``by_cwd``),
    else their command line names it."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            mine = os.readlink(f"/proc/{pid}/cwd").startswith(under) if by_cwd else under.encode() in cmd
        except OSError:
            continue
        if command in cmd and mine:
            out.append(int(pid))
    return out


def kill_all(pids, sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
