"""The kept ranking of a view (core/view_rank.py): same estimates, same
answers as ranking the whole view; its cost does not grow with the view."""
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gridrpc.core import messages as m
from gridrpc.core.agent.machine import AgentConfig, AgentState, MasterRole, Received, Send, Tick
from gridrpc.core.aggregators import make_aggregator
from gridrpc.core.messages import MsgType
from gridrpc.core.view import HERD_GROUP, MAX_RANKINGS, candidates, power_of_two, split_common
from gridrpc.core.view_rank import SortedBlocks, age_vector

SERVICE = "add"


def vec(tsls, **kw):
    v = {"tcomp": 0.01, "eft": 100.0, "est_wait": 0.0, "num_waiting": 0, "num_running": 0,
         "max_concurrent": 1, "time_since_last_solve": tsls, "free_cpu": 0.5, "server_type": "serial"}
    v.update(kw)
    return v


def entry(name, v, age_ms=0, services=(SERVICE,)):
    common, own = split_common({s: v for s in services})
    return {"name": name, "common": common, "services": own, "age_ms": age_ms}


class Tree:
    """An MA with LAs under it, each naming its SeDs (as a LA registers)."""

    def __init__(self, las=3, per=100, seed=1, services=(SERVICE,), **cfg):
        self.ma = AgentState(AgentConfig(name="MA", rebuild_time=0.0, **cfg), MasterRole(), random.Random(seed))
        self.services = services
        self.under = {f"LA{i}": [f"s{i}-{j}" for j in range(per)] for i in range(las)}
        for la in self.under:
            self.register(la, 0.0)
        self.n = 0

    def register(self, la, now):
        els = [{"name": s, "parent": la, "kind": "sed", "services": list(self.services),
                "address": f"tcp://{s}:1"} for s in self.under[la]]
        self.ma.handle(Received(la.encode(), MsgType.REGISTER, m.make(
            MsgType.REGISTER, f"r-{la}-{now}", name=la, kind="la", address=f"tcp://{la}:1", pid=1,
            services=list(self.services), elements=els)), now)
        self.ma.handle(Received(la.encode(), MsgType.HEARTBEAT, m.make(MsgType.HEARTBEAT, "hb", name=la)), now)

    def view(self, la, now, entries=(), gone=(), fresh=()):
        self.n += 1
        h = m.make(MsgType.VIEW, f"v{self.n}", name=la, entries=list(entries), **({"gone": list(gone)} if gone else {}),
                   **({"fresh": list(fresh)} if fresh else {}))
        self.ma.handle(Received(la.encode(), MsgType.VIEW, h), now)

    def discover(self, now, k=3, **kw):
        self.n += 1
        h = m.make(MsgType.DISCOVER, f"d{self.n}", service=SERVICE, k=k, **kw)
        return self.ma.handle(Received(b"client", MsgType.DISCOVER, h), now)


def whole_view(ma, now, max_age=1.5):
    """The ranking of every SeD of the view (what the root did before): the
    order, ties aside (the scenarios below have none)."""
    expected = ma.offers()[0][SERVICE]
    servers = candidates(ma.view, expected, SERVICE, now, max_age, silent_after=max_age)
    if not servers:
        return []
    return make_aggregator("default").rank(ma.discoveries.with_recent_since(servers, now), random.Random(0))


def kept(ma, now, k=3):
    expected = ma.offers()[0][SERVICE]
    agg = make_aggregator("default")
    r = ma._ranking(SERVICE, agg, len(expected))
    assert r is not None
    return r.answer(ma.view.seds, expected, now, 1.5, k)


def view_answer(actions):
    assert len(actions) == 1 and isinstance(actions[0], Send) and actions[0].header.get("view") is True, actions
    return actions[0].header


def test_kept_ranking_answers_as_the_whole_view_through_changes():
    """A long random life of a 300-SeD view: snapshots pushed anew (aged
    on the way), removed, confirmed or not (silent SeDs), an LA's subtree
    changing, and discoveries (the root's recent choices shown as load).
    After every step the kept ranking's first places are the whole view's,
    in the same order, and the answer through the agent is the whole
    view's ranking through the same power-of-two draw."""
    rnd = random.Random(5)
    t = Tree(view_index_min=0)
    now = 0.0
    for la, names in t.under.items():
        t.view(la, now, [entry(s, vec(rnd.uniform(0, 100))) for s in names])
    t.discover(now + 0.001)                     # the ranking exists from here (it drew its seed)
    answers = checked = missing = 0
    back: list = []
    for step in range(400):
        now += rnd.uniform(0.001, 0.05)
        for la_, s in back:                     # pushed again after a step without snapshot
            if s in t.under[la_]:
                t.view(la_, now, [entry(s, vec(rnd.uniform(0, 100)))])
        back = []
        la = rnd.choice(list(t.under))
        names = t.under[la]
        op = rnd.random()
        if op < 0.35:                           # a few SeDs pushed anew (their age on the way)
            t.view(la, now, [entry(s, vec(rnd.uniform(0, 100), num_waiting=rnd.randrange(2)),
                                   age_ms=rnd.uniform(0, 20)) for s in rnd.sample(names, rnd.randrange(1, 6))])
        elif op < 0.45:                         # gone, pushed again at the next step
            gone = rnd.sample(names, 2)
            t.view(la, now, gone=gone)
            back = [(la, s) for s in gone]
        elif op < 0.55:                         # confirmations: the others of that LA age towards silence
            t.view(la, now, fresh=rnd.sample(names, len(names) // 2))
        elif op < 0.6:                          # the LA's subtree changes (the registry's offers too)
            if rnd.random() < 0.5 and len(names) > 50:
                t.under[la] = names[:-1]
            else:
                t.under[la] = names + [f"{la}-new{step}"]
            t.register(la, now)
            t.view(la, now, [entry(s, vec(rnd.uniform(0, 100))) for s in t.under[la]
                             if s not in t.ma.view.seds])
        else:
            state = t.ma.discoveries.rng.getstate()
            want = whole_view(t.ma, now)
            out = t.discover(now, k=3)
            if want:
                rng = random.Random()
                rng.setstate(state)
                got = view_answer(out)["servers"]
                assert [s["name"] for s in got] == [s["name"] for s in power_of_two(want, 3, rng)]
                answers += 1
            continue
        want = whole_view(t.ma, now)
        got = kept(t.ma, now)
        if got is None:                         # a SeD without snapshot: the whole view (or a fan-out) decides
            assert any(s not in t.ma.view.seds for s in t.ma.offers()[0][SERVICE])
            missing += 1
            continue
        assert [s["name"] for s in got] == [s["name"] for s in want[:HERD_GROUP]]
        for a, b in zip(got, want):
            assert a["estimation"] == b["estimation"] and a["address"] == b["address"]
        checked += 1
    assert answers > 100 and checked > 100 and missing > 10
    assert len(t.ma.discoveries.recent) > 5                 # the recent choices did take part


KINDS = ("view_ranked", "view_sorted", "view_moved", "view_walked")


def _did(t, **kw):
    """One discovery answered from the view: what it did (counter deltas)."""
    c = t.ma.counters
    before = {k: getattr(c, k) for k in KINDS}
    view_answer(t.discover(kw.pop("now", 0.1), **kw))
    return {k[5:]: getattr(c, k) - before[k] for k in KINDS}


def test_a_kept_answer_costs_its_first_places_not_the_view():
    big = Tree(las=4, per=1500, view_index_min=0)
    whole = Tree(las=4, per=1500)
    whole.ma = AgentState(AgentConfig(name="MA", rebuild_time=0.0, view_index_min=10 ** 9), MasterRole(),
                          random.Random(1))
    for la in whole.under:
        whole.register(la, 0.0)
    for t in (big, whole):
        for la, names in t.under.items():
            t.view(la, 0.0, [entry(s, vec(5.0 + i * 1e-3)) for i, s in enumerate(names)])
        first = _did(t, now=0.01)
        if t is big:            # created: every SeD keyed and sorted, and counted against the registry
            assert first == {"ranked": 0, "sorted": 12000, "moved": 0, "walked": HERD_GROUP}
        else:
            assert first == {"ranked": 6000, "sorted": 0, "moved": 0, "walked": 0}
    for t in (big, whole):
        t.view("LA1", 0.02, [entry("s1-7", vec(0.5))])           # one SeD solved something
    kept, full = _did(big, now=0.03), _did(whole, now=0.03)
    assert full == {"ranked": 6000, "sorted": 0, "moved": 0, "walked": 0}
    # the SeD that solved something and the previous answer's choice moved; the first places walked
    assert kept == {"ranked": 0, "sorted": 0, "moved": 2, "walked": HERD_GROUP}
    assert view_answer(big.discover(0.04))["answered"] == 6000


def test_when_the_whole_view_is_ranked_instead():
    """Below ``view_index_min`` SeDs, for an aggregator without a
    ``view_key``, or for a request asking fresher state than the agent's
    bound, the root ranks the whole view as before; a SeD without snapshot
    still means a fan-out."""
    t = Tree(las=2, per=200, view_index_min=300)
    for la, names in t.under.items():
        t.view(la, 0.0, [entry(s, vec(float(i))) for i, s in enumerate(names)])
    assert _did(t)["sorted"] == 800         # 400 SeDs >= 300: kept; the first answer sorts them all
    assert _did(t)["walked"] < 100 and _did(t)["sorted"] == 0     # then only the first places
    assert _did(t, aggregator="least_wait_time")["ranked"] == 400
    assert _did(t, max_age_ms=1000)["ranked"] == 400
    t2 = Tree(las=2, per=100, view_index_min=300)
    for la, names in t2.under.items():
        t2.view(la, 0.0, [entry(s, vec(float(i))) for i, s in enumerate(names)])
    for now in (0.1, 0.2):
        assert _did(t2, now=now) == {"ranked": 200, "sorted": 0, "moved": 0, "walked": 0}   # 200 < 300: whole
    t.view("LA0", 0.3, gone=["s0-3"])                       # a SeD without snapshot: the fan-out asks
    out = t.discover(0.3)
    assert all(a.header["type"] == "discover" for a in out) and {a.to for a in out} == {b"LA0", b"LA1"}


def test_silent_seds_leave_the_kept_answer_and_come_back():
    t = Tree(las=2, per=150, view_index_min=0)
    for la, names in t.under.items():
        t.view(la, 0.0, [entry(s, vec(100.0 - i * 0.1)) for i, s in enumerate(names)])
    first = [s["name"] for s in view_answer(t.discover(0.1, k=1))["servers"]]
    # LA0 confirms its SeDs, LA1 falls silent: past 1.5 s only LA0's are answered
    t.view("LA0", 1.2, fresh=t.under["LA0"])
    got = kept(t.ma, 1.7)
    assert got and {s["name"] for s in got} <= set(t.under["LA0"])
    t.view("LA1", 1.8, fresh=t.under["LA1"])
    got = kept(t.ma, 1.9)
    assert {s["name"][:2] for s in got} == {"s0", "s1"}
    assert first[0] in t.under["LA0"] + t.under["LA1"]
    t.ma.handle(Tick(), 9.0)                                # both LAs silent past the timeout: dropped
    assert not t.ma.view.seds and t.discover(9.0)[0].header["type"] == "error"


def test_kept_rankings_are_bounded():
    services = tuple(f"svc{i}" for i in range(MAX_RANKINGS + 2))
    t = Tree(las=1, per=20, services=services, view_index_min=0)
    t.view("LA0", 0.0, [entry(s, vec(float(i)), services=services) for i, s in enumerate(t.under["LA0"])])
    for svc in services:
        h = m.make(MsgType.DISCOVER, f"d-{svc}", service=svc, k=1)
        view_answer(t.ma.handle(Received(b"client", MsgType.DISCOVER, h), 0.1))
    assert len(t.ma._rankings) == MAX_RANKINGS == len(t.ma.view.rankings)
    assert {r.service for r in t.ma.view.rankings} == set(services[-MAX_RANKINGS:])


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.floats(0, 1e4), st.sampled_from([0.0, 5.0])),
                          st.floats(0, 100)), min_size=2, max_size=30),
       st.floats(0, 50))
def test_view_key_orders_as_rank_does_on_vectors_aged_to_any_time(snaps, later):
    """``default``'s ``view_key`` (vector, time it was taken) gives the order
    its ``rank`` gives on the vectors aged to a common time, any time."""
    agg = make_aggregator("default")
    now = max(at for _, at in snaps) + later
    aged = []
    for i, (tsls, at) in enumerate(snaps):
        v = vec(tsls) if tsls is not None else {"num_waiting": 0}
        key = agg.view_key(dict(v), at)
        aged.append((key, {"name": f"s{i}", "estimation": age_vector(dict(v), now - at)}))
    ranked = agg.rank([s for _, s in aged], random.Random(0))
    keys = {s["name"]: k for k, s in aged}
    seq = [keys[s["name"]] for s in ranked]
    # the rank's order is the view_key's, up to float rounding between equal-by-construction times
    for a, b in zip(seq, seq[1:]):
        assert a[0] < b[0] or (a[0] == b[0] and a[1] <= b[1] + 1e-9 * max(1.0, abs(a[1]), abs(b[1])))


def test_sorted_blocks_hold_a_sorted_sequence():
    rng = random.Random(8)
    SortedBlocks.BLOCK, block = 4, SortedBlocks.BLOCK           # small blocks: many splits and drops
    try:
        sb, ref = SortedBlocks(), []
        items = [(rng.random(), i) for i in range(300)]
        sb.reset(sorted(items[:50]))
        ref = sorted(items[:50])
        for x in items[50:]:
            sb.add(x)
            ref.append(x)
            if rng.random() < 0.4:
                y = ref.pop(rng.randrange(len(ref)))
                assert sb.remove(y)
            assert not sb.remove((2.0, -1))                    # absent: not found
            assert list(sb) == sorted(ref) and len(sb) == len(ref)
            assert all(0 < len(b) <= 2 * SortedBlocks.BLOCK for b in sb.blocks)
        for y in list(ref):
            assert sb.remove(y)
        assert list(sb) == [] and sb.blocks == [] and not sb.remove(items[0])
    finally:
        SortedBlocks.BLOCK = block
