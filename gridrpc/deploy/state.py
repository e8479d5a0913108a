"""What a deployment keeps and reports between shells: its state directory
(``<state dir>/state.json``: what runs where, with the deployment file's
content), which of its processes are alive, the status rows, the logs.

:class:`DeploymentState` is a mixin of :class:`~gridrpc.deploy.runner.Deployment`
(it uses ``spec``, ``state_dir``, ``started``, ``addresses`` and
``launcher()``). The helpers the other deployment modules share live here
too: :class:`DeployError`, grouping elements by host and running one task per
host in parallel, the names of a SeD's replicas.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import ConfigError, GridRPCError
from .launchers import LaunchError, Started
from .spec import LOCAL_HOSTS, DeploymentSpec, ElementSpec


class DeployError(GridRPCError):
    pass


def state_root() -> Path:
    return Path(os.environ.get("GRIDRPC_HOME", Path.home() / ".gridrpc")) / "deployments"


def first_line(text: str) -> str:
    return (str(text).strip().splitlines() or [""])[0]


def host_key(host: str) -> str:
    """The launcher key of a host name: every local alias is ``localhost``."""
    return "localhost" if host in LOCAL_HOSTS else host


def per_host(task: Callable, hosts: Iterable) -> list:
    """``task(host)`` for every host, in parallel (one thread per host, 16 at
    most); the results in the order of ``hosts``.

    No task runs behind the caller's back: if the caller is interrupted (Ctrl-C
    raises KeyboardInterrupt in the main thread at any point, even while the
    pool is starting a thread it then never tracks nor joins), the tasks not yet
    begun are skipped and those under way are waited for before the exception
    goes on. (A ``deploy up`` interrupted as the pool started a thread rolled
    back, then that thread started its element: it ran on, left in the state.)"""
    hosts = list(hosts)
    if not hosts:
        return []
    gate = threading.Lock()         # the caller polls ``running``, never waits on a condition (below)
    running = 0
    cancelled = False

    def guarded(host):
        nonlocal running
        with gate:
            if cancelled:
                return None
            running += 1
        try:
            return task(host)
        finally:
            with gate:
                running -= 1

    # the main thread waits by polling (10 ms), never in Condition.wait: a Ctrl-C inside it can leave
    # the condition's lock broken and raise "RuntimeError: release unlocked lock" instead of
    # KeyboardInterrupt (an interrupted demo failed so once in a full test run)
    pool = cf.ThreadPoolExecutor(max_workers=min(16, len(hosts)))
    futures: list = []
    try:
        for h in hosts:
            futures.append(pool.submit(guarded, h))
        while not all(f.done() for f in futures):
            time.sleep(0.01)
        return [f.result() for f in futures]
    except BaseException:
        with gate:
            cancelled = True
        for f in futures:
            f.cancel()
        while True:
            with gate:
                if running == 0:
                    break
            time.sleep(0.01)
        raise
    finally:
        pool.shutdown(wait=False)


def replica_count(e: ElementSpec) -> int:
    """How many SeDs element ``e``'s process runs (``replicas``; 1 for agents)."""
    return int(e.options.get("replicas") or 1) if e.kind == "sed" else 1


def replica_names(e: ElementSpec) -> list[str]:
    """The names element ``e`` registers under: a SeD with ``replicas: N`` > 1
    registers as NAME-1..N (zero-padded, as :class:`gridrpc.sed.server.SeD`
    names them), anything else as its name."""
    r = replica_count(e)
    w = len(str(r))
    return [e.name] if r == 1 else [f"{e.name}-{i:0{w}d}" for i in range(1, r + 1)]


class DeploymentState:
    """State directory, liveness, status and logs of a deployment (mixin)."""

    # -- the state directory ------------------------------------------------
    def _save_state(self) -> None:
        with self._lock:
            data = {"name": self.spec.name, "spec_path": self.spec.path, "spec": self.spec.raw,
                    "state_dir": str(self.state_dir), "saved": time.time(),
                    "ma": self.ma_address,
                    "mas": {m.name: self.addresses.get(m.name) for m in self.spec.mas},
                    "elements": {n: {"started": s.to_dict(), "address": self.addresses.get(n),
                                     "host": self.spec.element(n).host, "kind": self.spec.element(n).kind}
                                 for n, s in self.started.items()}}
            self.state_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.state_dir / f"state.json.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(data, indent=2))
            os.replace(tmp, self.state_dir / "state.json")

    @classmethod
    def load_state(cls, state_dir: str | Path, spec: DeploymentSpec | None = None,
                   **kw) -> "DeploymentState":
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

    # -- the master agents' addresses ----------------------------------------
    def ma_addresses(self) -> list[str]:
        """The addresses of the master agents started (all of them, in file order)."""
        return [self.addresses[m.name] for m in self.spec.mas if m.name in self.addresses]

    @property
    def ma_address(self) -> str | None:
        """What a client is given: the MAs' addresses, comma-separated
        (``gridrpc.Client``, ``--ma`` and ``GRIDRPC_MA`` take that list)."""
        return ",".join(self.ma_addresses()) or None

    # -- which processes are alive -------------------------------------------
    def _by_host(self, names) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for n in names:
            out.setdefault(host_key(self.spec.element(n).host), []).append(n)
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

        per_host(one, groups)
        return out

    def _alive(self, name: str, st: Started) -> bool:
        try:
            return self.launcher(self.spec.element(name).host).alive(st)
        except (GridRPCError, ConfigError):
            return False

    # -- status / logs ----------------------------------------------------------
    def _trees(self) -> dict[str, dict[str, dict]]:
        """{MA name: {element name: entry}} from every master agent that
        answers (each asked on its own, in parallel)."""
        from ..client import Client
        mas = [m.name for m in self.spec.mas if self.addresses.get(m.name)]
        trees: dict[str, dict[str, dict]] = {}

        def ask(name: str) -> None:
            try:
                with Client(self.addresses[name], discovery_timeout=3, **self.client_options([name])) as c:
                    trees[name] = {e["name"]: e for e in c.tree()}
            except GridRPCError:
                pass

        per_host(ask, mas)
        return {n: trees[n] for n in mas if n in trees}

    def status(self) -> list[dict]:
        """Each element: name, kind, parent, host, address, pid, process state
        (running/stopped/unknown), tree state (from the MA: alive/lost/absent), load.
        With several MAs, ``tree`` is the state at every MA that answers
        (``mixed`` when they differ; ``tree_at``: per MA)."""
        alive_box: dict[str, bool | None] = {}
        t = threading.Thread(target=lambda: alive_box.update(self._alive_all()), daemon=True)
        t.start()
        trees = self._trees()
        t.join()
        several = len(self.spec.mas) > 1
        rows = []
        for e in self.spec.elements:
            st = self.started.get(e.name)
            alive = alive_box.get(e.name, False) if st else False
            r = replica_count(e)
            if e.kind == "ma":                    # an MA's own state: from itself only
                at = {e.name: _tree_state(e, trees[e.name])} if e.name in trees else {}
            else:
                at = {m: _tree_state(e, tree) for m, tree in trees.items()}
            states = list(dict.fromkeys(state for state, _ in at.values()))
            state = "absent" if not states else states[0] if len(states) == 1 else "mixed"
            load = next(iter(at.values()))[1] if at else {}
            row = {"name": e.name, "kind": e.kind, "parent": e.parent, "host": e.host,
                   "pid": st.pid if st else None, "replicas": r,
                   "process": "unknown" if alive is None else "running" if alive else "stopped",
                   "tree": state, "address": self.addresses.get(e.name), "load": load}
            if several:                           # per MA asked (an MA: itself only)
                asked = [e.name] if e.kind == "ma" else [m.name for m in self.spec.mas]
                row["tree_at"] = {m: at[m][0] if m in at else "no answer" for m in asked}
            rows.append(row)
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

    def _safe_logs(self, name: str, lines: int) -> str:
        try:
            return self.logs(name, lines)
        except GridRPCError as exc:
            return f"(cannot read the log: {exc})"

    def summary(self) -> dict:
        return {"name": self.spec.name, "ma": self.ma_address,
                "mas": {m.name: self.addresses.get(m.name) for m in self.spec.mas},
                "state_dir": str(self.state_dir),
                "elements": {n: {"pid": s.pid, "host": self.spec.element(n).host, "address": self.addresses.get(n),
                                 "log": s.log_path}
                             for n, s in self.started.items()}}


def _tree_state(e: ElementSpec, tree: dict[str, dict]) -> tuple[str, dict]:
    """(state, load) of element ``e`` in one MA's tree."""
    r = replica_count(e)
    if r == 1:
        te = tree.get(e.name, {})
        return te.get("state", "absent"), te.get("load") or {}
    # NAME-1..N: "alive" when all are, else "k/N"; loads summed
    reps = [tree.get(n) for n in replica_names(e)]
    up = sum(1 for t in reps if t and t.get("state", "alive") == "alive")
    state = "alive" if up == r else "absent" if up == 0 else f"{up}/{r}"
    load: dict = {}
    for t in reps:
        for k, v in ((t or {}).get("load") or {}).items():
            if isinstance(v, (int, float)) and k in ("num_running", "num_waiting", "completed"):
                load[k] = load.get(k, 0) + v
    return state, load


def format_status(rows: list[dict]) -> str:
    """The status rows as a tree: children indented under their parent."""
    children: dict[str | None, list[dict]] = {}
    for r in rows:
        children.setdefault(r["parent"], []).append(r)
    lines = [f"{'ELEMENT':24s} {'KIND':4s} {'HOST':12s} {'PID':>8s} {'PROCESS':8s} {'TREE':7s} "
             f"{'ADDRESS':26s} LOAD"]

    from ..cli.values import format_number

    def load_text(load: dict) -> str:
        keys = ("children", "num_running", "num_waiting", "completed", "free_cpu")
        return " ".join(f"{k}={format_number(load[k])}" for k in keys if k in load)

    def walk(r: dict, prefix: str, last: bool, top: bool) -> None:
        branch = "" if top else ("└─ " if last else "├─ ")
        label = (prefix + branch + r["name"])[:24]
        lines.append(f"{label:24s} {r['kind']:4s} {r['host'][:12]:12s} {str(r['pid'] or '-'):>8s} "
                     f"{r['process']:8s} {r['tree']:7s} {str(r['address'] or '-')[:26]:26s} "
                     f"{load_text(r['load'])}")
        kids = children.get(r["name"], [])
        for i, k in enumerate(kids):
            walk(k, prefix + ("" if top else ("   " if last else "│  ")), i == len(kids) - 1, False)

    roots = children.get(None, [])
    if len(roots) > 1:    # several MAs are one redundant root: their children, under the last one
        children[roots[-1]["name"]] = [k for r in roots for k in children.pop(r["name"], [])]
    for r in roots:
        walk(r, "", True, True)
    return "\n".join(lines)
