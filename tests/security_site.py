"""A small secure-able site of real processes for the security tests: an MA
and one SeD with the example services (``gridrpc ma``/``gridrpc sed``
subprocesses), plain or under CURVE with element and user keys. The
``secure_site`` fixture (tests/conftest.py) is one of these under CURVE."""
from __future__ import annotations

import psutil

import gridrpc
from gridrpc.testing import wait_for
from gridrpc.transport.security import KeyStore, Security
from tests.proc_tree import ProcTree
from tests.raw_peer import dealer, secure_args

USERS = ("alice", "mallory")


class Site:
    """MA -> sed-1 (example services) as processes, plain or under CURVE."""

    def __init__(self, tmp, secure: bool, *sed_args: str, nofile: int | None = None) -> None:
        self.secure = secure
        self.pt = ProcTree(tmp)
        self.keys = None
        ma_args: list[str] = []
        sed_extra: list[str] = []
        if secure:
            store = self.store = KeyStore(tmp / "keys")
            for name in ("MA", "sed-1"):
                store.create(name, "element")
            for u in USERS:
                store.create(u, "user")
            self.keys = str(store.dir)
            ma_args = secure_args(store.dir)
            sed_extra = secure_args(store.dir, parent_key="MA")
        try:
            self.ma = self.pt.start("ma", "MA", *ma_args, nofile=nofile)
            self.sed = self.pt.sed("sed-1", self.ma.address, *sed_extra, *sed_args)
            with self.client("alice") as c:
                def found():
                    try:
                        return c.discover("add", 1) != []
                    except (gridrpc.ServiceNotFound, gridrpc.NoServerAvailable):
                        return False
                wait_for(found, 20, "sed-1 registered")
        except BaseException:
            self.pt.stop()
            raise

    def client(self, user: str) -> gridrpc.Client:
        if self.secure:
            return gridrpc.Client(self.ma.address, keys=self.keys, key=user, user=user)
        return gridrpc.Client(self.ma.address, user=user)

    def raw(self, user: str):
        """A raw socket to sed-1 speaking as ``user`` (its key under CURVE)."""
        opts = None
        if self.secure:
            opts = Security(keys=self.store, name=user, role="user").client_options(
                self.store.public("sed-1", "element"))
        return dealer(self.sed.address, opts)

    def close(self) -> None:
        self.pt.stop()


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (a SeD's bulk socket shows up among them)."""
    return {c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN}
