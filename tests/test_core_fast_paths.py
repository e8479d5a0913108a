"""The shortcuts of the fan-out path (taken once per SeD and discovery, so
they decide how fast a 100,000-SeD tree is simulated): each gives what the
straightforward computation gives."""
import bisect
import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gridrpc.core import messages as m
from gridrpc.core.agent.machine import AgentConfig, AgentState, LocalRole, Received
from gridrpc.core.estimation import RunTimePredictor, queue_tags, scheduler_tags
from gridrpc.core.messages import MsgType
from gridrpc.core.queue import Request, SedScheduler, make_policy
from gridrpc.core.view import _P95, LATENCY_SAMPLES, ChildLatency


def _p95_reference(xs):
    srt = sorted(xs[-LATENCY_SAMPLES:])
    return srt[min(len(srt) - 1, int(math.ceil(0.95 * len(srt))) - 1)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.floats(0, 10)), min_size=1, max_size=120))
def test_child_latency_p95_is_the_sorted_windows(obs):
    lat = ChildLatency()
    seen: dict[str, list] = {}
    for i, (child, x) in enumerate(obs):
        if i % 3:
            lat.observe(child, x)
        else:
            lat.observe_all([child], x)
        seen.setdefault(child, []).append(x)
        assert lat.p95[child] == _p95_reference(seen[child])
        assert lat.samples[child] == seen[child][-LATENCY_SAMPLES:]
    lat.forget("a")
    lat.observe("a", 3.0)
    assert lat.p95["a"] == 3.0


def test_child_latency_p95_over_a_long_run():
    """Past 20 samples the 95th percentile is no longer the largest; past
    LATENCY_SAMPLES the oldest leave the window."""
    rng = random.Random(3)
    lat, xs = ChildLatency(), []
    for _ in range(3 * LATENCY_SAMPLES):
        xs.append(rng.expovariate(100.0))
        lat.observe_all(["a", "b"], xs[-1])
        assert lat.p95["a"] == lat.p95["b"] == _p95_reference(xs)
    assert lat.p95["a"] < max(xs[-LATENCY_SAMPLES:])


class _ChildLatencyReference:
    """ChildLatency as it was: a window of samples per child."""

    def __init__(self):
        self.samples, self._sorted, self.p95, self.missed = {}, {}, {}, {}
        self.floor, self.factor = ChildLatency().floor, ChildLatency().factor

    def observe_all(self, children, seconds):
        for child in children:
            xs = self.samples.get(child)
            if xs is None:
                xs = self.samples[child] = []
                self._sorted[child] = []
            srt = self._sorted[child]
            xs.append(seconds)
            bisect.insort(srt, seconds)
            if len(xs) > LATENCY_SAMPLES:
                del srt[bisect.bisect_left(srt, xs.pop(0))]
            self.p95[child] = srt[_P95[len(srt)]]
            if self.missed:
                self.missed.pop(child, None)

    def forget(self, child):
        for d in (self.samples, self._sorted, self.p95, self.missed):
            d.pop(child, None)


_CHILDREN = ["a", "b", "c", "d", "e"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("observe"), st.lists(st.sampled_from(_CHILDREN), max_size=6), st.floats(0, 5)),
    st.tuples(st.just("forget"), st.sampled_from(_CHILDREN), st.just(0.0)),
    st.tuples(st.just("miss"), st.sampled_from(_CHILDREN), st.floats(0, 5))), max_size=80),
    st.integers(0, 2))
def test_child_latency_shared_windows_are_a_window_per_child(ops, repeat):
    """Children observed together share one window (copied when one of
    them is observed alone): the samples, sorted samples, p95 (in the same
    key order), misses and deadlines of a window per child, whatever the
    groups, repeats (``repeat`` more rounds of the same group, to fill the
    windows past LATENCY_SAMPLES), duplicates and forgotten children."""
    lat, ref = ChildLatency(), _ChildLatencyReference()
    for op, arg, x in ops:
        if op == "observe":
            for i in range(1 + repeat * 15):
                lat.observe_all(list(arg), x + i)
                ref.observe_all(list(arg), x + i)
        elif op == "forget":
            lat.forget(arg)
            ref.forget(arg)
        else:
            lat.miss(arg, x)
            ref.missed[arg] = x
        assert lat.samples == ref.samples and lat._sorted == ref._sorted
        assert list(lat.samples) == list(ref.samples) and list(lat._sorted) == list(ref._sorted)
        assert list(lat.p95.items()) == list(ref.p95.items())
        assert lat.missed == ref.missed
        for c in _CHILDREN:
            assert lat.deadline([c, "a"], 9.0) == ChildLatency.deadline(ref, [c, "a"], 9.0)


def test_child_latency_shares_the_window_of_children_observed_together():
    lat = ChildLatency()
    names = [f"s-{i}" for i in range(18)]
    for i in range(40):
        lat.observe_all(names, 0.001 * i)
    assert len({id(lat.samples[n]) for n in names}) == 1         # one window for the SeD process's replicas
    lat.observe("s-3", 1.0)                                       # one answered alone: its own copy from now on
    assert lat.samples["s-3"][-1] == 1.0 and lat.samples["s-4"][-1] == 0.039
    assert len({id(lat.samples[n]) for n in names}) == 2


def _queue_tags_reference(service, predictor, now, max_concurrent, last_solve, running, waiting):
    """queue_tags as it was (every case through the slot simulation)."""
    tcomp = predictor.predict(service)
    slots = sorted(max(now, start + predictor.predict(svc)) for start, svc in running)
    slots += [now] * max(0, max_concurrent - len(slots))
    slots.sort()
    for s in waiting:
        slots[0] += predictor.predict(s)
        slots.sort()
    return {"tcomp": tcomp, "eft": slots[0] + tcomp, "num_waiting": len(waiting), "num_running": len(running),
            "max_concurrent": max_concurrent,
            "time_since_last_solve": (now - last_solve) if last_solve is not None else 1e9,
            "est_wait": slots[0] - now}


@settings(max_examples=80, deadline=None)
@given(st.floats(0, 1e6), st.integers(1, 4), st.one_of(st.none(), st.floats(0, 1e6)),
       st.lists(st.tuples(st.floats(0, 1e6), st.sampled_from(["a", "b"])), max_size=3),
       st.lists(st.sampled_from(["a", "b"]), max_size=3))
def test_queue_tags_idle_shortcut_is_the_slot_simulation(now, mc, last, running, waiting):
    p = RunTimePredictor()
    p.observe("a", 0.5)
    p.observe("b", 2.0)
    for r, w in ((running, waiting), ([], [])):
        got = queue_tags(service="a", predictor=p, now=now, num_waiting=len(w), num_running=len(r),
                         max_concurrent=mc, last_solve=last, running=r, waiting_services=w)
        assert got == _queue_tags_reference("a", p, now, mc, last, r, w)


def test_scheduler_tags_of_an_idle_and_a_busy_scheduler():
    p = RunTimePredictor()
    p.observe("a", 0.5)
    sch = SedScheduler(make_policy("fcfs"), max_concurrent=1)
    idle = scheduler_tags(scheduler=sch, service="a", predictor=p, now=10.0, last_solve=4.0)
    assert idle == _queue_tags_reference("a", p, 10.0, 1, 4.0, [], [])
    sch.submit(Request(id="r1", user="u", service="a", submitted=10.0), 10.0)
    sch.submit(Request(id="r2", user="u", service="a", submitted=10.0), 10.0)
    busy = scheduler_tags(scheduler=sch, service="a", predictor=p, now=10.2, last_solve=4.0)
    assert busy == _queue_tags_reference("a", p, 10.2, 1, 4.0, [(10.0, "a")], ["a"])
    assert busy["est_wait"] > 0 and idle["est_wait"] == 0.0


@settings(max_examples=100, deadline=None)
@given(st.floats(0, 1e6), st.integers(1, 3), st.one_of(st.none(), st.floats(0, 1e6)),
       st.integers(0, 3), st.sampled_from(["serial", "batch"]),
       st.dictionaries(st.sampled_from(["nb_cpu", "free_cpu", "tcomp", "server_type", "eft"]), st.integers(0, 9),
                       max_size=4))
def test_estimation_vector_is_the_merge(now, mc, last, calls, server_type, host_tags):
    """The whole vector, idle or not (idle: filled in place), is the merge
    of the host's tags, the server type and scheduler_tags, keys in the same order."""
    from gridrpc.core.estimation import estimation_vector
    p = RunTimePredictor()
    p.observe("a", 0.5)
    sch = SedScheduler(make_policy("fcfs"), max_concurrent=mc)
    for i in range(calls):
        sch.submit(Request(id=f"r{i}", user="u", service="a", submitted=now), now)
    for service in ("a", "b"):
        got = estimation_vector(host_tags, server_type, scheduler=sch, service=service, predictor=p, now=now,
                                last_solve=last)
        want = {**host_tags, "server_type": server_type,
                **scheduler_tags(scheduler=sch, service=service, predictor=p, now=now, last_solve=last)}
        assert got == want and list(got) == list(want)
        assert [type(v) for v in got.values()] == [type(v) for v in want.values()]
        assert got is not host_tags


def _register(st_, name, pid, now=0.0):
    h = m.make(MsgType.REGISTER, f"r-{name}-{now}", name=name, kind="sed", address="tcp://h:1", pid=pid,
               services=["add"])
    st_.handle(Received(name.encode(), MsgType.REGISTER, h), now)


def _fanout_names(st_, rid, now):
    out = st_.handle(Received(b"client", MsgType.DISCOVER, m.make(MsgType.DISCOVER, rid, service="add", k=1)), now)
    return sorted(tuple(a.header.get("names") or [a.to.decode()]) for a in out)


def test_fanout_groups_follow_the_registry():
    """The replicas of one process get one message; the groups are kept
    between fan-outs and redone when the registry changes."""
    la = AgentState(AgentConfig(name="LA", view=False), LocalRole(), random.Random(0))
    _register(la, "p-1", 7)
    _register(la, "p-2", 7)
    assert _fanout_names(la, "d1", 0.1) == [("p-1", "p-2")]
    assert _fanout_names(la, "d2", 0.2) == [("p-1", "p-2")]
    _register(la, "p-3", 7, 0.3)
    assert _fanout_names(la, "d3", 0.3) == [("p-1", "p-2", "p-3")]
    _register(la, "p-2", 8, 0.4)                        # restarted as another process
    assert _fanout_names(la, "d4", 0.4) == [("p-1", "p-3"), ("p-2",)]


def _owners_reference(reg):
    """owner_of's map built from scratch (what every registration did)."""
    owners = {}
    for n, c in reg.children.items():
        owners[n] = n
        for e in c.elements:
            if isinstance(e.get("name"), str):
                owners.setdefault(e["name"], n)
    return owners


def test_owner_of_follows_registrations_as_a_rebuild_would():
    """Random registrations (new children, LAs re-registering with more,
    fewer or clashing names), heartbeats carrying elements and removals:
    owner_of answers as the map rebuilt from scratch, and most
    registrations do not rebuild it."""
    from gridrpc.core.tree import ChildRegistry
    rng = random.Random(4)
    reg = ChildRegistry("MA")
    pool = [f"s{i}" for i in range(60)] + ["LA1", "LA2"]

    for step in range(600):
        op = rng.random()
        name = rng.choice(["LA1", "LA2", "LA3", f"sed{rng.randrange(40)}"])
        els = [{"name": n, "kind": "sed", "services": ["a"]} for n in rng.sample(pool, rng.randrange(0, 8))]
        if op < 0.6:
            reg.register(name.encode(), {"name": name, "kind": "la" if name.startswith("LA") else "sed",
                                         "services": ["a"], "elements": els}, step)
        elif op < 0.8 and name in reg.children:
            c = reg.children[name]
            reg.heartbeat(c.route, {"name": name, "elements": c.elements + els[:2]}, step)
        elif op < 0.85:
            reg.remove(name)
        want = _owners_reference(reg)
        for n in pool + ["LA1", "LA2", "LA3", "sed3", "nobody"]:
            assert reg.owner_of(n) == want.get(n), (step, n)


def test_owner_of_is_not_rebuilt_as_seds_and_subtrees_grow():
    from gridrpc.core.tree import ChildRegistry
    reg = ChildRegistry("LA")
    reg.owner_of("x")
    for i in range(200):                # SeDs registering one after the other (a leaf agent)
        reg.register(b"r", {"name": f"s{i}", "kind": "sed", "services": ["a"]}, 0.0)
        assert reg._owners is not None and reg.owner_of(f"s{i}") == f"s{i}"
    els = []
    for i in range(50):                 # an LA registering again with a growing subtree (the master agent)
        els = els + [{"name": f"t{i}", "kind": "sed"}]
        reg.register(b"la", {"name": "LA9", "kind": "la", "services": ["a"], "elements": els}, 0.0)
        assert reg._owners is not None and reg.owner_of(f"t{i}") == "LA9"
    reg.register(b"la", {"name": "LA9", "kind": "la", "services": ["a"], "elements": els[1:]}, 0.0)
    assert reg._owners is None and reg.owner_of("t0") is None      # a name gone: rebuilt


ODD = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5), st.booleans(), st.none(),
                st.text(max_size=2))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.fixed_dictionaries({"time_since_last_solve": ODD}), st.just({}), st.just("bad"),
                          st.none()), max_size=12), st.integers(0, 10 ** 6))
def test_default_rank_inlined_is_the_keyed_sort(ests, seed):
    """``default``'s rank (its key inlined) gives the order, and draws the
    random numbers, of the generic keyed sort with the documented key."""
    from gridrpc.core.aggregators import _est, _keyed, make_aggregator, num as _num
    servers = [{"name": f"s{i}", "estimation": e} for i, e in enumerate(ests)]

    def key(s):
        v = _num(_est(s), "time_since_last_solve")
        return (0, -v) if v is not None else (1, 0.0)
    a, b = random.Random(seed), random.Random(seed)
    assert make_aggregator("default").rank(servers, a) == _keyed(servers, b, key)
    assert a.random() == b.random()
