"""``gridrpc deploy``: start a tree from a spec, show it, take it down.

Parents start first (each level in parallel); each element prints
``READY {json}`` once serving, which gives its address to its children. Then
we wait until the MA sees every element. On any failure, everything started
is stopped and the failing element's log tail is shown. What runs where is
kept in ``<state dir>/state.json`` so ``down``/``status``/``logs`` work from
another shell.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from ..errors import ConfigError, GridRPCError
from .launchers import LaunchError, LocalLauncher, SlurmLauncher, SSHHostConfig, SSHLauncher, Started
from .spec import LOCAL_HOSTS, DeploymentSpec, ElementSpec, HostSpec

READY_RE = re.compile(r"^READY (\{.*\})\s*$", re.M)


class DeployError(GridRPCError):
    pass


def state_root() -> Path:
    return Path(os.environ.get("GRIDRPC_HOME", Path.home() / ".gridrpc")) / "deployments"


def _print(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Deployment:
    def __init__(self, spec: DeploymentSpec, *, state_dir: str | Path | None = None,
                 progress: Callable[[str], None] = _print, ready_timeout: float = 20.0,
                 register_timeout: float = 30.0) -> None:
        self.spec = spec
        self.state_dir = Path(state_dir) if state_dir else state_root() / spec.name
        self.progress = progress
        self.ready_timeout = ready_timeout
        self.register_timeout = register_timeout
        self.started: dict[str, Started] = {}
        self.addresses: dict[str, str] = {}
        self._launchers: dict[str, object] = {}
        self._state_lock = threading.Lock()     # elements of one level start in parallel threads

    # -- launchers ----------------------------------------------------------
    def launcher(self, host_name: str):
        if host_name in LOCAL_HOSTS:
            host_name = "localhost"
        if host_name not in self._launchers:
            h: HostSpec = self.spec.hosts[host_name]
            if h.launcher == "local":
                self._launchers[host_name] = LocalLauncher(self.state_dir, host=host_name)
            elif h.launcher == "ssh":
                self._launchers[host_name] = SSHLauncher(SSHHostConfig(
                    target=h.ssh, port=h.port, key_path=h.key, known_hosts=h.known_hosts,
                    python=h.python or "python3", venv=h.venv,
                    workdir=h.workdir or f"gridrpc-work/{self.spec.name}", env=dict(h.env),
                    ssh_options=tuple(h.ssh_options), wrapper=tuple(h.wrapper)))
            else:
                self._launchers[host_name] = SlurmLauncher(h.node or host_name, self.state_dir,
                                                           env=dict(h.env))
        return self._launchers[host_name]

    def python_for(self, e: ElementSpec) -> str:
        h = self.spec.hosts.get(e.host, self.spec.hosts["localhost"])
        if h.launcher == "ssh":
            return f"{h.venv.rstrip('/')}/bin/python" if h.venv else (h.python or "python3")
        return h.python or sys.executable

    def bind_host(self, e: ElementSpec) -> str:
        return self.spec.hosts.get(e.host, self.spec.hosts["localhost"]).address

    def command(self, e: ElementSpec) -> list[str]:
        cmd = [self.python_for(e), "-m", "gridrpc", e.kind, "--name", e.name, "--host", self.bind_host(e),
               "--port", str(e.port), "--hb-interval", str(self.spec.hb_interval),
               "--hb-timeout", str(self.spec.hb_timeout)]
        if e.parent:
            cmd += ["--parent", self.addresses[e.parent]]
        o = e.options
        if e.kind == "ma" and e.http_port is not None:
            cmd += ["--http-port", str(e.http_port), "--http-host", self.bind_host(e)]
        if o.get("orphan_timeout") is not None:
            cmd += ["--orphan-timeout", str(o["orphan_timeout"])]
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
            cmd += [str(a) for a in o.get("args") or []]
        return cmd

    # -- up -------------------------------------------------------------------
    def up(self) -> dict:
        if (self.state_dir / "state.json").exists():
            old = self.load_state(self.state_dir)
            if any(self._alive(n, s) for n, s in old.started.items()):
                raise DeployError(f"deployment {self.spec.name!r} is already running "
                                  f"(state in {self.state_dir}); run 'gridrpc deploy down' first")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        try:
            for level in self.spec.ordered():
                with cf.ThreadPoolExecutor(max_workers=min(16, len(level))) as pool:
                    futs = {pool.submit(self._start_one, e): e for e in level}
                    errors = []
                    for f in cf.as_completed(futs):
                        try:
                            f.result()
                        except GridRPCError as exc:
                            errors.append(exc)
                    if errors:
                        raise errors[0]
            self._wait_registered()
        except BaseException as exc:
            self.progress(f"deploy failed: {exc}")
            self.progress("stopping what was started ...")
            self.down(quiet=True)
            if isinstance(exc, GridRPCError):
                raise
            raise DeployError(str(exc)) from exc
        self.progress(f"deployment {self.spec.name!r} up: {len(self.started)} elements in "
                      f"{time.monotonic() - t0:.1f}s; MA at {self.addresses[self.spec.ma.name]}")
        return self.summary()

    def _start_one(self, e: ElementSpec) -> None:
        launcher = self.launcher(e.host)
        self.progress(f"  starting {e.kind:3s} {e.name} on {e.host} ...")
        try:
            st = launcher.start(self.command(e), name=e.name)
        except LaunchError as exc:
            raise DeployError(f"{e.name} on {e.host}: {exc}" + (f"\n--- log tail ---\n{exc.log_tail}"
                                                                  if exc.log_tail and exc.log_tail not in str(exc) else "")) from exc
        self.started[e.name] = st
        self._save_state()
        deadline = time.monotonic() + self.ready_timeout
        while True:
            text = launcher.logs(st, 400)
            mt = READY_RE.search(text)
            if mt:
                info = json.loads(mt.group(1))
                self.addresses[e.name] = info["address"]
                self._save_state()
                self.progress(f"  {e.name}: serving at {info['address']} (pid {st.pid})")
                return
            if not launcher.alive(st):
                raise DeployError(f"{e.name} on {e.host} exited during start-up; log tail:\n"
                                  + launcher.logs(st, 30))
            if time.monotonic() > deadline:
                raise DeployError(f"{e.name} on {e.host} did not report READY within "
                                  f"{self.ready_timeout}s; log tail:\n" + launcher.logs(st, 30))
            time.sleep(0.1)

    def _wait_registered(self) -> None:
        from ..client import Client
        want = {e.name for e in self.spec.elements}
        deadline = time.monotonic() + self.register_timeout
        last = -1
        with Client(self.addresses[self.spec.ma.name], discovery_timeout=3) as c:
            while True:
                try:
                    seen = {el["name"] for el in c.tree()}
                except GridRPCError:
                    seen = set()
                if len(seen & want) != last:
                    last = len(seen & want)
                    self.progress(f"  registered at the MA: {last}/{len(want)}")
                if want <= seen:
                    return
                if time.monotonic() > deadline:
                    missing = sorted(want - seen)
                    tails = "\n".join(f"--- {n} ---\n{self.logs(n, 15)}" for n in missing[:3])
                    raise DeployError(f"not registered after {self.register_timeout}s: "
                                      f"{', '.join(missing)}\n{tails}")
                time.sleep(0.2)

    # -- state ----------------------------------------------------------------
    def _save_state(self) -> None:
        with self._state_lock:
            data = {"name": self.spec.name, "spec_path": self.spec.path,
                    "ma": self.addresses.get(self.spec.ma.name),
                    "elements": {n: {"started": s.to_dict(), "address": self.addresses.get(n),
                                     "host": self.spec.element(n).host, "kind": self.spec.element(n).kind}
                                 for n, s in list(self.started.items())}}
            tmp = self.state_dir / f"state.json.{threading.get_ident()}.tmp"
            tmp.write_text(json.dumps(data, indent=2))
            os.replace(tmp, self.state_dir / "state.json")

    @classmethod
    def load_state(cls, state_dir: str | Path, spec: DeploymentSpec | None = None) -> "Deployment":
        state_dir = Path(state_dir)
        try:
            data = json.loads((state_dir / "state.json").read_text())
        except FileNotFoundError:
            raise ConfigError(f"no deployment state in {state_dir} (nothing deployed?)") from None
        if spec is None:
            from .spec import load
            if not data.get("spec_path"):
                raise ConfigError(f"state in {state_dir} does not name its deployment file")
            spec = load(data["spec_path"])
        d = cls(spec, state_dir=state_dir)
        for n, el in data["elements"].items():
            d.started[n] = Started.from_dict(el["started"])
            if el.get("address"):
                d.addresses[n] = el["address"]
        return d

    def _alive(self, name: str, st: Started) -> bool:
        try:
            return self.launcher(self.spec.element(name).host).alive(st)
        except (GridRPCError, ConfigError):
            return False

    # -- down / status / logs -------------------------------------------------
    def down(self, quiet: bool = False) -> list[str]:
        stopped = []
        order = [e for level in reversed(self.spec.ordered()) for e in level if e.name in self.started]
        for e in order:
            st = self.started[e.name]
            try:
                res = self.launcher(e.host).stop(st, timeout=10)
                if not quiet:
                    self.progress(f"  {e.name} on {e.host}: {res}")
                stopped.append(e.name)
            except GridRPCError as exc:
                self.progress(f"  {e.name} on {e.host}: could not stop: {exc}")
        state = self.state_dir / "state.json"
        if state.exists():
            state.unlink()
        self.started.clear()
        return stopped

    def status(self) -> list[dict]:
        """Each element: name, kind, host, pid, process state, tree state, load."""
        tree: dict[str, dict] = {}
        ma = self.addresses.get(self.spec.ma.name)
        if ma:
            from ..client import Client
            try:
                with Client(ma, discovery_timeout=3) as c:
                    tree = {e["name"]: e for e in c.tree()}
            except GridRPCError:
                tree = {}
        rows = []
        for e in self.spec.elements:
            st = self.started.get(e.name)
            alive = self._alive(e.name, st) if st else False
            t = tree.get(e.name, {})
            rows.append({"name": e.name, "kind": e.kind, "parent": e.parent, "host": e.host,
                         "pid": st.pid if st else None, "process": "running" if alive else "stopped",
                         "tree": t.get("state", "absent"), "address": self.addresses.get(e.name),
                         "load": t.get("load") or {}})
        return rows

    def logs(self, name: str, lines: int = 50) -> str:
        st = self.started.get(name)
        if st is None:
            raise ConfigError(f"{name} is not running in this deployment")
        return self.launcher(self.spec.element(name).host).logs(st, lines)

    def summary(self) -> dict:
        return {"name": self.spec.name, "ma": self.addresses.get(self.spec.ma.name),
                "elements": {n: {"pid": s.pid, "host": s.host, "address": self.addresses.get(n)}
                             for n, s in self.started.items()}}
