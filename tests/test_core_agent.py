"""Pure tests of the agent state machine (gridrpc.core.agent.machine): no sockets, no
clock, no loop. Events in, actions out."""
import dataclasses
import random

import pytest

from gridrpc.core import messages as m
from gridrpc.core.agent.machine import (AgentConfig, AgentState, ChildLost, ChildrenUpdated, FromParent, LocalRole,
                                MasterRole, Received, Rejected, Send, SendFailed, SendParent, Tick,
                                child_budget_ms, discovery_budget)
from gridrpc.core.messages import MsgType

CLIENT = b"client"


def agent(role=None, parent=None, seed=0, **cfg):
    role = role or MasterRole()
    cfg.setdefault("rebuild_time", 0.0)      # a fresh tree: no "rebuilding" window (tested in test_reliability_core)
    config = AgentConfig(name="MA" if role.kind == "ma" else "LA1", parent=parent, **cfg)
    return AgentState(config, role, random.Random(seed), info={"address": "tcp://h:1", "pid": 1})


def recv(state, peer, type_, id_="r1", now=0.0, **fields):
    """Deliver a message through the real boundary check, as the runtime does."""
    mt, h = m.parse_header(m.dumps(m.make(type_, id_, **fields)))
    return state.handle(Received(peer, mt, h), now)


def sed(state, name, services=("add",), *, pid=None, address=None, now=0.0, aggregator=None):
    svcs = [{"name": s, "doc": f"{s} doc", "params": [],
             **({"aggregator": aggregator} if aggregator else {})} for s in services]
    return recv(state, name.encode(), MsgType.REGISTER, f"reg-{name}", now, name=name, kind="sed",
                address=address or f"tcp://{name}:1", pid=pid or hash(name) % 10000, services=svcs)


def la(state, name, seds, now=0.0):
    elements = [{"name": n, "parent": name, "kind": "sed", "services": list(ss)} for n, ss in seds]
    services = sorted({s for _, ss in seds for s in ss})
    return recv(state, name.encode(), MsgType.REGISTER, f"reg-{name}", now, name=name, kind="la",
                address=f"tcp://{name}:2", pid=2, services=services, elements=elements)


def sends(actions):
    return [a for a in actions if isinstance(a, Send)]


def to(actions, peer):
    return [a.header for a in actions if isinstance(a, Send) and a.to == peer]


def srv(name, **est):
    return {"name": name, "address": f"tcp://{name}:1", "estimation": est}


def answer(state, child, fid, servers, now=0.1, **extra):
    return recv(state, child.encode(), MsgType.SERVERS, fid, now, name=child, servers=servers, **extra)


def discover(state, now=0.0, peer=CLIENT, id_="d1", **fields):
    fields.setdefault("service", "add")
    fields.setdefault("k", 3)
    return recv(state, peer, MsgType.DISCOVER, id_, now, **fields)


# -- the budget rule ------------------------------------------------------------------
@pytest.mark.parametrize("budget_ms, default, expect", [
    (None, 2.0, 2.0), (0, 2.0, 2.0), (500, 2.0, 0.5), (1, 2.0, 0.01), (0.0, 0.001, 0.01),
    (10 ** 9, 2.0, 60.0), (float("nan"), 2.0, 2.0), (float("inf"), 2.0, 2.0), ("x", 2.0, 2.0),
    (True, 2.0, 2.0), (-5, 1.0, 1.0),
])
def test_discovery_budget_bounds(budget_ms, default, expect):
    assert discovery_budget(budget_ms, default) == pytest.approx(expect)


@pytest.mark.parametrize("budget_s, expect_ms", [(1.0, 798.0), (2.0, 1598.0), (0.01, 6.0), (0.005, 5.0),
                                                  (60.0, 47998.0)])
def test_children_get_80_percent_minus_2_ms(budget_s, expect_ms):
    assert child_budget_ms(budget_s) == pytest.approx(expect_ms)


# -- the tree ---------------------------------------------------------------------------
def test_register_heartbeat_unregister():
    s = agent(LocalRole(), parent="tcp://ma:1")
    out = sed(s, "sed-1")
    assert to(out, b"sed-1") == [m.make(MsgType.REGISTERED, "reg-sed-1")]
    assert ChildrenUpdated(reregister=True) in out          # the parent must hear the new service
    assert s.registry.offering("add") == ["sed-1"]
    out = sed(s, "sed-1", now=1.0)                          # same registration again: nothing new
    assert ChildrenUpdated(reregister=False) in out
    out = recv(s, b"sed-1", MsgType.HEARTBEAT, "hb1", 1.5, name="sed-1", load={"num_waiting": 2})
    assert to(out, b"sed-1")[0]["known"] is True and ChildrenUpdated(reregister=False) in out
    assert s.registry.children["sed-1"].load == {"num_waiting": 2}
    out = recv(s, b"ghost", MsgType.HEARTBEAT, "hb2", 2.0, name="ghost")
    assert out == [Send(b"ghost", m.make(MsgType.HEARTBEAT_ACK, "hb2", known=False))]
    out = recv(s, b"sed-1", MsgType.UNREGISTER, "u1", 3.0, name="sed-1")
    assert out == [ChildLost("sed-1", "left"), ChildrenUpdated(reregister=True)]
    assert s.registry.children == {}


def test_the_root_never_reregisters():
    s = agent(MasterRole())
    assert ChildrenUpdated(reregister=False) in sed(s, "sed-1")
    s = agent(MasterRole(), parent="tcp://elsewhere:1")        # a root has no parent, whatever it is told
    assert ChildrenUpdated(reregister=False) in sed(s, "sed-1")
    assert s.tree(0.0)[0]["parent"] is None
    assert agent(LocalRole(), parent="tcp://ma:1").tree(0.0)[0]["parent"] == "tcp://ma:1"


def test_a_child_unregisters_only_itself():
    s = agent()
    sed(s, "sed-1")
    assert recv(s, b"stranger", MsgType.UNREGISTER, "u", name="sed-1") == []
    assert "sed-1" in s.registry.children


def test_silent_children_dropped_by_tick():
    s = agent(hb_interval=1.0, hb_timeout=3.0)
    sed(s, "old", now=0.0)
    sed(s, "fresh", now=0.0)
    assert s.next_wakeup() == pytest.approx(0.5)            # the next sweep of silent children
    recv(s, b"fresh", MsgType.HEARTBEAT, "h", 2.9, name="fresh")
    assert s.handle(Tick(), 2.9) == []
    out = s.handle(Tick(), 3.5)
    assert out == [ChildLost("old", "silent"), ChildrenUpdated(reregister=False)]
    assert list(s.registry.children) == ["fresh"]
    assert s.statistics().children_lost == 1


def test_tree_shows_lost_then_drops():
    s = agent(hb_interval=1.0, hb_timeout=3.0)
    sed(s, "sed-1", now=0.0)
    s.handle(Tick(wall=1000.0), 0.0)
    tree = s.tree(now=2.6)
    assert [e["name"] for e in tree] == ["MA", "sed-1"]
    me, child = tree
    assert me["kind"] == "ma" and me["parent"] is None and me["address"] == "tcp://h:1"
    assert me["last_heartbeat"] == pytest.approx(1002.6) and me["load"]["children"] == 1
    assert child["state"] == "lost" and child["last_heartbeat"] == pytest.approx(1000.0)
    assert child["parent"] == "MA" and child["services"] == ["add"]
    assert s.tree(now=1.0, wall=5001.0)[1]["state"] == "alive"


# -- discovery ----------------------------------------------------------------------------
def test_fan_out_only_to_children_offering_the_service():
    s = agent()
    sed(s, "sed-1", ["add"])
    sed(s, "sed-2", ["echo"])
    la(s, "LA1", [("sed-a", ["add"])])
    out = discover(s, budget_ms=1000, user="alice", optional=True, args=[1])
    asked = {a.to: a for a in sends(out)}
    assert set(asked) == {b"sed-1", b"LA1"}
    fwd = asked[b"sed-1"].header
    assert fwd["id"] == "MA:1" and fwd["k"] == 3 and fwd["budget_ms"] == pytest.approx(798.0)
    assert fwd["user"] == "alice" and fwd["optional"] is True and fwd["args"] == [1]
    assert "names" not in fwd and asked[b"sed-1"].children == ("sed-1",)
    assert s.next_wakeup() == pytest.approx(0.5)            # sweep first (0.5), then the deadline (1.0)
    assert s.discoveries.next_deadline() == pytest.approx(1.0)
    assert s.statistics().pending_discoveries == 1 and s.statistics().discoveries == 1


def test_replicas_of_one_process_get_one_message():
    s = agent()
    for n in ("r-1", "r-2", "r-3"):
        sed(s, n, address="tcp://box:7", pid=99)
    sed(s, "other", address="tcp://box:8", pid=100)
    out = discover(s, names=["injected"])
    msgs = sends(out)
    assert len(msgs) == 2
    grouped = next(a for a in msgs if len(a.children) == 3)
    assert grouped.to == b"r-1" and grouped.header["names"] == ["r-1", "r-2", "r-3"]
    single = next(a for a in msgs if a.children == ("other",))
    assert "names" not in single.header                     # a client's names never travel down
    # one answer speaks for all three replicas
    assert answer(s, "r-1", "MA:1", [srv("r-1"), srv("r-2"), srv("r-3")], names=["r-1", "r-2", "r-3"]) == []
    (reply,) = to(answer(s, "other", "MA:1", [srv("other")]), CLIENT)
    assert reply["answered"] == 4 and len(reply["servers"]) == 3


def test_answers_ranked_and_truncated_to_k():
    s = agent()
    sed(s, "a")
    sed(s, "b")
    discover(s, k=2, aggregator={"name": "priority", "params": {"order": [["eft", "min"]]}})
    assert answer(s, "a", "MA:1", [srv("a", eft=3)]) == []
    out = answer(s, "b", "MA:1", [srv("b", eft=1)])
    (reply,) = to(out, CLIENT)
    assert reply["type"] == "servers" and reply["id"] == "d1" and reply["name"] == "MA"
    assert [x["name"] for x in reply["servers"]] == ["b", "a"]
    assert reply["answered"] == 2 and reply["timed_out"] == []
    assert s.discoveries.pending == {}


def test_deadline_gives_a_partial_answer():
    s = agent()
    sed(s, "a")
    sed(s, "slow")
    discover(s, budget_ms=100)
    answer(s, "a", "MA:1", [srv("a")], now=0.05)
    assert s.handle(Tick(), 0.099) == []
    out = s.handle(Tick(), 0.1)
    (reply,) = to(out, CLIENT)
    assert [x["name"] for x in reply["servers"]] == ["a"] and reply["timed_out"] == ["slow"]
    assert s.statistics().discoveries_timed_out == 1
    assert answer(s, "slow", "MA:1", [srv("slow")], now=0.2) == []      # too late
    assert s.statistics().answers_ignored == 1


def test_master_role_errors():
    s = agent(MasterRole())
    (err,) = to(discover(s, service="nope"), CLIENT)
    assert err["error"]["kind"] == "service_not_found" and "'nope'" in err["error"]["message"]
    sed(s, "a")
    discover(s, id_="d2", budget_ms=50)
    (err,) = to(s.handle(Tick(), 1.0), CLIENT)
    # "a" was heard from within its heartbeat timeout: late (busy, or just stopped), not silent
    assert err["id"] == "d2" and err["error"]["kind"] == "no_server", err
    assert "late: a, heard from 1.0 s ago" in err["error"]["message"] and "silent" not in err["error"]["message"]
    discover(s, now=2.6, id_="d2b", budget_ms=40)
    (err,) = to(s.handle(Tick(), 2.65), CLIENT)           # nothing heard from "a" for 2.65 s > 2.5 intervals
    assert err["error"]["kind"] == "no_server" and "silent: a, nothing heard for 2.6 s" in err["error"]["message"], err
    discover(s, id_="d3", k=0)
    (reply,) = to(answer(s, "a", "MA:3", []), CLIENT)
    assert reply["type"] == "servers" and reply["servers"] == []         # k = 0 is no error


def test_local_role_answers_what_it_has_even_nothing():
    s = agent(LocalRole(), parent="tcp://ma:1")
    (reply,) = to(discover(s, service="nope"), CLIENT)
    assert reply["type"] == "servers" and reply["servers"] == [] and reply["answered"] == 0
    sed(s, "a")
    discover(s, id_="d2", budget_ms=50)
    (reply,) = to(s.handle(Tick(), 1.0), CLIENT)
    assert reply["type"] == "servers" and reply["timed_out"] == ["a"]


def test_discovery_from_the_parent_answers_the_parent():
    s = agent(LocalRole(), parent="tcp://ma:1")
    sed(s, "a")
    h = m.make(MsgType.DISCOVER, "MA:7", service="add", k=1, budget_ms=798.0)
    out = s.handle(FromParent(MsgType.DISCOVER, h), 0.0)
    assert sends(out)[0].header["budget_ms"] == pytest.approx(max(5.0, 798 * 0.8 - 2))
    out = answer(s, "a", "LA1:1", [srv("a")])
    assert out == [SendParent(m.make(MsgType.SERVERS, "MA:7", name="LA1", servers=[srv("a")], answered=1,
                                     timed_out=[]))]
    assert s.handle(FromParent(MsgType.PING, m.make(MsgType.PING, "p")), 0.0) == [
        SendParent(m.make(MsgType.PONG, "p", name="LA1"))]
    assert s.handle(FromParent(MsgType.REGISTERED, m.make(MsgType.REGISTERED, "x")), 0.0) == []


def test_the_root_remembers_its_choices():
    s = agent(MasterRole())
    sed(s, "a")
    firsts = []
    for i in range(3):
        discover(s, now=10.0 + i * 0.01, id_=f"d{i}", k=1)
        stale = [srv("a", time_since_last_solve=100)]
        out = answer(s, "a", f"MA:{i + 1}", [srv("x", time_since_last_solve=100),
                                            srv("y", time_since_last_solve=50)] + stale, now=10.0 + i * 0.01)
        firsts.append(to(out, CLIENT)[0]["servers"][0]["name"])
    assert len(set(firsts)) == 3                          # spread, not herded on one server
    assert agent(LocalRole()).discoveries.remember is False


def test_service_default_aggregator_is_used_and_forwarded():
    s = agent()
    spec = {"name": "priority", "params": {"order": [["speed", "max"]]}}
    sed(s, "a", ["speed"], aggregator=spec)
    sed(s, "b", ["speed"])
    out = discover(s, service="speed", k=2)
    assert all(a.header["aggregator"] == spec for a in sends(out))
    answer(s, "a", "MA:1", [srv("a", speed=10)])
    (reply,) = to(answer(s, "b", "MA:1", [srv("b", speed=1)]), CLIENT)
    assert [x["name"] for x in reply["servers"]] == ["a", "b"]


def test_unknown_aggregator_is_an_invalid_argument():
    s = agent()
    sed(s, "a")
    (err,) = to(discover(s, aggregator="os:system"), CLIENT)
    assert err["error"]["kind"] == "invalid_argument" and "aggregator" in err["error"]["message"]
    assert s.discoveries.pending == {}


def test_failed_sends_are_not_waited_for():
    s = agent()
    sed(s, "a")
    sed(s, "gone")
    out = discover(s)
    lost = next(a for a in sends(out) if a.to == b"gone")
    assert s.handle(SendFailed(lost), 0.0) == []
    (reply,) = to(answer(s, "a", "MA:1", [srv("a")]), CLIENT)
    assert reply["answered"] == 1 and reply["timed_out"] == []
    # every send failed: answered at once, no timer left
    s2 = agent()
    sed(s2, "gone")
    (only,) = sends(discover(s2))
    (err,) = to(s2.handle(SendFailed(only), 0.0), CLIENT)
    assert err["error"]["kind"] == "no_server" and s2.discoveries.pending == {}
    assert s2.handle(SendFailed(Send(CLIENT, m.make(MsgType.PONG, "p"))), 0.0) == []   # a reply: nothing to do


def test_lost_child_finishes_discoveries_waiting_on_it():
    s = agent()
    sed(s, "a")
    sed(s, "b")
    discover(s)
    answer(s, "a", "MA:1", [srv("a")])
    out = recv(s, b"b", MsgType.UNREGISTER, "u", 0.2, name="b")
    (reply,) = to(out, CLIENT)
    assert [x["name"] for x in reply["servers"]] == ["a"]


def test_stranger_answers_are_ignored():
    s = agent()
    sed(s, "a")
    discover(s)
    assert recv(s, b"stranger", MsgType.SERVERS, "MA:1", name="a", servers=[srv("evil")]) == []
    assert recv(s, b"stranger", MsgType.SERVERS, "MA:1", servers=[srv("evil")]) == []
    assert s.statistics().answers_ignored == 2
    (reply,) = to(answer(s, "a", "MA:1", [srv("a")]), CLIENT)
    assert [x["name"] for x in reply["servers"]] == ["a"]


def test_a_childs_error_is_an_empty_answer():
    s = agent()
    sed(s, "a")
    sed(s, "la-x")
    discover(s)
    answer(s, "a", "MA:1", [srv("a")])
    out = recv(s, b"la-x", MsgType.ERROR, "MA:1", 0.2, name="la-x",
               error={"kind": "invalid_argument", "type": "x", "message": "no such aggregator", "traceback": ""})
    (reply,) = to(out, CLIENT)
    assert reply["answered"] == 2 and [x["name"] for x in reply["servers"]] == ["a"]
    # an error about nothing pending gets no answer (never an error for an error)
    assert recv(s, b"la-x", MsgType.ERROR, "zz", 0.3, name="la-x", error={"kind": "protocol"}) == []
    assert recv(s, CLIENT, MsgType.ERROR, "zz", 0.3, error={"kind": "protocol"}) == []


def test_catalogue_ping_and_unhandled_types():
    s = agent()
    sed(s, "sed-1", ["add", "echo"])
    la(s, "LA1", [("sed-a", ["add"])])
    (cat,) = to(recv(s, CLIENT, MsgType.SERVICES, "s1"), CLIENT)
    assert cat["type"] == "catalogue" and sorted(cat["services"]["add"]["servers"]) == ["sed-1", "sed-a"]
    assert cat["servers"] == {"sed-1": "tcp://sed-1:1", "sed-a": None} and "elements" not in cat
    (cat,) = to(recv(s, CLIENT, MsgType.SERVICES, "s2", tree=True), CLIENT)
    assert [e["name"] for e in cat["elements"]] == ["MA", "sed-1", "LA1", "sed-a"]
    assert to(recv(s, CLIENT, MsgType.PING, "p"), CLIENT) == [m.make(MsgType.PONG, "p", name="MA")]
    for mt, fields in [(MsgType.CALL, dict(service="add", args=[], kwargs={})), (MsgType.RESULT, {}),
                       (MsgType.CANCEL, {}), (MsgType.CATALOGUE, dict(services={}))]:
        (err,) = to(recv(s, CLIENT, mt, "u1", **fields), CLIENT)
        assert err["id"] == "u1" and err["error"]["kind"] == "protocol" and "does not handle" in err["error"]["message"]


def test_register_info_and_heartbeat_info_for_the_parent():
    s = agent(LocalRole(), parent="tcp://ma:1")
    la_child = la(s, "LA9", [("sed-z", ["zz"])])
    assert la_child
    sed(s, "sed-1", ["add"])
    info = s.register_info(now=1.0, wall=101.0)
    assert info["kind"] == "la" and info["address"] == "tcp://h:1"
    assert [x["name"] for x in info["services"]] == ["zz", "add"]
    assert [e["name"] for e in info["elements"]] == ["LA9", "sed-z", "sed-1"]
    assert info["elements"][0]["last_heartbeat"] == pytest.approx(100.0)
    m.parse_header(m.dumps(m.make(MsgType.REGISTER, "r", name="LA1", **info)))   # valid on the wire
    hb = s.heartbeat_info(now=1.0, wall=101.0)
    assert hb["load"] == {"children": 2, "view_snapshots": 0, "view_refused": 0, "view_asked": 0} and len(hb["elements"]) == 3
    m.parse_header(m.dumps(m.make(MsgType.HEARTBEAT, "h", name="LA1", **hb)))


def test_statistics_is_a_frozen_snapshot():
    s = agent()
    before = s.statistics()
    sed(s, "a")
    discover(s)
    s.handle(Rejected(), 0.0)
    after = s.statistics()
    assert before.children == 0 and before.discoveries == 0 and before.bad_messages == 0
    assert after.children == 1 and after.discoveries == 1 and after.pending_discoveries == 1
    assert after.bad_messages == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        after.discoveries = 5
    assert after.as_dict()["kind"] == "ma" and set(after.as_dict()) >= {
        "name", "kind", "children", "pending_discoveries", "discoveries", "discoveries_timed_out", "bad_messages"}


def test_not_an_event():
    with pytest.raises(TypeError):
        agent().handle("hello", 0.0)


def test_same_seed_same_answers():
    def run(seed):
        s = agent(seed=seed)
        sed(s, "a")
        discover(s, k=10)
        out = answer(s, "a", "MA:1", [srv(f"s{i}", time_since_last_solve=1.0) for i in range(10)])
        return [x["name"] for x in to(out, CLIENT)[0]["servers"]]
    assert run(3) == run(3)
    assert len({tuple(run(i)) for i in range(8)}) > 1


def test_discoveries_in_flight_are_bounded_per_connection():
    """A flood of DISCOVERs from one connection is refused past the limit (no
    amplification down the tree); other connections are unaffected."""
    import random as _random
    from gridrpc.core.agent.machine import AgentConfig, AgentState, MasterRole, Received, Send
    from gridrpc.core import messages as _m
    st = AgentState(AgentConfig(name="MA", max_discoveries_per_peer=3), MasterRole(), _random.Random(1))
    st.handle(Received(b"child", _m.MsgType.REGISTER,
                       {"v": 1, "type": "register", "id": "r", "name": "sed-1", "kind": "sed",
                        "services": ["add"], "address": "tcp://h:1", "pid": 1}), 0.0)
    disc = lambda i, peer: Received(peer, _m.MsgType.DISCOVER,  # noqa: E731
                                    {"v": 1, "type": "discover", "id": f"d{i}", "service": "add", "k": 1})
    outs = [st.handle(disc(i, b"flood"), 0.1) for i in range(5)]
    refused = [o for o in outs if any(isinstance(a, Send) and a.header.get("type") == "error" for a in o)]
    assert len(refused) == 2
    assert "in flight" in refused[0][0].header["error"]["message"]
    assert refused[0][0].header["error"]["kind"] == "refused"
    fanned = st.handle(disc(9, b"other"), 0.1)
    assert any(isinstance(a, Send) and a.to == b"child" for a in fanned)
    # the answers free the slots
    for i in range(3):
        fid = [p for p in st.discoveries.pending][0]
        st.handle(Received(b"child", _m.MsgType.SERVERS, {"v": 1, "type": "servers", "id": fid, "name": "sed-1",
                                                          "servers": []}), 0.2)
    assert st.statistics().discoveries_refused == 2
    again = st.handle(disc(10, b"flood"), 0.3)
    assert any(isinstance(a, Send) and a.to == b"child" for a in again)


def test_discoveries_in_flight_are_bounded_per_authenticated_key():
    """Under CURVE a user opening many connections still has at most
    max_discoveries_per_user discoveries in flight (each fans out down the
    tree); another key is unaffected, and answers free the slots."""
    import random as _random
    from gridrpc.core.agent.machine import AgentConfig, AgentState, MasterRole, Received, Send
    from gridrpc.core import messages as _m
    st = AgentState(AgentConfig(name="MA", max_discoveries_per_peer=3, max_discoveries_per_user=4), MasterRole(),
                    _random.Random(1))
    st.handle(Received(b"child", _m.MsgType.REGISTER,
                       {"v": 1, "type": "register", "id": "r", "name": "sed-1", "kind": "sed",
                        "services": ["add"], "address": "tcp://h:1", "pid": 1}, "element:sed-1"), 0.0)
    disc = lambda i, peer, user: Received(peer, _m.MsgType.DISCOVER,  # noqa: E731
                                          {"v": 1, "type": "discover", "id": f"d{i}", "service": "add", "k": 1},
                                          user)
    # four connections of mallory, two discoveries each: 4 fan out, 4 are refused
    outs = [st.handle(disc(i, b"m%d" % (i % 4), "user:mallory"), 0.1) for i in range(8)]
    refused = [o[0].header for o in outs if o and isinstance(o[0], Send) and o[0].header.get("type") == "error"]
    assert len(refused) == 4
    assert all(r["error"]["kind"] == "refused" and "max_discoveries_per_user" in r["error"]["message"]
               for r in refused)
    fanned = st.handle(disc(20, b"a1", "user:alice"), 0.1)          # another key: fans out
    assert any(isinstance(a, Send) and a.to == b"child" for a in fanned)
    for fid in [p for p in st.discoveries.pending]:                   # the answers free the slots
        st.handle(Received(b"child", _m.MsgType.SERVERS, {"v": 1, "type": "servers", "id": fid, "name": "sed-1",
                                                          "servers": []}, "element:sed-1"), 0.2)
    assert st._inflight_user == {} and st._inflight == {}
    again = st.handle(disc(30, b"m9", "user:mallory"), 0.3)
    assert any(isinstance(a, Send) and a.to == b"child" for a in again)
