"""Pure tests of an agent's child registry (gridrpc.core.tree)."""
import pytest

from gridrpc.core.tree import ChildRegistry


def sed_header(name, services=("add",), **info):
    return {"name": name, "kind": "sed", "address": f"tcp://{name}:1", "host": "h1", "pid": 10,
            "started": 1.0, "services": [{"name": s, "doc": f"{s} doc", "params": [{"name": "x"}]}
                                         for s in services], **info}


def la_header(name, seds):
    """An agent's registration: services of its subtree, its elements flattened."""
    services = sorted({s for _, ss in seds for s in ss})
    elements = [{"name": n, "parent": name, "kind": "sed", "services": list(ss), "state": "alive"}
                for n, ss in seds]
    return {"name": name, "kind": "la", "address": f"tcp://{name}:2", "host": "h2", "pid": 20,
            "started": 2.0, "services": services, "elements": elements}


def test_register_and_query():
    r = ChildRegistry("MA")
    assert r.version == 0 and r.offering("add") == []
    r.register(b"r1", sed_header("sed-1", ["add", "sleep"]), now=1.0)
    r.register(b"r2", sed_header("sed-2", ["add"]), now=2.0)
    assert r.offering("add") == ["sed-1", "sed-2"]
    assert r.offering("sleep") == ["sed-1"]
    assert r.offering("nope") == []
    c = r.children["sed-1"]
    assert c.route == b"r1" and c.last_seen == 1.0
    assert c.info == {"kind": "sed", "address": "tcp://sed-1:1", "host": "h1", "pid": 10,
                      "started": 1.0}
    assert c.services["add"] == {"doc": "add doc", "params": [{"name": "x"}]}
    assert r.version == 2


def test_services_given_as_plain_names_and_junk_skipped():
    r = ChildRegistry("MA")
    r.register(b"r", {"name": "s", "kind": "sed", "services": ["add", {"name": "echo"}, 5,
                                                               {"doc": "no name"}, None]}, 0.0)
    assert r.children["s"].services == {"add": {"doc": "", "params": []},
                                        "echo": {"doc": "", "params": []}}


def test_version_bumps_only_on_real_changes():
    r = ChildRegistry("MA")
    r.register(b"r1", sed_header("sed-1"), now=1.0)
    v = r.version
    r.register(b"r1-new-route", sed_header("sed-1", load={"x": 1}), now=5.0)   # same shape
    assert r.version == v
    assert r.children["sed-1"].route == b"r1-new-route" and r.children["sed-1"].last_seen == 5.0
    r.register(b"r1", sed_header("sed-1", ["add", "echo"]), now=6.0)           # services changed
    assert r.version == v + 1
    r.register(b"r1", sed_header("sed-1", ["add", "echo"], started=9.0), now=7.0)  # restarted
    assert r.version == v + 2
    r.heartbeat(b"r1", {"name": "sed-1", "load": {"num_waiting": 3}}, now=8.0)
    assert r.version == v + 2                                                  # load is not shape
    assert r.remove("nobody") is False and r.version == v + 2
    assert r.remove("sed-1") is True and r.version == v + 3


def test_heartbeat_unknown_child_returns_false():
    r = ChildRegistry("MA")
    assert r.heartbeat(b"r", {"name": "ghost"}, now=1.0) is False
    assert "ghost" not in r.children


def test_heartbeat_updates_time_and_load():
    r = ChildRegistry("MA")
    r.register(b"old", sed_header("sed-1", load={"a": 1}), now=1.0)
    assert r.children["sed-1"].load == {"a": 1}
    assert r.heartbeat(b"old", {"name": "sed-1", "load": {"num_running": 1}}, now=3.0) is True
    c = r.children["sed-1"]
    assert c.route == b"old" and c.last_seen == 3.0 and c.load == {"num_running": 1}
    r.heartbeat(b"old", {"name": "sed-1", "load": "junk"}, now=4.0)
    assert c.load == {"num_running": 1} and c.last_seen == 4.0


def test_a_heartbeat_from_another_connection_does_not_take_the_child():
    """A stranger heartbeating under a live child's name used to take its
    route (and its discoveries). Now only the child's own key may move it."""
    r = ChildRegistry("MA")
    r.register(b"real", sed_header("sed-1"), now=1.0)
    assert r.heartbeat(b"rogue", {"name": "sed-1"}, now=2.0) is False
    c = r.children["sed-1"]
    assert c.route == b"real" and c.last_seen == 1.0
    r.register(b"r2", sed_header("sed-2"), now=1.0, identity="element:sed-2")
    assert r.heartbeat(b"r3", {"name": "sed-2"}, now=2.0, identity="element:sed-9") is False
    assert r.heartbeat(b"r3", {"name": "sed-2"}, now=2.0, identity="element:sed-2") is True
    assert r.children["sed-2"].route == b"r3"


def test_names_are_unique_in_the_subtree():
    r = ChildRegistry("MA")
    r.register(b"la", {"name": "LA1", "kind": "la", "services": [],
                       "elements": [{"name": "sed-1", "parent": "LA1", "kind": "sed"}]}, now=1.0)
    r.register(b"s2", sed_header("sed-2"), now=1.0)
    # a live direct child, a live descendant, the agent's own name: taken
    assert "already registered" in r.name_conflict(b"x", sed_header("sed-2"), None, now=2.0, live_for=3.0)
    why = r.name_conflict(b"x", sed_header("sed-1"), None, now=2.0, live_for=3.0)
    assert "subtree of LA1" in why
    assert "this agent" in r.name_conflict(b"x", sed_header("MA"), None, now=2.0, live_for=3.0)
    # an agent claiming a taken descendant
    la2 = {"name": "LA2", "kind": "la", "services": [], "elements": [{"name": "sed-2"}]}
    assert "sed-2" in r.name_conflict(b"x", la2, None, now=2.0, live_for=3.0)
    # the child itself again (same connection), a new name, a silent holder: fine
    assert r.name_conflict(b"s2", sed_header("sed-2"), None, now=2.0, live_for=3.0) is None
    assert r.name_conflict(b"x", sed_header("sed-3"), None, now=2.0, live_for=3.0) is None
    assert r.name_conflict(b"x", sed_header("sed-2"), None, now=5.0, live_for=3.0) is None


def test_heartbeat_with_changed_subtree_bumps_version_and_replaces_elements():
    r = ChildRegistry("MA")
    r.register(b"la", la_header("LA1", [("sed-a", ["add"])]), now=0.0)
    v = r.version
    same = la_header("LA1", [("sed-a", ["add"])])["elements"]
    r.heartbeat(b"la", {"name": "LA1", "elements": same}, now=1.0)
    assert r.version == v
    grown = la_header("LA1", [("sed-a", ["add"]), ("sed-b", ["echo"])])["elements"]
    r.heartbeat(b"la", {"name": "LA1", "elements": grown}, now=2.0)
    assert r.version == v + 1
    assert [e["name"] for e in r.elements(now=2.0)] == ["LA1", "sed-a", "sed-b"]


def test_heartbeat_with_malformed_elements_does_not_crash():
    r = ChildRegistry("MA")
    r.register(b"la", la_header("LA1", [("sed-a", ["add"])]), now=0.0)
    assert r.heartbeat(b"la", {"name": "LA1", "elements": [1, "x", None,
                                                          {"name": "sed-z", "kind": "sed"}]},
                       now=1.0) is True
    assert [e["name"] for e in r.elements(now=1.0)] == ["LA1", "sed-z"]
    r.register(b"la", {**la_header("LA1", []), "elements": [7, {"name": "sed-y", "kind": "sed"}]},
               now=2.0)
    assert [e["name"] for e in r.elements(now=2.0)] == ["LA1", "sed-y"]


def test_remove_and_offering_cache_invalidated():
    r = ChildRegistry("MA")
    r.register(b"1", sed_header("sed-1"), 0.0)
    r.register(b"2", sed_header("sed-2"), 0.0)
    assert r.offering("add") == ["sed-1", "sed-2"]
    assert r.remove("sed-1") is True
    assert r.offering("add") == ["sed-2"]
    r.register(b"3", sed_header("sed-3", ["add", "new"]), 0.0)
    assert r.offering("new") == ["sed-3"] and r.offering("add") == ["sed-2", "sed-3"]


def test_expire_drops_only_silent_children():
    r = ChildRegistry("MA")
    r.register(b"1", sed_header("old"), now=0.0)
    r.register(b"2", sed_header("fresh"), now=0.0)
    r.register(b"3", sed_header("edge"), now=0.0)
    r.heartbeat(b"2", {"name": "fresh"}, now=8.0)
    r.heartbeat(b"3", {"name": "edge"}, now=5.0)
    v = r.version
    assert r.expire(now=9.0, timeout=4.0) == ["old"]        # 9-5 = 4 is not > 4
    assert set(r.children) == {"fresh", "edge"} and r.version == v + 1
    assert r.offering("add") == ["fresh", "edge"]
    assert r.expire(now=9.0, timeout=4.0) == []
    assert r.expire(now=100.0, timeout=4.0) == ["fresh", "edge"] and r.children == {}


def test_services_union_of_children():
    r = ChildRegistry("MA")
    r.register(b"1", sed_header("sed-1", ["add"]), 0.0)
    r.register(b"2", {"name": "sed-2", "kind": "sed",
                      "services": [{"name": "add", "doc": "other doc"}, {"name": "echo"}]}, 0.0)
    svcs = r.services()
    assert set(svcs) == {"add", "echo"}
    assert svcs["add"]["doc"] == "add doc"              # first child's metadata wins
    assert dict(svcs["echo"]) == {"doc": "", "params": []}


def test_services_result_cannot_corrupt_the_cache_or_the_children():
    r = ChildRegistry("MA")
    r.register(b"1", sed_header("sed-1", ["add"]), 0.0)
    svcs = r.services()
    with pytest.raises(TypeError):
        svcs["add"]["doc"] = "mutated"                  # read-only all the way down to the metadata
    with pytest.raises(TypeError):
        svcs["evil"] = {}
    with pytest.raises(TypeError):
        del svcs["add"]
    assert r.services()["add"]["doc"] == "add doc"
    assert r.children["sed-1"].services["add"]["doc"] == "add doc"
    assert {"name": "add", **r.services()["add"]} == {"name": "add", "doc": "add doc", "params": [{"name": "x"}]}


def test_offering_result_is_the_callers_own():
    r = ChildRegistry("MA")
    r.register(b"1", sed_header("sed-1"), 0.0)
    got = r.offering("add")
    got.append("intruder")
    got.clear()
    assert r.offering("add") == ["sed-1"]


def _cached(r):
    """Both caches, filled."""
    return r.services(), r.offering("add")


def test_services_cache_is_reused_until_a_change():
    r = ChildRegistry("MA")
    r.register(b"1", sed_header("sed-1", ["add"]), 0.0)
    first = r.services()
    assert r.services() is first                       # cached: no rebuild per discovery
    r.heartbeat(b"1", {"name": "sed-1", "load": {"num_waiting": 2}}, 1.0)
    r.register(b"1", sed_header("sed-1", ["add"], load={"x": 1}), 2.0)    # same shape
    assert r.services() is first


def test_services_cache_invalidated_on_register():
    r = ChildRegistry("MA")
    r.register(b"1", sed_header("sed-1", ["add"]), 0.0)
    _cached(r)
    r.register(b"2", sed_header("sed-2", ["echo"]), 0.0)           # a new child
    assert set(r.services()) == {"add", "echo"} and r.offering("echo") == ["sed-2"]
    r.register(b"1", sed_header("sed-1", ["add", "sleep"]), 1.0)   # a child's services changed
    assert set(r.services()) == {"add", "echo", "sleep"} and r.offering("sleep") == ["sed-1"]
    r.register(b"1", {**sed_header("sed-1", []), "services": [{"name": "add", "doc": "new doc"}]}, 2.0)
    assert r.services()["add"]["doc"] == "new doc" and "sleep" not in r.services()


def test_services_cache_invalidated_on_heartbeat_shape_change():
    r = ChildRegistry("MA")
    r.register(b"la", la_header("LA1", [("sed-a", ["add"])]), 0.0)
    before_services, before_offering = _cached(r)
    grown = la_header("LA1", [("sed-a", ["add"]), ("sed-b", ["echo"])])["elements"]
    r.heartbeat(b"la", {"name": "LA1", "elements": grown}, 1.0)
    assert r.services() is not before_services          # rebuilt after the shape change
    assert dict(r.services()) == dict(before_services) and r.offering("add") == before_offering
    assert sorted(r.catalogue()["echo"]["servers"]) == ["sed-b"]


def test_services_cache_invalidated_on_remove():
    r = ChildRegistry("MA")
    r.register(b"1", sed_header("sed-1", ["add", "sleep"]), 0.0)
    r.register(b"2", sed_header("sed-2", ["add"]), 0.0)
    _cached(r)
    assert r.remove("sed-1") is True
    assert set(r.services()) == {"add"} and r.offering("add") == ["sed-2"] and r.offering("sleep") == []


def test_services_cache_invalidated_on_expire():
    r = ChildRegistry("MA")
    r.register(b"1", sed_header("sed-1", ["add", "sleep"]), 0.0)
    r.register(b"2", sed_header("sed-2", ["echo"]), 5.0)
    _cached(r)
    assert r.expire(now=6.0, timeout=3.0) == ["sed-1"]
    assert set(r.services()) == {"echo"} and r.offering("add") == [] and r.offering("echo") == ["sed-2"]
    assert r.expire(now=100.0, timeout=3.0) == ["sed-2"]
    assert dict(r.services()) == {} and r.catalogue() == {}


def test_elements_flatten_nested_agents():
    r = ChildRegistry("MA")
    r.register(b"s", sed_header("sed-0", ["add"]), now=1.0)
    r.register(b"la", la_header("LA1", [("sed-a", ["add"]), ("sed-b", ["echo", "add"])]), now=2.0)
    els = r.elements(now=3.0)
    assert [e["name"] for e in els] == ["sed-0", "LA1", "sed-a", "sed-b"]
    sed0, la1, seda, _ = els
    assert sed0["parent"] == "MA" and sed0["kind"] == "sed" and sed0["services"] == ["add"]
    assert sed0["state"] == "alive" and sed0["last_seen"] == 1.0 and sed0["address"] == "tcp://sed-0:1"
    assert la1["parent"] == "MA" and la1["kind"] == "la" and la1["services"] == []
    assert seda["parent"] == "LA1"                       # descendants keep their own parent


def test_catalogue_over_the_whole_subtree():
    r = ChildRegistry("MA")
    r.register(b"s", sed_header("sed-0", ["add"]), 0.0)
    r.register(b"la", {**la_header("LA1", [("sed-a", ["add"]), ("sed-b", ["echo"])]),
                       "services": [{"name": "add", "doc": "add doc"},
                                    {"name": "echo", "doc": "echo doc", "params": [{"name": "v"}]}]},
               0.0)
    cat = r.catalogue()
    assert set(cat) == {"add", "echo"}
    assert sorted(cat["add"]["servers"]) == ["sed-0", "sed-a"]
    assert cat["echo"]["servers"] == ["sed-b"]
    assert cat["echo"]["doc"] == "echo doc" and cat["echo"]["params"] == [{"name": "v"}]
    assert "LA1" not in cat["add"]["servers"]            # agents are not servers


def test_re_registration_after_expiry():
    r = ChildRegistry("MA")
    r.register(b"1", sed_header("sed-1"), 0.0)
    r.expire(now=100.0, timeout=1.0)
    assert r.heartbeat(b"1", {"name": "sed-1"}, 100.5) is False   # must register again
    r.register(b"1", sed_header("sed-1"), 101.0)
    assert r.heartbeat(b"1", {"name": "sed-1"}, 101.5) is True
    assert r.offering("add") == ["sed-1"]


@pytest.mark.parametrize("owner", ["MA", "LA7"])
def test_owner_is_the_parent_of_direct_children(owner):
    r = ChildRegistry(owner)
    r.register(b"1", sed_header("s"), 0.0)
    assert r.elements(None)[0]["parent"] == owner


def test_a_heartbeat_cannot_describe_a_subtree_that_takes_others_names():
    """Attack: a rogue child registered under a free name, then heartbeated
    ``elements`` naming another child's SeD (and the agent itself); the agent
    listed the forged element and routed that name's calls to it."""
    r = ChildRegistry("MA")
    r.register(b"r1", la_header("LA1", [("sed-1", ["add"])]), now=1.0)
    r.register(b"r2", la_header("rogue", []), now=1.0)
    forged = [{"name": n, "parent": "rogue", "kind": "sed", "services": ["add"], "state": "alive"}
              for n in ("sed-1", "MA", "LA1", "rogue-sed")]
    assert r.heartbeat(b"r2", {"name": "rogue", "elements": forged}, now=2.0)
    assert r.owner_of("sed-1") == "LA1" and r.owner_of("MA") is None and r.owner_of("LA1") == "LA1"
    assert [e["name"] for e in r.children["rogue"].elements] == ["rogue-sed"]
    names = [e["name"] for e in r.elements(now=2.0)]
    assert names.count("sed-1") == 1 and "MA" not in names and names.count("LA1") == 1
    assert r.catalogue()["add"]["servers"].count("sed-1") == 1
