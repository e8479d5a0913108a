"""Events travel up a real tree: one call's whole story (discovery at the
MA, queued / started / finished on a SeD under an LA) is found by its id at
the MA's /api/events/{id}; the terminal tools read it."""
import json
import subprocess
import sys
import urllib.request

import gridrpc
from gridrpc.testing import LocalTree, wait_for


def _get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_a_calls_story_reaches_the_ma_and_the_tools():
    with LocalTree(las=1, seds_per_la=2, http=False) as t:
        # a second MA-level HTTP server is not needed: start one on the tree's MA
        t.lt.run(_start_http(t.ma))
        with gridrpc.Client(t.ma_address, user="alice") as c:
            call = c.submit("add", 2, 3)
            assert call.result(10) == 5
            bad = c.submit("fail", "boom")
            bad.exception(10)
        base = t.ma.http.url

        def story(cid):
            try:
                return [e["kind"] for e in _get(f"{base}/api/events/{cid}")["events"]]
            except urllib.error.HTTPError:
                return []
        wait_for(lambda: "call_finished" in story(call.id), 10, "the SeD's events at the MA")
        kinds = story(call.id)
        assert kinds[-3:] == ["call_queued", "call_started", "call_finished"]
        wait_for(lambda: "call_failed" in story(bad.id), 10, "the failure at the MA")
        stats = _get(f"{base}/api/stats")
        assert "add" in json.dumps(stats) and "alice" in json.dumps(stats)
        # wide: captured, the console is 80 columns, where the element names may be cut ("sed-1…")
        # depending on the other columns' contents (an MA up for minutes, loads of two digits)
        top = subprocess.run([sys.executable, "-m", "gridrpc", "top", "--ma", base, "--once", "--width", "200"],
                             capture_output=True, text=True, timeout=60)
        assert top.returncode == 0, top.stderr
        assert "elements 4" in top.stdout and "sed-1-" in top.stdout and "calls/s" in top.stdout
        ev = subprocess.run([sys.executable, "-m", "gridrpc", "events", "--ma", base, "--id", call.id, "--json"],
                            capture_output=True, text=True, timeout=60)
        assert ev.returncode == 0, ev.stderr
        got = [json.loads(line)["kind"] for line in ev.stdout.splitlines() if line.strip()]
        assert "call_finished" in got


async def _start_http(ma):
    from gridrpc.dashboard.http import StatusServer
    ma.http = StatusServer(ma, host="127.0.0.1", port=0)
    await ma.http.start()
