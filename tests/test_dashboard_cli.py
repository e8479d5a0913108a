"""``gridrpc top --once`` and ``gridrpc events`` against a real HTTP server."""
from __future__ import annotations

import argparse
import io
import json
import threading

import pytest
from aiohttp import web
from rich.console import Console

from gridrpc.core.events import Event, EventKind
from gridrpc.dashboard import follow, top
from gridrpc.dashboard.app import add_dashboard_routes
from gridrpc.dashboard.httpclient import ApiError, resolve
from gridrpc.testing import LoopThread

K = EventKind
NOW = 1_800_000_000.0
TREE = [
    {"name": "MA", "kind": "ma", "parent": None, "address": "tcp://127.0.0.1:5555", "host": "h", "pid": 1,
     "services": [], "state": "alive", "last_heartbeat": NOW, "started": NOW - 125, "load": {"children": 2}},
    {"name": "LA1", "kind": "la", "parent": "MA", "address": "tcp://127.0.0.1:6000", "host": "h", "pid": 2,
     "services": [], "state": "alive", "last_heartbeat": NOW - 0.4, "load": {"children": 1}},
    {"name": "sed-1", "kind": "sed", "parent": "LA1", "address": "tcp://127.0.0.1:6001", "host": "h", "pid": 3,
     "services": ["add"], "state": "alive", "last_heartbeat": NOW - 0.3,
     "load": {"num_running": 2, "num_waiting": 5, "free_cpu": 0.25, "completed": 17, "policy": "ethic"}},
    {"name": "sed-[bold]2", "kind": "sed", "parent": "MA", "address": "tcp://127.0.0.1:6002", "host": "h",
     "pid": 4, "services": ["add"], "state": "lost", "last_heartbeat": NOW + 3.0,   # a clock ahead of the MA's
     "load": {"num_running": 0, "num_waiting": 0}},
]


@pytest.fixture(scope="module")
def server():
    lt = LoopThread()
    state = {}

    async def start():
        app = web.Application()
        dash = add_dashboard_routes(app, tree_source=lambda: TREE, name="MA", clock=lambda: NOW)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state.update(dash=dash, runner=runner, port=site._server.sockets[0].getsockname()[1])
    lt.run(start())
    dash = state["dash"]

    def emit(e: Event) -> None:
        lt.call(dash.hub.emit, e)
    for i in range(4):
        emit(Event(K.CALL_QUEUED, NOW - 2, "sed-1", id=f"c{i}", user="alice", service="add"))
        emit(Event(K.CALL_FINISHED, NOW - 1, "sed-1", id=f"c{i}", user="alice", service="add", duration=0.25))
    emit(Event(K.CALL_FAILED, NOW - 1, "sed-1", id="bad", user="bob", service="add", duration=0.1,
               detail="ValueError: [red]boom[/red]"))
    yield {"url": f"http://127.0.0.1:{state['port']}", "hostport": f"127.0.0.1:{state['port']}",
           "emit": emit, "dash": dash}
    lt.run(state["runner"].cleanup())
    lt.close()


def ns(**kw) -> argparse.Namespace:
    return argparse.Namespace(**kw)


def test_top_once(server):
    buf = io.StringIO()
    console = Console(file=buf, width=140, color_system=None, highlight=False)
    rc = top.run(ns(ma=server["hostport"], once=True, interval=1.0, width=None), console=console)
    out = buf.getvalue()
    assert rc == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("gridrpc top MA") and server["url"] in lines[0]
    assert "elements 4" in out and "running 2" in out and "waiting 5" in out
    assert any("├─ LA1" in ln or "└─ LA1" in ln for ln in lines)
    sed = next(ln for ln in lines if "sed-1" in ln and "alive" in ln)
    assert "ethic" in sed and "25%" in sed and " 17" in sed
    assert "root, up 2m" in out                                        # the MA: no "-0.0s ago"
    lost = next(ln for ln in lines if "sed-[bold]2" in ln)             # markup in names printed as is
    assert "lost" in lost and "0.0s" in lost and "-" not in lost.split("lost")[1].split()[0]
    svc = next(ln for ln in lines if ln.startswith("add "))
    assert "250ms" in svc and svc.split()[-1] == "5" and svc.split()[-2] == "1"
    assert "alice" in out and "bob" in out
    assert "ValueError: [red]boom[/red]" in out                         # not taken as markup


def test_top_once_unreachable_and_bad_address(capsys):
    assert top.run(ns(ma="http://127.0.0.1:9", once=True, interval=1, width=80)) == 1
    assert "gridrpc top:" in capsys.readouterr().err
    assert top.run(ns(ma="not an address", once=True, interval=1, width=80)) == 2
    assert "http://HOST:PORT" in capsys.readouterr().err


def test_resolve():
    assert resolve("http://h:8080/") == "http://h:8080"
    assert resolve("10.0.0.1:8080") == "http://10.0.0.1:8080"
    with pytest.raises(ApiError, match="HTTP"):
        resolve("tcp://127.0.0.1:9")           # no MA there: a clear message, not a hang


def test_events_no_follow_and_story(server):
    out: list[str] = []
    base = dict(ma=server["url"], id=None, kinds=None, replay=3, count=None, no_follow=True, json=True)
    assert follow.run(ns(**base), out=out.append) == 0
    evs = [json.loads(x) for x in out]
    assert [e["kind"] for e in evs] == ["call_queued", "call_finished", "call_failed"]
    out.clear()
    assert follow.run(ns(**dict(base, id="c2", json=False)), out=out.append) == 0
    assert len(out) == 2 and "call_finished" in out[1] and "id=c2" in out[1] and "250.0ms" in out[1]
    assert follow.run(ns(**dict(base, id="nope")), out=out.append) == 1


def test_events_follow_until_the_call_ends(server):
    out: list[str] = []
    a = ns(ma=server["url"], id="live-1", kinds=None, replay=0, count=None, no_follow=False, json=False)
    t = threading.Thread(target=lambda: out.append(f"rc={follow.run(a, out=out.append)}"), daemon=True)
    t.start()
    hub = server["dash"].hub
    import time
    deadline = time.monotonic() + 10
    while not hub.subscribers and time.monotonic() < deadline:
        time.sleep(0.02)
    server["emit"](Event(K.CALL_QUEUED, NOW, "sed-1", id="live-1", user="carol", service="add"))
    server["emit"](Event(K.CALL_STARTED, NOW, "sed-1", id="live-1", user="carol", service="add", duration=0.01))
    server["emit"](Event(K.CALL_FINISHED, NOW, "sed-1", id="live-1", user="carol", service="add", duration=0.5))
    t.join(10)
    assert not t.is_alive()
    assert out[-1] == "rc=0" and [ln.split()[1] for ln in out[:-1]] == ["call_queued", "call_started", "call_finished"]


def test_events_count(server):
    out: list[str] = []
    a = ns(ma=server["hostport"], id=None, kinds="call_failed", replay=5, count=1, no_follow=False, json=True)
    assert follow.run(a, out=out.append) == 0
    assert json.loads(out[0])["id"] == "bad"


def test_parsers_register_like_bench():
    ap = argparse.ArgumentParser(prog="gridrpc")
    sub = ap.add_subparsers(dest="cmd")
    top.add_parser(sub)
    follow.add_parser(sub)
    a = ap.parse_args(["top", "--ma", "h:1", "--once"])
    assert a.func is top.run and a.once and a.ma == "h:1"
    a = ap.parse_args(["events", "--ma", "http://h:1", "--id", "abc", "--json"])
    assert a.func is follow.run and a.id == "abc" and a.json
    for cmd in ("top", "events"):
        with pytest.raises(SystemExit):
            ap.parse_args([cmd, "--help"])
