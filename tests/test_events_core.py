"""gridrpc.core.events: validation, the bounded ring and story index, and the
rolling aggregates checked against a naive recomputation (pure, hypothesis)."""
from __future__ import annotations

import math
from bisect import bisect_left
from collections import OrderedDict

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gridrpc.core.events import (LATENCY_BOUNDS, OTHER, OUTCOME, TERMINAL, Event, EventKind, EventLog,
                                 EventOutbox, InvalidEvent, decode_events, make_event, quantile,
                                 story_summary)

K = EventKind
NAMES = st.sampled_from(["sed-1", "sed-2", "LA1", "MA", "batch.1"])
SERVICES = st.sampled_from(["add", "sleep", "dgemm", "fail"])
USERS = st.sampled_from(["alice", "bob", "carol", "anonymous"])
IDS = st.sampled_from([f"c{i}" for i in range(12)] + [None])


@st.composite
def events(draw, kinds=st.sampled_from(list(EventKind))):
    kind = draw(kinds)
    return Event(kind=kind, time=draw(st.floats(0, 2e9)), element=draw(NAMES), id=draw(IDS),
                 user=draw(st.none() | USERS), service=draw(st.none() | SERVICES),
                 server=draw(st.none() | NAMES),
                 duration=draw(st.none() | st.floats(0, 100)), optional=draw(st.booleans()),
                 detail=draw(st.none() | st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)))


# -- Event: JSON and validation ----------------------------------------------------
@given(events())
def test_round_trip(ev):
    assert Event.from_json(ev.to_json()) == ev
    assert Event.from_dict(orjson.loads(ev.to_json())) == ev


def test_to_dict_leaves_out_empty_fields():
    d = Event(K.REGISTERED, 1.5, "sed-1", detail="sed under LA1").to_dict()
    assert d == {"kind": "registered", "time": 1.5, "element": "sed-1", "detail": "sed under LA1"}


GOOD = {"kind": "call_finished", "time": 1700000000.0, "element": "sed-1", "id": "abc:1",
        "user": "alice", "service": "add", "server": "sed-1", "duration": 0.5, "detail": "ok"}


@pytest.mark.parametrize("key,value", [
    ("kind", "rm_rf"), ("kind", 3), ("kind", None),
    ("time", "now"), ("time", float("nan")), ("time", float("inf")), ("time", -1), ("time", True), ("time", 1e12),
    ("element", "<script>"), ("element", ""), ("element", "a" * 65), ("element", None), ("element", "../x"),
    ("id", "a/b"), ("id", ""), ("id", "x" * 129), ("id", 7),
    ("user", "bob smith"), ("user", "x\n"), ("user", "<b>"), ("user", ["alice"]),
    ("service", "a b"), ("service", "x" * 129), ("service", "\u202eevil"),
    ("server", "sed 1"), ("server", "a\"b"),
    ("duration", -0.1), ("duration", float("nan")), ("duration", "1s"), ("duration", 1e9), ("duration", False),
    ("optional", "yes"), ("optional", 1),
    ("detail", "x" * 401), ("detail", "line\nbreak"), ("detail", "\x1b[2J"), ("detail", 5),
])
def test_every_field_is_validated(key, value):
    d = dict(GOOD, **{key: value})
    with pytest.raises(InvalidEvent):
        Event.from_dict(d)


def test_from_dict_accepts_the_good_one_and_ignores_unknown_keys():
    ev = Event.from_dict(dict(GOOD, seq=5, future_field=[1, 2]))
    assert ev.kind is K.CALL_FINISHED and ev.duration == 0.5 and ev.user == "alice"


@pytest.mark.parametrize("junk", [b"", b"[]", b"null", b"{", b'{"kind": "registered"}',
                                  b'"x"' * 2000, orjson.dumps({str(i): i for i in range(40)})])
def test_from_json_rejects_junk_with_invalid_event_only(junk):
    with pytest.raises(InvalidEvent):
        Event.from_json(junk)


json_values = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=False) | st.integers() | st.text(max_size=20),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=6),
                           max_leaves=12)


@given(st.dictionaries(st.sampled_from(list(GOOD) + ["optional", "x"]), json_values, max_size=10))
def test_hostile_dicts_raise_only_invalid_event(d):
    try:
        ev = Event.from_dict(d)
    except InvalidEvent:
        return
    assert Event.from_dict(ev.to_dict()) == ev


@given(kind=st.sampled_from(list(EventKind)), element=st.text(max_size=80), user=st.none() | st.text(max_size=80),
       service=st.none() | st.text(max_size=150), server=st.none() | st.text(max_size=80),
       rid=st.none() | st.text(max_size=140), detail=st.none() | st.text(max_size=600),
       duration=st.none() | st.floats(allow_nan=True, allow_infinity=True))
def test_make_event_always_builds_a_valid_event(kind, element, user, service, server, rid, detail, duration):
    ev = make_event(kind, 1.0, element, id=rid, user=user, service=service, server=server,
                    detail=detail, duration=duration)
    assert Event.from_dict(ev.to_dict()) == ev


def test_make_event_keeps_valid_names_untouched():
    ev = make_event(K.CALL_QUEUED, 2.0, "sed-1", id="abc:1", user="alice", service="add", optional=True)
    assert (ev.element, ev.id, ev.user, ev.service, ev.optional) == ("sed-1", "abc:1", "alice", "add", True)
    assert make_event(K.CALL_FAILED, 1, "s", detail="x" * 1000).detail == "x" * 400


def test_decode_events_counts_rejects_and_caps_the_batch():
    good = Event(K.CALL_QUEUED, 1.0, "sed-1", id="r1").to_dict()
    evs, bad = decode_events([good, {"kind": "nope"}, 3, good], max_events=10)
    assert len(evs) == 2 and bad == 2
    evs, bad = decode_events([good] * 20, max_events=5)
    assert len(evs) == 5 and bad == 15
    assert decode_events({"kind": "x"}) == ([], 1)


# -- from_dict's fast paths against the plain validation they replaced -------------------
def _reference_from_dict(d):
    """Event.from_dict as it was before its fast paths (name caches, inline
    checks, _new_event): every name through its regex, the dataclass __init__.
    The fast one must accept and reject exactly the same inputs, with the
    same messages, and build equal events with the same field types."""
    from gridrpc.core.events.event import (_CONTROL_RE, _KINDS, ID_RE, MAX_DETAIL, MAX_DURATION, MAX_TIME,
                                          NAME_RE, SERVICE_RE, USER_RE, _clip)

    def check(key, rx, required=False):
        v = d.get(key)
        if v is None and not required:
            return None
        if type(v) is not str or rx.fullmatch(v) is None:
            raise InvalidEvent(f"{key} {_clip(v)} is not a valid name")
        return v

    if type(d) is not dict:
        raise InvalidEvent("an event is a JSON object")
    if len(d) > 32:
        raise InvalidEvent("too many keys")
    kind = _KINDS.get(d.get("kind")) if type(d.get("kind")) is str else None
    if kind is None:
        raise InvalidEvent(f"unknown kind {_clip(d.get('kind'))}")
    t = d.get("time")
    if type(t) not in (int, float) or not (0 <= t < MAX_TIME):
        raise InvalidEvent("time must be a finite unix time")
    element = check("element", NAME_RE, required=True)
    dur = d.get("duration")
    if dur is not None and (type(dur) not in (int, float) or not (0 <= dur <= MAX_DURATION)):
        raise InvalidEvent("duration must be a finite number of seconds >= 0")
    opt = d.get("optional", False)
    if type(opt) is not bool:
        raise InvalidEvent("optional must be a boolean")
    detail = d.get("detail")
    if detail is not None and (type(detail) is not str or len(detail) > MAX_DETAIL or _CONTROL_RE.search(detail)):
        raise InvalidEvent(f"detail must be printable text of at most {MAX_DETAIL} characters")
    return Event(kind=kind, time=float(t), element=element, id=check("id", ID_RE),
                 user=check("user", USER_RE), service=check("service", SERVICE_RE),
                 server=check("server", NAME_RE), duration=None if dur is None else float(dur),
                 optional=opt, detail=detail)


class _Str(str):
    pass


NEAR_NAMES = st.sampled_from(["sed-1", "sed-1-1", "bench", "add", "alice", "a:b", "a@b", "a+b", "a#b", "a=b",
                              "_x", "-x", ".x", "x" * 64, "x" * 65, "x" * 128, "x" * 129, "", "a b", "\u00e9",
                              "<b>", "a\n", "../x", "c-3f2a91-17", "\u202eevil"])
ANY = (st.none() | st.booleans() | st.integers(-2, 10**12) | st.floats() | NEAR_NAMES | st.text(max_size=8)
       | st.lists(st.integers(), max_size=2) | st.builds(_Str, NEAR_NAMES))


def _mostly(good, bad=ANY):
    """``good`` about 6 times in 7, else anything."""
    return st.sampled_from([True] * 6 + [False]).flatmap(lambda ok: good if ok else bad)


@st.composite
def near_valid_dicts(draw):
    d = {"kind": draw(_mostly(st.sampled_from([k.value for k in EventKind]))),
         "time": draw(_mostly(st.floats(0, 2e9) | st.integers(0, 10**11) | st.sampled_from([1e11, -0.0]))),
         "element": draw(_mostly(NEAR_NAMES))}
    for key in ("id", "user", "service", "server"):
        if draw(st.booleans()):
            d[key] = draw(_mostly(NEAR_NAMES))
    if draw(st.booleans()):
        d["duration"] = draw(_mostly(st.floats(0, 1e7) | st.integers(0, 10**7) | st.just(1e7 + 1)))
    if draw(st.booleans()):
        d["optional"] = draw(_mostly(st.booleans()))
    if draw(st.booleans()):
        d["detail"] = draw(_mostly(st.text(max_size=12) | st.sampled_from(["x" * 400, "x" * 401])))
    if draw(st.sampled_from([False] * 20 + [True])):
        d.update({str(i): i for i in range(33 - len(d) + draw(st.sampled_from([-1, 0, 1])))})
    return d


def _outcome(from_dict, d):
    try:
        ev = from_dict(d)
    except InvalidEvent as exc:
        return "rejected", str(exc)
    return "accepted", ev, [type(getattr(ev, f)) for f in ev.__slots__]


@settings(max_examples=400, deadline=None)
@given(st.lists(near_valid_dicts() | ANY, max_size=4))
def test_from_dict_accepts_and_rejects_exactly_as_the_plain_validation(batch):
    for d in batch:
        want = _outcome(_reference_from_dict, d)
        for _ in range(2):                  # the second time, the names it accepted are cached
            assert _outcome(Event.from_dict, d) == want
    accepted = [r[1] for r in (_outcome(_reference_from_dict, d) for d in batch) if r[0] == "accepted"]
    assert decode_events(batch) == (accepted, len(batch) - len(accepted))


def test_a_cached_name_does_not_let_a_non_str_through():
    good = Event.from_dict(GOOD)
    assert good.element == "sed-1"                          # now cached
    for key in ("element", "user", "service", "server"):
        with pytest.raises(InvalidEvent, match=f"^{key} 'sed-1' is not a valid name"):
            Event.from_dict(dict(GOOD, **{key: _Str("sed-1")}))
    with pytest.raises(InvalidEvent, match="^user 'sed 1' is not a valid name"):
        Event.from_dict(dict(GOOD, user="sed 1"))


def test_fast_built_events_are_ordinary_frozen_events():
    import copy
    import dataclasses
    import pickle
    plain = Event(K.CALL_FINISHED, 1700000000.0, "sed-1", id="abc:1", user="alice", service="add",
                  server="sed-1", duration=0.5, detail="ok")
    for ev in (Event.from_dict(GOOD), make_event(K.CALL_FINISHED, 1700000000.0, "sed-1", id="abc:1", user="alice",
                                                 service="add", server="sed-1", duration=0.5, detail="ok")):
        assert type(ev) is Event and isinstance(ev, Event)
        assert ev == plain and hash(ev) == hash(plain) and repr(ev) == repr(plain) and len({ev, plain}) == 1
        assert pickle.loads(pickle.dumps(ev)) == ev and copy.copy(ev) == ev and copy.deepcopy(ev) == ev
        assert dataclasses.asdict(ev) == dataclasses.asdict(plain)
        assert dataclasses.replace(ev, id="other") == dataclasses.replace(plain, id="other")
        assert ev.to_dict() == plain.to_dict() == GOOD
        with pytest.raises(dataclasses.FrozenInstanceError):
            ev.id = "changed"
        with pytest.raises(dataclasses.FrozenInstanceError):
            del ev.user
        assert not hasattr(ev, "__dict__")


def test_outbox_drops_the_oldest_and_counts():
    ob = EventOutbox(capacity=3)
    for i in range(5):
        ob.emit(Event(K.CALL_QUEUED, float(i), "sed-1", id=f"r{i}"))
    assert len(ob) == 3 and ob.dropped == 2
    taken = ob.take(2)
    assert [d["id"] for d in taken] == ["r2", "r3"]
    assert ob.take_dropped() == 2 and ob.take_dropped() == 0
    assert [d["id"] for d in ob.take()] == ["r4"] and len(ob) == 0


def test_outbox_relays_a_childs_batch_as_received():
    child = EventOutbox(capacity=10)
    for i in range(3):
        child.emit(Event(K.CALL_QUEUED, float(i), "sed-1", id=f"r{i}"))
    la = EventOutbox(capacity=4)
    la.emit(Event(K.REGISTERED, 0.0, "sed-1"))
    la.relay(child.take() + ["junk"], dropped=5)
    la.relay({"not": "a list"}, dropped=-3)
    assert [d.get("id") for d in la.take()] == [None, "r0", "r1", "r2"]
    assert la.dropped == 5
    la.relay([{"kind": "x"}] * 7, max_events=5)
    assert len(la) == 4 and la.dropped == 5 + 2 + 1


# -- ring and story index ------------------------------------------------------------------------
@settings(max_examples=60)
@given(st.lists(events(), max_size=120), st.integers(1, 30), st.integers(1, 6), st.integers(2, 5))
def test_ring_and_stories_stay_bounded(evs, capacity, max_stories, story_len):
    log = EventLog(capacity=capacity, max_stories=max_stories, story_len=story_len)
    for i, ev in enumerate(evs):
        assert log.append(ev, 1000.0 + i) == i + 1
    assert len(log) == min(len(evs), capacity)
    ring = log.since(0)
    assert [e for _, e in ring] == evs[len(evs) - len(ring):]
    assert [q for q, _ in ring] == list(range(len(evs) - len(ring) + 1, len(evs) + 1))
    assert log.first_seq == (ring[0][0] if ring else len(evs) + 1)
    for k in range(0, len(evs) + 2):
        assert log.since(k) == [x for x in ring if x[0] > k]
    assert log.latest(3) == ring[-3:] if ring else log.latest(3) == []
    assert len(log._stories) <= max_stories
    model: OrderedDict = OrderedDict()         # reference: unbounded stories, evicted by first arrival
    for i, e in enumerate(evs):
        if e.id is not None:
            if e.id not in model and len(model) >= max_stories:
                model.popitem(last=False)
            model.setdefault(e.id, []).append((i + 1, e))
    assert list(log._stories) == list(model)
    for rid, story in log._stories.items():
        mine = model[rid]
        assert 1 <= len(story) <= story_len
        # the latest event of the id is always last; the first ones are kept in order
        assert story[-1] == mine[-1]
        assert story[:-1] == mine[:len(story) - 1]
        assert len(story) == min(len(mine), story_len)


def test_story_and_summary():
    log = EventLog()
    seq = [Event(K.DISCOVERY_ASKED, 10.0, "MA", id="r1", user="alice", service="add"),
           Event(K.DISCOVERY_ANSWERED, 10.01, "MA", id="r1", user="alice", service="add", server="sed-2", duration=0.01),
           Event(K.CALL_QUEUED, 10.02, "sed-2", id="r1", user="alice", service="add", server="sed-2"),
           Event(K.CALL_STARTED, 10.5, "sed-2", id="r1", user="alice", service="add", duration=0.48),
           Event(K.CALL_FINISHED, 11.5, "sed-2", id="r1", user="alice", service="add", duration=1.0)]
    for i, e in enumerate(seq):
        log.append(e, 100.0 + i)
        log.append(Event(K.CALL_QUEUED, 10.0, "sed-1", id=f"other{i}"), 100.0 + i)
    story = log.story("r1")
    assert [e for _, e in story] == seq
    s = story_summary(story)
    assert s["state"] == "finished" and s["chosen"] == "sed-2" and s["server"] == "sed-2"
    assert s["wait"] == 0.48 and s["run"] == 1.0 and s["user"] == "alice"
    assert log.story("nope") == []


# -- aggregates against a naive recomputation ------------------------------------------------------
CALL_KINDS = [K.CALL_QUEUED, K.CALL_STARTED, *TERMINAL, K.DISCOVERY_ANSWERED, K.REGISTERED, K.WORKER_DIED]


def naive(items, now, log):
    """Recompute what EventLog.stats(now) reports from the raw (event, now) list."""
    B, nb, rb = log.bucket, log.nbuckets, log.rate_buckets
    eff, m = [], -math.inf
    for ev, t in items:                 # late events count in the newest bucket
        m = max(m, int(t // B))
        eff.append(m)
    cur = max([int(now // B)] + eff)
    inwin = [(ev, b) for (ev, _), b in zip(items, eff) if b > cur - nb]
    span = max(B, (rb - 1) * B + min(B, max(0.0, now - cur * B)))
    svc = {}
    for ev, b in inwin:
        if ev.kind in TERMINAL:
            s = svc.setdefault(ev.service or "?", {"calls": 0, "errors": 0, "durs": [], "recent": 0})
            s["calls"] += 1
            s["recent"] += b > cur - rb
            s["errors"] += ev.kind in (K.CALL_FAILED, K.CALL_KILLED)
            if ev.kind is K.CALL_FINISHED and ev.duration is not None:
                s["durs"].append(ev.duration)
    users, active = {}, set()
    for ev, b in inwin:
        if ev.kind in (K.CALL_QUEUED, K.CALL_STARTED) or ev.kind in TERMINAL:
            u = ev.user or "anonymous"
            active.add(u)
            if ev.kind in TERMINAL:
                users[u] = users.get(u, 0.0) + (ev.duration or 0.0)
    total = sum(users.values())
    fair = total / len(active) if active and total > 0 else 0.0       # 0.0: underflow of tiny durations
    sats = {u: users.get(u, 0.0) / fair for u in active} if fair > 0 else {}
    cum = {}
    for ev, _ in items:
        if ev.kind in TERMINAL:
            key = (ev.service or "?", OUTCOME[ev.kind])
            cum[key] = cum.get(key, 0) + 1
    return svc, span, users, sats, cum


@st.composite
def timed_events(draw):
    n = draw(st.integers(0, 80))
    t, out = 1000.0, []
    for _ in range(n):
        t += draw(st.sampled_from([0.0, 0.3, 1.0, 4.9, 5.0, 17.0, 80.0, -2.0]))   # a few late stamps
        ev = draw(events(kinds=st.sampled_from(CALL_KINDS)))
        out.append((ev, t))
    return out, t + draw(st.sampled_from([0.0, 0.1, 3.0, 12.0, 200.0]))


@settings(max_examples=150, deadline=None)
@given(timed_events())
def test_aggregates_match_naive_recomputation(data):
    items, now = data
    log = EventLog(bucket=5.0, window=60.0, rate_buckets=2)
    for ev, t in items:
        log.append(ev, t)
    st_ = log.stats(now)
    svc, span, users, sats, cum = naive(items, now, log)
    for name, s in svc.items():
        got = st_["services"][name]
        assert got["calls"] == s["calls"] and got["errors"] == s["errors"]
        assert got["calls_per_s"] == pytest.approx(s["recent"] / span)
        if s["durs"]:
            assert got["mean"] == pytest.approx(sum(s["durs"]) / len(s["durs"]))
            assert got["max"] == pytest.approx(max(s["durs"]))
            for q in (0.5, 0.95):     # the estimate falls in the histogram bucket of the true quantile
                true = sorted(s["durs"])[max(0, math.ceil(q * len(s["durs"])) - 1)]
                est = got["p50" if q == 0.5 else "p95"]
                assert bisect_left(LATENCY_BOUNDS, est) == bisect_left(LATENCY_BOUNDS, true) or est == pytest.approx(true)
        else:
            assert got["mean"] is None and got["p95"] is None
    for name, got in st_["services"].items():
        if name not in svc:
            assert got["calls"] == 0 and got["calls_per_s"] == 0
        assert sum(got["series"]["calls"]) == got["calls"] and len(got["series"]["calls"]) == log.nbuckets
    assert st_["calls_per_s"] == pytest.approx(sum(s["recent"] for s in svc.values()) / span)
    for u, alloc in users.items():
        assert st_["users"][u]["allocated"] == pytest.approx(alloc)
    for u, sat in sats.items():
        assert st_["users"][u]["satisfaction"] == pytest.approx(sat)
    expect_unfair = (max(sats.values()) - min(sats.values())) if len(sats) >= 2 else 0.0
    assert st_["unfairness"] == pytest.approx(expect_unfair)
    assert log.calls_total == cum
    assert len(st_["t"]) == log.nbuckets


def test_rates_and_series_by_bucket():
    log = EventLog(bucket=1.0, window=10.0, rate_buckets=2)
    for i in range(30):                          # 3 calls per second for 10 s
        log.append(Event(K.CALL_FINISHED, 0, "sed-1", service="add", user="u", duration=0.01), 100.0 + i / 3)
    s = log.stats(109.99)
    assert s["services"]["add"]["calls"] == 30
    assert s["services"]["add"]["series"]["calls"] == [3] * 10
    assert s["calls_per_s"] == pytest.approx(6 / 1.99)
    later = log.stats(200.0)                     # long after: nothing in the window
    assert later["calls_per_s"] == 0 and later["services"]["add"]["calls"] == 0
    assert later["services"]["add"]["total"]["finished"] == 30      # cumulative kept


def test_user_counts_optional_and_unfairness():
    log = EventLog()
    def call(user, kind, d, optional=False):
        log.append(Event(kind, 0, "sed-1", service="sleep", user=user, duration=d, optional=optional), 50.0)
    call("alice", K.CALL_FINISHED, 3.0)
    call("alice", K.CALL_FINISHED, 1.0, optional=True)
    call("bob", K.CALL_PREEMPTED, 1.0, optional=True)
    call("bob", K.CALL_KILLED, 1.0, optional=True)
    log.append(Event(K.CALL_QUEUED, 0, "sed-1", service="sleep", user="carol"), 50.0)
    s = log.stats(51.0)
    u = s["users"]
    assert u["alice"]["finished"] == 2 and u["alice"]["optional_completed"] == 1
    assert u["bob"]["optional_killed"] == 2 and u["bob"]["preempted"] == 1 and u["bob"]["killed"] == 1
    assert u["carol"]["queued"] == 1 and u["carol"]["allocated"] == 0.0
    # fair share = 6 s / 3 active users = 2 s: alice 2.0, bob 1.0, carol 0.0
    assert (u["alice"]["satisfaction"], u["bob"]["satisfaction"], u["carol"]["satisfaction"]) == (2.0, 1.0, 0.0)
    assert s["unfairness"] == 2.0
    assert s["services"]["sleep"]["errors"] == 1          # killed; preempted is not an error


def test_cardinality_caps_and_errors_list():
    log = EventLog(max_services=3, max_users=2, max_errors=4)
    for i in range(10):
        log.append(Event(K.CALL_FAILED, 0, "sed-1", service=f"s{i}", user=f"u{i}", detail=f"e{i}"), 10.0)
    s = log.stats(11.0)
    assert set(s["services"]) == {"s0", "s1", "s2", OTHER}
    assert s["services"][OTHER]["errors"] == 7
    assert set(s["users"]) == {"u0", "u1", OTHER}
    assert [e["detail"] for e in s["errors"]] == ["e9", "e8", "e7", "e6"]


def test_quantile_interpolates_inside_the_bucket():
    hist = [0] * (len(LATENCY_BOUNDS) + 1)
    hist[bisect_left(LATENCY_BOUNDS, 0.3)] = 10       # all in (0.25, 0.5]
    assert 0.25 < quantile(hist, 0.5) <= 0.5
    assert quantile([0] * len(hist), 0.5) is None
    hist = [0] * len(hist)
    hist[-1] = 1                                        # beyond the last bound: its lower bound
    assert quantile(hist, 0.99) == LATENCY_BOUNDS[-1]


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError):
        EventLog(bucket=0)
    with pytest.raises(ValueError):
        EventLog(window=1, bucket=5)
