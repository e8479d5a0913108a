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

:class:`Deployment` is assembled from one module per duty; this module holds
what it runs where (one launcher per host, each element's command line) and
re-exports the rest::

    startup.py    preflight, up, progress, waiting for READY and registration
    teardown.py   down, and the roll-back of a failed up
    state.py      state directory, liveness, status, logs; DeployError
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable

from ..errors import ConfigError
from .launchers import LocalLauncher, SlurmLauncher, SSHHostConfig, SSHLauncher, Started
from .schema import SED_KEYS
from .spec import DeploymentSpec, ElementSpec, HostSpec
from .startup import StartUp, say, allocation_nodes
from .state import (  # noqa: F401 - DeployError, format_status, state_root: what `gridrpc deploy` uses with Deployment
    DeployError, DeploymentState, format_status, host_key, state_root)
from .teardown import TearDown


class Deployment(StartUp, TearDown, DeploymentState):
    """One deployment: ``up()``, ``status()``, ``logs(name)``, ``down()``.

    ``Deployment.load_state(dir)`` rebuilds it from a state directory (another
    shell, another process). Call ``close()`` (or use ``with``) when done: it
    ends the shared ssh connections opened for this object.
    """

    def __init__(self, spec: DeploymentSpec, *, state_dir: str | Path | None = None,
                 progress: Callable[[str], None] = say, ready_timeout: float = 20.0,
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
        host_name = host_key(host_name)
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

    @property
    def keys_dir(self) -> Path:
        """The key directory of a secure deployment (same path on every host)."""
        return Path(self.spec.keys_dir).expanduser().resolve() if self.spec.keys_dir else self.state_dir / "keys"

    def ensure_keys(self) -> None:
        """Create the element keys (and the deploying user's) that are missing."""
        from ..transport.security import KeyStore
        store = KeyStore(self.keys_dir)
        made = []
        for e in self.spec.elements:
            if not (store.dir / "elements" / f"{e.name}.key_secret").exists():
                store.create(e.name, "element", overwrite=True)
                made.append(e.name)
        user = self.client_options().get("key")
        if user and not (store.dir / "users" / f"{user}.key_secret").exists():
            store.create(user, "user", overwrite=True)
            made.append(f"user {user}")
        if made:
            self.progress(f"created CURVE keys in {store.dir}: {', '.join(made)}")
        self._check_peer_keys(store)

    def _check_peer_keys(self, store) -> None:
        """Each ``peer_keys`` entry of an MA on a local host must be found now
        (an element name in the key directory, a .key file, or the key): a
        missing one is a clear error before anything starts, not an MA
        that exits at start-up. (Elsewhere the MA's host reads them.)"""
        from ..errors import ConfigError
        from ..transport.security import public_key_from
        bad = []
        for e in self.spec.mas:
            if self.spec.host(e.host).launcher != "local":
                continue
            for peer, key in zip(e.options.get("peers") or [], e.options.get("peer_keys") or []):
                try:
                    store.public(str(key), "element")
                except ConfigError:
                    try:
                        public_key_from(str(key))
                    except ConfigError:
                        bad.append(f"  - {e.name}: peer {peer}: {key!r} is not an element key in "
                                   f"{store.dir}/elements, a .key file, nor a public key")
        if bad:
            raise DeployError("peer_keys not found (copy the other tree's MA public key into the key "
                              "directory, e.g. elements/site-b-MA.key, and name it in peer_keys):\n"
                              + "\n".join(bad) + "\nnothing was started")

    def client_options(self, mas: list[str] | None = None) -> dict:
        """Client keywords for talking to this deployment's MAs (``mas``: the
        names of the ones the client is given; default all, in file order)."""
        if not self.spec.security:
            return {}
        from ..client.aio import default_user
        user = self.spec.deploy_user or default_user()
        names = mas if mas is not None else [m.name for m in self.spec.mas if m.name in self.addresses]
        return {"keys": str(self.keys_dir), "key": user, "user": user,
                "ma_key": ",".join(names) or self.spec.ma.name}

    def command(self, e: ElementSpec) -> list[str]:
        cmd = [self.python_for(e), "-m", "gridrpc", e.kind, "--name", e.name, "--host", self.bind_host(e),
               "--port", str(e.port), "--hb-interval", str(self.spec.hb_interval),
               "--hb-timeout", str(self.spec.hb_timeout)]
        parents = self.spec.parents_of(e)          # all the MAs when the parent is one of them
        if parents:
            cmd += ["--parent", ",".join(self.addresses[p] for p in parents)]
        if self.spec.security:
            cmd += ["--secure", "--keys", str(self.keys_dir)]
            if parents:
                cmd += ["--parent-key", ",".join(parents)]
        elif self.spec.allow_insecure:
            cmd.append("--insecure")
        if e.kind == "ma":                          # federation: MAs of other trees
            for i, peer in enumerate(e.options.get("peers") or []):
                cmd += ["--peer", peer]
                if self.spec.security:
                    cmd += ["--peer-key", str(e.options["peer_keys"][i])]
            if e.options.get("peer_hops") is not None:
                cmd += ["--peer-hops", str(e.options["peer_hops"])]
            if e.options.get("peer_busy_wait") is not None:
                cmd += ["--peer-busy-wait", str(e.options["peer_busy_wait"])]
        if e.kind in ("ma", "la"):
            for target in self.spec.aggregator_plugins:
                cmd += ["--plugin", target]
            if e.options.get("view") is False:
                cmd.append("--no-view")
            if e.kind == "ma" and e.options.get("view_max_age") is not None:
                cmd += ["--view-max-age", f"{e.options['view_max_age']:g}"]
        o = e.options
        if o.get("cpus") is not None:
            cmd += ["--cpus", str(o["cpus"])]
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
                              ("prestart_workers", "--prestart-workers"),
                              ("isolation", "--isolation"), ("kill_grace", "--kill-grace"),
                              ("gather", "--gather"),
                              ("result_cache_bytes", "--result-cache-bytes"),
                              ("max_message_size", "--max-message-size"),
                              ("max_calls_per_user", "--max-calls-per-user"),
                              ("data_memory_bytes", "--data-memory-bytes"), ("data_disk_bytes", "--data-disk-bytes"),
                              ("data_policy", "--data-policy"), ("data_dir", "--data-dir"),
                              ("data_bytes_per_user", "--data-bytes-per-user")):
                if o.get(key) is not None:
                    cmd += [flag, str(o[key])]
            for key, flag in (("allow", "--allow"), ("groups", "--group")):
                for name, users in (o.get(key) or {}).items():
                    cmd += [flag, f"{name}={','.join(users)}"]
            from ..sed.backends.registry import DEFAULT_KIND, get_kind
            kind = get_kind(o.get("kind") or DEFAULT_KIND)    # gridrpc sed --batch ..., --cloud ... (its flags)
            if kind.entry_args is not None:
                cmd += kind.entry_args(kind.settings(o, SED_KEYS), f"SeD {e.name}")
            cmd += [str(a) for a in o.get("args") or []]
        return cmd

    def _hosts_used(self) -> list[str]:
        return list(dict.fromkeys(host_key(e.host) for e in self.spec.elements))
