"""Helpers to run a whole tree inside one process (tests, demos, benchmarks).

``LocalTree`` starts an MA, LAs and SeDs on an event loop in a background
thread, on free loopback ports, so blocking clients can be used from the
calling thread::

    with LocalTree(las=2, seds_per_la=2) as tree:
        with gridrpc.Client(tree.ma_address) as c:
            c.call("add", 1, 2)
"""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Callable, Iterable

from .errors import NoServerAvailable, ServiceNotFound, Timeout
from .examples import services as example_services
from .local_agent import LocalAgent
from .master_agent import MasterAgent
from .sed import SeD


class LoopThread:
    """An asyncio loop running in a daemon thread."""

    def __init__(self, name: str = "gridrpc-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float | None = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable, *args):
        async def _c():
            return fn(*args)
        return self.run(_c())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def example_sed(name: str, parent: str | None, services: Iterable[str] = tuple(example_services.ALL),
                **kw) -> SeD:
    sed = SeD(name, parent, **kw)
    for s in services:
        sed.add_service(s, getattr(example_services, s))
    return sed


class LocalTree:
    def __init__(self, *, las: int = 2, seds_per_la: int = 2, seds_under_ma: int = 0,
                 services: Iterable[str] = tuple(example_services.ALL), http: bool = True,
                 hb_interval: float = 0.5, hb_timeout: float = 1.5, host: str = "127.0.0.1",
                 sed_options: dict | None = None, replicas: int = 1, keys: str | None = None,
                 users: Iterable[str] = ()) -> None:
        """``keys``: a key directory: the tree runs CURVE, with element keys
        created there for every element and user keys for ``users``."""
        self.keys = keys
        self.users = list(users)
        self.n_las, self.seds_per_la, self.seds_under_ma = las, seds_per_la, seds_under_ma
        self.services = list(services)
        self.http = http
        self.hb = dict(hb_interval=hb_interval, hb_timeout=hb_timeout)
        self.host = host
        self.sed_options = sed_options or {}
        self.replicas = replicas
        self.lt: LoopThread | None = None
        self.ma: MasterAgent | None = None
        self.las: list[LocalAgent] = []
        self.seds: list[SeD] = []

    @property
    def ma_address(self) -> str:
        return self.ma.address

    @property
    def http_url(self) -> str:
        return self.ma.http.url

    def sed_names(self) -> list[str]:
        return [n for s in self.seds for n in s.replicas]

    def security(self, name: str, parent: str | None = None) -> dict:
        """Keyword arguments giving element ``name`` its CURVE settings (its
        key is created on first use), pinning ``parent``'s key."""
        if not self.keys:
            return {}
        from .transport.security import KeyStore, Security
        store = KeyStore(self.keys)
        for n in (name, parent):
            if n and not (store.dir / "elements" / f"{n}.key").exists():
                store.create(n, "element")
        kw = {"security": Security(keys=store, name=name, role="element")}
        if parent:
            kw["parent_key"] = store.public(parent, "element")
        return kw

    def start(self, wait: bool = True) -> "LocalTree":
        if self.keys:
            from .transport.security import KeyStore
            store = KeyStore(self.keys)
            for u in self.users:
                if not (store.dir / "users" / f"{u}.key").exists():
                    store.create(u, "user")
        self.lt = LoopThread()
        self.ma = self.lt.run(MasterAgent(name="MA", address=f"tcp://{self.host}:0",
                                          http_port=0 if self.http else None, **self.hb,
                                          **self.security("MA")).start())
        for i in range(self.n_las):
            la = self.lt.run(LocalAgent(name=f"LA{i + 1}", parent=self.ma.address,
                                        address=f"tcp://{self.host}:0", **self.hb,
                                        **self.security(f"LA{i + 1}", "MA")).start())
            self.las.append(la)
            for j in range(self.seds_per_la):
                self.add_sed(f"sed-{i + 1}-{j + 1}", la.address, **self.security(f"sed-{i + 1}-{j + 1}", la.name))
        for j in range(self.seds_under_ma):
            self.add_sed(f"sed-ma-{j + 1}", self.ma.address, **self.security(f"sed-ma-{j + 1}", "MA"))
        if wait:
            self.wait_registered()
        return self

    def add_sed(self, name: str, parent: str, services: Iterable[str] | None = None, **kw) -> SeD:
        opts = {**self.sed_options, **kw}
        opts.setdefault("replicas", self.replicas)
        sed = self.lt.run(self._make_sed(name, parent, services, opts))
        self.seds.append(sed)
        return sed

    async def _make_sed(self, name, parent, services, opts):
        sed = example_sed(name, parent, services or self.services, address=f"tcp://{self.host}:0",
                          **self.hb, **opts)
        return await sed.start()

    def expected_seds(self) -> int:
        return sum(len(s.replicas) for s in self.seds)

    def registered_seds(self) -> list[str]:
        return self.lt.call(lambda: [e["name"] for e in self.ma.tree() if e.get("kind") == "sed"])

    def wait_registered(self, n: int | None = None, timeout: float = 20.0) -> None:
        n = self.expected_seds() if n is None else n
        wait_for(lambda: len(self.registered_seds()) >= n, timeout,
                 f"{n} SeDs registered at the MA")

    def stop_sed(self, sed: SeD) -> None:
        self.lt.run(sed.aclose())
        self.seds.remove(sed)

    def stop(self) -> None:
        if self.lt is None:
            return
        for s in self.seds:
            self.lt.run(s.aclose())
        for la in self.las:
            self.lt.run(la.aclose())
        if self.ma:
            self.lt.run(self.ma.aclose())
        self.lt.close()
        self.lt = None

    def __enter__(self) -> "LocalTree":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def discoverable(client, service: str, n: int = 1) -> bool:
    """Whether ``client.discover(service)`` finds at least ``n`` servers; a
    predicate for :func:`wait_for` after starting SeDs: a SeD is "ready" once
    it listens, before its registration reached the MA, so the MA may still
    answer that nobody offers ``service`` (``ServiceNotFound``, or
    ``NoServerAvailable`` once ``discover`` stopped retrying a rebuilding
    MA): not yet, rather than an error."""
    try:
        return len(client.discover(service, max(n, 10))) >= n
    except (ServiceNotFound, NoServerAvailable):
        return False


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.02) -> None:
    """Poll ``predicate`` until true or raise Timeout naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            raise Timeout(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
