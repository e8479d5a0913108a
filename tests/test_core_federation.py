"""Federation of master agents in the pure agent state machine
(gridrpc.core.agent.federation): forwarding to peers, hop limit, no loops,
fast failure when a peer cannot be asked, only elements may forward."""
from __future__ import annotations

import random

from gridrpc.core import messages as m
from gridrpc.core.agent.machine import (AgentConfig, AgentState, FromPeer, MasterRole, PeerUnreachable, Received, Send,
                                SendPeer, Tick)
from gridrpc.core.messages import MsgType
from gridrpc.errors import CommunicationError, ServiceNotFound, error_from_wire

CLIENT = b"client"
B, C = "tcp://site-b:5555", "tcp://site-c:5555"


def ma(name="A", peers=(B,), **cfg):
    cfg.setdefault("rebuild_time", 0.0)
    return AgentState(AgentConfig(name=name, peers=tuple(peers), **cfg), MasterRole(), random.Random(0),
                      info={"address": "tcp://a:1", "pid": 1})


def recv(state, peer, type_, id_="r1", now=0.0, user=None, **fields):
    mt, h = m.parse_header(m.dumps(m.make(type_, id_, **fields)))
    return state.handle(Received(peer, mt, h, user), now)


def discover(state, now=0.0, peer=CLIENT, id_="d1", user=None, **fields):
    fields.setdefault("service", "solve")
    fields.setdefault("k", 3)
    return recv(state, peer, MsgType.DISCOVER, id_, now, user, **fields)


def from_peer(state, peer, type_, id_, now=0.1, **fields):
    mt, h = m.parse_header(m.dumps(m.make(type_, id_, **fields)))
    return state.handle(FromPeer(peer, mt, h), now)


def replies(actions, peer=CLIENT):
    return [a.header for a in actions if isinstance(a, Send) and a.to == peer]


def test_a_service_the_tree_lacks_is_forwarded_and_the_peer_answer_reaches_the_client():
    st = ma(peers=(B, C))
    acts = discover(st)
    fwd = [a for a in acts if isinstance(a, SendPeer)]
    assert [a.peer for a in fwd] == [B, C] and not replies(acts)
    h = fwd[0].header
    assert h["hops"] == 1 and h["via"] == ["A"] and h["service"] == "solve" and h["id"] != "d1"
    assert 0 < h["budget_ms"] < 2000                               # a share of the budget, as children get
    remote = {"name": "sed-b", "address": "tcp://site-b:7000", "estimation": {"eft": 1.0}}
    assert from_peer(st, B, MsgType.SERVERS, h["id"], servers=[remote], name="B") == []    # C still asked
    out = from_peer(st, C, MsgType.ERROR, h["id"], error={"kind": "service_not_found", "message": "no"})
    (ans,) = replies(out)
    assert ans["type"] == "servers" and ans["id"] == "d1" and ans["servers"][0]["address"] == "tcp://site-b:7000"
    assert st.statistics().forwarded == 1


def test_nobody_has_it_is_service_not_found_naming_the_peers():
    st = ma()
    fwd = next(a for a in discover(st) if isinstance(a, SendPeer))
    (ans,) = replies(from_peer(st, B, MsgType.ERROR, fwd.header["id"],
                               error={"kind": "service_not_found", "message": "no"}))
    e = error_from_wire(ans["error"])
    assert isinstance(e, ServiceNotFound) and B in str(e) and "solve" in str(e)


def test_an_unreachable_peer_fails_fast_with_a_clear_error():
    st = ma()
    fwd = next(a for a in discover(st) if isinstance(a, SendPeer))
    (ans,) = replies(st.handle(PeerUnreachable(B, fwd.header["id"]), 0.001))
    assert ans["error"]["kind"] == "peer_unreachable"
    e = error_from_wire(ans["error"])
    assert isinstance(e, CommunicationError) and B in str(e) and "partition" in str(e)


def test_a_silent_peer_is_named_at_the_deadline():
    st = ma()
    acts = discover(st, budget_ms=100)
    assert not replies(acts)
    assert replies(st.handle(Tick(), 0.05)) == []
    (ans,) = replies(st.handle(Tick(), 0.2))
    assert ans["error"]["kind"] == "peer_unreachable" and B in ans["error"]["message"]


def test_no_loops_and_a_hop_limit():
    st = ma(name="B", peers=("tcp://site-a:5555",))
    # it came from A through us already: answered at once, not sent around the ring again
    acts = discover(st, via=["A", "B"], hops=1, peer=b"A")
    assert not [a for a in acts if isinstance(a, SendPeer)]
    assert replies(acts, b"A")[0]["error"]["kind"] == "service_not_found"
    # no hops left: the local tree only
    acts = discover(st, via=["A"], hops=0, peer=b"A", id_="d2")
    assert not [a for a in acts if isinstance(a, SendPeer)]
    # a request may lower the hop count, never raise it past the MA's own limit
    fwd = next(a for a in discover(st, hops=4, id_="d3") if isinstance(a, SendPeer))
    assert fwd.header["hops"] == 1                              # peer_hops 2, minus this hop


def test_under_security_only_an_element_key_forwards():
    st = ma(name="B", peers=("tcp://site-a:5555",), peer_hops=3)
    acts = discover(st, via=["X"], hops=2, user="user:mallory")     # a client posing as a peer
    assert not [a for a in acts if isinstance(a, SendPeer)]
    acts = discover(st, via=["A"], hops=2, user="element:A", id_="d2")
    assert [a for a in acts if isinstance(a, SendPeer)]


def test_answers_from_strangers_and_late_answers_are_ignored():
    st = ma()
    fwd = next(a for a in discover(st) if isinstance(a, SendPeer))
    assert from_peer(st, "tcp://evil:1", MsgType.SERVERS, fwd.header["id"], servers=[]) == []
    assert from_peer(st, B, MsgType.SERVERS, "A:f999", servers=[]) == []
    assert st.statistics().answers_ignored == 2


def test_without_peers_nothing_changes():
    st = ma(peers=())
    (ans,) = replies(discover(st))
    assert ans["error"]["kind"] == "service_not_found"


def _with_local_sed(st, est_wait):
    """One local SeD offering 'solve', its pushed snapshot showing ``est_wait``."""
    mt, h = m.parse_header(m.dumps(m.make(MsgType.REGISTER, "reg", name="sed-a", kind="sed", address="tcp://a:7",
                                          pid=7, services=[{"name": "solve"}])))
    st.handle(Received(b"sed-a", mt, h), 0.0)
    vec = {"tcomp": 1.0, "eft": 100.0, "est_wait": est_wait, "num_waiting": 5, "num_running": 1,
           "max_concurrent": 1, "free_cpu": 0.0, "server_type": "serial"}
    mt, h = m.parse_header(m.dumps(m.make(MsgType.VIEW, "v", name="sed-a",
                                          entries=[{"name": "sed-a", "common": {}, "services": {"solve": vec},
                                                    "age_ms": 0}])))
    st.handle(Received(b"sed-a", mt, h), 0.0)


def test_a_saturated_site_asks_its_peers_and_ranks_both():
    st = ma(peer_busy_wait=10.0)
    _with_local_sed(st, est_wait=60.0)                    # a minute of queue here
    acts = discover(st, now=0.1)
    fwd = [a for a in acts if isinstance(a, SendPeer)]
    assert fwd and not replies(acts) and st.statistics().forwarded_busy == 1
    idle = {"name": "sed-b", "address": "tcp://site-b:7000",
            "estimation": {"tcomp": 1.0, "eft": 1.0, "est_wait": 0.0, "num_waiting": 0, "num_running": 0,
                           "max_concurrent": 1, "free_cpu": 1.0, "server_type": "serial", "time_since_last_solve": 1e9}}
    (ans,) = replies(from_peer(st, B, MsgType.SERVERS, fwd[0].header["id"], servers=[idle], name="B", now=0.12))
    assert [s["name"] for s in ans["servers"]] == ["sed-b", "sed-a"]      # the idle remote one first, both kept


def test_a_busy_site_with_its_peer_cut_off_still_answers_locally():
    st = ma(peer_busy_wait=10.0)
    _with_local_sed(st, est_wait=60.0)
    fwd = next(a for a in discover(st, now=0.1) if isinstance(a, SendPeer))
    (ans,) = replies(st.handle(PeerUnreachable(B, fwd.header["id"]), 0.11))
    assert ans["type"] == "servers" and [s["name"] for s in ans["servers"]] == ["sed-a"]


def test_a_site_not_busy_enough_answers_alone():
    st = ma(peer_busy_wait=10.0)
    _with_local_sed(st, est_wait=2.0)
    acts = discover(st, now=0.1)
    assert not [a for a in acts if isinstance(a, SendPeer)] and replies(acts)[0]["servers"][0]["name"] == "sed-a"
