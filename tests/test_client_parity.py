"""The asyncio client (gridrpc.Client over AsyncClient) and the gevent
load-test client (GreenClient) drive the same call machine
(gridrpc.core.client_call.machine): the same scenarios, run against both on real daemons
(``gridrpc ma|la|sed`` subprocesses), must end the same way — discovery,
failover when a SeD dies, a transient ``no_server`` / ``rebuilding`` answer
of the MA retried until the call's deadline, the call's own timeout giving
Timeout (also when the MA is silent), ServiceNotFound for a service nobody
offers, and an overloaded tree whose calls end done or by their own timeout.

The green client runs in this (unpatched) process: it needs no
monkey-patching, only a gevent hub, which waits run in."""
from __future__ import annotations

import asyncio
import collections
import re
import signal
import threading
import time

import pytest

import gridrpc
from tests.proc_tree import ProcTree

pytestmark = pytest.mark.timeout(120)

gevent = pytest.importorskip("gevent")


class GreenSide:
    """GreenClient: calls run in greenlets; waits go through the hub."""
    name = "green"

    def __init__(self, ma: str, **kw) -> None:
        from gridrpc.loadtest.green import GreenClient
        self.client = GreenClient(ma, **kw)

    def call(self, service, *args, **kw):
        return self.client.call(service, *args, **kw)

    def start(self, service, *args, **kw):
        return gevent.spawn(self.client.call, service, *args, **kw)

    def server_of(self, handle) -> str | None:
        for flight in list(self.client._driver.flights.values()):
            if flight.machine.server:
                return flight.machine.server
        return None

    def result(self, handle, timeout: float):
        return handle.get(timeout=timeout)

    def final_server(self, handle) -> str:
        return self.client.last.server

    def pause(self, seconds: float) -> None:
        gevent.sleep(seconds)

    def close(self) -> None:
        self.client.close()


class AsyncioSide:
    """gridrpc.Client: the AsyncClient on its loop thread."""
    name = "asyncio"

    def __init__(self, ma: str, **kw) -> None:
        self.client = gridrpc.Client(ma, **kw)

    def call(self, service, *args, **kw):
        return self.client.call(service, *args, **kw)

    def start(self, service, *args, **kw):
        return self.client.submit(service, *args, **kw)

    def server_of(self, handle) -> str | None:
        return handle.server

    def result(self, handle, timeout: float):
        return handle.result(timeout)

    def final_server(self, handle) -> str:
        return handle.server

    def pause(self, seconds: float) -> None:
        time.sleep(seconds)

    def close(self) -> None:
        self.client.close()


SIDES = {"green": GreenSide, "asyncio": AsyncioSide}


@pytest.fixture(params=sorted(SIDES))
def side(request):
    made = []

    def make(ma: str, **kw):
        s = SIDES[request.param](ma, **kw)
        made.append(s)
        return s
    make.name = request.param
    yield make
    for s in made:
        s.close()


@pytest.fixture(scope="module")
def shared_tree(tmp_path_factory):
    """MA -> LA -> 2 SeDs (single slot), for the scenarios that leave the tree as it was."""
    with ProcTree(tmp_path_factory.mktemp("parity"), hb=(0.3, 1.5)) as pt:
        ma = pt.start("ma", "MA")
        la = pt.start("la", "LA1", parent=ma.address)
        for i in (1, 2):
            pt.sed(f"s{i}", la.address, "--max-concurrent", "1")
        _wait_discoverable(ma.address, "add", 2)
        yield ma


def _wait_discoverable(ma: str, service: str, n: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    with gridrpc.Client(ma, discovery_timeout=2) as c:
        while True:
            try:
                if len(c.discover(service, 10)) >= n:
                    return
            except gridrpc.GridRPCError:
                pass
            assert time.monotonic() < deadline, f"{n} servers of {service} not discoverable"
            time.sleep(0.05)


def _later(seconds: float, fn) -> threading.Timer:
    t = threading.Timer(seconds, fn)
    t.daemon = True
    t.start()
    return t


# -- the tree as it is -------------------------------------------------------------------------

def test_call_with_discovery(side, shared_tree):
    c = side(shared_tree.address, timeout=10)
    assert c.call("add", 2, 3) == 5
    assert [c.call("add", i, 1) for i in range(20)] == [i + 1 for i in range(20)]


def test_the_calls_own_timeout_gives_timeout(side, shared_tree):
    c = side(shared_tree.address, timeout=10)
    t0 = time.monotonic()
    with pytest.raises(gridrpc.Timeout):
        c.call("sleep", 3.0, timeout=0.4)
    assert time.monotonic() - t0 < 2.0


def test_a_service_nobody_offers_is_service_not_found_at_once(side, shared_tree):
    c = side(shared_tree.address, timeout=10)
    t0 = time.monotonic()
    with pytest.raises(gridrpc.ServiceNotFound):
        c.call("no_such_service", 1)
    assert time.monotonic() - t0 < 3.0          # permanent: not retried until the 10 s deadline


# -- the tree changes under the call -----------------------------------------------------------

def test_failover_when_the_sed_running_the_call_dies(side, tmp_path):
    with ProcTree(tmp_path, hb=(0.3, 3.0)) as pt:
        ma = pt.start("ma", "MA")
        seds = {f"s{i}": pt.sed(f"s{i}", ma.address, "--max-concurrent", "1") for i in (1, 2)}
        _wait_discoverable(ma.address, "sleep", 2)
        c = side(ma.address, timeout=20, ping_interval=0.1, ping_timeout=0.5)
        h = c.start("sleep", 1.0)
        deadline = time.monotonic() + 5
        while (victim := c.server_of(h)) is None:
            assert time.monotonic() < deadline, "the call was never sent"
            c.pause(0.01)
        c.pause(0.2)
        seds[victim].signal(signal.SIGKILL)
        assert c.result(h, 15) == 1.0               # idempotent: run again on the other SeD
        assert c.final_server(h) == ({"s1", "s2"} - {victim}).pop()


def test_transient_no_server_is_retried_until_the_deadline(side, tmp_path):
    """The LA is frozen (SIGSTOP, shorter than its heartbeat timeout): the MA
    asks it and answers ``no_server ... (late: LA1 ...)``, as under overload on
    a large host. The call retries with backoff and succeeds once the LA
    answers again, within its own timeout."""
    with ProcTree(tmp_path, hb=(0.5, 8.0)) as pt:
        ma = pt.start("ma", "MA", "--no-view")
        la = pt.start("la", "LA1", "--no-view", parent=ma.address)
        pt.sed("s1", la.address)
        _wait_discoverable(ma.address, "add", 1)
        c = side(ma.address, timeout=10)
        la.signal(signal.SIGSTOP)
        with gridrpc.Client(ma.address) as probe:      # the MA really says no_server now
            with pytest.raises(gridrpc.NoServerAvailable, match=r"(late|silent): LA1"):
                probe.discover("add", 1)
        _later(1.0, lambda: la.signal(signal.SIGCONT))
        t0 = time.monotonic()
        assert c.call("add", 20, 22) == 42
        assert 0.9 < time.monotonic() - t0 < 8.0


def test_no_server_until_the_deadline_gives_timeout(side, tmp_path):
    with ProcTree(tmp_path, hb=(0.5, 8.0)) as pt:
        ma = pt.start("ma", "MA", "--no-view")
        la = pt.start("la", "LA1", "--no-view", parent=ma.address)
        pt.sed("s1", la.address)
        _wait_discoverable(ma.address, "add", 1)
        c = side(ma.address, timeout=10)
        la.signal(signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(gridrpc.Timeout, match=r"(late|silent): LA1") as exc:
            c.call("add", 1, 2, timeout=1.0)
        # retried with backoff (50 ms doubling, jittered) while a retry could still start before the
        # deadline: several attempts, then the call's Timeout naming the last answer
        assert 0.3 < time.monotonic() - t0 < 3.0
        assert int(re.search(r"after (\d+) discovery attempt", str(exc.value)).group(1)) >= 3
        la.signal(signal.SIGCONT)


def test_a_rebuilding_ma_is_retried_until_the_sed_is_back(side, tmp_path):
    with ProcTree(tmp_path, hb=(0.3, 1.0)) as pt:
        ma = pt.start("ma", "MA", "--rebuild-time", "6")
        c = side(ma.address, timeout=10)
        _later(0.8, lambda: pt.sed("s1", ma.address))
        t0 = time.monotonic()
        assert c.call("add", 1, 2) == 3
        assert time.monotonic() - t0 > 0.7


def test_a_silent_ma_gives_the_calls_timeout(side, tmp_path):
    with ProcTree(tmp_path, hb=(0.5, 8.0)) as pt:
        ma = pt.start("ma", "MA")
        pt.sed("s1", ma.address)
        _wait_discoverable(ma.address, "add", 1)
        c = side(ma.address, timeout=10, reuse_discovery=0)
        ma.signal(signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(gridrpc.Timeout):
            c.call("add", 1, 2, timeout=1.0)
        assert 0.8 < time.monotonic() - t0 < 3.0
        ma.signal(signal.SIGCONT)


# -- overload ----------------------------------------------------------------------------------

USERS, SECONDS, TASK, TIMEOUT = 24, 3.0, 0.05, 0.25


def _green_users(ma: str) -> list[tuple[str, float, float]]:
    from gridrpc.loadtest.green import GreenClient
    out: list = []
    stop = time.monotonic() + SECONDS

    def user(i):
        with GreenClient(ma, user=f"u{i}", timeout=TIMEOUT) as c:
            while time.monotonic() < stop:
                t0 = time.monotonic()
                try:
                    c.call("sleep", TASK)
                    out.append(("ok", t0, time.monotonic()))
                except gridrpc.GridRPCError as exc:
                    out.append((type(exc).__name__, t0, time.monotonic()))
    gevent.joinall([gevent.spawn(user, i) for i in range(USERS)], timeout=SECONDS + 20, raise_error=True)
    return out


def _asyncio_users(ma: str) -> list[tuple[str, float, float]]:
    out: list = []

    async def main():
        stop = time.monotonic() + SECONDS

        async def user(i):
            async with gridrpc.AsyncClient(ma, user=f"u{i}", timeout=TIMEOUT) as c:
                while time.monotonic() < stop:
                    t0 = time.monotonic()
                    try:
                        await c.call("sleep", TASK)
                        out.append(("ok", t0, time.monotonic()))
                    except gridrpc.GridRPCError as exc:
                        out.append((type(exc).__name__, t0, time.monotonic()))
        await asyncio.wait_for(asyncio.gather(*(user(i) for i in range(USERS))), SECONDS + 20)
    asyncio.run(main())
    return out


@pytest.mark.parametrize("which", ["green", "asyncio"])
def test_overload_ends_every_call_done_or_by_its_own_timeout(which, shared_tree):
    """24 closed-loop users on 2 single-slot SeDs, calls of 50 ms with a 250 ms
    timeout: the tree can serve 40 calls/s, the users ask for ~100. Every call
    ends with its value or with Timeout at its own deadline — never
    NoServerAvailable or CommunicationError while both servers are up."""
    out = (_green_users if which == "green" else _asyncio_users)(shared_tree.address)
    kinds = collections.Counter(k for k, _, _ in out)
    print(f"\n[{which}] {dict(kinds)}")
    assert kinds["ok"] >= 5 and kinds["Timeout"] >= 20, kinds      # served, and overloaded for real
    assert set(kinds) == {"ok", "Timeout"}, kinds
    for k, t0, t1 in out:
        if k == "Timeout":
            assert TIMEOUT - 0.02 <= t1 - t0 < TIMEOUT + 1.0, (t0, t1)
