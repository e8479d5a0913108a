"""Placement of concurrent calls: N calls sent together on M free
single-slot SeDs put at most ceil(N/M) on each, also when they come from
one client in one burst (late binding, the client's reuse of view answers,
gridrpc.client.reuse)."""
from __future__ import annotations

import asyncio
from collections import Counter

import pytest

import gridrpc
from gridrpc.testing import LocalTree

pytestmark = pytest.mark.timeout(120)

SLEEP = 0.3     # long enough for every call of a burst to be placed while the first ones run


@pytest.fixture(scope="module")
def tree():
    with LocalTree(las=2, seds_per_la=2, http=False, sed_options={"max_concurrent": 1}) as t:
        yield t


async def _burst(c, n: int) -> Counter:
    """``n`` sleep calls submitted in one go (one loop iteration); how many each server ran."""
    calls = [c.submit_nowait("sleep", SLEEP) for _ in range(n)]
    await asyncio.gather(*calls)
    return Counter(x.server for x in calls)


def test_a_burst_of_eight_on_four_single_slot_seds_puts_two_on_each(tree):
    """As ``gridrpc demo``: sequential short calls first (the MA remembers
    having chosen their servers, and those SeDs never pushed the short calls'
    end: the MA's answers show them with a waiting call that does not exist),
    then 8 calls at once; then bursts right after each other (the MA's view
    still shows the last burst's calls): every SeD serves exactly two."""
    names = sorted(tree.sed_names())

    async def go():
        spreads = []
        async with gridrpc.AsyncClient(tree.ma_address, user="burst", timeout=30) as c:
            for rnd in range(3):
                if rnd != 1:
                    for i in range(40):
                        assert await c.call("add", i, i) == 2 * i
                spreads.append(await _burst(c, 8))
            in_flight = dict(c._reuse.in_flight)
        return spreads, in_flight
    spreads, in_flight = tree.lt.run(go(), timeout=90)
    for spread in spreads:
        assert sorted(spread) == names and set(spread.values()) == {2}, spreads
    assert in_flight == {}


def test_a_burst_from_the_blocking_client_puts_two_on_each(tree):
    """``gridrpc.Client.submit`` hands each call to the client's loop in
    turn: the calls find the last answer's servers full one at a time, and
    each discovery is asked for the servers beyond those (not the same
    first three again)."""
    names = sorted(tree.sed_names())
    with gridrpc.Client(tree.ma_address, user="burst-sync", timeout=30) as c:
        for _ in range(2):
            for i in range(40):
                assert c.call("add", i, i) == 2 * i
            calls = [c.submit("sleep", SLEEP) for _ in range(8)]
            done, pending = gridrpc.wait(calls, timeout=30)
            assert not pending and all(x.result() == SLEEP for x in calls)
            spread = Counter(x.server for x in calls)
            assert sorted(spread) == names and set(spread.values()) == {2}, spread


def test_a_burst_of_six_on_four_puts_at_most_two_on_each(tree):
    async def go():
        async with gridrpc.AsyncClient(tree.ma_address, user="burst6", timeout=30) as c:
            return [await _burst(c, 6) for _ in range(2)]
    for spread in tree.lt.run(go(), timeout=60):
        assert sum(spread.values()) == 6 and max(spread.values()) <= 2 and len(spread) >= 3, spread


def test_a_call_passed_on_by_a_busy_probe_is_counted_where_it_runs(tree):
    """A kept answer shows a server free that another call keeps busy: the
    call probes it, is passed on to the next candidate, and this client
    counts it there (its in-flight count, then its recent end), not on the
    server its answer put first."""
    from dataclasses import replace

    from gridrpc.client.reuse import answer_key
    busy, free = sorted(tree.sed_names())[:2]

    def running(name: str) -> int:
        return sum(len(r.scheduler.running) for s in tree.seds for n, r in s.replicas.items() if n == name)

    async def go():
        async with gridrpc.AsyncClient(tree.ma_address, user="moved", timeout=30, reuse_discovery=30.0) as c:
            for _ in range(500):                # the last test's calls are over on both servers
                if not running(busy) and not running(free):
                    break
                await asyncio.sleep(0.01)
            long = c.submit_nowait("sleep", 60, server=busy)      # bound: not counted by the reuse
            for _ in range(500):
                if running(busy):
                    break
                await asyncio.sleep(0.01)
            found = {s.name: s for s in await c.discover("sleep", 10)}
            idle = {"num_running": 0, "num_waiting": 0, "max_concurrent": 1}
            answer = [replace(found[n], estimation=dict(found[n].estimation, **idle)) for n in (busy, free)]
            c._reuse.keep(answer_key("sleep", False, c.max_candidates, None), answer, c.loop.time())
            call = c.submit_nowait("sleep", 0.3)
            for _ in range(500):
                if call.server == free:
                    break
                await asyncio.sleep(0.01)
            during = dict(c._reuse.in_flight)
            await call
            recent = {n: c._reuse.recent(n, c.loop.time()) for n in (busy, free)}
            await long.acancel()
            return call.server, len(call.attempts), during, recent, dict(c._reuse.in_flight)
    server, attempts, during, recent, after = tree.lt.run(go(), timeout=60)
    assert server == free and attempts == 2
    assert during == {free: 1} and recent == {busy: 0, free: 1} and after == {}
