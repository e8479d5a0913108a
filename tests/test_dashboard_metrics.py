"""/metrics: a prometheus_client collector, read back with Prometheus' own parser."""
from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from gridrpc.core.events import LATENCY_BOUNDS, Event, EventKind, EventLog
from gridrpc.dashboard.app import add_dashboard_routes
from gridrpc.dashboard.metrics import GridCollector, make_registry, render
from gridrpc.dashboard.stream import EventHub

K = EventKind


def tree(n_seds: int = 3, weird: str | None = None) -> list[dict]:
    out = [{"name": "MA", "kind": "ma", "parent": None, "state": "alive", "last_heartbeat": 1000.0,
            "load": {"children": 2}},
           {"name": "LA1", "kind": "la", "parent": "MA", "state": "alive", "last_heartbeat": 999.0, "load": {}}]
    for i in range(n_seds):
        out.append({"name": f"sed-{i}", "kind": "sed", "parent": "LA1", "services": ["add", "sleep"],
                    "state": "lost" if i == 2 else "alive", "last_heartbeat": 998.0,
                    "load": {"num_running": i, "num_waiting": 2 * i, "free_cpu": 0.5, "completed": 10 * i}})
    if weird:
        out.append({"name": weird, "kind": "sed", "parent": "LA1", "services": [], "state": "alive",
                    "last_heartbeat": 998.0, "load": {"num_running": 1, "num_waiting": 0}})
    return out


def filled_log() -> EventLog:
    log = EventLog()
    for i, d in enumerate([0.004, 0.02, 0.3, 0.3, 7.0]):
        log.append(Event(K.CALL_STARTED, 1.0, "sed-0", id=f"r{i}", service="add", user="alice", duration=0.5), 1000.0)
        log.append(Event(K.CALL_FINISHED, 1.0, "sed-0", id=f"r{i}", service="add", user="alice", duration=d), 1000.0)
    log.append(Event(K.CALL_FAILED, 1.0, "sed-1", id="x", service="sleep", user="bob", duration=1.0), 1000.0)
    log.append(Event(K.CALL_PREEMPTED, 1.0, "sed-1", id="y", service="sleep", user="bob", duration=1.0,
                     optional=True), 1000.0)
    log.append(Event(K.DISCOVERY_ANSWERED, 1.0, "MA", id="z", service="add", server="sed-0", duration=0.002), 1000.0)
    return log


def families(text: str) -> dict:
    fams = list(text_string_to_metric_families(text))
    names = [f.name for f in fams]
    assert len(names) == len(set(names)), f"a family appears twice: {names}"
    return {f.name: f for f in fams}


def scrape(**kw) -> tuple[str, dict]:
    c = GridCollector(tree_source=kw.pop("tree_source", lambda: tree()),
                      statistics=lambda: {"discoveries": 7, "discoveries_timed_out": 1, "bad_messages": 2},
                      clock=lambda: 1000.0, **kw)
    text = render(make_registry(c)).decode()
    return text, families(text)


def test_each_family_once_typed_with_help():
    hub = EventHub(filled_log())
    text, fams = scrape(event_log=hub.log, hub=hub)
    expected = {
        "gridrpc_elements": "gauge", "gridrpc_services": "gauge", "gridrpc_element_up": "gauge",
        "gridrpc_element_heartbeat_age_seconds": "gauge", "gridrpc_sed_running": "gauge",
        "gridrpc_sed_waiting": "gauge", "gridrpc_sed_free_cpu": "gauge", "gridrpc_sed_completed": "counter",
        "gridrpc_discoveries": "counter", "gridrpc_discoveries_timed_out": "counter",
        "gridrpc_bad_messages": "counter", "gridrpc_calls": "counter",
        "gridrpc_call_duration_seconds": "histogram", "gridrpc_call_wait_seconds": "summary",
        "gridrpc_discovery_duration_seconds": "summary", "gridrpc_user_calls": "counter",
        "gridrpc_user_optional_calls": "counter", "gridrpc_events": "counter",
        "gridrpc_event_subscribers": "gauge", "gridrpc_events_dropped": "counter"}
    for name, typ in expected.items():
        assert fams[name].type == typ, name
        assert fams[name].documentation, f"{name} has no HELP"
    assert not [f for f in fams.values() if f.type == "unknown"]
    for f in fams.values():                   # process_* included; every family documented
        assert f.documentation
    assert "# HELP gridrpc_sed_running " in text and "# TYPE gridrpc_sed_waiting gauge" in text


def test_values_of_the_metrics_exported_before_and_the_new_ones():
    hub = EventHub(filled_log())
    _, fams = scrape(event_log=hub.log, hub=hub)
    val = lambda name, **labels: next(s.value for f in fams.values() for s in f.samples  # noqa: E731
                                      if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))
    assert val("gridrpc_elements", kind="sed") == 3 and val("gridrpc_elements", kind="la") == 1
    assert val("gridrpc_services") == 2
    assert val("gridrpc_discoveries_total") == 7 and val("gridrpc_discoveries_timed_out_total") == 1
    assert val("gridrpc_bad_messages_total") == 2
    assert val("gridrpc_sed_running", sed="sed-2") == 2 and val("gridrpc_sed_waiting", sed="sed-2") == 4
    assert val("gridrpc_element_up", element="sed-2") == 0 and val("gridrpc_element_up", element="sed-1") == 1
    assert val("gridrpc_element_heartbeat_age_seconds", element="sed-0") == 2.0
    assert val("gridrpc_calls_total", service="add", outcome="finished") == 5
    assert val("gridrpc_calls_total", service="sleep", outcome="failed") == 1
    assert val("gridrpc_calls_total", service="sleep", outcome="preempted") == 1
    assert val("gridrpc_user_calls_total", user="bob", outcome="failed") == 1
    assert val("gridrpc_user_optional_calls_total", user="bob", outcome="preempted") == 1
    assert val("gridrpc_events_total", kind="call_finished") == 5
    assert val("gridrpc_call_wait_seconds_count", service="add") == 5
    assert val("gridrpc_discovery_duration_seconds_sum", service="add") == 0.002
    # the histogram: cumulative buckets, +Inf = count, the sum of the run times
    h = fams["gridrpc_call_duration_seconds"]
    buckets = [(s.labels["le"], s.value) for s in h.samples if s.name.endswith("_bucket")
               and s.labels["service"] == "add"]
    assert len(buckets) == len(LATENCY_BOUNDS) + 1 and buckets[-1] == ("+Inf", 5)
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)
    assert dict(buckets)["0.005"] == 1 and dict(buckets)["0.5"] == 4 and dict(buckets)["5.0"] == 4
    assert val("gridrpc_call_duration_seconds_count", service="add") == 5
    assert abs(val("gridrpc_call_duration_seconds_sum", service="add") - 7.624) < 1e-9


def test_label_values_are_escaped():
    weird = 'sed"x\\y\nz'
    text, fams = scrape(tree_source=lambda: tree(weird=weird))
    assert 'gridrpc_sed_running{sed="sed\\"x\\\\y\\nz"} 1.0' in text
    got = {s.labels["sed"] for s in fams["gridrpc_sed_running"].samples}
    assert weird in got


def test_without_an_event_log_only_the_tree():
    _, fams = scrape()
    assert "gridrpc_calls" not in fams and "gridrpc_sed_running" in fams


def test_metrics_route():
    async def main():
        app = web.Application()
        dash = add_dashboard_routes(app, tree_source=lambda: tree(), statistics=lambda: {"discoveries": 3},
                                    services=lambda: {"add": {}, "sleep": {}, "echo": {}})
        dash.hub.emit(Event(K.CALL_FINISHED, 1.0, "sed-0", service="add", duration=0.1))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with aiohttp.ClientSession() as s:
                async with s.get(f"http://127.0.0.1:{port}/metrics") as r:
                    assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
                    text = await r.text()
        finally:
            await runner.cleanup()
        fams = families(text)
        assert fams["gridrpc_services"].samples[0].value == 3
        assert fams["gridrpc_discoveries"].samples[0].value == 3
        assert any(s.value == 1 for s in fams["gridrpc_calls"].samples)
    asyncio.run(main())


def test_grafana_dashboard_uses_only_exported_metrics():
    import json
    import re
    from pathlib import Path
    dash = json.loads((Path(__file__).resolve().parent.parent / "deployments" / "grafana-gridrpc.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) > 20
    hub = EventHub(filled_log())
    _, fams = scrape(event_log=hub.log, hub=hub)
    samples = {s.name for f in fams.values() for s in f.samples}
    used = {m for e in exprs for m in re.findall(r"\b((?:gridrpc|process)_[a-z_]+)\b", e)}
    assert used and not used - samples, f"not exported: {sorted(used - samples)}"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
