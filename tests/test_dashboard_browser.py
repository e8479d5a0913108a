"""The dashboard in a real headless Chromium (Playwright): an in-process tree,
the dashboard routes on an aiohttp app of the tree's loop, events emitted into
its log; the page must draw the tree, then show live numbers as events arrive,
without reloading.

Needs Debian's ``chromium`` (``/usr/bin/chromium``, or ``$GRIDRPC_CHROMIUM``)
and the ``playwright`` package. Without them the test is skipped, or fails
when ``GRIDRPC_REQUIRE_REAL=1``. The screenshot goes to ``$GRIDRPC_SCREENSHOT``
when set (``GRIDRPC_SCREENSHOT=docs/dashboard.png`` refreshes the one in the
docs), else to the test's temporary directory.
"""
from __future__ import annotations

import math
import os
import random
import time
from pathlib import Path

import pytest
from aiohttp import web

import gridrpc
from gridrpc.core.events import EventKind as K
from gridrpc.core.events import make_event
from gridrpc.dashboard.app import add_dashboard_routes
from gridrpc.testing import LocalTree

pytestmark = [pytest.mark.real, pytest.mark.timeout(240)]

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
HOSTILE = '<img src=x onerror="document.title=\'pwned\'">'


def _chromium() -> str:
    require = os.environ.get("GRIDRPC_REQUIRE_REAL") == "1"
    exe = os.environ.get("GRIDRPC_CHROMIUM", "/usr/bin/chromium")
    problem = None
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        problem = "the playwright package is not installed (pip install playwright)"
    if problem is None and not os.access(exe, os.X_OK):
        problem = (f"Chromium not found at {exe}: apt-get install -y chromium "
                   "(or set GRIDRPC_CHROMIUM to a Chromium binary)")
    if problem:
        if require:
            pytest.fail(f"GRIDRPC_REQUIRE_REAL=1 but {problem}")
        pytest.skip(problem)
    return exe


SERVICES = {"add": 0.004, "dgemm": 0.35, "sleep": 1.2, "echo": 0.02}
USERS = ["alice", "bob", "carol", "dave"]


def _calls(rng: random.Random, now: float, n: int, seds: list[str], t_event: float):
    """The events of n calls ending around ``t_event`` (some fail, some optional)."""
    out = []
    for _ in range(n):
        svc = rng.choice(list(SERVICES))
        user = rng.choices(USERS, weights=[4, 3, 2, 1])[0]
        sed = rng.choice(seds)
        rid = f"{rng.getrandbits(48):012x}:{rng.randrange(1, 999)}"
        run = SERVICES[svc] * rng.lognormvariate(0, 0.35)
        optional = user == "dave" and rng.random() < 0.6
        common = dict(id=rid, user=user, service=svc, server=sed, optional=optional)
        out.append(make_event(K.DISCOVERY_ASKED, t_event - run - 0.02, "MA", id=rid, user=user, service=svc))
        out.append(make_event(K.DISCOVERY_ANSWERED, t_event - run - 0.019, "MA", id=rid, user=user, service=svc,
                              server=sed, duration=0.0012))
        out.append(make_event(K.CALL_QUEUED, t_event - run - 0.01, sed, **common))
        out.append(make_event(K.CALL_STARTED, t_event - run, sed, duration=0.01 * rng.random(), **common))
        r = rng.random()
        if svc == "echo" and r < 0.08:
            out.append(make_event(K.CALL_FAILED, t_event, sed, duration=run,
                                  detail="RemoteError: ValueError: bad input " + HOSTILE, **common))
        elif optional and r < 0.25:
            out.append(make_event(K.CALL_PREEMPTED, t_event, sed, duration=run,
                                  detail="preempted by a mandatory call", **common))
        else:
            out.append(make_event(K.CALL_FINISHED, t_event, sed, duration=run, **common))
    return out


def test_dashboard_in_chromium(tmp_path):
    exe = _chromium()
    from playwright.sync_api import sync_playwright

    with LocalTree(las=2, seds_per_la=2, http=True) as tree:
        state = {}

        async def mount():
            app = web.Application()
            dash = add_dashboard_routes(app, tree_source=tree.ma.tree, statistics=tree.ma.statistics,
                                        services=tree.ma.registry.catalogue, name=tree.ma.name)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            state.update(dash=dash, runner=runner, url=f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}")
        tree.lt.run(mount())
        dash, url = state["dash"], state["url"]
        seds = tree.sed_names()
        rng = random.Random(7)

        # history: the last 5 minutes, ending 30 s ago (so calls/s starts at 0)
        def backfill():
            now = time.time()
            for name in ["LA1", "LA2", *seds]:
                dash.log.append(make_event(K.REGISTERED, now - 310, name, detail="joined"), now - 310)
            for k in range(56):
                t = now - 310 + 5 * k
                n = int(6 + 5 * math.sin(k / 6) + rng.random() * 3)
                for e in _calls(rng, now, n, seds, t):
                    dash.log.append(e, t)
        tree.lt.call(backfill)

        client = gridrpc.Client(tree.ma_address, user="alice")
        running = [client.submit("sleep", 6) for _ in range(6)]     # real load on the SeDs
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
                try:
                    page = browser.new_page(viewport={"width": 1440, "height": 1000})
                    errors: list[str] = []
                    page.on("pageerror", lambda e: errors.append(str(e)))
                    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                    page.goto(url + "/")
                    # 1. the tree is drawn: MA, 2 LAs, 4 SeDs, with their names
                    page.wait_for_function("() => document.querySelectorAll('#tree g.node').length === 7", timeout=15000)
                    names = page.eval_on_selector_all("#tree g.node text.name", "ns => ns.map(n => n.textContent)")
                    assert sorted(names) == sorted(["MA", "LA1", "LA2", *seds])
                    assert page.locator("#tree path.edge").count() == 6
                    page.wait_for_function("() => document.getElementById('conn').dataset.state === 'live'", timeout=15000)
                    ma_info = page.text_content("#tree g.node.ma text.info")
                    assert "root" in ma_info and "-0.0s" not in ma_info
                    # history loaded, but nothing in the last seconds
                    page.wait_for_function("() => document.querySelectorAll('#services tbody tr td').length > 4",
                                           timeout=10000)
                    assert float(page.text_content("#calls-per-s")) == 0
                    page.evaluate("window.__noReload = 42")

                    # 2. live events arrive: numbers move without a reload
                    def live_burst():
                        now = time.time()
                        for e in _calls(rng, now, 40, seds, now):
                            dash.hub.emit(e)
                    tree.lt.call(live_burst)
                    page.wait_for_function("() => parseFloat(document.getElementById('calls-per-s').textContent) > 0",
                                           timeout=10000)
                    assert page.evaluate("window.__noReload") == 42
                    page.wait_for_function("() => document.querySelectorAll('#feed li .k').length >= 40", timeout=10000)
                    feed_kinds = set(page.eval_on_selector_all("#feed li .k", "ns => ns.map(n => n.textContent)"))
                    assert {"call_finished", "call_started", "call_queued"} <= feed_kinds
                    services = page.eval_on_selector_all("#services tbody td:first-child",
                                                         "ns => ns.map(n => n.textContent)")
                    assert set(services) == set(SERVICES)
                    users = page.eval_on_selector_all("#users tbody td:first-child", "ns => ns.map(n => n.textContent)")
                    assert set(users) == set(USERS)
                    # the real load of the SeDs shows (sleep calls running)
                    page.wait_for_function("() => parseInt(document.getElementById('kpi-running').textContent) > 0",
                                           timeout=15000)
                    # 3. hostile text stays text
                    page.wait_for_function("() => document.querySelectorAll('#errors li .k').length > 0", timeout=10000)
                    assert page.locator("#errors img, #feed img").count() == 0
                    assert HOSTILE in page.text_content("#errors")
                    assert page.title() != "pwned"
                    # charts were drawn (pixels on the canvas)
                    painted = page.evaluate("""() => {
                        const c = document.getElementById('chart-rate');
                        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                        let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n; }""")
                    assert painted > 1000
                    page.wait_for_timeout(1200)          # let the flash animations settle
                    shot = Path(os.environ.get("GRIDRPC_SCREENSHOT") or tmp_path / "dashboard.png")
                    shot.parent.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(shot), full_page=True)
                    assert shot.stat().st_size > 20000
                    # 4. a call's story, from a click on its id
                    page.click("#feed li .idlink >> nth=0")
                    page.wait_for_selector("#story:not([hidden]) #story-events li", timeout=10000)
                    assert page.locator("#story-events li").count() >= 3
                    assert not [e for e in errors if "favicon" not in e], errors
                finally:
                    browser.close()
        finally:
            for c in running:
                c.cancel()
            client.close()
            tree.lt.run(state["runner"].cleanup())
