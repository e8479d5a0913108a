"""``gridrpc deploy up``: start the elements of a deployment and report progress.

Every host used is checked first (ssh reachable, key accepted, host key
known, python and gridrpc there; Slurm allocation present), so a wrong host
stops the deployment before anything runs. Then parents start first (each
level in parallel, one batch per host); each element prints ``READY {json}``
once serving, which gives its address to its children. Then we wait until
the MA sees every element. On any failure, everything started is stopped
(:mod:`.teardown`) and the failing element's log tail is shown.

:class:`StartUp` is a mixin of :class:`~gridrpc.deploy.runner.Deployment`.
Progress lines go to ``progress`` (stderr by default, :func:`say`).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

from ..errors import ConfigError, GridRPCError
from .launchers import LaunchError, NotReady, Started
from .spec import ElementSpec, HostSpec
from .state import DeployError, first_line, host_key, per_host, replica_names

READY_PATTERN = r"^READY [{].*[}]"
READY_RE = re.compile(r"^READY (\{.*\})\s*$", re.M)

print_lock = threading.Lock()


def say(msg: str) -> None:
    with print_lock:  # one write per line: progress comes from several threads
        sys.stderr.write(msg + "\n")
        sys.stderr.flush()


nodes_cache: dict[str, list[str]] = {}


def allocation_nodes() -> list[str]:
    """Node names of the current Slurm allocation (empty outside one)."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST") or ""
    if not nodelist:
        return []
    if nodelist not in nodes_cache:
        nodes: list[str] = []
        if shutil.which("scontrol"):
            try:
                res = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                                     text=True, timeout=20)
                nodes = res.stdout.split()
            except (OSError, subprocess.TimeoutExpired):
                nodes = []
        if not nodes and "[" not in nodelist:
            nodes = [n for n in nodelist.split(",") if n]
        nodes_cache[nodelist] = nodes
    return nodes_cache[nodelist]


class StartUp:
    """Preflight, start-up and registration of a deployment (mixin)."""

    # -- preflight ------------------------------------------------------------
    def preflight(self) -> None:
        """Check every host before starting anything; raise one DeployError naming each bad host."""
        hosts = self._hosts_used()
        errors: dict[str, str] = {}

        def check(hn: str) -> None:
            h = self.spec.hosts[hn]
            t0 = time.monotonic()
            try:
                if h.launcher == "ssh":
                    version = self.launcher(hn).check()
                    self.progress(f"  host {hn} ({h.target}): reachable, python {version} with gridrpc "
                                  f"({time.monotonic() - t0:.1f}s)")
                elif h.launcher == "slurm":
                    self._check_slurm(hn, h)
                else:
                    py = self.python_for(ElementSpec(name="-", kind="la", host=hn))
                    if not (os.path.isabs(py) and os.access(py, os.X_OK)) and shutil.which(py) is None:
                        raise LaunchError(f"python {py!r} not found on this machine", host=hn)
            except (LaunchError, ConfigError) as exc:
                errors[hn] = str(exc)

        per_host(check, hosts)
        if errors:
            users = {hn: [e.name for e in self.spec.elements if host_key(e.host) == hn] for hn in errors}
            def indent(msg: str) -> str:
                first, *rest = msg.strip().splitlines() or [""]
                return first + "".join(f"\n      {r}" for r in rest)
            raise DeployError(f"cannot deploy, {len(errors)} host(s) not usable:\n" + "\n".join(
                f"  - host {hn} (for {', '.join(users[hn])}): {indent(msg)}" for hn, msg in errors.items())
                + "\nnothing was started")

    def _check_slurm(self, hn: str, h: HostSpec) -> None:
        launcher = self.launcher(hn)
        if not launcher.job_id:
            raise LaunchError("not inside a Slurm allocation (SLURM_JOB_ID is not set): run "
                              "'gridrpc deploy up' from salloc or sbatch", host=hn)
        if shutil.which(launcher.srun) is None:
            raise LaunchError(f"{launcher.srun!r} not found on PATH", host=hn)
        nodes = allocation_nodes()
        if launcher.host.startswith("@"):
            raise LaunchError(f"node {launcher.host!r}: the allocation's node list is unknown "
                              "(SLURM_JOB_NODELIST is not set)", host=hn)
        if nodes and launcher.host not in nodes:
            raise LaunchError(f"node {launcher.host!r} is not in allocation {launcher.job_id} "
                              f"(nodes: {', '.join(nodes)})", host=hn)
        self.progress(f"  host {hn}: Slurm node {launcher.host} of job {launcher.job_id}")

    # -- up -------------------------------------------------------------------
    def up(self) -> dict:
        if (self.state_dir / "state.json").exists():
            old = self.load_state(self.state_dir, progress=self.progress)
            try:
                running = [n for n, alive in old._alive_all().items() if alive]
            finally:
                old.close()
            if running:
                raise DeployError(f"deployment {self.spec.name!r} is already running "
                                  f"({', '.join(running)}; state in {self.state_dir}); "
                                  "run 'gridrpc deploy down' first")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self.spec.security:
            self.ensure_keys()
        t0 = time.monotonic()
        n = len(self.spec.elements)
        self.progress(f"deploying {self.spec.name!r}: {n} elements on {len(self._hosts_used())} host(s)")
        try:
            self.preflight()
            for level in self.spec.ordered():
                self._start_level(level)
            self._wait_registered()
        except BaseException as exc:
            self._roll_back()
            if isinstance(exc, GridRPCError):
                raise
            if isinstance(exc, KeyboardInterrupt):
                raise DeployError("interrupted; what was started has been stopped") from exc
            raise DeployError(f"{type(exc).__name__}: {exc}") from exc
        mas = self.ma_addresses()
        self.progress(f"deployment {self.spec.name!r} up: {len(self.started)} elements in "
                      f"{time.monotonic() - t0:.1f}s; " + (f"MA at {mas[0]}" if len(mas) == 1 else
                                                           f"{len(mas)} MAs at {','.join(mas)}"))
        return self.summary()

    def _start_level(self, level: list[ElementSpec]) -> None:
        """Start one level: each host's elements in one batch (one ssh session
        for an ssh host), all hosts in parallel; raise if any failed."""
        groups: dict[str, list[ElementSpec]] = {}
        for e in level:
            groups.setdefault(host_key(e.host), []).append(e)
        errors: list[GridRPCError] = []
        for errs in per_host(self._start_group, groups.values()):
            errors += errs
        if len(errors) > 1:
            raise DeployError(f"{errors[0]}\n(also failed: " + "; ".join(first_line(x) for x in errors[1:]) + ")")
        if errors:
            raise errors[0]

    def _start_group(self, group: list[ElementSpec]) -> list[GridRPCError]:
        """Start elements of one host and wait for their READY line."""
        host = group[0].host
        launcher = self.launcher(host)
        t0 = time.monotonic()
        for e in group:
            self.progress(f"  {e.kind} {e.name} on {e.host}: starting")

        def on_started(name: str, st: Started) -> None:
            with self._lock:           # recorded at once: `down` finds it even if we die now
                self.started[name] = st
                self._save_state()

        try:
            results = launcher.start_many([(e.name, self.command(e)) for e in group], READY_PATTERN,
                                          self.ready_timeout, on_started=on_started)
        except LaunchError as exc:
            return [DeployError(f"{', '.join(e.name for e in group)} on host {host} failed to start: {exc}")]
        errors: list[GridRPCError] = []
        for e in group:
            r = results.get(e.name)
            st = r.started if r else None
            if r is None or r.error is not None or st is None:
                exc = r.error if r else None
                if isinstance(exc, NotReady) and st is not None:
                    what = ("exited before it was ready" if exc.exited
                            else f"did not report READY within {self.ready_timeout:g}s")
                    errors.append(DeployError(f"{e.name} on host {e.host} {what} (pid {st.pid}, log "
                                              f"{st.log_path}); log tail:\n{exc.log_tail.rstrip()}"))
                else:
                    errors.append(DeployError(f"{e.name} on host {e.host} failed to start: {exc}"))
                continue
            mt = READY_RE.search(r.ready_line)
            if not mt:
                errors.append(DeployError(f"{e.name} on host {e.host}: unreadable READY line {r.ready_line!r}"))
                continue
            info = json.loads(mt.group(1))
            with self._lock:
                self.addresses[e.name] = info["address"]
                self._save_state()
            self.progress(f"  {e.kind} {e.name} on {e.host}: serving at {info['address']} (pid {st.pid}, "
                          f"{time.monotonic() - t0:.1f}s)")
        return errors

    def expected_names(self, ma: str | None = None) -> set[str]:
        """Names the tree of master agent ``ma`` (default: the first) shows
        once all registered: itself and every LA and SeD (each MA holds the
        whole tree, not the other MAs). A SeD with ``replicas: N`` > 1
        registers as NAME-1..N (zero-padded), not as NAME."""
        ma = ma or self.spec.ma.name
        return {n for e in self.spec.elements if e.kind != "ma" or e.name == ma for n in replica_names(e)}

    def _wait_registered(self) -> None:
        """Wait until every master agent sees every element (with several
        MAs, each holds the whole tree: each is asked on its own)."""
        from ..client import Client
        mas = [m.name for m in self.spec.mas]
        deadline = time.monotonic() + self.register_timeout
        clients = {n: Client(self.addresses[n], discovery_timeout=3, **self.client_options([n])) for n in mas}
        try:
            waiting = list(mas)
            last: dict[str, int] = {}
            while waiting:
                for n in list(waiting):
                    want = self.expected_names(n)
                    try:
                        seen = {el["name"] for el in clients[n].tree() if el.get("state", "alive") == "alive"}
                    except GridRPCError:
                        seen = set()
                    if len(seen & want) != last.get(n):
                        last[n] = len(seen & want)
                        where = "the MA" if len(mas) == 1 else n
                        self.progress(f"  registered at {where}: {last[n]}/{len(want)}")
                    if want <= seen:
                        waiting.remove(n)
                    elif time.monotonic() > deadline:
                        missing = sorted(want - seen)
                        owners = sorted({self._owner(x) for x in missing})
                        tails = "\n".join(f"--- {x} (log tail) ---\n{self._safe_logs(x, 15)}" for x in owners[:3])
                        where = "the MA" if len(mas) == 1 else f"master agent {n}"
                        raise DeployError(f"not registered at {where} after {self.register_timeout:.0f}s: "
                                          + ", ".join(missing[:20]) + (" ..." if len(missing) > 20 else "")
                                          + f"\n{tails}")
                if waiting:
                    time.sleep(0.1)
        finally:
            for c in clients.values():
                c.close()

    def _owner(self, name: str) -> str:
        """The element (process) a registered name belongs to (replicas: NAME-i)."""
        for e in self.spec.elements:
            if name == e.name or name in replica_names(e):
                return e.name
        return name
