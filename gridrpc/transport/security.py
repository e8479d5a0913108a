"""CurveZMQ for every link, with pyzmq's own ZAP authenticator (``zmq.auth``).

Keys live in a key directory (``gridrpc keys create NAME``)::

    KEYDIR/elements/NAME.key          public key of an element (MA, LA, SeD)
    KEYDIR/elements/NAME.key_secret   its secret key (only on the host running it)
    KEYDIR/users/NAME.key             public key of a user
    KEYDIR/users/NAME.key_secret      the user's secret key (only the user has it)

The files are the standard ``zmq.auth`` certificate files
(``zmq.auth.create_certificates``). A daemon serving with security on:

* binds its ROUTER as a CURVE server with its own element key pair and a ZAP
  domain of its own;
* accepts a connection only from a public key found in the key directory
  (re-read when the directory changes: adding a user's ``.key`` file is
  enough, no restart);
* learns who is talking from the ZAP ``User-Id`` that the authenticator sets
  from the key's file name: ``user:alice`` or ``element:LA1``. The endpoint
  exposes it as :attr:`gridrpc.transport.endpoint.Incoming.user`; headers
  never decide identity.

A client pins only the MA's public key; the MA hands it each SeD's public key
with the discovery answer.

The same ZAP thread admits connections to the bulk sockets of
:mod:`gridrpc.transport.bulk` (ZeroMQ's PLAIN mechanism, a session id and its
token handed out over CURVE): :meth:`Security.bulk_options`.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import zmq
import zmq.auth
import zmq.utils.z85
from zmq.auth.thread import ThreadAuthenticator

from ..errors import ConfigError

log = logging.getLogger(__name__)
ROLES = ("element", "user")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_Z85_RE = re.compile(r"[0-9A-Za-z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")


def is_loopback(host: str) -> bool:
    """Is ``host`` (a bind address or name) on the loopback interface only?"""
    import ipaddress
    h = host.strip("[]")
    if h in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def default_key_dir() -> Path:
    return Path(os.environ.get("GRIDRPC_KEYS") or Path.home() / ".gridrpc" / "keys")


@dataclass(frozen=True, slots=True)
class Identity:
    role: str            # "element" | "user"
    name: str

    def __str__(self) -> str:
        return f"{self.role}:{self.name}"

    @classmethod
    def parse(cls, user_id: str | None) -> "Identity | None":
        if not user_id or ":" not in user_id:
            return None
        role, _, name = user_id.partition(":")
        return cls(role, name) if role in ROLES else None


@dataclass(frozen=True, slots=True)
class KeyPair:
    public: bytes                 # z85, 40 bytes
    secret: bytes | None = None   # z85, 40 bytes; None for a peer's public key only


def public_key_from(text: str | bytes | os.PathLike) -> bytes:
    """A z85 public key given literally (40 characters) or as a ``.key`` file."""
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    s = str(text)
    if _Z85_RE.fullmatch(s):
        return s.encode("ascii")
    p = Path(s).expanduser()
    if p.is_file():
        public, _ = zmq.auth.load_certificate(str(p))
        return public
    raise ConfigError(f"not a CURVE public key (40 z85 characters) nor a key file: {s[:60]!r}")


class KeyStore:
    """A key directory (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike | None = None) -> None:
        self.dir = Path(directory).expanduser() if directory else default_key_dir()

    def _path(self, role: str, name: str) -> Path:
        if role not in ROLES:
            raise ConfigError(f"key role must be one of {', '.join(ROLES)}, not {role!r}")
        if not _NAME_RE.fullmatch(name):
            raise ConfigError(f"key name {name!r}: letters, digits, '_', '.', '-' (at most 64)")
        return self.dir / f"{role}s" / f"{name}.key"

    def create(self, name: str, role: str = "user", *, overwrite: bool = False) -> Path:
        """Create a key pair; returns the public key file. Refuses to overwrite."""
        pub = self._path(role, name)
        if pub.exists() and not overwrite:
            raise ConfigError(f"{pub} exists already (give overwrite to replace it)")
        pub.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        public_file, secret_file = zmq.auth.create_certificates(str(pub.parent), name,
                                                                 metadata={"role": role})
        os.chmod(secret_file, 0o600)
        return Path(public_file)

    def load(self, name: str, role: str) -> KeyPair:
        """A key pair with its secret (our own identity)."""
        pub = self._path(role, name)
        secret_file = pub.with_suffix(".key_secret")
        if not secret_file.exists():
            raise ConfigError(f"no secret key for {role} {name!r} in {self.dir} "
                              f"(create it with: gridrpc keys create {name}"
                              f"{' --element' if role == 'element' else ''} --dir {self.dir})")
        public, secret = zmq.auth.load_certificate(str(secret_file))
        return KeyPair(public=public, secret=secret)

    def public(self, name: str, role: str) -> bytes:
        pub = self._path(role, name)
        if not pub.exists():
            raise ConfigError(f"no public key for {role} {name!r} in {self.dir}")
        return zmq.auth.load_certificate(str(pub))[0]

    def entries(self) -> list[tuple[str, str, bytes, bool]]:
        """``(role, name, public z85, has secret here)`` for every key, sorted."""
        out = []
        for role in ROLES:
            d = self.dir / f"{role}s"
            if not d.is_dir():
                continue
            for f in sorted(d.glob("*.key")):
                try:
                    public, _ = zmq.auth.load_certificate(str(f))
                except (OSError, ValueError) as exc:
                    log.warning("unreadable key file %s: %s", f, exc)
                    continue
                out.append((role, f.stem, public, f.with_suffix(".key_secret").exists()))
        return out

    def stamp(self) -> tuple:
        """Changes when a key file is added, removed or replaced."""
        out = []
        for role in ROLES:
            d = self.dir / f"{role}s"
            try:
                out.append((role, d.stat().st_mtime_ns))
            except OSError:
                out.append((role, None))
        return tuple(out)


class _KeyRing:
    """The public keys a daemon accepts, re-read when the directory changes.
    Used by the ZAP thread: ``callback`` decides, ``identity`` names."""

    def __init__(self, store: KeyStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._stamp: tuple | None = None
        self._by_key: dict[bytes, Identity] = {}

    def _refresh(self) -> None:
        stamp = self.store.stamp()
        if stamp != self._stamp:
            self._by_key = {pub: Identity(role, name) for role, name, pub, _ in self.store.entries()}
            self._stamp = stamp

    def callback(self, domain: str, key: bytes) -> bool:
        with self._lock:
            self._refresh()
            ok = key in self._by_key
        if not ok:
            log.warning("CURVE: refused a connection with an unknown key %s (domain %s)",
                        key.decode("ascii", "replace")[:12] + "...", domain)
        return ok

    def identity(self, key_z85: bytes) -> Identity | None:
        with self._lock:
            self._refresh()
            return self._by_key.get(key_z85)


class _Authenticator(ThreadAuthenticator):
    """One per zmq context; User-Id = ``role:name`` of the key's file."""

    def __init__(self, context: zmq.Context) -> None:
        super().__init__(context, log=logging.getLogger("gridrpc.zap"))
        #: domain -> ring; copied on write (``add_ring``): the ZAP thread iterates it while
        #: daemons of the same process add theirs (it once died of "dictionary changed size
        #: during iteration", and with it every later CURVE handshake of the process)
        self.rings: dict[str, _KeyRing] = {}
        #: domain -> ``check(user name, password) -> bool`` for sockets using PLAIN (the bulk data
        #: path, gridrpc.transport.bulk); copied on write like ``rings``
        self.plain_checks: dict[str, Callable[[str, str], bool]] = {}

    def add_plain_check(self, domain: str, check: "Callable[[str, str], bool]") -> None:
        with _auth_lock:
            self.plain_checks = {**self.plain_checks, domain: check}

    def remove_plain_check(self, domain: str) -> None:
        with _auth_lock:
            self.plain_checks = {d: c for d, c in self.plain_checks.items() if d != domain}

    def _authenticate_plain(self, domain: str, username: str, password: str) -> tuple[bool, bytes]:
        """PLAIN is only used by bulk sockets: the domain's check decides (User-Id = the user name)."""
        check = self.plain_checks.get(domain)
        if check is None:
            return False, b"no PLAIN on this domain"
        try:
            ok = bool(check(username, password))
        except Exception:  # noqa: BLE001 - a failing check refuses; the ZAP thread must survive
            log.exception("PLAIN check of domain %s failed", domain)
            ok = False
        return ok, (b"OK" if ok else b"unknown bulk session or token")

    def add_ring(self, domain: str, store: "KeyStore") -> "_KeyRing":
        with _auth_lock:
            ring = self.rings.get(domain)
            if ring is None:
                ring = _KeyRing(store)
                self.rings = {**self.rings, domain: ring}
                self.configure_curve_callback(domain=domain, credentials_provider=ring)
            return ring

    def curve_user_id(self, client_public_key: bytes) -> str:
        z = zmq.utils.z85.encode(client_public_key)
        for ring in self.rings.values():
            ident = ring.identity(z)
            if ident is not None:
                return str(ident)
        return "unknown:" + z.decode("ascii")


_auth_lock = threading.Lock()
_authenticators: dict[int, _Authenticator] = {}


def _authenticator(ctx: zmq.Context) -> _Authenticator:
    with _auth_lock:
        a = _authenticators.get(id(ctx))
        if a is None or a.thread is None or not a.thread.is_alive():
            a = _Authenticator(ctx)
            a.start()
            _authenticators[id(ctx)] = a
        return a


def stop_authenticators() -> None:
    """Stop every ZAP thread (tests, process exit)."""
    with _auth_lock:
        for a in _authenticators.values():
            try:
                a.stop()
            except Exception:  # noqa: BLE001
                pass
        _authenticators.clear()


@dataclass(frozen=True, kw_only=True)
class Security:
    """Security settings of one element or client.

    ``keys``: the key directory; ``name``/``role``: whose key pair this
    process uses (an element's name, or a user's). ``enabled=False`` is the
    insecure mode (NULL mechanism, no identities)."""
    enabled: bool = True
    keys: KeyStore = field(default_factory=KeyStore)
    name: str = ""
    role: str = "element"

    @property
    def pair(self) -> KeyPair:
        return self.keys.load(self.name, self.role)

    def server_options(self, domain: str, context: zmq.Context) -> dict:
        """Socket options for a bound ROUTER; starts the ZAP handler of this
        context for ``domain`` (unique per daemon in a process)."""
        if not self.enabled:
            return {}
        pair = self.pair
        auth = _authenticator(context)
        domain = self.zap_domain(domain)
        auth.add_ring(domain, self.keys)
        return {zmq.CURVE_SERVER: 1, zmq.CURVE_PUBLICKEY: pair.public, zmq.CURVE_SECRETKEY: pair.secret,
                zmq.ZAP_DOMAIN: domain.encode()}

    def zap_domain(self, domain: str) -> str:
        """The ZAP domain of a daemon's sockets: one per (daemon, key directory), since daemons of
        one process (tests, replicas) may trust different directories."""
        return f"{domain}.{hashlib.sha1(str(self.keys.dir.resolve()).encode()).hexdigest()[:10]}"

    def bulk_options(self, domain: str, context: zmq.Context, check: "Callable[[str, str], bool]") -> dict:
        """Socket options for a bound bulk ROUTER (gridrpc.transport.bulk): ZeroMQ's PLAIN
        mechanism, each connection admitted by ``check(user name, password)`` in this context's
        ZAP thread (the User-Id of its frames is then the user name)."""
        auth = _authenticator(context)
        auth.add_plain_check(domain, check)
        return {zmq.PLAIN_SERVER: 1, zmq.ZAP_DOMAIN: domain.encode()}

    @staticmethod
    def forget_bulk(domain: str, context: zmq.Context) -> None:
        """Stop admitting connections to the bulk socket of ``domain``."""
        with _auth_lock:
            a = _authenticators.get(id(context))
        if a is not None:
            a.remove_plain_check(domain)

    def client_options(self, server_public: bytes | None) -> dict:
        """Socket options for a DEALER connecting to a server with that public key."""
        if not self.enabled:
            return {}
        if not server_public:
            raise ConfigError("security is on but the server's public key is unknown "
                              "(give the MA's key, e.g. ma_key=KEYDIR/elements/MA.key)")
        pair = self.pair
        return {zmq.CURVE_SERVERKEY: server_public, zmq.CURVE_PUBLICKEY: pair.public,
                zmq.CURVE_SECRETKEY: pair.secret}


INSECURE = Security(enabled=False)
