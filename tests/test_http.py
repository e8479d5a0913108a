"""The MA's HTTP status API."""
import json
import urllib.request

import gridrpc


def get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


def test_api_tree(tree):
    status, ctype, body = get(tree.http_url + "/api/tree")
    assert status == 200 and "json" in ctype
    elements = json.loads(body)["elements"]
    by_name = {e["name"]: e for e in elements}
    assert by_name["MA"]["kind"] == "ma" and by_name["MA"]["parent"] is None
    assert {by_name[f"LA{i}"]["kind"] for i in (1, 2)} == {"la"}
    for name in tree.sed_names():
        e = by_name[name]
        assert e["kind"] == "sed" and e["parent"] in ("LA1", "LA2")
        assert e["state"] == "alive" and "add" in e["services"]
        assert e["address"].startswith("tcp://") and isinstance(e["pid"], int)
        assert isinstance(e["last_heartbeat"], float) and "num_running" in e["load"]
        for key in ("name", "kind", "parent", "address", "host", "pid", "services", "state",
                    "last_heartbeat", "load"):
            assert key in e


def test_api_services_metrics_health_index(tree):
    with gridrpc.Client(tree.ma_address) as c:
        c.call("add", 1, 1)
    _, _, body = get(tree.http_url + "/api/services")
    services = json.loads(body)["services"]
    assert sorted(services["add"]["servers"]) == sorted(tree.sed_names())
    assert "Return x + y" in services["add"]["doc"]
    _, ctype, text = get(tree.http_url + "/metrics")
    assert "text/plain" in ctype
    assert 'gridrpc_elements{kind="sed"} 4' in text
    assert "gridrpc_discoveries_total" in text
    _, _, health = get(tree.http_url + "/healthz")
    assert json.loads(health)["status"] == "ok"
    _, ctype, page = get(tree.http_url + "/")
    assert "text/html" in ctype and "sed-1-1" in page


def _metric(text, name):
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def test_bad_messages_counted_in_metrics_and_statistics(tree):
    import zmq
    _, _, before = get(tree.http_url + "/metrics")
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(tree.ma_address)
    try:
        for frame in (b"garbage", b'{"v": 1, "type": "discover", "id": "x", "service": "add", "k": -1}'):
            s.send_multipart([frame])
            assert s.poll(3000)
            s.recv_multipart()
    finally:
        s.close()
    _, _, after = get(tree.http_url + "/metrics")
    assert _metric(after, "gridrpc_bad_messages_total") == _metric(before, "gridrpc_bad_messages_total") + 2
    st = tree.lt.call(tree.ma.statistics)
    assert st["kind"] == "ma" and st["children"] == 2 and st["bad_messages"] >= 2
    _, _, body = get(tree.http_url + "/api/tree")
    ma = next(e for e in json.loads(body)["elements"] if e["name"] == "MA")
    assert ma["load"]["bad_messages"] >= 2 and ma["load"]["children"] == 2
