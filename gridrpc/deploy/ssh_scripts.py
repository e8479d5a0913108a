"""The remote side of the SSH launcher (:mod:`.ssh`): POSIX ``sh`` scripts,
built as text, and the reading of what they print.

Each script runs in one ssh session (``sh -c SCRIPT``) and reports on lines
starting with :data:`MARK`, so the login shell's own output never gets in the
way. Each list element is its own statement (never ``a && b && nohup c &``,
which backgrounds the whole list and keeps ssh's stdout open). Processes are
checked with ``alive PID START`` (:data:`SH_ALIVE`): ``kill -0`` plus a zombie
and start-time check, so a reused PID is never taken for the element.

The scripts that start elements begin with :func:`prelude` (enter the
workdir, activate the venv, export the environment) and, before the first
start on a host, :func:`check_python`; they exit with :data:`RC_WORKDIR`,
:data:`RC_PYTHON` or :data:`RC_MODULE` when that fails. No I/O here.
"""
from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

MARK = "@@gridrpc"
RC_WORKDIR, RC_PYTHON, RC_MODULE = 97, 98, 99

# Remote helpers: is PID alive (not a zombie, same start time)?
SH_ALIVE = r"""
pstart() { [ -r /proc/$1/stat ] && sed 's/^.*) //' /proc/$1/stat 2>/dev/null | awk '{print $20}'; }
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  if [ -r /proc/$1/stat ]; then
    st=$(sed 's/^.*) //' /proc/$1/stat 2>/dev/null | awk '{print $1}')
    [ "$st" = Z ] && return 1
    [ -n "$2" ] && [ "$(pstart "$1")" != "$2" ] && return 1
  fi
  return 0
}
"""


def rpath(path: str) -> str:
    """Quote a remote path for sh, keeping a leading ``~/`` expandable."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


# -- preflight ---------------------------------------------------------------------

def prelude(workdir: str, venv: str | None, env: Mapping[str, str]) -> str:
    """Create and enter ``workdir``, put ``venv`` first on PATH, export ``env``
    (whose names the caller has checked)."""
    lines = [f'mkdir -p {rpath(workdir)} 2>/dev/null; cd {rpath(workdir)} || '
             f'{{ echo "{MARK} workdir"; exit {RC_WORKDIR}; }}']
    if venv:
        lines += [f"VIRTUAL_ENV={rpath(venv.rstrip('/'))}; export VIRTUAL_ENV",
                  'PATH="$VIRTUAL_ENV/bin:$PATH"; export PATH']
    lines += [f"{k}={shlex.quote(v)}; export {k}" for k, v in env.items()]
    return "\n".join(lines) + "\n"


def check_python(python: str, module: str | None) -> str:
    """One python run: the interpreter exists (126/127 otherwise) and imports
    ``module``; leaves its version in ``$pyver``."""
    py = rpath(python)
    imp = f"; import {module}" if module else ""
    return (f'out=$({py} -c "import sys; print(sys.version.split()[0]){imp}" 2>&1); rc=$?\n'
            f'if [ $rc -eq 126 ] || [ $rc -eq 127 ]; then echo "{MARK} python"; exit {RC_PYTHON}; fi\n'
            f'if [ $rc -ne 0 ]; then echo "{MARK} module"; printf "%s\\n" "$out" | tail -n 5; '
            f'exit {RC_MODULE}; fi\n'
            'pyver=$(printf "%s\\n" "$out" | head -n 1)\n')


REPORT_VERSION = f'echo "{MARK} version $pyver"\n'
VERSION_RE = re.compile(rf"^{MARK} version (.*)$", re.M)


# -- start one, with a check window ------------------------------------------------

def start_one(command: Sequence[str], logf: str, check_window: float) -> str:
    """Start ``command`` with ``nohup`` (output to ``logf``), report its pid,
    start time and log, then watch it for ``check_window`` seconds: an early
    exit is reported with its code and the log tail."""
    steps = max(1, int(check_window * 10))
    return (SH_ALIVE +
            "mkdir -p logs\n"
            f"nohup {shlex.join(command)} >{logf} 2>&1 </dev/null &\n"
            "pid=$!\n"
            f'echo "{MARK} pid=$pid start=$(pstart $pid) log=$PWD/{logf}"\n'
            f"i=0; while [ $i -lt {steps} ]; do\n"
            "  if ! alive $pid; then wait $pid; rc=$?\n"
            f'    echo "{MARK} exited rc=$rc"; tail -n 20 {logf}; exit 0; fi\n'
            "  sleep 0.1; i=$((i+1))\n"
            "done\n"
            f'echo "{MARK} running"\n')


START_ONE_RE = re.compile(rf"^{MARK} pid=(\d+) start=(\S*) log=(.*)$", re.M)
EXITED_RE = re.compile(rf"^{MARK} exited rc=(\d+)$", re.M)


# -- start many and wait for readiness --------------------------------------------

def _watch(logs: Sequence[str], pattern: str, timeout: float) -> list[str]:
    """Wait until each log ``logs[i]`` has a line matching the extended regex
    ``pattern``, or its process (``$p{i}``, start ``$s{i}``) is gone, or
    ``timeout`` passes; report ``ready I LINE``, ``exited I`` or ``timeout I``
    with the log tail on ``MARK+I`` lines. ``$d{i}`` (0) marks what is done."""
    steps = max(1, int(timeout * 10))
    pat = shlex.quote(pattern)
    lines = ["i=0", "while :; do", "  all=1"]
    for i, logf in enumerate(logs):
        lf = shlex.quote(logf)
        lines += [
            f"  if [ $d{i} = 0 ]; then",
            f"    if line=$(grep -m1 -E {pat} {lf} 2>/dev/null); then "
            f"printf '%s\\n' \"{MARK} ready {i} $line\"; d{i}=1",
            f"    elif ! alive $p{i} $s{i}; then",
            f"      if line=$(grep -m1 -E {pat} {lf} 2>/dev/null); then "
            f"printf '%s\\n' \"{MARK} ready {i} $line\"",
            f"      else echo \"{MARK} exited {i}\"; tail -n 30 {lf} 2>/dev/null | sed 's/^/{MARK}+{i} /'; fi",
            f"      d{i}=1",
            "    else all=0; fi",
            "  fi"]
    lines += ["  [ $all = 1 ] && break", f"  if [ $i -ge {steps} ]; then"]
    for i, logf in enumerate(logs):
        lines.append(f"    [ $d{i} = 0 ] && {{ echo \"{MARK} timeout {i}\"; tail -n 30 {shlex.quote(logf)} "
                     f"2>/dev/null | sed 's/^/{MARK}+{i} /'; }}")
    lines += ["    break", "  fi", "  sleep 0.1; i=$((i+1))", "done", "exit 0"]
    return lines


def start_many(items: Sequence[tuple[Sequence[str], str]], pattern: str, timeout: float) -> str:
    """Start every ``(command, logf)`` with ``nohup``, report ``started I
    pid=P start=S log=L`` for each, then :func:`_watch` them all."""
    lines = [SH_ALIVE, "mkdir -p logs"]
    for i, (command, logf) in enumerate(items):
        lines += [f"nohup {shlex.join(command)} >{logf} 2>&1 </dev/null &",
                  f"p{i}=$!; s{i}=$(pstart $p{i}); d{i}=0",
                  f'echo "{MARK} started {i} pid=$p{i} start=$s{i} log=$PWD/{logf}"']
    lines += _watch([logf for _, logf in items], pattern, timeout)
    return "\n".join(lines) + "\n"


def wait_ready(pid: int, pid_start: str, log_path: str, pattern: str, timeout: float) -> str:
    """:func:`_watch` one process started earlier (item 0)."""
    lines = [SH_ALIVE, f"p0={int(pid)}; s0={shlex.quote(pid_start)}; d0=0"]
    lines += _watch([log_path], pattern, timeout)
    return "\n".join(lines) + "\n"


_STARTED_RE = re.compile(rf"^{MARK} started (\d+) pid=(\d+) start=(\S*) log=(.*)$")
_OUTCOME_RE = re.compile(rf"^{MARK} (ready|exited|timeout) (\d+) ?(.*)$")
_TAIL_RE = re.compile(rf"^{MARK}\+(\d+) ?(.*)$")


@dataclass
class WatchReport:
    """What :func:`start_many` / :func:`wait_ready` printed, read line by line
    with :meth:`feed` (as it comes: ``start_many`` reports pids before it
    waits). Keys are item indexes."""
    started: dict[int, tuple[int, str, str]] = field(default_factory=dict)   # pid, start, log
    outcome: dict[int, str] = field(default_factory=dict)       # ready | exited | timeout
    ready_line: dict[int, str] = field(default_factory=dict)
    tails: dict[int, list[str]] = field(default_factory=dict)
    other: list[str] = field(default_factory=list)

    def feed(self, line: str) -> int | None:
        """Read one output line; the item index if it reported a start."""
        m = _STARTED_RE.match(line)
        if m:
            i = int(m.group(1))
            self.started[i] = (int(m.group(2)), m.group(3), m.group(4).strip())
            return i
        m = _OUTCOME_RE.match(line)
        if m:
            i = int(m.group(2))
            self.outcome[i] = m.group(1)
            if m.group(1) == "ready":
                self.ready_line[i] = m.group(3)
            return None
        m = _TAIL_RE.match(line)
        if m:
            self.tails.setdefault(int(m.group(1)), []).append(m.group(2))
            return None
        self.other.append(line)
        return None

    def tail(self, i: int) -> str:
        return "\n".join(self.tails.get(i, [])) + ("\n" if self.tails.get(i) else "")


# -- alive / stop / logs --------------------------------------------------------------

def alive_many(started: Sequence[tuple[int, str]]) -> str:
    """Report ``PID 1`` or ``PID 0`` for every ``(pid, start)``."""
    return SH_ALIVE + "".join(
        f'alive {pid} {shlex.quote(start)} && echo "{MARK} {pid} 1" || '
        f'echo "{MARK} {pid} 0"\n' for pid, start in started)


def read_alive(stdout: str) -> dict[int, bool]:
    return {int(p): f == "1" for p, f in re.findall(rf"^{MARK} (\d+) ([01])$", stdout, re.M)}


def stop_many(started: Sequence[tuple[int, str]], timeout: float) -> str:
    """TERM every live ``(pid, start)``, wait up to ``timeout`` for all, KILL
    the survivors; report ``PID not-running|terminated|killed|survived``."""
    pairs = " ".join(f"{pid}:{start or '-'}" for pid, start in started)
    steps = max(1, int(timeout * 10))
    return SH_ALIVE + f"""
pairs={shlex.quote(pairs)}
st_of() {{ s=${{1#*:}}; [ "$s" = - ] && s=; printf '%s' "$s"; }}
live=
for pp in $pairs; do
  p=${{pp%%:*}}
  if alive "$p" "$(st_of "$pp")"; then kill -TERM "$p" 2>/dev/null; live="$live $pp"
  else echo "{MARK} $p not-running"; fi
done
i=0
while [ -n "$live" ] && [ $i -lt {steps} ]; do
  sleep 0.1; i=$((i+1)); next=
  for pp in $live; do
    p=${{pp%%:*}}
    if alive "$p" "$(st_of "$pp")"; then next="$next $pp"; else echo "{MARK} $p terminated"; fi
  done
  live=$next
done
for pp in $live; do kill -KILL "${{pp%%:*}}" 2>/dev/null; done
i=0
while [ -n "$live" ] && [ $i -lt 50 ]; do
  next=
  for pp in $live; do
    p=${{pp%%:*}}
    if alive "$p" "$(st_of "$pp")"; then next="$next $pp"; else echo "{MARK} $p killed"; fi
  done
  live=$next; [ -n "$live" ] && sleep 0.1; i=$((i+1))
done
for pp in $live; do echo "{MARK} ${{pp%%:*}} survived"; done
exit 0
"""


def read_stop(stdout: str) -> dict[int, str]:
    return {int(p): r for p, r in re.findall(rf"^{MARK} (\d+) (\S+)$", stdout, re.M)}


def tail(path: str, lines: int) -> str:
    return f"tail -n {int(lines)} {shlex.quote(path)} 2>/dev/null; exit 0\n"
