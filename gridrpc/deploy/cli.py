"""``gridrpc deploy up|down|status|logs|plan|calibrate``."""
from __future__ import annotations

import argparse
import json
import sys


def add_parser(sub) -> None:
    p = sub.add_parser("deploy", help="deploy a tree from a YAML file (up, down, status, logs, plan)")
    dsub = p.add_subparsers(dest="deploy_cmd", metavar="ACTION")
    for name, helptext in (("up", "start every element and wait until all registered"),
                           ("down", "stop every element of a deployment (also on remote hosts)"),
                           ("status", "show the tree: host, pid, state, load"),
                           ("logs", "print an element's log")):
        q = dsub.add_parser(name, help=helptext)
        q.add_argument("file", help="deployment file (YAML), or a deployment name for down/status/logs")
        q.add_argument("--state-dir", help="where the deployment state is kept "
                                           "(default $GRIDRPC_HOME or ~/.gridrpc, then deployments/NAME)")
        if name == "logs":
            q.add_argument("element")
            q.add_argument("-n", "--lines", type=int, default=50)
            q.add_argument("-f", "--follow", action="store_true",
                           help="keep printing what the element writes, until it stops (or Ctrl-C)")
        if name in ("status", "up"):
            q.add_argument("--json", action="store_true")
        if name == "up":
            q.add_argument("--ready-timeout", type=float, default=20.0,
                           help="seconds each element has to print READY (default 20)")
            q.add_argument("--register-timeout", type=float, default=30.0,
                           help="seconds for all elements to appear at the MA (default 30)")
        if name == "down":
            q.add_argument("--timeout", type=float, default=10.0,
                           help="seconds between SIGTERM and SIGKILL (default 10)")
    q = dsub.add_parser("plan", help="propose a tree shape for N SeDs on some hosts and write a deployment file")
    q.add_argument("--seds", type=int, required=True, help="number of SeDs")
    q.add_argument("--hosts", required=True, help="YAML file with a 'hosts:' mapping (deployment file syntax, "
                                                  "plus optional 'seds: N' and 'agents: false' per host)")
    q.add_argument("-o", "--output", help="deployment file to write (default: print it)")
    q.add_argument("--figures", help="JSON file from 'gridrpc deploy calibrate' (default: built-in figures)")
    q.add_argument("--max-levels", type=int, default=4, help="most agent levels to consider (default 4)")
    q.add_argument("--max-fanout", type=int, default=None, help="most children per agent")
    q.add_argument("--services", default="examples",
                   help="comma-separated MODULE:FUNC for every SeD, or 'examples' (default)")
    q.add_argument("--name", help="deployment name (default: from the output file)")
    q.add_argument("--ma-port", type=int, default=5555)
    q.add_argument("--tolerance", type=float, default=0.1,
                   help="take the shape with fewest agents among those predicted within this fraction "
                        "of the fastest (default 0.1)")
    q.add_argument("--min-gain", type=float, default=0.5,
                   help="... or within this many milliseconds (default 0.5)")
    q.add_argument("--pack", action="store_true",
                   help="SeD processes with replicas instead of one process per SeD: one process per "
                        "core of each host (its 'cores' key; localhost: this machine's), per parent")
    q.add_argument("--model", choices=("sim", "analytic"), default="sim",
                   help="sim (default): simulate every candidate shape on these hosts with gridrpc.sim; "
                        "analytic: the per-child/per-hop latency formula (--figures)")
    q.add_argument("--costs", help="JSON from 'gridrpc sim calibrate' (default: the built-in calibration)")
    q = dsub.add_parser("calibrate", help="measure discovery cost per child and per hop (in-process tree)")
    q.add_argument("--seds", default="50,100,200", help="comma-separated SeD counts (default 50,100,200)")
    q.add_argument("--las", default="5", help="comma-separated LA counts for the two-level runs (default 5)")
    q.add_argument("--rounds", type=int, default=30, help="discoveries per measurement (default 30)")
    q.add_argument("-o", "--output", help="write the figures as JSON here")
    p.set_defaults(func=run)


def _deployment(a):
    """The Deployment for ``a``; None for ``down`` when nothing is deployed."""
    from pathlib import Path
    from .runner import Deployment, state_root
    from .spec import load
    path = Path(a.file)
    is_file = path.suffix in (".yaml", ".yml", ".json") or path.is_file()
    if a.deploy_cmd == "up":
        if not is_file:
            from ..errors import ConfigError
            raise ConfigError(f"deployment file {a.file} not found")
        return Deployment(load(path), state_dir=a.state_dir, ready_timeout=a.ready_timeout,
                          register_timeout=a.register_timeout)
    spec = None
    if is_file and not (a.deploy_cmd == "down" and not path.exists()):
        spec = load(path)
        state_dir = Path(a.state_dir or state_root() / spec.name)
    else:
        state_dir = Path(a.state_dir or state_root() / (path.stem if is_file else a.file))
    if a.deploy_cmd == "down" and not (state_dir / "state.json").exists():
        return None
    return Deployment.load_state(state_dir, spec)


class once_interruptible:
    """The first Ctrl-C (or SIGTERM, SIGHUP) interrupts (KeyboardInterrupt);
    later ones only say that what was started is being stopped, so the
    rollback is never cut short and leaves no process behind."""

    def __enter__(self):
        import signal
        self._signal = signal
        self._hits = 0
        self._old = {}
        for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is None:
                continue
            try:
                self._old[sig] = signal.signal(sig, self._on_sigint)
            except ValueError:              # not the main thread: leave signals alone
                break
        return self

    def _on_sigint(self, signum, frame):
        self._hits += 1
        if self._hits == 1:
            raise KeyboardInterrupt
        print("gridrpc deploy: stopping what was started, please wait ...", file=sys.stderr)

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            self._signal.signal(sig, old)
        return False


def _interrupted(exc: BaseException) -> bool:
    """A Ctrl-C, possibly wrapped by the runner (``DeployError from KeyboardInterrupt``)."""
    while exc is not None:
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc = exc.__cause__
    return False


def follow(d, name: str, lines: int, out=None, poll: float = 0.25) -> int:
    """``deploy logs --follow``: the last ``lines`` lines, then whatever the
    element writes, until it stops (exit 0) or Ctrl-C (exit 130). Local and
    Slurm elements: the log file is read here; ssh hosts: ``tail -F`` over ssh."""
    import os
    import subprocess
    import time
    out = out or sys.stdout
    st = d.started.get(name)
    d.logs(name, 0)                                   # clear errors: unknown name, not running
    launcher = d.launcher(d.spec.element(name).host)
    remote = getattr(launcher, "launcher_name", "") == "ssh"
    if st.log_path and os.path.exists(st.log_path) and not remote:
        out.write(d.logs(name, lines))
        out.flush()
        with open(st.log_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            while True:
                chunk = fh.read()
                if chunk:
                    out.write(chunk.decode(errors="replace"))
                    out.flush()
                    continue
                if not launcher.alive(st):
                    rest = fh.read()
                    if rest:
                        out.write(rest.decode(errors="replace"))
                        out.flush()
                    print(f"({name} is not running any more)", file=sys.stderr)
                    return 0
                time.sleep(poll)
    argv_of = getattr(launcher, "ssh_argv", None)
    if argv_of is None:
        raise DeployFollowError(f"cannot follow the log of {name} on {d.spec.element(name).host}")
    import shlex
    path = shlex.quote(st.log_path)
    pid = int(st.pid)
    script = (f"tail -n {int(lines)} -F {path} 2>/dev/null & t=$!; "
              f"while kill -0 {pid} 2>/dev/null; do sleep 1; done; sleep 1; kill $t 2>/dev/null; "
              f"echo '({name} is not running any more)' >&2")
    proc = subprocess.Popen(argv_of("sh -c " + shlex.quote(script)), stdin=subprocess.DEVNULL)
    try:
        return 0 if proc.wait() in (0, 143) else 1
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(5)


class DeployFollowError(Exception):
    pass


def run(a: argparse.Namespace) -> int:
    from ..errors import GridRPCError
    if not getattr(a, "deploy_cmd", None):
        print("usage: gridrpc deploy {up,down,status,logs,plan,calibrate} ...", file=sys.stderr)
        return 2
    if a.deploy_cmd == "plan":
        from .plan import cmd_plan
        return cmd_plan(a)
    if a.deploy_cmd == "calibrate":
        from .calibrate import cmd_calibrate
        return cmd_calibrate(a)
    d = None
    try:
        d = _deployment(a)
        if d is None:                           # down, and no state: a second `down` is fine
            print(f"nothing running ({a.file} is not deployed, or already down)")
            return 0
        if a.deploy_cmd == "up":
            with once_interruptible():
                summary = d.up()
            if a.json:
                print(json.dumps(summary, indent=2))
            else:
                print(f"MA: {summary['ma']}")
        elif a.deploy_cmd == "down":
            d.stop_timeout = a.timeout
            stopped = d.down()
            print(f"stopped {len(stopped)} element(s)")
            if d.down_errors:
                by_error: dict[str, list[str]] = {}
                for n, e in d.down_errors.items():
                    by_error.setdefault(e, []).append(n)
                print(f"gridrpc deploy down: could not stop {len(d.down_errors)} element(s):\n"
                      + "\n".join(f"  - {', '.join(ns)}: {e}" for e, ns in by_error.items())
                      + f"\n(state kept in {d.state_dir}; run 'gridrpc deploy down' again)", file=sys.stderr)
                return 1
        elif a.deploy_cmd == "status":
            from .runner import format_status
            rows = d.status()
            if a.json:
                print(json.dumps(rows, indent=2))
            else:
                print(format_status(rows))
            return 0 if all(r["process"] == "running" and r["tree"] == "alive" for r in rows) else 1
        elif a.deploy_cmd == "logs":
            if a.follow:
                return follow(d, a.element, a.lines)
            sys.stdout.write(d.logs(a.element, a.lines))
    except (GridRPCError, DeployFollowError) as exc:
        if _interrupted(exc):
            print(f"gridrpc deploy {a.deploy_cmd}: interrupted; what was started has been stopped",
                  file=sys.stderr)
            return 130
        print(f"gridrpc deploy {a.deploy_cmd}: {exc}", file=sys.stderr)
        return 1
    finally:
        if d is not None:
            d.close()
    return 0
