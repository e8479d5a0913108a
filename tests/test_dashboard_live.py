"""The dashboard of a real tree under a real locust load, in headless Chromium:
the MA's own HTTP server, events from real SeDs (through an LA), a bounded
`gridrpc loadtest` run; the page shows the tree, the calls per second and the
service without reloading. `GRIDRPC_SCREENSHOT=docs/dashboard.png` refreshes
the screenshot in the docs."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from gridrpc.testing import LocalTree
from tests.test_dashboard_browser import CHROMIUM_ARGS, _chromium

pytestmark = [pytest.mark.real, pytest.mark.timeout(240)]


def _locust(load: subprocess.Popen) -> list[psutil.Process]:
    try:
        kids = psutil.Process(load.pid).children(recursive=True)
    except psutil.Error:
        return []
    out = []
    for p in kids:
        try:
            if "-m locust" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            pass
    return out


def _stop_locust(load: subprocess.Popen) -> None:
    """End the run now, as at its time limit: SIGTERM to the locust process
    (it stops its users, writes the summary and exits), so that ``gridrpc
    loadtest`` reports and exits by itself. Waits for locust to exist
    (``gridrpc loadtest`` starts it in a session of its own)."""
    deadline = time.monotonic() + 30
    while load.poll() is None and time.monotonic() < deadline:
        procs = _locust(load)
        if procs:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            return
        time.sleep(0.05)


def test_dashboard_of_a_real_tree_under_locust_load():
    exe = _chromium()
    from playwright.sync_api import sync_playwright
    with LocalTree(las=2, seds_per_la=2, http=True) as t:
        url = t.http_url
        # paced (--wait 0.5 s: 8 users, ~16 calls/s) and bounded by a time the page never outlasts: the
        # load runs while the page is looked at, however slow the browser, and is stopped once it was;
        # unpaced, the 2 cores go to locust and the tree, and the run could end before the page is up
        load = subprocess.Popen([sys.executable, "-m", "gridrpc", "loadtest", t.ma_address, "-u", "8", "-t", "120s",
                                 "-n", "100000", "--wait", "0.5", "--mix", "add:4,echo:1"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
                    shot_to = os.environ.get("GRIDRPC_SCREENSHOT")
                    if shot_to:
                        page.wait_for_timeout(1500)         # the docs' picture: charts a little fuller
                    shot = Path(shot_to or Path(tempfile.mkdtemp(prefix="gridrpc-shot-")) / "dashboard.png")
                    page.screenshot(path=str(shot), full_page=True)
                    assert shot.stat().st_size > 10_000
                    assert not errors, errors
                finally:
                    browser.close()
        finally:
            _stop_locust(load)
            try:
                out, err = load.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                for p in _locust(load):
                    p.kill()
                load.kill()
                out, err = load.communicate(timeout=10)
    # 0: locust wrote its summary, some requests completed, none failed beyond the allowed ratio
    assert load.returncode == 0, out[-2000:] + err[-2000:]
