"""What the real-component tests need, and one way to say it: ``require(...)``.

A real-component test (Slurm, Grid Engine, OAR, sshd, network namespaces,
moto...) calls::

    from tests.requirements import require
    require("slurm")                 # or require("netns", "sshd"), ...

When everything named is present, ``require`` returns. When something is
missing, it **skips** the test with a message naming what is missing and how
to install it -- unless ``GRIDRPC_REQUIRE_REAL`` is set, in which case it
**fails** the test with the same message. ``scripts/run-tests`` (the README's
and CI's test command) sets ``GRIDRPC_REQUIRE_REAL=1``, so a CI machine that
lost Slurm or root cannot pass by silently skipping half of the real tier.

``GRIDRPC_REQUIRE_REAL``:

* unset, empty or ``0``: missing components skip (a developer's laptop);
* ``1`` / ``all`` / ``yes`` / ``true``: every component is required;
* a comma-separated list (``slurm,moto``): only those are required, the
  others still skip (a CI runner without root, say).

``tests/conftest.py`` adds a safety net: under ``GRIDRPC_REQUIRE_REAL`` a
test marked ``real`` (or ``slurm``/``netns``/``cloud``) that skips for any
other reason also fails, except opt-in measurements (:func:`opt_in`).

Components are probed once per process (``ip netns add`` costs a few ms).
"""
from __future__ import annotations

import functools
import importlib.util
import os
import re
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable

import pytest

__all__ = ["ENV", "COMPONENTS", "component_of", "missing", "require", "required", "strict", "opt_in", "OPT_IN_PREFIX"]

ENV = "GRIDRPC_REQUIRE_REAL"
OPT_IN_PREFIX = "opt-in:"
INSTALL = "scripts/install-test-deps"
_TRUE = {"1", "all", "yes", "true", "on"}
_FALSE = {"", "0", "no", "false", "off"}


@dataclass(frozen=True)
class Component:
    name: str
    what: str                          # human name
    probe: Callable[[], str | None]    # None if present, else what is missing
    install: str                       # how to get it


def _on_path(*binaries: str) -> str | None:
    """None when every binary is on PATH (as the code under test finds them)."""
    gone = [b for b in binaries if shutil.which(b) is None]
    if not gone:
        return None
    where = {}
    for b in gone:
        for d in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"):
            if os.access(p := os.path.join(d, b), os.X_OK):
                where[b] = p
                break
    hint = ""
    if where:
        hint = " (" + ", ".join(f"{b} is at {p}" for b, p in where.items()) + ": add its directory to PATH)"
    return f"{', '.join(gone)} not found on PATH{hint}"


def _module(*names: str) -> str | None:
    gone = []
    for n in names:
        try:
            if importlib.util.find_spec(n) is None:
                gone.append(n)
        except (ImportError, ValueError):
            gone.append(n)
    return f"Python module(s) {', '.join(gone)} not importable by {sys.executable}" if gone else None


def _root() -> str | None:
    if sys.platform != "linux":
        return f"needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return f"needs root (running as uid {os.geteuid()})"
    return None


def _netns() -> str | None:
    reason = _root() or _on_path("ip", "unshare", "nsenter", "mount")
    if reason:
        return reason
    probe = f"grt-{os.getpid()}-{secrets.token_hex(2)}-probe"
    res = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        return f"'ip netns add' failed: {res.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


def _sshd() -> str | None:
    from tests.netns import SSHD  # the path the namespace cluster runs
    reason = _on_path("ssh", "ssh-keygen")
    if not os.access(SSHD, os.X_OK):
        reason = (reason + "; " if reason else "") + f"{SSHD} not found"
    return reason


def _slurm() -> str | None:
    return _on_path("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scontrol", "sinfo")


def _sge() -> str | None:
    reason = _on_path("qsub", "qstat", "qacct", "qdel", "qconf", "sge_qmaster", "sge_execd")
    if reason is None and not os.access("/usr/lib/gridengine/spoolinit", os.X_OK):
        reason = "/usr/lib/gridengine/spoolinit not found (package gridengine-master)"
    return reason


def _oar() -> str | None:
    import glob
    reason = _root() or _on_path("oarsub", "oarstat", "oardel", "oarnodes", "oarnodesetting", "oar-server",
                                 "oar-database")
    if reason is None and not glob.glob("/usr/lib/postgresql/*/bin/initdb"):
        reason = "PostgreSQL's initdb not found under /usr/lib/postgresql/*/bin (package postgresql)"
    return reason


def _chromium() -> str | None:
    if any(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")):
        return None
    return "chromium, chromium-browser or google-chrome not found on PATH"


def _simgrid() -> str | None:
    from gridrpc.sim.simgrid_loader import SimGridMissing, load_simgrid
    try:
        load_simgrid()
    except SimGridMissing as exc:
        return str(exc)
    return None


COMPONENTS: dict[str, Component] = {c.name: c for c in [
    Component("root", "root privileges", _root,
              "run the tests as root (sudo scripts/run-tests)"),
    Component("netns", "Linux network namespaces", _netns,
              f"run as root on Linux; `sudo {INSTALL}` installs iproute2 and util-linux (ip, unshare, nsenter)"),
    Component("sshd", "OpenSSH server and client", _sshd,
              f"`sudo {INSTALL}` (apt-get install openssh-server openssh-client)"),
    Component("slurm", "Slurm and munge", _slurm,
              f"`sudo {INSTALL}` (apt-get install slurmd slurmctld slurm-client munge)"),
    Component("sge", "Grid Engine (Son of Grid Engine)", _sge,
              f"`sudo {INSTALL}` (apt-get install gridengine-master gridengine-exec gridengine-client, "
              "debconf preseeded)"),
    Component("oar", "OAR with PostgreSQL, as root", _oar,
              f"`sudo {INSTALL}` (apt-get install oar-server oar-server-pgsql oar-node oar-user "
              "oar-user-pgsql postgresql); run as root"),
    Component("moto", "moto's EC2 server", lambda: _module("moto", "flask", "flask_cors"),
              "python3 -m pip install -e '.[test]' (or: pip install 'moto[server]>=5')"),
    Component("libcloud", "Apache Libcloud", lambda: _module("libcloud"),
              "python3 -m pip install -e '.[test]' (or: pip install 'apache-libcloud>=3.8')"),
    Component("chromium", "a headless Chromium", _chromium,
              f"`sudo {INSTALL} --chromium` (apt-get install chromium)"),
    Component("simgrid", "SimGrid's Python module (Debian's python3-simgrid)", _simgrid,
              f"`sudo {INSTALL}` (apt-get install python3-simgrid; its Python must be this one's version)"),
]}


@functools.cache
def missing(name: str) -> str | None:
    """Why component ``name`` cannot be used here, or None when it can."""
    try:
        comp = COMPONENTS[name]
    except KeyError:
        raise ValueError(f"unknown component {name!r}; known: {sorted(COMPONENTS)}") from None
    try:
        return comp.probe()
    except Exception as exc:  # noqa: BLE001 - a probe that crashes means "not usable"
        return f"probe failed: {type(exc).__name__}: {exc}"


def required() -> set[str]:
    """The components that ``GRIDRPC_REQUIRE_REAL`` makes mandatory."""
    raw = os.environ.get(ENV, "").strip().lower()
    if raw in _FALSE:
        return set()
    if raw in _TRUE:
        return set(COMPONENTS)
    names = {n.strip() for n in raw.split(",") if n.strip()}
    unknown = names - set(COMPONENTS)
    if unknown:
        raise pytest.UsageError(f"{ENV}={raw!r}: unknown component(s) {sorted(unknown)}; "
                                f"use 1 (all) or some of {sorted(COMPONENTS)}")
    return names


def strict() -> bool:
    """True when any component is required (``GRIDRPC_REQUIRE_REAL`` set)."""
    return bool(required())


def component_of(skip_reason: str) -> str | None:
    """The component a skip made by :func:`require` names, else None."""
    m = re.search(r"\bneeds (\w+): ", skip_reason)
    return m.group(1) if m and m.group(1) in COMPONENTS else None


def message(name: str, reason: str) -> str:
    comp = COMPONENTS[name]
    return f"needs {name}: {comp.what} unavailable: {reason}. Install: {comp.install}"


def require(*names: str) -> None:
    """Skip -- or, under ``GRIDRPC_REQUIRE_REAL``, fail -- unless every named
    component is usable."""
    must = required()
    for name in names:
        reason = missing(name)
        if reason is None:
            continue
        text = message(name, reason)
        if name in must:
            pytest.fail(f"{text}. {ENV}={os.environ.get(ENV)} is set (scripts/run-tests sets it): "
                        f"a missing real component fails instead of skipping", pytrace=False)
        pytest.skip(f"{text} (set {ENV}=1 to make this a failure)")


def opt_in(variable: str, what: str) -> pytest.MarkDecorator:
    """A ``skipif`` for tests that run only on request (long measurements):
    skipped unless ``variable`` is set, also under ``GRIDRPC_REQUIRE_REAL``."""
    return pytest.mark.skipif(not os.environ.get(variable),
                              reason=f"{OPT_IN_PREFIX} {what}; set {variable}=1 to run it")
