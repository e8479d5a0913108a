"""``gridrpc deploy``: start a tree from a spec, show it, take it down.

``up``: every host used is checked first (ssh reachable, key accepted, host
key known, python and gridrpc there; Slurm allocation present), so a wrong
host stops the deployment before anything runs. Then parents start first
(each level in parallel); each element prints ``READY {json}`` once serving,
which gives its address to its children. Then we wait until the MA sees every
element. On any failure, everything started is stopped and the failing
element's log tail is shown.

What runs where is kept in ``<state dir>/state.json`` (with the deployment
file's content) so ``down``/``status``/``logs`` work from another shell, even
when the file changed or is gone.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from ..errors import ConfigError, GridRPCError
from .launchers import (LaunchError, LocalLauncher, NotReady, SlurmLauncher, SSHHostConfig, SSHLauncher,
                        Started)
from .spec import LOCAL_HOSTS, DeploymentSpec, ElementSpec, HostSpec

READY_PATTERN = r"^READY [{].*[}]"
READY_RE = re.compile(r"^READY (\{.*\})\s*$", re.M)


class DeployError(GridRPCError):
    pass


def state_root() -> Path:
    return Path(os.environ.get("GRIDRPC_HOME", Path.home() / ".gridrpc")) / "deployments"


_print_lock = threading.Lock()


def _print(msg: str) -> None:
    with _print_lock:  # one write per line: progress comes from several threads
        sys.stderr.write(msg + "\n")
        sys.stderr.flush()


def _first_line(text: str) -> str:
    return (str(text).strip().splitlines() or [""])[0]


_nodes_cache: dict[str, list[str]] = {}


def allocation_nodes() -> list[str]:
    """Node names of the current Slurm allocation (empty outside one)."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST") or ""
    if not nodelist:
        return []
    if nodelist not in _nodes_cache:
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
        _nodes_cache[nodelist] = nodes
    return _nodes_cache[nodelist]


class Deployment:
    """One deployment: ``up()``, ``status()``, ``logs(name)``, ``down()``.

    ``Deployment.load_state(dir)`` rebuilds it from a state directory (another
    shell, another process). Call ``close()`` (or use ``with``) when done: it
    ends the shared ssh connections opened for this object.
    """

    def __init__(self, spec: DeploymentSpec, *, state_dir: str | Path | None = None,
                 progress: Callable[[str], None] = _print, ready_timeout: float = 20.0,
                 register_timeout: float = 30.0, stop_timeout: float = 10.0) -> None:
        self.spec = spec
        self.state_dir = Path(state_dir).resolve() if state_dir else state_root() / spec.name
        self.progress = progress
        self.ready_timeout = ready_timeout
        self.register_timeout = register_timeout
        self.stop_timeout = stop_timeout
        self.started: dict[str, Started] = {}
        self.addresses: dict[str, str] = {}
        self.down_errors: dict[str, str] = {}
        self._launchers: dict[str, object] = {}
        self._lock = threading.RLock()
        self._cm_dir: str | None = None

    def __enter__(self) -> "Deployment":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """End shared ssh connections (ControlMaster) opened by this object."""
        for la in list(self._launchers.values()):
            try:
                la.close()
            except Exception:  # pragma: no cover - best effort
                pass
        self._launchers.clear()
        if self._cm_dir:
            shutil.rmtree(self._cm_dir, ignore_errors=True)
            self._cm_dir = None

    # -- launchers ----------------------------------------------------------
    def host_spec(self, host_name: str) -> HostSpec:
        return self.spec.host(host_name)

    def _control_path(self, h: HostSpec) -> str | None:
        if not h.ssh_multiplex:
            return None
        if self._cm_dir is None:  # short: unix socket paths are limited to ~104 bytes
            self._cm_dir = tempfile.mkdtemp(prefix="grcm-", dir="/tmp" if os.path.isdir("/tmp") else None)
        return os.path.join(self._cm_dir, "%C")  # %C: hash of local host, remote host, port, user

    def launcher(self, host_name: str):
        if host_name in LOCAL_HOSTS:
            host_name = "localhost"
        with self._lock:
            if host_name not in self._launchers:
                self._launchers[host_name] = self._make_launcher(self.spec.hosts[host_name])
            return self._launchers[host_name]

    def _make_launcher(self, h: HostSpec):
        if h.launcher == "local":
            return LocalLauncher(Path(h.workdir).expanduser() if h.workdir else self.state_dir,
                                 env=dict(h.env), check_window=0.2, host=h.name)
        if h.launcher == "ssh":
            return SSHLauncher(SSHHostConfig(
                target=h.target, port=h.port, key_path=os.path.expanduser(h.key) if h.key else None,
                known_hosts=os.path.expanduser(h.known_hosts) if h.known_hosts else None,
                ssh_config=h.ssh_config, python=h.python or "python3", venv=h.venv,
                workdir=h.workdir or f"gridrpc-work/{self.spec.name}", env=dict(h.env),
                ssh_options=tuple(h.ssh_options), wrapper=tuple(h.wrapper),
                connect_timeout=h.connect_timeout, check_window=0.3, control_path=self._control_path(h)))
        return SlurmLauncher(self._slurm_node(h), self.state_dir, env=dict(h.env), extra_args=h.srun_args,
                             check_window=0.3)

    def _slurm_node(self, h: HostSpec) -> str:
        """``node: "@I"`` is the I-th node of the allocation (0-based, from
        ``SLURM_JOB_NODELIST``); other values are node names."""
        node = str(h.node or h.name)
        if not node.startswith("@"):
            return node
        try:
            index = int(node[1:])
        except ValueError:
            raise ConfigError(f"host {h.name}: node {node!r}: expected '@' and a number, e.g. '@0'") from None
        nodes = allocation_nodes()
        if not nodes:
            return node  # not in an allocation: preflight says so
        if index >= len(nodes):
            raise ConfigError(f"host {h.name}: node {node} but the allocation has only {len(nodes)} node(s): "
                              + ", ".join(nodes))
        return nodes[index]

    def python_for(self, e: ElementSpec) -> str:
        h = self.host_spec(e.host)
        if h.venv:
            return f"{h.venv.rstrip('/')}/bin/python"
        if h.launcher == "ssh":
            return h.python or "python3"
        return h.python or sys.executable

    def bind_host(self, e: ElementSpec) -> str:
        h = self.host_spec(e.host)
        if h.launcher == "slurm" and h.address.startswith("@"):
            return self.launcher(e.host).host      # the node's name, resolved in the allocation
        return h.address

    def command(self, e: ElementSpec) -> list[str]:
        cmd = [self.python_for(e), "-m", "gridrpc", e.kind, "--name", e.name, "--host", self.bind_host(e),
               "--port", str(e.port), "--hb-interval", str(self.spec.hb_interval),
               "--hb-timeout", str(self.spec.hb_timeout)]
        if e.parent:
            cmd += ["--parent", self.addresses[e.parent]]
        if e.kind in ("ma", "la"):
            for target in self.spec.aggregator_plugins:
                cmd += ["--plugin", target]
        o = e.options
        if e.kind == "ma" and e.http_port is not None:
            cmd += ["--http-port", str(e.http_port), "--http-host", self.bind_host(e)]
        orphan = self.spec.orphan_timeout_for(e)
        if orphan is not None:
            cmd += ["--orphan-timeout", f"{orphan:g}"]
        if e.kind == "sed":
            for s in o.get("services") or []:
                cmd += ["--service", str(s)]
            if o.get("examples"):
                cmd.append("--examples")
            for key, flag in (("max_concurrent", "--max-concurrent"), ("queue", "--queue"),
                              ("replicas", "--replicas"), ("workers", "--workers"),
                              ("isolation", "--isolation"), ("kill_grace", "--kill-grace")):
                if o.get(key) is not None:
                    cmd += [flag, str(o[key])]
            if o.get("kind") == "cloud":
                from ..sed.cloud.config import cloud_cli_args
                cmd += cloud_cli_args(o)
            if o.get("kind") == "batch":      # gridrpc sed --batch ... (docs/batch.md)
                from ..sed.batch.config import batch_settings, config_to_cli, parse_batch_config
                cmd += config_to_cli(parse_batch_config(batch_settings(o), what=f"SeD {e.name}"))
            cmd += [str(a) for a in o.get("args") or []]
        return cmd

    def _hosts_used(self) -> list[str]:
        seen: list[str] = []
        for e in self.spec.elements:
            h = "localhost" if e.host in LOCAL_HOSTS else e.host
            if h not in seen:
                seen.append(h)
        return seen

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

        with cf.ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
            list(pool.map(check, hosts))
        if errors:
            users = {hn: [e.name for e in self.spec.elements
                          if ("localhost" if e.host in LOCAL_HOSTS else e.host) == hn] for hn in errors}
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
        t0 = time.monotonic()
        n = len(self.spec.elements)
        self.progress(f"deploying {self.spec.name!r}: {n} elements on {len(self._hosts_used())} host(s)")
        try:
            self.preflight()
            for level in self.spec.ordered():
                self._start_level(level)
            self._wait_registered()
        except BaseException as exc:
            if self.started:
                self.progress(f"deploy failed: stopping the {len(self.started)} element(s) started ...")
                self.down(quiet=False)
            if isinstance(exc, GridRPCError):
                raise
            if isinstance(exc, KeyboardInterrupt):
                raise DeployError("interrupted; what was started has been stopped") from exc
            raise DeployError(f"{type(exc).__name__}: {exc}") from exc
        self.progress(f"deployment {self.spec.name!r} up: {len(self.started)} elements in "
                      f"{time.monotonic() - t0:.1f}s; MA at {self.addresses[self.spec.ma.name]}")
        return self.summary()

    def _start_level(self, level: list[ElementSpec]) -> None:
        """Start one level: each host's elements in one batch (one ssh session
        for an ssh host), all hosts in parallel; raise if any failed."""
        groups: dict[str, list[ElementSpec]] = {}
        for e in level:
            groups.setdefault("localhost" if e.host in LOCAL_HOSTS else e.host, []).append(e)
        errors: list[GridRPCError] = []
        if groups:
            with cf.ThreadPoolExecutor(max_workers=min(16, len(groups))) as pool:
                for errs in pool.map(self._start_group, groups.values()):
                    errors += errs
        if len(errors) > 1:
            raise DeployError(f"{errors[0]}\n(also failed: " + "; ".join(_first_line(x) for x in errors[1:]) + ")")
        if errors:
            raise errors[0]

    def _start_one(self, e: ElementSpec) -> None:
        errors = self._start_group([e])
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

    def expected_names(self) -> set[str]:
        """Names the MA's tree shows once all registered: a SeD with
        ``replicas: N`` > 1 registers as NAME-1..N (zero-padded), not as NAME."""
        want = set()
        for e in self.spec.elements:
            r = int(e.options.get("replicas") or 1) if e.kind == "sed" else 1
            w = len(str(r))
            want |= {e.name} if r == 1 else {f"{e.name}-{i:0{w}d}" for i in range(1, r + 1)}
        return want

    def _wait_registered(self) -> None:
        from ..client import Client
        want = self.expected_names()
        deadline = time.monotonic() + self.register_timeout
        last = -1
        with Client(self.addresses[self.spec.ma.name], discovery_timeout=3) as c:
            while True:
                try:
                    seen = {el["name"] for el in c.tree() if el.get("state", "alive") == "alive"}
                except GridRPCError:
                    seen = set()
                if len(seen & want) != last:
                    last = len(seen & want)
                    self.progress(f"  registered at the MA: {last}/{len(want)}")
                if want <= seen:
                    return
                if time.monotonic() > deadline:
                    missing = sorted(want - seen)
                    owners = sorted({self._owner(n) for n in missing})
                    tails = "\n".join(f"--- {n} (log tail) ---\n{self._safe_logs(n, 15)}" for n in owners[:3])
                    raise DeployError(f"not registered at the MA after {self.register_timeout:.0f}s: "
                                      + ", ".join(missing[:20]) + (" ..." if len(missing) > 20 else "")
                                      + f"\n{tails}")
                time.sleep(0.1)

    def _owner(self, name: str) -> str:
        """The element (process) a registered name belongs to (replicas: NAME-i)."""
        if name in self.started or any(e.name == name for e in self.spec.elements):
            return name
        return name.rsplit("-", 1)[0]

    def _safe_logs(self, name: str, lines: int) -> str:
        try:
            return self.logs(name, lines)
        except GridRPCError as exc:
            return f"(cannot read the log: {exc})"

    # -- state ----------------------------------------------------------------
    def _save_state(self) -> None:
        with self._lock:
            data = {"name": self.spec.name, "spec_path": self.spec.path, "spec": self.spec.raw,
                    "state_dir": str(self.state_dir), "saved": time.time(),
                    "ma": self.addresses.get(self.spec.ma.name),
                    "elements": {n: {"started": s.to_dict(), "address": self.addresses.get(n),
                                     "host": self.spec.element(n).host, "kind": self.spec.element(n).kind}
                                 for n, s in self.started.items()}}
            self.state_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.state_dir / f"state.json.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(data, indent=2))
            os.replace(tmp, self.state_dir / "state.json")

    @classmethod
    def load_state(cls, state_dir: str | Path, spec: DeploymentSpec | None = None,
                   **kw) -> "Deployment":
        """Rebuild a deployment from its state directory. The deployment file
        as it was at ``up`` time (kept in the state) wins over ``spec``."""
        state_dir = Path(state_dir)
        try:
            data = json.loads((state_dir / "state.json").read_text())
        except FileNotFoundError:
            raise ConfigError(f"no deployment state in {state_dir} (nothing deployed, or already down)") from None
        except ValueError as exc:
            raise ConfigError(f"{state_dir / 'state.json'} is corrupt: {exc}") from None
        from .spec import load, parse
        if data.get("spec"):
            spec = parse(data["spec"], name=data.get("name") or "deployment", path=data.get("spec_path"))
        elif spec is None:
            if not data.get("spec_path"):
                raise ConfigError(f"state in {state_dir} does not name its deployment file")
            spec = load(data["spec_path"])
        d = cls(spec, state_dir=state_dir, **kw)
        for n, el in data["elements"].items():
            d.started[n] = Started.from_dict(el["started"])
            if el.get("address"):
                d.addresses[n] = el["address"]
        return d

    def _by_host(self, names) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for n in names:
            h = self.spec.element(n).host
            out.setdefault("localhost" if h in LOCAL_HOSTS else h, []).append(n)
        return out

    def _alive_all(self) -> dict[str, bool | None]:
        """{name: alive}, one round trip per host (None: host unreachable)."""
        groups = self._by_host(self.started)
        out: dict[str, bool | None] = {}

        def one(hn: str) -> None:
            names = groups[hn]
            try:
                res = self.launcher(hn).alive_many([self.started[n] for n in names])
                for n in names:
                    out[n] = res.get(self.started[n].pid, False)
            except (GridRPCError, ConfigError):
                for n in names:
                    out[n] = None

        if groups:
            with cf.ThreadPoolExecutor(max_workers=min(16, len(groups))) as pool:
                list(pool.map(one, groups))
        return out

    def _alive(self, name: str, st: Started) -> bool:
        try:
            return self.launcher(self.spec.element(name).host).alive(st)
        except (GridRPCError, ConfigError):
            return False

    # -- down / status / logs -------------------------------------------------
    def down(self, quiet: bool = False) -> list[str]:
        """Stop every started element: all hosts in parallel, one ssh session
        per host (SIGTERM to all, children listed first, SIGKILL after
        ``stop_timeout``). Returns the names stopped; elements that could not
        be stopped stay in the state (see ``down_errors``) so a later
        ``down`` can retry."""
        stopped: list[str] = []
        self.down_errors = {}
        order = [e.name for level in reversed(self.spec.ordered()) for e in level if e.name in self.started]
        groups = self._by_host(order)

        def stop_host(hn: str) -> None:
            members = groups[hn]
            try:
                res = self.launcher(hn).stop_many([self.started[n] for n in members], timeout=self.stop_timeout)
            except (GridRPCError, ConfigError) as exc:
                ot = [self.spec.orphan_timeout_for(self.spec.element(n)) for n in members]
                hint = "" if any(v is None for v in ot) else (
                    f" (they exit by themselves {max(ot):g}s after losing their parent)")
                res = {self.started[n].pid: f"error: {_first_line(exc)}{hint}" for n in members}
            for n in members:
                r = res.get(self.started[n].pid, "error: no answer")
                with self._lock:
                    if r.startswith("error"):
                        self.down_errors[n] = r[len("error: "):]
                    else:
                        stopped.append(n)
                if not quiet or r.startswith("error"):
                    self.progress(f"  {n} on {hn} (pid {self.started[n].pid}): {r}")

        if groups:
            with cf.ThreadPoolExecutor(max_workers=min(16, len(groups))) as pool:
                list(pool.map(stop_host, groups))
        with self._lock:
            for n in stopped:
                self.started.pop(n, None)
            state = self.state_dir / "state.json"
            if self.started:
                self._save_state()
            elif state.exists():
                state.unlink()
        return stopped

    def status(self) -> list[dict]:
        """Each element: name, kind, parent, host, address, pid, process state
        (running/stopped/unknown), tree state (from the MA: alive/lost/absent), load."""
        tree: dict[str, dict] = {}
        ma = self.addresses.get(self.spec.ma.name)
        alive_box: dict[str, bool | None] = {}
        t = threading.Thread(target=lambda: alive_box.update(self._alive_all()), daemon=True)
        t.start()
        if ma:
            from ..client import Client
            try:
                with Client(ma, discovery_timeout=3) as c:
                    tree = {e["name"]: e for e in c.tree()}
            except GridRPCError:
                tree = {}
        t.join()
        rows = []
        for e in self.spec.elements:
            st = self.started.get(e.name)
            alive = alive_box.get(e.name, False) if st else False
            r = int(e.options.get("replicas") or 1) if e.kind == "sed" else 1
            if r == 1:
                te = tree.get(e.name, {})
                state, load = te.get("state", "absent"), te.get("load") or {}
            else:  # NAME-1..N: "alive" when all are, else "k/N alive"; loads summed
                w = len(str(r))
                reps = [tree.get(f"{e.name}-{i:0{w}d}") for i in range(1, r + 1)]
                up = sum(1 for t in reps if t and t.get("state", "alive") == "alive")
                state = "alive" if up == r else "absent" if up == 0 else f"{up}/{r}"
                load = {}
                for t in reps:
                    for k, v in ((t or {}).get("load") or {}).items():
                        if isinstance(v, (int, float)) and k in ("num_running", "num_waiting", "completed"):
                            load[k] = load.get(k, 0) + v
            rows.append({"name": e.name, "kind": e.kind, "parent": e.parent, "host": e.host,
                         "pid": st.pid if st else None, "replicas": r,
                         "process": "unknown" if alive is None else "running" if alive else "stopped",
                         "tree": state, "address": self.addresses.get(e.name), "load": load})
        return rows

    def logs(self, name: str, lines: int = 50) -> str:
        self.spec.element(name)  # a clear error for an unknown name
        st = self.started.get(name)
        if st is None:
            raise ConfigError(f"{name} is not running in deployment {self.spec.name!r}")
        try:
            return self.launcher(self.spec.element(name).host).logs(st, lines)
        except LaunchError as exc:
            raise DeployError(f"cannot fetch the log of {name} from {self.spec.element(name).host}: {exc}") from exc

    def summary(self) -> dict:
        return {"name": self.spec.name, "ma": self.addresses.get(self.spec.ma.name),
                "state_dir": str(self.state_dir),
                "elements": {n: {"pid": s.pid, "host": self.spec.element(n).host, "address": self.addresses.get(n),
                                 "log": s.log_path}
                             for n, s in self.started.items()}}


def format_status(rows: list[dict]) -> str:
    """The status rows as a tree: children indented under their parent."""
    children: dict[str | None, list[dict]] = {}
    for r in rows:
        children.setdefault(r["parent"], []).append(r)
    lines = [f"{'ELEMENT':24s} {'KIND':4s} {'HOST':12s} {'PID':>8s} {'PROCESS':8s} {'TREE':7s} "
             f"{'ADDRESS':26s} LOAD"]

    def load_text(load: dict) -> str:
        keys = ("children", "num_running", "num_waiting", "completed", "free_cpu")
        return " ".join(f"{k}={load[k]}" for k in keys if k in load)

    def walk(r: dict, prefix: str, last: bool, top: bool) -> None:
        branch = "" if top else ("└─ " if last else "├─ ")
        label = (prefix + branch + r["name"])[:24]
        lines.append(f"{label:24s} {r['kind']:4s} {r['host'][:12]:12s} {str(r['pid'] or '-'):>8s} "
                     f"{r['process']:8s} {r['tree']:7s} {str(r['address'] or '-')[:26]:26s} "
                     f"{load_text(r['load'])}")
        kids = children.get(r["name"], [])
        for i, k in enumerate(kids):
            walk(k, prefix + ("" if top else ("   " if last else "│  ")), i == len(kids) - 1, False)

    for i, r in enumerate(children.get(None, [])):
        walk(r, "", True, True)
    return "\n".join(lines)
