"""The dashboard of a real tree under a real locust load, in headless Chromium:
the MA's own HTTP server, events from real SeDs (through an LA), a bounded
`gridrpc loadtest` run; the page shows the tree, the calls per second and the
service without reloading. `GRIDRPC_SCREENSHOT=docs/dashboard.png` refreshes
the screenshot in the docs."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gridrpc.testing import LocalTree
from tests.test_dashboard_browser import CHROMIUM_ARGS, _chromium

pytestmark = [pytest.mark.real, pytest.mark.timeout(240)]


def test_dashboard_of_a_real_tree_under_locust_load():
    exe = _chromium()
    from playwright.sync_api import sync_playwright
    with LocalTree(las=2, seds_per_la=2, http=True) as t:
        url = t.http_url
        # paced (--wait) so that the load still runs when a slow browser (a loaded CI host) looks:
        # unpaced, 4,000 requests could be over before the page is up, and the rate back at 0
        load = subprocess.Popen([sys.executable, "-m", "gridrpc", "loadtest", t.ma_address, "-u", "8", "-t", "40s",
                                 "-n", "4000", "--wait", "0.05", "--mix", "add:4,echo:1"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
                try:
                    page = browser.new_page(viewport={"width": 1440, "height": 1000})
                    errors: list[str] = []
                    page.on("pageerror", lambda e: errors.append(str(e)))
                    page.goto(url + "/")
                    page.wait_for_function("() => document.querySelectorAll('#tree g.node').length === 7",
                                           timeout=20000)
                    names = page.eval_on_selector_all("#tree g.node text.name", "ns => ns.map(n => n.textContent)")
                    assert sorted(names) == sorted(["MA", "LA1", "LA2", *t.sed_names()])
                    page.evaluate("window.__noReload = 7")
                    # live numbers from the real SeDs' events (relayed by the LAs), no reload
                    page.wait_for_function(
                        "() => parseFloat(document.getElementById('calls-per-s').textContent) > 1", timeout=30000)
                    page.wait_for_function("() => [...document.querySelectorAll('#services tbody td:first-child')]"
                                           ".some(td => td.textContent === 'add')", timeout=20000)
                    users = page.eval_on_selector_all("#users tbody td:first-child", "ns => ns.map(n => n.textContent)")
                    assert users, "no user in the users table"
                    assert page.evaluate("window.__noReload") == 7
                    page.wait_for_timeout(1500)
                    shot = Path(os.environ.get("GRIDRPC_SCREENSHOT") or
                                Path(tempfile.mkdtemp(prefix="gridrpc-shot-")) / "dashboard.png")
                    page.screenshot(path=str(shot), full_page=True)
                    assert shot.stat().st_size > 10_000
                    assert not errors, errors
                finally:
                    browser.close()
        finally:
            try:
                load.wait(60)
            except subprocess.TimeoutExpired:
                load.kill()
                load.wait(10)
    assert load.returncode == 0, load.stderr[-2000:]
