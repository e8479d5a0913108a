"""A cluster of "hosts" made of Linux network namespaces, each with its own sshd.

Layout (all names carry a per-run prefix, e.g. ``grt-4242-a1b2-``)::

    PREFIX+sw   : bridge br0, one port p-hI per host
    PREFIX+hI   : eth0 (veth peer of p-hI) with 10.200.0.(10+I)/24, lo up,
                  sshd on 10.200.0.(10+I):22 (own host key, key-only auth)

Each host is more than a network namespace: it has its **own PID namespace**
(its "init", a small Python reaper, is PID 1 there; sshd is its child) and its
**own mount namespace** with a private tmpfs mounted at :attr:`host_dir` --
the same path on every host, a different directory on each, and an empty
directory seen from the machine itself. So a PID a host reports means
nothing on the machine or on another host, and a file written under
``host_dir`` on one host is invisible everywhere else: the SSH launcher's
``start``/``alive``/``stop``/``logs`` pass only if they really act on the
remote host. The rest of the file system (``/usr``, the repository, ``/tmp``)
is shared, like an NFS home. ``exec``/``popen``/``wrapper`` enter all three
namespaces (``nsenter``); killing a host's init powers the host off (the
kernel kills every process of its PID namespace).

The test processes talk to the hosts only from *inside* a host
(``cluster.exec``/``popen``/``wrapper``); the root namespace never sends to the test subnet, and a
``blackhole`` route for the subnet is installed in the root namespace for the
lifetime of the cluster as a safety net (see
``/work/shared/notes/multihost-and-cloud.md``).  The blackhole route is shared
between concurrent clusters through a small reference count under
``/run/gridrpc-netns-tests``; it is removed when the last holder goes, and only
if a cluster added it.

Cleanup (``stop()``, also registered with ``atexit``): power every host off
(SIGKILL to its init), kill the processes the cluster started (by PID and
process group), then every process left in each namespace
(``ip netns pids``), delete the namespaces, release the route, remove the
temporary directory.  ``cleanup_stale()`` does the same for namespaces of
earlier runs whose owning process is gone.
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

BASE_PREFIX = "grt-"
STATE_DIR = Path("/run/gridrpc-netns-tests")
SSHD = "/usr/sbin/sshd"
HOST_TMPFS_SIZE = "256m"

# PID 1 of a namespace host: mount the host's private tmpfs, run the command
# (sshd) as its child, reap every orphan (daemons started over ssh end up
# here), exit with the command's status. With no command: just reap.
_HOST_INIT = r"""
import os, signal, subprocess, sys
size, private, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755,size=" + size, "gridrpc-host", private],
               check=True)
print("gridrpc-host: private", private, "mounted; pid", os.getpid(), flush=True)
child = None
if argv:
    child = os.fork()
    if child == 0:
        os.execv(argv[0], argv)
def forward(sig, _frame):
    if child is None:
        sys.exit(0)
    try:
        os.kill(child, sig)
    except ProcessLookupError:
        pass
signal.signal(signal.SIGTERM, forward)
signal.signal(signal.SIGINT, forward)
signal.signal(signal.SIGCHLD, lambda *_: None)
while True:
    try:
        pid, status = os.wait()
    except ChildProcessError:
        signal.pause()
        continue
    if pid == child:
        code = os.waitstatus_to_exitcode(status)
        sys.exit(code if code >= 0 else 128 - code)
"""
_PREFIX_RE = re.compile(r"^grt-(\d+)-([0-9a-f]+)-")

_TCP_WAIT = r"""
import socket, sys, time
host, port, deadline = sys.argv[1], int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
while True:
    try:
        socket.create_connection((host, port), timeout=max(0.05, min(1.0, deadline - time.monotonic()))).close()
        sys.exit(0)
    except OSError:
        if time.monotonic() >= deadline:
            sys.exit(1)
        time.sleep(0.05)
"""


def _run(cmd: Sequence[str], *, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    res = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _kill_pids(pids: Sequence[int], timeout: float = 3.0) -> None:
    """SIGTERM the given PIDs, wait for them to go, SIGKILL the survivors."""
    pids = [p for p in pids if p > 1 and p != os.getpid()]
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, timeout)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline:
            for pid in pids:  # reap our own children, ignore others
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)
            pids = [p for p in pids if _pid_alive(p)]
            if pids:
                time.sleep(0.02)
        if not pids:
            return


def netns_list() -> list[str]:
    res = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in res.stdout.splitlines() if line.strip()]


def netns_pids(ns: str) -> list[int]:
    res = _run(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in res.stdout.split() if x.isdigit()]


def _destroy_namespace(ns: str) -> None:
    _kill_pids(netns_pids(ns))
    _run(["ip", "netns", "del", ns], check=False)


# -- the shared blackhole route ------------------------------------------------

@contextlib.contextmanager
def _state_lock():
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / "lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _subnet_key(subnet: str) -> str:
    return subnet.replace("/", "_")


def _holders_dir(subnet: str) -> Path:
    return STATE_DIR / f"holders-{_subnet_key(subnet)}"


def _owned_marker(subnet: str) -> Path:
    return STATE_DIR / f"route-added-{_subnet_key(subnet)}"


def _live_holders(subnet: str) -> list[str]:
    """Holder files of live owners; stale ones (dead owner PID) are removed."""
    d = _holders_dir(subnet)
    d.mkdir(parents=True, exist_ok=True)
    live = []
    for f in d.iterdir():
        try:
            pid = int(f.read_text().strip() or "0")
        except (OSError, ValueError):
            pid = 0
        if pid and _pid_alive(pid):
            live.append(f.name)
        else:
            f.unlink(missing_ok=True)
    return live


def route_holders(subnet: str = "10.200.0.0/24") -> list[str]:
    """Prefixes of live clusters currently holding the blackhole route."""
    with _state_lock():
        return _live_holders(subnet)


def blackhole_present(subnet: str = "10.200.0.0/24") -> bool:
    res = _run(["ip", "-4", "route", "show", "type", "blackhole", subnet], check=False)
    return bool(res.stdout.strip())


def _assert_root_ns_blocked(addresses: Sequence[str]) -> None:
    """Every test address must be unroutable from the root namespace."""
    for addr in addresses:
        res = _run(["ip", "-4", "route", "get", addr], check=False)
        if res.returncode == 0 and not res.stdout.lstrip().startswith(("blackhole", "unreachable", "prohibit")):
            raise RuntimeError(
                f"unsafe: {addr} is routable from the root namespace despite the blackhole "
                f"route ({res.stdout.strip()!r}); a more specific route exists")


def _acquire_route(subnet: str, holder: str) -> None:
    with _state_lock():
        live = _live_holders(subnet)
        if not blackhole_present(subnet):
            if live:
                raise RuntimeError(f"blackhole route for {subnet} vanished while held by {live}")
            existing = _run(["ip", "-4", "route", "show", "exact", subnet], check=False).stdout.strip()
            if existing:
                raise RuntimeError(f"refusing to use {subnet}: root namespace already routes it: {existing!r}")
            _run(["ip", "route", "add", "blackhole", subnet])
            _owned_marker(subnet).write_text(str(os.getpid()))
        (_holders_dir(subnet) / holder).write_text(str(os.getpid()))


def _release_route(subnet: str, holder: str) -> None:
    with _state_lock():
        (_holders_dir(subnet) / holder).unlink(missing_ok=True)
        if _live_holders(subnet):
            return
        marker = _owned_marker(subnet)
        if marker.exists():
            if blackhole_present(subnet):
                _run(["ip", "route", "del", "blackhole", subnet], check=False)
            marker.unlink(missing_ok=True)


# -- stale runs and environment check ------------------------------------------

def cleanup_stale(base: str = BASE_PREFIX) -> list[str]:
    """Destroy namespaces ``grt-PID-...`` whose owner PID is dead; return them."""
    removed = []
    for ns in netns_list():
        m = _PREFIX_RE.match(ns)
        if not ns.startswith(base) or not m or _pid_alive(int(m.group(1))):
            continue
        _destroy_namespace(ns)
        removed.append(ns)
    for prefix in {m.group(0) for ns in removed if (m := _PREFIX_RE.match(ns))}:
        for d in Path(tempfile.gettempdir()).glob(f"{prefix}cluster*"):
            shutil.rmtree(d, ignore_errors=True)
    if STATE_DIR.exists():
        for d in STATE_DIR.glob("holders-*"):  # drops dead holders, then the route
            subnet = d.name[len("holders-"):].replace("_", "/")
            _release_route(subnet, "__none__")
    return removed


def skip_unless_root_netns() -> str | None:
    """Return why network namespaces/sshd cannot be used, else None.
    (Tests say ``tests.requirements.require("netns", "sshd")`` instead.)"""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "needs root (network namespaces, sshd)"
    for tool in ("ip", "ssh", "ssh-keygen", "unshare", "nsenter", "mount"):
        if shutil.which(tool) is None:
            return f"{tool!r} not found"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} not found (apt-get install openssh-server)"
    probe = f"{BASE_PREFIX}{os.getpid()}-{secrets.token_hex(2)}-probe"
    res = _run(["ip", "netns", "add", probe], check=False)
    if res.returncode != 0:
        return f"'ip netns add' failed: {res.stderr.strip()}"
    _run(["ip", "netns", "del", probe], check=False)
    return None


# -- processes seen from a host ---------------------------------------------------

def _ns_inode(pid: int, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def _nspid(pid: int) -> list[int]:
    """``NSpid`` of ``pid``: its PID in each PID namespace, outermost first."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


# -- the cluster ----------------------------------------------------------------

class NetnsCluster:
    """``n_hosts`` hosts h1..hN on one bridge: each a network, PID and mount
    namespace of its own, running its own sshd (see the module docstring)."""

    def __init__(self, n_hosts: int = 3, subnet: str = "10.200.0.0/24", prefix: str | None = None,
                 *, first_host: int = 10, ssh_port: int = 22, sshd: bool = True) -> None:
        self.n_hosts = n_hosts
        self.subnet = str(ipaddress.ip_network(subnet))
        net = ipaddress.ip_network(subnet)
        self.prefix = prefix or f"{BASE_PREFIX}{os.getpid()}-{secrets.token_hex(2)}-"
        self.hosts = [f"h{i}" for i in range(1, n_hosts + 1)]
        self._addr = {h: str(net.network_address + first_host + i)
                      for i, h in enumerate(self.hosts, start=1)}
        self._prefixlen = net.prefixlen
        self.ssh_port = ssh_port
        self._with_sshd = sshd
        self.switch = self.prefix + "sw"
        self.tmp: Path | None = None
        self.client_key: Path | None = None
        self.known_hosts: Path | None = None
        self._boot: dict[str, subprocess.Popen] = {}   # per host: `ip netns exec NS unshare ... init`
        self._init: dict[str, int] = {}                # per host: its init (PID 1 there), machine PID
        self._daemons: dict[str, set[int]] = {}        # per host: what init started (sshd), machine PIDs
        self._procs: list[subprocess.Popen] = []
        self._route_held = False
        self._started = False

    # naming
    def ns(self, host: str | int) -> str:
        """Network namespace name of ``host`` ("h2" or 2)."""
        return self.prefix + self._host(host)

    def _host(self, host: str | int) -> str:
        h = f"h{host}" if isinstance(host, int) else host
        if h not in self._addr:
            raise KeyError(f"unknown host {host!r}; hosts are {self.hosts}")
        return h

    def address(self, host: str | int) -> str:
        return self._addr[self._host(host)]

    def namespaces(self) -> list[str]:
        return [self.switch] + [self.ns(h) for h in self.hosts]

    @property
    def host_dir(self) -> str:
        """The directory private to each host (a tmpfs per host, mounted at
        the same path on all): put remote work directories here. Seen from
        the machine it is an empty directory."""
        assert self.tmp is not None, "cluster not started"
        return str(self.tmp / "host")

    def init_pid(self, host: str | int) -> int:
        """Machine PID of ``host``'s init (PID 1 inside the host)."""
        return self._init[self._host(host)]

    def wrapper(self, host: str | int, cwd: str | os.PathLike | None = None) -> list[str]:
        """Prefix that runs a command *on* ``host``: in its network, mount and
        PID namespaces (``nsenter``), in ``cwd`` (default: the current
        directory) as seen on the host."""
        return ["nsenter", f"--target={self.init_pid(host)}", "--net", "--mount", "--pid",
                f"--wdns={os.fspath(cwd) if cwd is not None else os.getcwd()}", "--"]

    # lifecycle
    def __enter__(self) -> NetnsCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> NetnsCluster:
        if self._started:
            return self
        self._started = True
        atexit.register(self.stop)
        try:
            cleanup_stale()
            _acquire_route(self.subnet, self.prefix)
            self._route_held = True
            _assert_root_ns_blocked(list(self._addr.values()))
            self.tmp = Path(tempfile.mkdtemp(prefix=f"{self.prefix}cluster"))
            Path(self.host_dir).mkdir()
            self._make_network()
            if self._with_sshd:
                self._make_keys()
            for h in self.hosts:
                self._boot_host(h)
            for h in self.hosts:
                self._wait_host(h)
            if self._with_sshd:
                for h in self.hosts:
                    self._wait_sshd(h)
        except BaseException:
            self.stop()
            raise
        return self

    def _make_network(self) -> None:
        sw = self.switch
        _run(["ip", "netns", "add", sw])
        _run(["ip", "-n", sw, "link", "set", "lo", "up"])
        _run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", sw, "link", "set", "br0", "up"])
        for h in self.hosts:
            ns, port = self.ns(h), f"p-{h}"
            _run(["ip", "netns", "add", ns])
            _run(["ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns])
            _run(["ip", "-n", sw, "link", "set", port, "master", "br0"])
            _run(["ip", "-n", sw, "link", "set", port, "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.address(h)}/{self._prefixlen}", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])

    def _make_keys(self) -> None:
        assert self.tmp is not None
        self.client_key = self.tmp / "client_key"
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gridrpc-test-client",
              "-f", str(self.client_key)])
        lines = []
        for h in self.hosts:
            d = self.tmp / h
            d.mkdir()
            key = d / "ssh_host_ed25519_key"
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", h, "-f", str(key)])
            kind, blob = Path(f"{key}.pub").read_text().split()[:2]
            lines.append(f"{self._known_hosts_name(h)} {kind} {blob}\n")
        self.known_hosts = self.tmp / "known_hosts"
        self.known_hosts.write_text("".join(lines))

    def _known_hosts_name(self, host: str) -> str:
        addr = self.address(host)
        return addr if self.ssh_port == 22 else f"[{addr}]:{self.ssh_port}"

    def host_key_pub(self, host: str | int) -> Path:
        assert self.tmp is not None
        return self.tmp / self._host(host) / "ssh_host_ed25519_key.pub"

    def sshd_log(self, host: str | int) -> str:
        """The host's console: its init's and its sshd's output."""
        assert self.tmp is not None
        p = self.tmp / self._host(host) / "sshd.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def _sshd_config(self, h: str) -> Path:
        assert self.tmp is not None
        d = self.tmp / h
        conf = d / "sshd_config"
        conf.write_text(
            f"ListenAddress {self.address(h)}:{self.ssh_port}\n"
            f"HostKey {d / 'ssh_host_ed25519_key'}\n"
            f"PidFile {d / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {self.client_key}.pub\n"
            "PermitRootLogin prohibit-password\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            "StrictModes no\n"
            "UseDNS no\n"
            "PrintMotd no\n"
            "X11Forwarding no\n"
            "MaxStartups 100:30:200\n"
            "LogLevel VERBOSE\n")
        return conf

    def _boot_host(self, h: str) -> None:
        """Start the host's init in new mount and PID namespaces inside its
        network namespace; the init mounts the private tmpfs, then runs sshd."""
        assert self.tmp is not None
        d = self.tmp / h
        d.mkdir(exist_ok=True)
        cmd: list[str] = []
        if self._with_sshd:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
            cmd = [SSHD, "-D", "-e", "-f", str(self._sshd_config(h))]
        argv = ["ip", "netns", "exec", self.ns(h),
                "unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--kill-child",
                "--mount-proc", sys.executable, "-c", _HOST_INIT, HOST_TMPFS_SIZE, self.host_dir, *cmd]
        log = open(d / "sshd.log", "ab")
        try:
            self._boot[h] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()

    def _wait_host(self, h: str, timeout: float = 15.0) -> None:
        """Wait until the host's init runs and has mounted its private directory."""
        boot = self._boot[h]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if boot.poll() is not None:
                raise RuntimeError(f"host {h} did not boot (exit {boot.returncode}):\n{self.sshd_log(h)}")
            for pid in _children(boot.pid):
                if _nspid(pid)[-1:] == [1]:
                    try:
                        mounts = Path(f"/proc/{pid}/mountinfo").read_text()
                    except OSError:
                        continue
                    kids = _children(pid)
                    if f" {self.host_dir} " in mounts and (kids or not self._with_sshd):
                        self._init[h] = pid
                        self._daemons[h] = set(kids)    # sshd: nothing else runs on the host yet
                        return
            time.sleep(0.02)
        raise RuntimeError(f"host {h} not up after {timeout}s:\n{self.sshd_log(h)}")

    def _wait_sshd(self, h: str, timeout: float = 15.0) -> None:
        proc = self._boot[h]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"sshd on {h} exited ({proc.returncode}):\n{self.sshd_log(h)}")
            if self.tcp_check(h, self.address(h), self.ssh_port, timeout=0.5):
                return
        raise RuntimeError(f"sshd on {h} not accepting after {timeout}s:\n{self.sshd_log(h)}")

    def power_off(self, host: str | int) -> None:
        """Kill ``host``'s init: the kernel kills every process of the host."""
        h = self._host(host)
        pid = self._init.pop(h, None)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        boot = self._boot.pop(h, None)
        if boot is not None:
            with contextlib.suppress(Exception):
                boot.wait(timeout=5)
            if boot.poll() is None:
                _kill_pids([boot.pid])

    def stop(self) -> None:
        """Kill everything the cluster started and remove all its traces (idempotent)."""
        if not self._started:
            return
        self._started = False
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        for h in list(self._boot):
            self.power_off(h)
        self._init.clear()
        self._daemons.clear()
        procs = self._procs
        for p in procs:  # nsenter parents and their children, which share the process group
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
        _kill_pids([p.pid for p in procs if p.poll() is None])
        for p in procs:
            with contextlib.suppress(Exception):
                p.wait(timeout=1)
        self._procs.clear()
        existing = set(netns_list())
        for ns in reversed(self.namespaces()):  # hosts first, then the switch
            if ns in existing:
                _destroy_namespace(ns)
        for ns in netns_list():  # anything else created under our prefix
            if ns.startswith(self.prefix):
                _destroy_namespace(ns)
        if self._route_held:
            _release_route(self.subnet, self.prefix)
            self._route_held = False
        if self.tmp is not None:
            if Path(self.host_dir).is_mount():      # never: the tmpfs lives in the hosts only
                raise RuntimeError(f"{self.host_dir} is mounted on the machine itself")
            shutil.rmtree(self.tmp, ignore_errors=True)

    @property
    def sshd_pids(self) -> dict[str, int]:
        """Per host, the machine PID of the process that boots it (its
        namespaces' anchor: ``ip netns exec ... unshare``)."""
        return {h: p.pid for h, p in self._boot.items()}

    # processes as a host sees them
    def _in_host(self, h: str, pid: int) -> bool:
        return _ns_inode(pid, "pid") == _ns_inode(self.init_pid(h), "pid")

    def host_pids(self, host: str | int) -> dict[int, int]:
        """``{PID on the host: machine PID}`` of every process running on ``host``."""
        h = self._host(host)
        out = {}
        for pid in netns_pids(self.ns(h)):
            if self._in_host(h, pid):
                nspid = _nspid(pid)
                if nspid:
                    out[nspid[-1]] = pid
        return out

    def local_pid(self, host: str | int, host_pid: int) -> int | None:
        """The machine PID of the process ``host`` calls ``host_pid`` (None if none)."""
        return self.host_pids(host).get(host_pid)

    def infra_pids(self, host: str | int) -> set[int]:
        """Machine PIDs of the host's own machinery: the boot process, init, sshd."""
        h = self._host(host)
        out = {self._boot[h].pid} if h in self._boot else set()
        if h in self._init:
            out |= {self._init[h], *self._daemons.get(h, ())}
        return {p for p in out if _pid_alive(p)}

    def read_file(self, host: str | int, path: str | os.PathLike) -> str | None:
        """The content of ``path`` as ``host`` sees it (None if it has no such file)."""
        res = self.exec(host, ["cat", os.fspath(path)])
        return res.stdout if res.returncode == 0 else None

    # running things on hosts
    def _argv(self, host: str | int, cmd: str | Sequence[str], cwd=None) -> list[str]:
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        return self.wrapper(host, cwd) + argv

    def exec(self, host: str | int, cmd: str | Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        """Run ``cmd`` (argv list, or a string for ``sh -c``) on ``host`` and wait.

        Defaults: ``capture_output=True, text=True, timeout=30``; keyword
        arguments are passed to :class:`subprocess.Popen` (``cwd`` is the
        directory as the host sees it). On timeout the whole command (its
        process group: ``nsenter`` and what it started on the host) is killed.
        """
        timeout = kwargs.pop("timeout", 30)
        capture = kwargs.pop("capture_output", True)
        check = kwargs.pop("check", False)
        inp = kwargs.pop("input", None)
        kwargs.setdefault("text", True)
        if capture:
            kwargs.setdefault("stdout", subprocess.PIPE)
            kwargs.setdefault("stderr", subprocess.PIPE)
        if inp is not None:
            kwargs.setdefault("stdin", subprocess.PIPE)
        argv = self._argv(host, cmd, kwargs.pop("cwd", None))
        kwargs.setdefault("start_new_session", True)
        with subprocess.Popen(argv, **kwargs) as proc:
            try:
                out, err = proc.communicate(inp, timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                raise
        res = subprocess.CompletedProcess(argv, proc.returncode, out, err)
        if check:
            res.check_returncode()
        return res

    def popen(self, host: str | int, cmd: str | Sequence[str], **kwargs) -> subprocess.Popen:
        """Start ``cmd`` on ``host``; the cluster kills it on stop().

        It runs in a session of its own: ``os.killpg(proc.pid, sig)`` reaches
        the command itself (``proc.kill()`` only ends the ``nsenter`` in front).
        """
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(self._argv(host, cmd, kwargs.pop("cwd", None)), **kwargs)
        self._procs.append(proc)
        return proc

    def ssh_args(self, to_host: str | int, remote_cmd: str | Sequence[str] | None = None, *,
                 key: str | os.PathLike | None = None,
                 known_hosts: str | os.PathLike | None = None) -> list[str]:
        """The bare ssh command line to ``to_host`` (without the namespace prefix)."""
        argv = ["ssh", "-F", "/dev/null", "-i", str(key or self.client_key),
                "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", f"UserKnownHostsFile={known_hosts or self.known_hosts}",
                "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=5",
                "-p", str(self.ssh_port), f"root@{self.address(to_host)}"]
        if remote_cmd is not None:
            argv.append(remote_cmd if isinstance(remote_cmd, str) else shlex.join(remote_cmd))
        return argv

    def ssh_cmd(self, from_host: str | int, to_host: str | int,
                remote_cmd: str | Sequence[str] | None = None, **kwargs) -> list[str]:
        """Full command line running ssh *on* ``from_host`` to ``to_host``.

        ``[*wrapper(from_host), "ssh", "-F", "/dev/null", ..., "root@ADDR",
        remote_cmd]``, ready for :func:`subprocess.run`.
        """
        return self.wrapper(from_host) + self.ssh_args(to_host, remote_cmd, **kwargs)

    def tcp_check(self, from_host: str | int, address: str, port: int, timeout: float = 2.0) -> bool:
        """True if a TCP connect from inside ``from_host`` succeeds within ``timeout``.

        Polls (connect refused/timed out are retried) until the deadline.
        """
        res = self.exec(from_host, [sys.executable, "-c", _TCP_WAIT, address, str(port), str(timeout)],
                        timeout=timeout + 30)
        return res.returncode == 0

    # faults
    def partition(self, host: str | int, *, silent: bool = False) -> None:
        """Cut ``host`` off the bridge.

        Default: bridge port link down (the host sees NO-CARRIER). ``silent``:
        keep the link up and set the bridge port to the blocking state, so
        packets vanish without any signal.
        """
        port = f"p-{self._host(host)}"
        if silent:
            _run(["bridge", "-n", self.switch, "link", "set", "dev", port, "state", "0"])
        else:
            _run(["ip", "-n", self.switch, "link", "set", port, "down"])

    def heal(self, host: str | int) -> None:
        """Undo :meth:`partition` (either kind) and wait until the port forwards.

        A port whose link was down has no carrier for a moment after ``up``;
        the kernel refuses a state change then (``Network is down``) and puts
        the port to forwarding by itself once the carrier is back (no STP on
        this bridge). So the state is set only once the link has its carrier
        (``LOWER_UP``), which a silent cut never lost, and both kinds wait for
        ``forwarding``.
        """
        port = f"p-{self._host(host)}"
        _run(["ip", "-n", self.switch, "link", "set", port, "up"])
        deadline = time.monotonic() + 10
        while True:
            shown = _run(["bridge", "-n", self.switch, "link", "show", "dev", port]).stdout
            if "state forwarding" in shown:
                return
            if "LOWER_UP" in shown:  # carrier back, port still disabled (a silent cut)
                _run(["bridge", "-n", self.switch, "link", "set", "dev", port, "state", "3"], check=False)
            if time.monotonic() > deadline:
                raise RuntimeError(f"bridge port {port} not forwarding 10 s after heal: {shown.strip()}")
            time.sleep(0.02)

