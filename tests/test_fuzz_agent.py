"""Fuzzing the agent state machine (hypothesis): random sequences of
registrations, heartbeats, discoveries, answers, errors, failed sends, junk
and the passing of time. Whatever happens:

* no exception escapes ``handle``;
* every request that expects an answer gets one: REGISTER, HEARTBEAT,
  SERVICES, PING and unhandled types at once, each DISCOVER exactly once
  (at once, when its children answered, or at its deadline);
* everything the agent sends is a valid message (it passes parse_header);
* nothing stays pending once every deadline has passed.
"""
import random

import orjson
from hypothesis import HealthCheck, given, settings, strategies as st

from gridrpc.core import messages as m
from gridrpc.core.agent.machine import (AgentConfig, AgentState, FromParent, LocalRole, MasterRole, Received, Rejected,
                                Send, SendFailed, SendParent, Tick)
from gridrpc.core.messages import MsgType
from gridrpc.errors import ProtocolError

CHILDREN = ["c1", "c2", "c3", "r-1", "r-2"]
CLIENTS = [b"k1", b"k2"]
SERVICES = ["add", "echo", "nope"]

junk = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=False),
                              st.sampled_from(["", "x", "nan", "add", "c1", "a b", "MA:1", "default"])),
                    lambda inner: st.one_of(st.lists(inner, max_size=3),
                                            st.dictionaries(st.sampled_from(["name", "params", "kind", "x"]),
                                                            inner, max_size=3)), max_leaves=8)
aggregators = st.sampled_from([None, "default", "nope", "os:system", {"name": "priority",
                               "params": {"order": [["eft", "min"]]}}, {"name": "priority", "params": {"order": 5}},
                               {"name": "least_cost", "params": {"max_cost": "x"}}, {"name": "least_wait_time"}])
server_entry = st.builds(lambda n, est: {"name": n, "address": f"tcp://{n}:1", "estimation": est},
                         st.sampled_from(CHILDREN + ["s9"]),
                         st.one_of(st.none(), st.dictionaries(st.sampled_from(["eft", "time_since_last_solve",
                                                                               "num_waiting", "price"]),
                                                              junk, max_size=3)))

discover_ev = st.tuples(st.just("discover"), st.sampled_from(CLIENTS), st.sampled_from(SERVICES), st.integers(0, 5),
                        st.sampled_from([None, None, 0, 1, 20, 500, 10**7, "x", "nan", -3]),
                        st.sampled_from([None, None, "default", "least_wait_time"]) | aggregators)
answer_ev = st.tuples(st.just("answer"), st.sampled_from(CHILDREN), st.integers(0, 8),
                      st.lists(server_entry, max_size=3), st.booleans())
events = st.one_of(
    discover_ev, answer_ev, discover_ev, answer_ev, st.tuples(st.just("answer_all"), st.integers(0, 8), st.lists(st.booleans(), min_size=4, max_size=4)),
    st.tuples(st.just("unregister"), st.sampled_from(CHILDREN), st.just(True)),
    st.tuples(st.just("register"), st.sampled_from(CHILDREN), st.lists(st.sampled_from(SERVICES[:2]), max_size=2),
              st.sampled_from(["sed", "la"]), st.sampled_from([1, 2]), st.one_of(st.none(), aggregators)),
    st.tuples(st.just("heartbeat"), st.sampled_from(CHILDREN + ["ghost"]), st.booleans()),
    st.tuples(st.just("unregister"), st.sampled_from(CHILDREN), st.booleans()),
    st.tuples(st.just("discover"), st.sampled_from(CLIENTS), st.sampled_from(SERVICES), st.integers(0, 5),
              st.sampled_from([None, 0, 1, 20, 500, 10**7, "x", "nan", -3]), aggregators),
    st.tuples(st.just("answer"), st.sampled_from(CHILDREN), st.integers(0, 8), st.lists(server_entry, max_size=3),
              st.booleans()),
    st.tuples(st.just("error"), st.sampled_from(CHILDREN), st.integers(0, 8)),
    st.tuples(st.just("parent"), st.sampled_from(["discover", "ping", "registered"]), st.sampled_from(SERVICES),
              st.integers(0, 3)),
    st.tuples(st.just("query"), st.sampled_from(CLIENTS),
              st.sampled_from(["services", "ping", "call", "result", "cancel", "pong", "catalogue",
                               "registered", "heartbeat_ack", "accepted", "cancelled"])),
    st.tuples(st.just("junk"), st.sampled_from(CLIENTS + [b"c1"]), st.sampled_from([t.value for t in MsgType]),
              st.dictionaries(st.sampled_from(["name", "service", "k", "servers", "budget_ms", "names", "error",
                                               "aggregator", "elements", "services", "kind", "load", "tree"]),
                              junk, max_size=5)),
    st.tuples(st.just("tick"), st.floats(0, 0.3) | st.floats(0, 3)),
    st.tuples(st.just("fail"), st.integers(0, 50)),
)

#: every run starts from a tree: two SeDs, an LA, two replicas of one SeD process
PREFIX = [("register", "c1", ["add"], "sed", 1, None), ("register", "c2", ["add", "echo"], "la", 2, None),
          ("register", "c3", ["echo"], "sed", 3, "least_wait_time"), ("register", "r-1", ["add"], "sed", 4, None),
          ("register", "r-2", ["add"], "sed", 4, None)]

ANSWERED_AT_ONCE = {"register", "heartbeat", "services", "ping", "call", "result", "cancel", "pong", "catalogue",
                    "registered", "heartbeat_ack", "accepted", "cancelled"}


class Run:
    def __init__(self, role, parent):
        self.s = AgentState(AgentConfig(name="A", parent=parent, hb_interval=0.5, hb_timeout=1.5), role,
                            random.Random(1), info={"address": "tcp://h:1"})
        self.now = 0.0
        self.seq = 0
        self.sent: list[Send] = []                 # every Send, for failures and answer ids
        self.fids: list[str] = []                  # ids of discoveries sent to children
        self.waiting_peer: dict[str, bytes] = {}   # discover id -> client awaiting its answer
        self.waiting_parent: set[str] = set()

    def feed(self, event):
        actions = self.s.handle(event, self.now)
        assert isinstance(actions, list)
        for a in actions:
            if isinstance(a, (Send, SendParent)):
                data = m.dumps(a.header)                  # serialisable ...
                m.parse_header(data)                      # ... and valid on the wire
            if isinstance(a, Send):
                self.sent.append(a)
                if a.children:
                    self.fids.append(a.header["id"])
                elif self.waiting_peer.get(a.header["id"]) == a.to:
                    del self.waiting_peer[a.header["id"]]
                else:
                    assert a.header["id"] not in self.waiting_peer, "a discovery answered twice"
            elif isinstance(a, SendParent):
                assert a.header["id"] in self.waiting_parent or a.header["type"] == "pong"
                self.waiting_parent.discard(a.header["id"])
        return actions

    def received(self, peer, header: dict):
        """Through the boundary: a refused message is answered there (Rejected)."""
        try:
            mt, h = m.parse_header(orjson.dumps(header))
        except ProtocolError:
            return self.feed(Rejected()), None
        return self.feed(Received(peer, mt, h)), h

    def next_id(self):
        self.seq += 1
        return f"q{self.seq}"

    def step(self, ev):
        kind = ev[0]
        if kind == "register":
            _, name, services, k, pid, agg = ev
            svcs = [{"name": s, "doc": "", "params": [], **({"aggregator": agg} if agg else {})} for s in services]
            h = m.make(MsgType.REGISTER, self.next_id(), name=name, kind=k, pid=pid, address=f"tcp://box:{pid}",
                       services=svcs, elements=[{"name": f"{name}x", "kind": "sed", "services": services}]
                       if k == "la" else [])
            out, _ = self.received(name.encode(), h)
            assert any(isinstance(a, Send) and a.header["id"] == h["id"] for a in out)
        elif kind == "heartbeat":
            _, name, same_route = ev
            h = m.make(MsgType.HEARTBEAT, self.next_id(), name=name, load={"n": 1})
            out, _ = self.received(name.encode() if same_route else b"other", h)
            assert any(isinstance(a, Send) and a.header["id"] == h["id"] for a in out)
        elif kind == "unregister":
            _, name, own = ev
            self.received(name.encode() if own else b"stranger", m.make(MsgType.UNREGISTER, self.next_id(), name=name))
        elif kind == "discover":
            _, peer, service, k, budget, agg = ev
            h = m.make(MsgType.DISCOVER, self.next_id(), service=service, k=k, budget_ms=budget, aggregator=agg)
            self.waiting_peer[h["id"]] = peer
            out, parsed = self.received(peer, h)
            if parsed is None:
                del self.waiting_peer[h["id"]]        # refused at the boundary: the endpoint answers
        elif kind == "answer":
            _, name, i, servers, with_names = ev
            fid = self.fids[-1 - i % len(self.fids)] if self.fids else "A:1"
            h = m.make(MsgType.SERVERS, fid, name=name, servers=servers)
            if with_names:
                h["names"] = [name, "r-2"]
            self.received(name.encode(), h)
        elif kind == "answer_all":             # children asked by one fan-out answer properly (some of them)
            asks = [a for a in self.sent if a.children]
            if asks:
                ask = asks[-1 - ev[1] % len(asks)]
                group = [x for x in asks if x.header["id"] == ask.header["id"]]
                for a, answers in zip(group, ev[2]):
                    if not answers:
                        continue
                    h = m.make(MsgType.SERVERS, a.header["id"], name=a.children[0],
                               servers=[{"name": c, "address": "tcp://x:1", "estimation": {"eft": i}}
                                        for i, c in enumerate(a.children)])
                    if len(a.children) > 1:
                        h["names"] = list(a.children)
                    self.received(a.children[0].encode(), h)
        elif kind == "error":
            _, name, i = ev
            fid = self.fids[-1 - i % len(self.fids)] if self.fids else "A:1"
            self.received(name.encode(), m.error_header(fid, "invalid_argument", "x", name=name))
        elif kind == "parent":
            _, what, service, k = ev
            rid = f"P{self.next_id()}"
            if what == "discover":
                self.waiting_parent.add(rid)
                self.feed(FromParent(MsgType.DISCOVER, m.make(MsgType.DISCOVER, rid, service=service, k=k)))
            elif what == "ping":
                out = self.feed(FromParent(MsgType.PING, m.make(MsgType.PING, rid)))
                assert [a.header["type"] for a in out] == ["pong"]
            else:
                assert self.feed(FromParent(MsgType.REGISTERED, m.make(MsgType.REGISTERED, rid))) == []
        elif kind == "query":
            _, peer, type_ = ev
            fields = {"call": dict(service="add", args=[], kwargs={}), "catalogue": dict(services={}),
                      "heartbeat_ack": dict(known=True)}.get(type_, {})
            h = m.make(MsgType(type_), self.next_id(), **fields)
            out, parsed = self.received(peer, h)
            if type_ in ANSWERED_AT_ONCE and parsed is not None:
                assert [a.to for a in out if isinstance(a, Send) and a.header["id"] == h["id"]] == [peer]
        elif kind == "junk":
            _, peer, type_, fields = ev
            h = {"v": 1, "type": type_, "id": self.next_id(), **fields}
            if type_ == "discover":
                self.waiting_peer[h["id"]] = peer
            out, parsed = self.received(peer, h)
            if parsed is None:
                self.waiting_peer.pop(h["id"], None)
            elif type_ in ANSWERED_AT_ONCE:
                assert any(isinstance(a, Send) and a.header["id"] == h["id"] and a.to == peer for a in out)
        elif kind == "tick":
            self.now += ev[1]
            self.feed(Tick(wall=1000.0 + self.now))
        elif kind == "fail":
            if self.sent:
                self.feed(SendFailed(self.sent[ev[1] % len(self.sent)]))

    def finish(self):
        self.now += 1000.0                  # past every deadline (budgets are at most 60 s)
        self.feed(Tick())
        assert self.s.discoveries.pending == {}
        assert self.waiting_peer == {}, f"discoveries never answered: {self.waiting_peer}"
        assert self.waiting_parent == set()
        wake = self.s.next_wakeup()
        assert wake is None or wake > self.now - 1e-9     # nothing overdue: no busy loop
        st_ = self.s.statistics()
        assert st_.pending_discoveries == 0 and st_.children == len(self.s.registry.children)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events, max_size=40))
def test_master_agent_random_sequences(evs):
    run = Run(MasterRole(), None)
    for ev in PREFIX + evs:
        run.step(ev)
    run.finish()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events, max_size=40))
def test_local_agent_random_sequences(evs):
    run = Run(LocalRole(), "tcp://parent:1")
    for ev in PREFIX + evs:
        run.step(ev)
    run.finish()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["tick", "register", "discover"]), st.floats(0, 2)), max_size=30))
def test_next_wakeup_is_never_in_the_past_after_a_tick(evs):
    """The runtime arms its one timer at next_wakeup(): after a Tick at
    ``now`` nothing may be due at or before ``now`` (else it would spin)."""
    run = Run(MasterRole(), None)
    for what, dt in evs:
        if what == "tick":
            run.now += dt
            run.feed(Tick())
            wake = run.s.next_wakeup()
            assert wake is None or wake > run.now
        elif what == "register":
            run.step(("register", "c1", ["add"], "sed", 1, None))
        else:
            run.step(("discover", b"k1", "add", 1, dt * 1000, None))
