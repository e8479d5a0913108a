"""Discovery from pushed state, pure: the view, freshness and fallback, the
ranking (as a fan-out's), power-of-two, learnt fan-out deadlines."""
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gridrpc.core import messages as m
from gridrpc.core.agent.machine import (AgentConfig, AgentState, LocalRole, MasterRole, Received, Send, SendParent,
                                Tick)
from gridrpc.core.aggregators import make_aggregator
from gridrpc.core.messages import MsgType
from gridrpc.core.view import VOLATILE as VOL
from gridrpc.core.view import num as _num
from gridrpc.core.view import ChildLatency, PushRule, SubtreeView, near_equal, power_of_two, split_common

ADDR = {"sed-1": "tcp://h:1", "sed-2": "tcp://h:2", "sed-3": "tcp://h:3"}


def vec(**kw):
    base = {"tcomp": 0.01, "eft": 100.0, "est_wait": 0.0, "num_waiting": 0, "num_running": 0,
            "max_concurrent": 1, "time_since_last_solve": 5.0, "free_cpu": 0.5, "server_type": "serial"}
    base.update(kw)
    return base


def register(state, name, now=0.0, services=("add",)):
    h = m.make(MsgType.REGISTER, f"r-{name}", name=name, kind="sed", address=ADDR.get(name, "tcp://h:9"),
               pid=hash(name) % 10000, services=[{"name": s} for s in services])
    return state.handle(Received(name.encode(), MsgType.REGISTER, h), now)


def push(state, name, vectors, now, age_ms=0):
    common, own = split_common(vectors)
    h = m.make(MsgType.VIEW, f"v-{name}", name=name,
               entries=[{"name": name, "common": common, "services": own, "age_ms": age_ms}])
    return state.handle(Received(name.encode(), MsgType.VIEW, h), now)


def discover(state, now, k=3, rid="d1", **kw):
    h = m.make(MsgType.DISCOVER, rid, service="add", k=k, **kw)
    return state.handle(Received(b"client", MsgType.DISCOVER, h), now)


def ma(seed=1, **cfg):
    return AgentState(AgentConfig(name="MA", **cfg), MasterRole(), random.Random(seed))


def answered_from_view(actions):
    return (len(actions) == 1 and isinstance(actions[0], Send) and actions[0].to == b"client"
            and actions[0].header.get("view") is True)


def test_fresh_view_answers_in_one_hop():
    s = ma()
    for n in ("sed-1", "sed-2"):
        register(s, n)
        push(s, n, {"add": vec()}, 0.0)
    out = discover(s, 0.1)
    assert answered_from_view(out)
    servers = out[0].header["servers"]
    assert {x["name"] for x in servers} == {"sed-1", "sed-2"}
    assert {x["address"] for x in servers} == {ADDR["sed-1"], ADDR["sed-2"]}     # from the registry
    assert s.statistics().view_answers == 1


def test_missing_or_stale_snapshot_falls_back_to_fanout():
    s = ma()
    for n in ("sed-1", "sed-2"):
        register(s, n)
    push(s, "sed-1", {"add": vec()}, 0.0)
    out = discover(s, 0.1)                           # sed-2 never pushed
    assert not answered_from_view(out) and {a.to for a in out} == {b"sed-1", b"sed-2"}
    push(s, "sed-2", {"add": vec()}, 0.0)
    assert answered_from_view(discover(s, 1.0, rid="d2"))
    assert not answered_from_view(discover(s, 2.0, rid="d3"))      # older than 1.5 s: fan-out
    hb = m.make(MsgType.HEARTBEAT, "hb", name="sed-1")
    s.handle(Received(b"sed-1", MsgType.HEARTBEAT, hb), 2.0)
    s.handle(Received(b"sed-2", MsgType.HEARTBEAT, dict(hb, name="sed-2")), 2.0)
    assert answered_from_view(discover(s, 2.1, rid="d4"))          # a heartbeat confirms the snapshot


def test_a_silent_sed_is_left_out_of_view_answers_not_a_reason_to_fan_out():
    """A SeD that pushed, then went silent (frozen, cut off) past the
    agent's bound is left out, as the fan-out would leave it out at its
    deadline: the others are still answered in one hop (before, every
    discovery fanned out and waited for it until its parent dropped it)."""
    s = ma()
    for n in ("sed-1", "sed-2"):
        register(s, n)
        push(s, n, {"add": vec()}, 0.0)
    hb = m.make(MsgType.HEARTBEAT, "hb", name="sed-1")
    s.handle(Received(b"sed-1", MsgType.HEARTBEAT, hb), 1.9)           # sed-2 says nothing
    out = discover(s, 2.0)
    assert answered_from_view(out)
    assert [x["name"] for x in out[0].header["servers"]] == ["sed-1"]
    # a request asking for fresher state than the heartbeats give is not answered from a subset
    assert not answered_from_view(discover(s, 2.0, rid="d2", max_age_ms=50))


def test_request_freshness_bound_and_zero_forces_fanout():
    s = ma()
    register(s, "sed-1")
    push(s, "sed-1", {"add": vec()}, 0.0)
    assert not answered_from_view(discover(s, 0.5, max_age_ms=0))
    assert not answered_from_view(discover(s, 0.5, rid="d2", max_age_ms=100))
    assert answered_from_view(discover(s, 0.5, rid="d3", max_age_ms=1000))


def test_request_dependent_service_is_never_pushed_so_it_fans_out():
    s = ma()
    register(s, "sed-1", services=("add", "solve"))
    push(s, "sed-1", {"add": vec()}, 0.0)            # "solve" has its own estimate: not in the snapshot
    h = m.make(MsgType.DISCOVER, "d-solve", service="solve", k=1)
    out = s.handle(Received(b"client", MsgType.DISCOVER, h), 0.1)
    assert [a.to for a in out] == [b"sed-1"] and out[0].header["type"] == "discover"


def test_a_child_speaks_only_for_its_subtree():
    s = ma()
    register(s, "sed-1")
    register(s, "sed-2")
    h = m.make(MsgType.VIEW, "v", name="sed-1", entries=[{"name": "sed-2", "services": {"add": vec()}}])
    s.handle(Received(b"sed-1", MsgType.VIEW, h), 0.0)
    assert "sed-2" not in s.view.seds and s.view.refused == 1
    s.handle(Received(b"intruder", MsgType.VIEW, dict(h, name="sed-2")), 0.0)    # wrong route
    assert "sed-2" not in s.view.seds


def test_lost_child_leaves_the_view():
    s = ma()
    register(s, "sed-1")
    push(s, "sed-1", {"add": vec()}, 0.0)
    s.handle(Tick(), 0.6)
    s.handle(Tick(), 3.7)                            # missed heartbeats (timeout 3 s)
    assert "sed-1" not in s.view.seds


def test_local_agent_batches_snapshots_up():
    la = AgentState(AgentConfig(name="LA1", parent="tcp://ma:1"), LocalRole(), random.Random(0))
    for n in ("sed-1", "sed-2"):
        register(la, n)
        push(la, n, {"add": vec()}, 0.0)
    assert la.next_wakeup() <= 0.002 + 1e-9
    out = la.handle(Tick(), 0.003)
    ups = [a for a in out if isinstance(a, SendParent) and a.header["type"] == "view"]
    assert len(ups) == 1 and {e["name"] for e in ups[0].header["entries"]} == {"sed-1", "sed-2"}
    m.parse_header(m.dumps(ups[0].header))          # valid on the wire
    # the MA takes it, with the LA's elements naming the SeDs
    s = ma()
    elements = la.elements(0.0)
    h = m.make(MsgType.REGISTER, "r", name="LA1", kind="la", address="tcp://la:1", services=[{"name": "add"}],
               elements=elements)
    s.handle(Received(b"LA1", MsgType.REGISTER, h), 0.0)
    s.handle(Received(b"LA1", MsgType.VIEW, ups[0].header), 0.004)
    out = discover(s, 0.01)
    assert answered_from_view(out) and len(out[0].header["servers"]) == 2
    # gone: the LA lost sed-2
    la.handle(Received(b"sed-2", MsgType.UNREGISTER, m.make(MsgType.UNREGISTER, "u", name="sed-2")), 0.02)
    up = [a for a in la.handle(Tick(), 0.03) if isinstance(a, SendParent) and a.header["type"] == "view"]
    assert up and up[0].header.get("gone") == ["sed-2"]


def test_choices_update_the_view_at_once():
    """Two discoveries before any push: the second does not pick the first's server."""
    s = ma()
    for n in ("sed-1", "sed-2"):
        register(s, n)
        push(s, n, {"add": vec()}, 0.0)
    a = discover(s, 0.1, k=1)[0].header["servers"][0]["name"]
    b = discover(s, 0.1, k=1, rid="d2")[0].header["servers"][0]["name"]
    assert a != b


# -- ranking: a view answer ranks as the fan-out would -------------------------------
TAGS = st.fixed_dictionaries({
    "num_waiting": st.integers(0, 3), "num_running": st.integers(0, 1), "tcomp": st.sampled_from([0.01, 0.5]),
    "time_since_last_solve": st.floats(0, 100), "eft": st.floats(0, 10), "free_cpu": st.sampled_from([0.1, 0.9])})
AGGS = st.sampled_from(["default", "least_wait_time", "least_slowdown",
                        {"name": "priority", "params": {"order": [["num_waiting", "min"], ["eft", "min"]]}}])


@settings(max_examples=60, deadline=None)
@given(st.lists(TAGS, min_size=1, max_size=3), AGGS, st.integers(1, 3), st.integers(0, 1000))
def test_view_answer_ranks_as_the_fanout_would(vectors, agg, k, seed):
    names = [f"sed-{i + 1}" for i in range(len(vectors))]
    fan, view = ma(seed), ma(seed)
    for n, v in zip(names, vectors):
        register(fan, n)
        register(view, n)
        push(view, n, {"add": v}, 1.0)
    out = discover(fan, 1.0, k=k, aggregator=agg, max_age_ms=0)       # fan-out: every SeD answers
    fid = out[0].header["id"]
    final = []
    for n, v in zip(names, vectors):
        h = m.make(MsgType.SERVERS, fid, name=n, servers=[{"name": n, "address": ADDR[n], "estimation": v}])
        final += fan.handle(Received(n.encode(), MsgType.SERVERS, h), 1.0)
    fan_servers = final[-1].header["servers"]
    got = discover(view, 1.0, k=k, aggregator=agg)
    assert answered_from_view(got)
    view_servers = got[0].header["servers"]
    # same candidates, same ranking; the first place may go to a near-equal server (power of two)
    pick = view_servers[0]
    assert near_equal(pick["estimation"], fan_servers[0]["estimation"]) or pick == fan_servers[0]
    full = make_aggregator(agg).rank(
        [{"name": n, "address": ADDR[n], "estimation": v} for n, v in zip(names, vectors)], random.Random(seed))
    assert pick["name"] in {s["name"] for s in full}
    rest = [s["name"] for s in fan_servers if s["name"] != pick["name"]]
    assert [s["name"] for s in view_servers[1:]] == rest[: k - 1] or pick["name"] not in \
        [s["name"] for s in fan_servers]


def test_power_of_two_spreads_over_near_equal_and_keeps_the_better():
    ranked = [{"name": f"s{i}", "estimation": vec()} for i in range(4)] + \
             [{"name": "busy", "estimation": vec(num_running=1)}]
    rng = random.Random(3)
    firsts = [power_of_two(ranked, 2, rng)[0]["name"] for _ in range(400)]
    assert set(firsts) == {"s0", "s1", "s2", "s3"}                 # never the busy one
    assert firsts.count("s0") > firsts.count("s3")                 # the better of two
    assert power_of_two([ranked[0], ranked[4]], 1, rng)[0]["name"] == "s0"
    assert not near_equal(vec(), vec(server_type="cloud"))
    assert not near_equal(vec(price=1), vec(price=2))


# -- pushes and deadlines ------------------------------------------------------------------
def test_push_rule_coalesces_and_is_fast_on_busy_changes():
    r = PushRule(fast=0.002, slow=0.05)
    assert r.changed((False, 0, 0), False, 0.0) == 0.002
    r.done((False, 0, 0))
    assert r.changed((False, 0, 0), False, 0.01) is None            # unchanged
    assert r.changed((True, 1, 0), True, 0.01) == 0.012            # busy: fast
    assert r.changed((True, 1, 1), True, 0.011) is None            # already due sooner
    r.done((True, 1, 1))
    assert r.changed((True, 1, 2), True, 0.02) == 0.07             # longer queue: slow


def test_push_rule_a_flapping_replica_is_pushed_slowly():
    """Sequential short calls: busy, free (what was pushed), busy again before
    the fast push went out: the push moves to slow after the change began."""
    r = PushRule(fast=0.002, slow=0.05)
    r.done((False, 0, 0))
    assert r.changed((True, 1, 0), True, 1.0) == 1.002             # busy: fast
    assert r.changed((False, 0, 0), False, 1.0003) is None         # back to what was pushed
    assert r.changed((True, 1, 0), True, 1.0006) == 1.05           # busy again: flapping, later
    assert r.changed((False, 0, 0), False, 1.0009) is None
    assert r.changed((True, 1, 0), True, 1.0012) is None           # already postponed: the timer stands
    assert r.take((True, 1, 0), False) is True                     # pushed at 1.05 with the load then
    # a replica that stays busy is still pushed fast (the staleness row)
    assert r.changed((False, 0, 0), False, 2.0) == 2.002
    assert r.take((False, 0, 0), False) is True
    assert r.changed((True, 1, 0), True, 3.0) == 3.002
    assert r.changed((True, 1, 1), True, 3.001) is None            # a longer queue: no bounce, as before
    assert r.take((True, 1, 1), False) is True
    # a bounce that ends the pending change: nothing sent, the next change starts afresh
    assert r.changed((False, 0, 0), False, 4.0) == 4.002
    assert r.changed((True, 1, 1), True, 4.001) is None
    assert r.take((True, 1, 1), False) is False and r.due is None and not r.bounced
    assert r.changed((False, 0, 0), False, 5.0) == 5.002


def test_silent_child_costs_a_learnt_deadline_not_the_budget():
    lat = ChildLatency(floor=0.05, factor=4.0)
    assert lat.deadline(["a"], 2.0) == 2.0                         # nothing learnt yet
    for x in (0.002, 0.003, 0.004):
        lat.observe("a", x)
    assert lat.deadline(["a"], 2.0) == 0.05                        # floor
    assert lat.deadline(["a", "silent"], 2.0) == 0.05              # the unknown child: its siblings' p95
    lat.observe("slow", 0.1)
    assert abs(lat.deadline(["a", "slow"], 2.0) - 0.4) < 1e-9
    assert lat.deadline(["slow"], 0.2) == 0.2                      # never past the budget


def test_agent_fanout_ends_at_the_learnt_deadline_and_skips_the_silent_child_after():
    s = ma(hb_timeout=1000.0)
    register(s, "sed-1")
    register(s, "sed-2")
    push(s, "sed-1", {"add": vec()}, 0.0)
    for i in range(3):                               # sed-1 answers in 2 ms, sed-2 never
        out = discover(s, i * 10.0, rid=f"d{i}", budget_ms=2000, max_age_ms=0)
        fid = out[0].header["id"]
        h = m.make(MsgType.SERVERS, fid, name="sed-1", servers=[{"name": "sed-1", "address": "x",
                                                                 "estimation": vec()}])
        s.handle(Received(b"sed-1", MsgType.SERVERS, h), i * 10.0 + 0.002)
        wake = s.discoveries.next_deadline()
        assert wake is not None and wake - i * 10.0 <= (2.0 if i == 0 else 0.051)
        done = s.handle(Tick(), wake)
        assert [a.header["servers"][0]["name"] for a in done if isinstance(a, Send)] == ["sed-1"]
    # sed-2 missed its deadline: a discovery from the view leaves it out for a while
    push(s, "sed-1", {"add": vec()}, 20.01)
    out = discover(s, 20.02, rid="dv")
    assert answered_from_view(out) and [x["name"] for x in out[0].header["servers"]] == ["sed-1"]
    assert not answered_from_view(discover(s, 21.5, rid="dp"))      # then it is probed again


def test_power_of_two_looks_for_the_near_equal_group_among_the_first_places_only():
    """On thousands of equal servers the first choice is spread over the
    first HERD_GROUP places (not all of them: comparing 2,000 vectors cost
    more than the rest of a view answer), and k are still returned."""
    from gridrpc.core.view import HERD_GROUP
    ranked = [{"name": f"s{i}", "estimation": vec()} for i in range(2000)]
    firsts = {power_of_two(ranked, 3, random.Random(seed))[0]["name"] for seed in range(400)}
    assert len(firsts) > 20                                     # spread, no herd
    assert all(int(n[1:]) < HERD_GROUP for n in firsts)        # within the first places
    out = power_of_two(ranked, 3, random.Random(7))
    assert len(out) == 3 and len({s["name"] for s in out}) == 3


def _near_equal_reference(a: dict, b: dict) -> bool:
    """The definition, tag by tag (the oracle of core.view's near_equal_to)."""
    if (_num(a.get("num_waiting")) or 0) + (_num(a.get("num_running")) or 0) != \
            (_num(b.get("num_waiting")) or 0) + (_num(b.get("num_running")) or 0):
        return False
    for tag in a.keys() | b.keys():
        x, y = a.get(tag), b.get(tag)
        if tag not in VOL:
            if x != y:
                return False
            continue
        tol = VOL[tag]
        if tol is None:
            continue
        fx, fy = _num(x), _num(y)
        if fx is None or fy is None:
            if (fx is None) != (fy is None):
                return False
            continue
        if isinstance(tol, tuple):
            tol = tol[1] * max(abs(fx), abs(fy))
        if abs(fx - fy) > tol:
            return False
    return True


def test_near_equal_to_is_near_equal():
    """The precomputed test power_of_two uses gives the tag-by-tag
    definition's answer (perturbed vectors: tags missing, None, NaN, strings,
    small and large moves)."""
    from gridrpc.core.view import near_equal_to
    rng = random.Random(5)
    base = {"tcomp": 1.0, "eft": 10.0, "est_wait": 0.0, "free_cpu": 0.5, "free_mem": 8e9, "nb_cpu": 4,
            "total_mem": 16e9, "num_waiting": 0, "num_running": 1, "max_concurrent": 1,
            "time_since_last_solve": 3.0, "server_type": "serial"}
    keys = [*base, "price", "x"]
    near = 0
    for _ in range(5000):
        a, b = dict(base), dict(base)
        for d in (a, b):
            for _ in range(rng.randrange(4)):
                k = rng.choice(keys)
                op = rng.randrange(4)
                if op == 0:
                    d.pop(k, None)
                elif op == 1:
                    d[k] = None
                elif op == 2:
                    d[k] = rng.choice([0, 1, 0.001, 1e9, float("nan"), float("inf"), "serial", True, [1]])
                elif type(d.get(k)) in (int, float):
                    d[k] = d[k] + rng.choice([0.0005, 0.01, 0.05, 1.0]) * rng.random()
        assert near_equal_to(a)(b) == _near_equal_reference(a, b), (a, b)
        near += _near_equal_reference(a, b)
    assert 200 < near < 4800


def test_confirmations_are_batched_longer_than_changes():
    """'Still fresh' confirmations (heartbeats) wait up to FRESH_INTERVAL, so
    thousands of SeDs do not wake the parent thousands of times a second; a
    real change pulls the batch in to the push interval."""
    from gridrpc.core.view import FRESH_INTERVAL, PUSH_INTERVAL
    v = SubtreeView()
    v.update("sed-1", [{"name": "sed-1", "common": {}, "services": {"add": vec()}}], [], 0.0, {"sed-1": "sed-1",
                                                                                          "sed-2": "sed-2"})
    v.take(0.0)
    v.refresh("sed-1", ["sed-1"], 1.0)
    assert v.flush_at == 1.0 + FRESH_INTERVAL
    v.update("sed-2", [{"name": "sed-2", "common": {}, "services": {"add": vec()}}], [], 1.01,
             {"sed-1": "sed-1", "sed-2": "sed-2"})
    assert v.flush_at == 1.01 + PUSH_INTERVAL
    batch = v.take(1.02)
    assert [e["name"] for e in batch["entries"]] == ["sed-2"] and batch["fresh"] == ["sed-1"]


def test_an_idle_snapshot_resent_to_a_new_parent_arrives_alive():
    """An LA resends its whole view to a restarted MA: a SeD idle for a long
    time has an old snapshot that heartbeats kept confirming; it must arrive
    with its last confirmation, not expire at once at the parent."""
    la, ma = SubtreeView(), SubtreeView()
    vec = {"add": {"num_running": 0}}
    la.update("s1", [{"name": "s1", "services": vec, "age_ms": 0}], [], 0.0, {"s1": "s1"})
    la.take(0.0)
    for t in range(1, 31):                       # 30 s idle, confirmed by heartbeats
        la.refresh("s1", ["s1"], float(t))
    la.take(30.0)
    la.resend_all(30.0)
    batch = la.take(30.0)
    (entry,) = batch["entries"]
    assert entry["age_ms"] >= 29_000 and entry["seen_ms"] <= 1_000
    ma.update("LA1", batch["entries"], [], 100.0, {"s1": "LA1"})
    ma.expire(100.0, timeout=1.5)
    assert "s1" in ma.seds                       # without seen_ms: older than the timeout, dropped
    assert ma.seds["s1"].at <= 100.0 - 29.0      # its estimate keeps its true age


def _heartbeat(state, name, now):
    h = m.make(MsgType.HEARTBEAT, f"hb-{name}-{now}", name=name)
    acks = [a.header for a in state.handle(Received(name.encode(), MsgType.HEARTBEAT, h), now)
            if isinstance(a, Send) and a.header["type"] == "heartbeat_ack"]
    assert len(acks) == 1
    return acks[0]


def test_a_snapshot_refused_before_its_registration_is_asked_for_again():
    """A snapshot that came before the registration naming its SeD is refused; an idle SeD
    pushes only on change, so the view stayed incomplete and every discovery fanned out for
    good. The agent asks the child for it in a heartbeat ack (after VIEW_ASK_FIRST)."""
    from gridrpc.core.agent.discovery import VIEW_ASK_FIRST
    s = ma()
    register(s, "sed-1")
    push(s, "sed-1", {"add": vec()}, 0.0)
    push(s, "sed-2", {"add": vec()}, 0.0)              # not registered yet: dropped
    assert "sed-2" not in s.view.seds
    register(s, "sed-2", now=0.01)
    assert not answered_from_view(discover(s, 0.05, rid="d0"))     # incomplete: a fan-out
    assert "view_missing" not in _heartbeat(s, "sed-2", 0.5)        # the gap is noted,
    first = 0.5 + VIEW_ASK_FIRST + 0.1
    assert "view_missing" not in _heartbeat(s, "sed-2", first)      # missing at one scan: maybe in flight
    second = first + 2 * VIEW_ASK_FIRST
    assert "view_missing" not in _heartbeat(s, "sed-1", second)     # sed-1 lacks nothing
    assert _heartbeat(s, "sed-2", second + 0.1)["view_missing"] == ["sed-2"]     # missing at two: asked
    assert s.statistics().view_asked == 1
    push(s, "sed-2", {"add": vec()}, second + 0.2)     # the SeD pushes it again
    assert "view_missing" not in _heartbeat(s, "sed-2", second + 10)
    assert answered_from_view(discover(s, second + 10.1, rid="d1"))


def test_a_sed_whose_first_push_is_on_the_way_is_not_asked_for():
    from gridrpc.core.agent.discovery import VIEW_ASK_FIRST
    s = ma()
    register(s, "sed-1")
    _heartbeat(s, "sed-1", 0.0)                        # the gap noted
    register(s, "sed-2", now=VIEW_ASK_FIRST)           # just before the first scan
    assert "view_missing" not in _heartbeat(s, "sed-2", VIEW_ASK_FIRST + 0.01)
    push(s, "sed-2", {"add": vec()}, VIEW_ASK_FIRST + 0.02)    # its push arrives
    ack = _heartbeat(s, "sed-1", 3 * VIEW_ASK_FIRST + 0.1)
    assert ack["view_missing"] == ["sed-1"]           # missing twice; sed-2 arrived in time
    assert s.statistics().view_asked == 1


def test_snapshots_that_never_come_are_asked_at_doubling_intervals():
    # a SeD whose services are not pushed (a request-dependent estimation) never fills the gap
    from gridrpc.core.agent.discovery import VIEW_ASK_FIRST, VIEW_ASK_MAX_S
    s = ma()
    register(s, "sed-1")
    asked = []
    t = 0.0
    while t < 40.0:
        if "view_missing" in _heartbeat(s, "sed-1", t):
            asked.append(t)
        t = round(t + 0.5, 3)
    gaps = [b - a for a, b in zip(asked, asked[1:])]
    assert asked and asked[0] == 3 * VIEW_ASK_FIRST        # the scan at 1 s notes it, the next asks
    assert gaps == [4.0, 8.0, 16.0][:len(gaps)] and len(gaps) >= 2, asked
    assert all(g <= VIEW_ASK_MAX_S for g in gaps)


def test_a_view_asks_nothing_with_views_off_or_when_complete():
    s = ma(view=False)
    register(s, "sed-1")
    assert all("view_missing" not in _heartbeat(s, "sed-1", t) for t in (0.0, 1.5, 3.0, 5.0))
    s = ma()
    register(s, "sed-1")
    push(s, "sed-1", {"add": vec()}, 0.0)
    assert all("view_missing" not in _heartbeat(s, "sed-1", t) for t in (0.0, 1.5, 3.0, 5.0))
    assert s.statistics().view_asked == 0


def test_an_agent_resends_only_the_snapshots_it_holds():
    v = SubtreeView()
    v.update("la", [{"name": "a", "services": {"add": vec()}}], [], 0.0, {"a": "la"})
    v.take(0.1)
    assert v.resend(["a", "b"], 0.2) == 1
    assert [e["name"] for e in v.take(0.3)["entries"]] == ["a"]


def test_a_parent_cannot_flood_a_child_with_view_missing_names():
    import pytest as _pytest
    from gridrpc.core.fields import MAX_VIEW_MISSING
    from gridrpc.errors import ProtocolError
    ok = m.make(MsgType.HEARTBEAT_ACK, "h", known=True, view_missing=[f"s{i}" for i in range(MAX_VIEW_MISSING)])
    assert m.parse_header(m.dumps(ok))[1]["view_missing"][-1] == f"s{MAX_VIEW_MISSING - 1}"
    for bad in ([f"s{i}" for i in range(MAX_VIEW_MISSING + 1)], ["../etc/passwd"], [3], "sed-1"):
        with _pytest.raises(ProtocolError):
            m.parse_header(m.dumps(m.make(MsgType.HEARTBEAT_ACK, "h", known=True, view_missing=bad)))
