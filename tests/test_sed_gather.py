"""``gather`` on a real SeD (ethic queue): an idle SeD that receives optional
calls of one user and, a few milliseconds later, a mandatory call of another
runs the mandatory one first and kills nothing; without it the optional call
starts at once and is preempted."""
from __future__ import annotations

import asyncio

import pytest

import gridrpc
from gridrpc.client.aio import AsyncClient
from gridrpc.testing import LoopThread, example_sed

pytestmark = pytest.mark.timeout(60)


def _scenario(queue_options: dict) -> tuple[dict, dict]:
    lt = LoopThread()
    sed = example_sed("g", None, ["sleep"], queue="ethic", queue_options=queue_options)
    lt.run(sed.start())

    async def run():
        async with AsyncClient(None, user="a") as a, AsyncClient(None, user="b") as b:
            opt = a.submit_nowait("sleep", 0.3, optional=True, server=sed.address)
            await asyncio.sleep(0.01)
            if not queue_options:       # without gather the optional call starts at once: wait for it
                for _ in range(500):    # (a loaded machine may take longer than 10 ms to start it)
                    if any(r.scheduler.running for r in sed.replicas.values()):
                        break
                    await asyncio.sleep(0.01)
                else:
                    raise AssertionError("the optional call never started")
            mand = b.submit_nowait("sleep", 0.05, server=sed.address)
            got = {}
            for name, call in (("optional", opt), ("mandatory", mand)):
                try:
                    await call
                    got[name] = ("done", call.timing.get("started"))
                except gridrpc.GridRPCError as exc:
                    got[name] = (type(exc).__name__, None)
            return got
    try:
        return lt.run(run()), dict(sed.stats)
    finally:
        lt.run(sed.aclose())
        lt.close()


def test_without_gather_the_optional_call_is_preempted():
    got, stats = _scenario({})
    assert got["optional"][0] == "CallPreempted" and got["mandatory"][0] == "done"
    assert stats.get("preempted") == 1


def test_with_gather_the_mandatory_call_goes_first_and_nothing_is_killed():
    got, stats = _scenario({"gather": 0.05})
    assert got == {"optional": ("done", got["optional"][1]), "mandatory": ("done", got["mandatory"][1])}
    assert got["mandatory"][1] < got["optional"][1]        # the held optional call started after it
    assert not stats.get("preempted")


def test_gather_is_refused_on_a_fcfs_queue():
    with pytest.raises(gridrpc.GridRPCError):
        example_sed("f", None, ["sleep"], queue="fcfs", queue_options={"gather": 0.05})


def test_users_of_one_process_send_every_mandatory_call_before_any_optional_one():
    """run_optional / drive: the mandatory calls leave in their own batch, on the wire before the
    optional calls even exist, for every user of the process starting together; before, each user's
    batch held its mandatory and optional calls together, user after user. (What the SeD reads first
    across two sockets is up to zmq's fair queuing: the client's order is what is checked.)"""
    import time
    from gridrpc.client.futures import ServerInfo
    from gridrpc.client.optional import drive
    from gridrpc.core.dispatcher import OptionalDispatcher
    lt = LoopThread()
    sed = example_sed("o", None, ["sleep"], queue="ethic", max_concurrent=8)
    lt.run(sed.start())
    log: list = []

    def watch(client, user):
        driver = client._driver
        queue_call, send = driver._send_call, client._send

        def _send_call(flight, a):
            log.append(("queued", user, flight.context.optional))
            return queue_call(flight, a)

        def _send(address, frames):
            log.append(("sent", user, None))
            return send(address, frames)
        driver._send_call = _send_call
        driver.send = _send

    async def run():
        async with AsyncClient(None, user="a") as a, AsyncClient(None, user="b") as b:
            watch(a, "a")
            watch(b, "b")
            servers = [ServerInfo("o", sed.address)]
            dl = time.time() + 1.0
            da = OptionalDispatcher([0.05], iter([0.05] * 3), dl, ["o"])
            db = OptionalDispatcher([0.05], iter([0.05] * 3), dl, ["o"])
            await asyncio.gather(drive(a, "sleep", da, servers), drive(b, "sleep", db, servers))
    try:
        lt.run(run())
    finally:
        lt.run(sed.aclose())
        lt.close()
    first_optional = next(i for i, e in enumerate(log) if e[0] == "queued" and e[2])
    mandatory = [i for i, e in enumerate(log) if e[0] == "queued" and e[2] is False]
    assert len(mandatory) == 2 and max(mandatory) < first_optional, log
    for user in "ab":       # each user's mandatory batch went out before any optional call was queued
        m = next(i for i, e in enumerate(log) if e[:2] == ("queued", user) and e[2] is False)
        assert any(e[:2] == ("sent", user) for e in log[m:first_optional]), log


def test_a_huge_read_starts_work_before_it_is_all_admitted():
    """One read bringing more than PAUSE_CALLS calls resumes the queues every PAUSE_CALLS
    calls: the first calls start while the rest are still being admitted (before, every replica
    stayed idle until the whole read was admitted: ~0.3 s for a 7,000-call burst)."""
    from gridrpc.client.futures import ServerInfo
    from gridrpc.sed.calls.receive import PAUSE_CALLS
    lt = LoopThread()
    sed = example_sed("h", None, ["sleep"], replicas=4, isolation="inline")
    lt.run(sed.start())
    n = 3 * PAUSE_CALLS

    async def run():
        async with AsyncClient(None, user="a") as c:
            calls = [c.submit_nowait("sleep", 30, server=ServerInfo(f"h-{1 + i % 4}", sed.address))
                     for i in range(n)]           # one loop iteration: one batch, one read
            for _ in range(500):
                if sum(1 for x in calls if getattr(x, "_flight", None) is not None
                       and x._flight.machine.phase.name not in ("NEW", "WAITING")) == n:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the calls were never all sent")
            await c.cancel_calls(calls, timeout=10)
            return [x.timing for x in calls]
    try:
        timings = lt.run(run())
    finally:
        lt.run(sed.aclose())
        lt.close()
    received = [t["received"] for t in timings if t.get("received")]
    started = [t["started"] for t in timings if t.get("started")]
    assert len(received) == n and len(started) == 4          # one running call per replica
    assert min(started) < max(received)
