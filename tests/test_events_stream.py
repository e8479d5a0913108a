"""gridrpc.dashboard.stream: fan-out with bounded queues, SSE over a real
aiohttp server on 127.0.0.1, one call's story, the JSON-lines file."""
from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from aiohttp import web

from gridrpc.core.events import Event, EventKind, EventLog
from gridrpc.dashboard.app import add_dashboard_routes
from gridrpc.dashboard.stream import EventHub, JsonlWriter, Subscriber

K = EventKind
TREE = [{"name": "MA", "kind": "ma", "parent": None, "address": "tcp://127.0.0.1:1", "host": "h", "pid": 1,
         "services": [], "state": "alive", "last_heartbeat": 100.0, "load": {"children": 1}, "started": 50.0},
        {"name": "sed-1", "kind": "sed", "parent": "MA", "address": "tcp://127.0.0.1:2", "host": "h", "pid": 2,
         "services": ["add"], "state": "alive", "last_heartbeat": 99.5, "load": {"num_running": 1, "num_waiting": 0}}]


def ev(i: int, rid: str | None = None, kind: EventKind = K.CALL_QUEUED) -> Event:
    return Event(kind, 1000.0 + i, "sed-1", id=rid or f"r{i}", user="alice", service="add",
                 duration=0.01 if kind in (K.CALL_FINISHED, K.CALL_STARTED) else None)


# -- fan-out ------------------------------------------------------------------------
def test_slow_subscriber_loses_events_others_keep_up():
    async def main():
        hub = EventHub(EventLog(), queue_size=5)
        fast, slow = hub.subscribe(), hub.subscribe()
        got = []

        async def reader():
            while len(got) < 100:
                got.append(await fast.queue.get())

        task = asyncio.create_task(reader())
        t0 = time.perf_counter()
        for i in range(100):
            hub.emit(ev(i))
            if i % 4 == 3:
                await asyncio.sleep(0)          # the fast reader runs between bursts
        emit_time = time.perf_counter() - t0
        await asyncio.wait_for(task, 5)
        assert [seq for seq, _ in got] == list(range(1, 101))
        assert slow.queue.qsize() == 5 and slow.dropped == 95 and fast.dropped == 0
        assert slow.take_dropped() == 95 and slow.take_dropped() == 0
        assert hub.statistics()["dropped"] == 95
        assert emit_time < 1.0                   # nobody waited on the slow one
        hub.unsubscribe(slow)
        assert hub.statistics()["dropped"] == 95 and hub.statistics()["subscribers"] == 1
    asyncio.run(main())


def test_subscriber_filters_and_close_wakes_a_full_queue():
    async def main():
        s = Subscriber(2, request_id="r1", kinds=frozenset({K.CALL_FINISHED}))
        assert not s.offer(1, ev(1, "r2", K.CALL_FINISHED))
        assert not s.offer(2, ev(2, "r1", K.CALL_QUEUED))
        assert s.offer(3, ev(3, "r1", K.CALL_FINISHED))
        s.offer(4, ev(4, "r1", K.CALL_FINISHED))
        s.close()                                  # full queue: still wakes the reader
        from gridrpc.dashboard.stream import _CLOSED
        assert await s.queue.get() is _CLOSED and s.closed
        assert not s.offer(5, ev(5, "r1", K.CALL_FINISHED))
    asyncio.run(main())


def test_too_many_subscribers():
    async def main():
        hub = EventHub(max_subscribers=2)
        hub.subscribe(), hub.subscribe()
        with pytest.raises(OverflowError):
            hub.subscribe()
    asyncio.run(main())


# -- SSE over a real server ------------------------------------------------------------------
class Server:
    """The dashboard routes on a real aiohttp server on 127.0.0.1, port 0."""

    def __init__(self, **kw):
        self.kw = kw

    async def __aenter__(self):
        self.app = web.Application()
        self.dash = add_dashboard_routes(self.app, tree_source=lambda: TREE, name="MA", **self.kw)
        self.runner = web.AppRunner(self.app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20))
        return self

    async def __aexit__(self, *exc):
        await self.session.close()
        t0 = time.monotonic()
        await self.runner.cleanup()
        self.cleanup_time = time.monotonic() - t0


async def read_sse(resp, n: int, timeout: float = 5.0) -> list[tuple[str, str, str | None]]:
    """The next n SSE messages (event, data, id) from an aiohttp response."""
    out, event, data, eid = [], "message", [], None

    async def go():
        nonlocal event, data, eid
        while len(out) < n:
            line = (await resp.content.readline()).decode().rstrip("\n")
            if line == "" and resp.content.at_eof():
                return
            if not line:
                if data:
                    out.append((event, "\n".join(data), eid))
                event, data = "message", []
            elif line.startswith(":") or line.startswith("retry:"):
                continue
            else:
                k, _, v = line.partition(": ")
                if k == "event":
                    event = v
                elif k == "data":
                    data.append(v)
                elif k == "id":
                    eid = v
    await asyncio.wait_for(go(), timeout)
    return out


async def wait_subscribers(hub, n):
    for _ in range(500):
        if len(hub.subscribers) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the stream never subscribed")


def test_sse_live_replay_filter_and_resume():
    async def main():
        async with Server() as srv:
            hub = srv.dash.hub
            for i in range(3):
                hub.emit(ev(i))
            async with srv.session.get(srv.url + "/api/events?replay=2") as resp:
                assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
                await wait_subscribers(hub, 1)
                hub.emit(ev(3, kind=K.CALL_FINISHED))
                msgs = await read_sse(resp, 3)
            data = [json.loads(d) for _, d, _ in msgs]
            assert [d["seq"] for d in data] == [2, 3, 4]                # 2 replayed, then live
            assert data[2]["kind"] == "call_finished" and data[2]["duration"] == 0.01
            last_id = msgs[1][2]
            assert last_id == f"{hub.epoch}.3"
            # one request id: its story so far, then its live events only
            hub.emit(ev(10, "job-7"))
            async with srv.session.get(srv.url + "/api/events?id=job-7") as resp:
                await wait_subscribers(hub, 1)
                hub.emit(ev(11, "other"))
                hub.emit(ev(12, "job-7", K.CALL_FINISHED))
                msgs = await read_sse(resp, 2)
            assert [json.loads(d)["id"] for _, d, _ in msgs] == ["job-7", "job-7"]
            assert json.loads(msgs[1][1])["kind"] == "call_finished"
            # resume after a disconnect: Last-Event-ID gives what was missed
            async with srv.session.get(srv.url + "/api/events", headers={"Last-Event-ID": last_id}) as resp:
                msgs = await read_sse(resp, 4)
            assert [json.loads(d)["seq"] for _, d, _ in msgs] == [4, 5, 6, 7]
            # kinds filter, and follow=0 ends the stream after the past
            async with srv.session.get(srv.url + "/api/events?replay=100&kinds=call_finished&follow=0") as resp:
                body = await resp.text()
            assert body.count("data: ") == 2 and "call_queued" not in body
            async with srv.session.get(srv.url + "/api/events?kinds=nope") as resp:
                assert resp.status == 400
            async with srv.session.get(srv.url + "/api/events?id=../etc") as resp:
                assert resp.status == 400
    asyncio.run(main())


def test_sse_gap_and_other_epoch():
    async def main():
        async with Server(event_log=EventLog(capacity=5)) as srv:
            hub = srv.dash.hub
            for i in range(20):
                hub.emit(ev(i))
            async with srv.session.get(srv.url + "/api/events?follow=0",
                                       headers={"Last-Event-ID": f"{hub.epoch}.3"}) as resp:
                body = await resp.text()
            assert "event: gap" in body and body.count("data: {\"kind\"") == 5
            # an id of another MA run: everything the ring holds
            async with srv.session.get(srv.url + "/api/events?follow=0",
                                       headers={"Last-Event-ID": "deadbeef.17"}) as resp:
                body = await resp.text()
            assert body.count("data: {\"kind\"") == 5
    asyncio.run(main())


def test_sse_slow_reader_is_told_what_it_lost():
    async def main():
        async with Server() as srv:
            hub = srv.dash.hub
            hub.queue_size = 3
            async with srv.session.get(srv.url + "/api/events") as resp:
                await wait_subscribers(hub, 1)
                for i in range(50):              # no await: the handler cannot drain in between
                    hub.emit(ev(i))
                msgs = await read_sse(resp, 4)
            assert [m[0] for m in msgs] == ["message"] * 3 + ["dropped"]
            assert json.loads(msgs[3][1]) == {"dropped": 47}
            assert hub.statistics()["dropped"] == 47
    asyncio.run(main())


def test_open_streams_do_not_hold_up_shutdown():
    async def main():
        srv = Server()
        await srv.__aenter__()
        resp = await srv.session.get(srv.url + "/api/events")
        await wait_subscribers(srv.dash.hub, 1)
        resp2 = await srv.session.get(srv.url + "/api/events?id=abc")
        await wait_subscribers(srv.dash.hub, 2)
        await srv.__aexit__(None, None, None)
        assert srv.cleanup_time < 5 and not srv.dash.hub.subscribers
        resp.close()
        resp2.close()
    asyncio.run(main())


def test_story_endpoint_and_stats():
    async def main():
        async with Server() as srv:
            hub = srv.dash.hub
            hub.emit(Event(K.CALL_QUEUED, 1.0, "sed-1", id="c1", user="bob", service="add", server="sed-1"))
            hub.emit(Event(K.CALL_STARTED, 1.1, "sed-1", id="c1", user="bob", service="add", duration=0.1))
            hub.emit(Event(K.CALL_FAILED, 1.3, "sed-1", id="c1", user="bob", service="add", duration=0.2,
                           detail="ValueError: <b>boom</b>"))
            async with srv.session.get(srv.url + "/api/events/c1") as r:
                story = await r.json()
            assert r.status == 200 and [e["kind"] for e in story["events"]] == [
                "call_queued", "call_started", "call_failed"]
            assert story["summary"]["state"] == "failed" and story["summary"]["error"] == "ValueError: <b>boom</b>"
            async with srv.session.get(srv.url + "/api/events/unknown") as r:
                assert r.status == 404
            async with srv.session.get(srv.url + "/api/events/a%2Fb") as r:
                assert r.status in (400, 404)
            async with srv.session.get(srv.url + "/api/stats") as r:
                stats = await r.json()
            assert stats["services"]["add"]["errors"] == 1 and stats["users"]["bob"]["failed"] == 1
            assert stats["stream"]["seq"] == 3 and stats["errors"][0]["id"] == "c1"
            async with srv.session.get(srv.url + "/api/tree") as r:
                assert (await r.json())["elements"][1]["name"] == "sed-1"
            async with srv.session.get(srv.url + "/") as r:
                page = await r.text()
                assert "script-src 'self'" in r.headers["Content-Security-Policy"]
            assert "/static/app.js" in page and "<td>sed-1</td>" in page and "0.5s ago" in page
            for f in ("app.js", "style.css"):
                async with srv.session.get(srv.url + "/static/" + f) as r:
                    assert r.status == 200 and r.headers.get("X-Content-Type-Options") == "nosniff"
    asyncio.run(main())


def test_dashboard_routes_leave_an_existing_api_tree_alone():
    app = web.Application()

    async def mine(request):
        return web.json_response({"elements": []})
    app.router.add_get("/api/tree", mine)
    add_dashboard_routes(app, tree_source=lambda: TREE)         # no duplicate-route error
    assert sum(1 for r in app.router.resources() if r.canonical == "/api/tree") == 1


# -- JSON-lines file -----------------------------------------------------------------
def test_jsonl_writer_rotates_and_bounds(tmp_path):
    path = tmp_path / "events.jsonl"

    async def main():
        w = JsonlWriter(str(path), max_bytes=2000, backups=2, interval=0.01)
        hub = EventHub(EventLog(), writer=w)
        w.start()
        for i in range(100):
            hub.emit(ev(i))
        await asyncio.sleep(0.05)
        await hub.aclose()
        return w
    w = asyncio.run(main())
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["events.jsonl", "events.jsonl.1", "events.jsonl.2"]
    for p in tmp_path.iterdir():
        assert p.stat().st_size <= 2000
        for line in p.read_text().splitlines():
            d = json.loads(line)
            assert Event.from_dict(d).service == "add" and isinstance(d["seq"], int)
    last = [json.loads(x)["seq"] for x in path.read_text().splitlines()]
    assert last[-1] == 100 and w.written == 100 and w.rotations >= 2


def test_jsonl_writer_queue_is_bounded(tmp_path):
    w = JsonlWriter(str(tmp_path / "e.jsonl"), queue_size=10)
    for i in range(25):
        w.offer(i + 1, ev(i))
    assert w.dropped == 15

    async def main():
        await w.aclose()                      # never started: flushes what it holds
    asyncio.run(main())
    assert len((tmp_path / "e.jsonl").read_text().splitlines()) == 10


def test_events_file_through_add_dashboard_routes(tmp_path):
    path = tmp_path / "ev.jsonl"

    async def main():
        async with Server(events_file=str(path)) as srv:
            srv.dash.hub.emit(ev(1))
            srv.dash.hub.emit(ev(2, kind=K.CALL_FINISHED))
    asyncio.run(main())
    kinds = [json.loads(x)["kind"] for x in path.read_text().splitlines()]
    assert kinds == ["call_queued", "call_finished"]
