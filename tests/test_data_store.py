"""The pure data store: modes, budgets, eviction policies, ownership (gridrpc.core.datastore)."""
import pytest

from gridrpc.core.aggregators import make_aggregator
from gridrpc.core.datastore import DataStore, Evict, Freed, Mode, Spill
from gridrpc.core.refs import fetch_bytes, light_ref
from gridrpc.errors import DataAccessDenied, DataError, DataLost

P = Mode.PERSISTENT


def test_lru_evicts_least_recently_used_and_says_why():
    s = DataStore(memory_bytes=300, policy="lru", holder="SeD s1")
    s.add("a", "u", P, 100, now=1)
    s.add("b", "u", P, 100, now=2)
    s.add("c", "u", P, 100, now=3)
    s.touch("a", now=4)
    _, actions = s.add("d", "u", P, 100, now=5)
    assert actions == [Evict("b", actions[0].where, actions[0].reason)]
    with pytest.raises(DataLost, match=r"b is gone from SeD s1: evicted \(LRU\)"):
        s.check("b", "u")
    assert s.check("a", "u").size == 100


@pytest.mark.parametrize("policy,victim", [("fifo", "a"), ("lfu", "b")])
def test_fifo_and_lfu(policy, victim):
    s = DataStore(memory_bytes=200, policy=policy)
    s.add("a", "u", P, 100, now=1)
    s.add("b", "u", P, 100, now=2)
    s.touch("a", 3)
    s.touch("a", 4)
    _, actions = s.add("c", "u", P, 100, now=5)
    assert [a.ref for a in actions] == [victim]


def test_sticky_and_pinned_are_never_evicted():
    s = DataStore(memory_bytes=300)
    s.add("sticky", "u", Mode.STICKY, 100, now=1)
    s.add("pinned", "u", P, 100, now=2)
    s.pin("pinned")
    s.add("free", "u", P, 100, now=3)
    _, actions = s.add("new", "u", P, 100, now=4)
    assert [a.ref for a in actions] == ["free"]
    # nothing evictable left: refused with a clear error, the others intact
    with pytest.raises(DataError, match="no room"):
        s.add("more", "u", P, 200, now=5)
    assert {"sticky", "pinned", "new"} <= set(s.entries)
    assert s.unpin("pinned") == []


def test_spill_to_disk_then_evict_from_disk():
    s = DataStore(memory_bytes=200, disk_bytes=200)
    s.add("a", "u", P, 100, now=1)
    s.add("b", "u", P, 100, now=2)
    _, act = s.add("c", "u", P, 100, now=3)
    assert act == [Spill("a")]
    _, act = s.add("d", "u", P, 100, now=4)
    assert act == [Spill("b")]
    _, act = s.add("e", "u", P, 100, now=5)
    assert [type(a) for a in act] == [Evict, Spill] and act[0].ref == "a" and act[1].ref == "c"
    st = s.statistics()
    assert st["memory_bytes"] == 200 and st["disk_bytes"] == 200 and st["evicted"] == 1


def test_modes_volatile_freed_after_use_persistent_kept():
    s = DataStore()
    s.add("v", "u", Mode.VOLATILE, 10, now=1)
    s.add("p", "u", P, 10, now=1)
    assert isinstance(s.used_once("v", 2)[0], Freed)
    assert s.used_once("p", 2) == []
    with pytest.raises(DataLost, match="volatile"):
        s.check("v", "u")
    assert isinstance(s.free("p", "u"), Freed)
    with pytest.raises(DataLost, match="freed by its owner"):
        s.check("p", "u")


def test_owner_only_and_held_bytes_per_user():
    s = DataStore()
    s.add("a", "alice", P, 10, now=1)
    s.add("b", "bob", P, 5, now=1)
    with pytest.raises(DataAccessDenied):
        s.check("a", "bob")
    with pytest.raises(DataAccessDenied):
        s.free("a", "bob")
    assert s.held_by_user() == {"alice": 10, "bob": 5}


def test_pending_producer_failure_is_a_clear_error():
    s = DataStore()
    s.expect("r", "u", P, "call-1", now=1)
    assert s.held_by_user() == {}
    s.fail("r", "call call-1 failed: RuntimeError: boom")
    with pytest.raises(DataLost, match="boom"):
        s.check("r", "u")


def test_fetch_bytes_and_locality_aggregator():
    light = [light_ref({"id": "r1", "holder": "s1", "size": 1000, "replicas": [["s2", "x"]]}), 3]
    assert fetch_bytes(light, {"s1"}) == 0 and fetch_bytes(light, {"s2"}) == 0
    assert fetch_bytes(light, {"s3"}) == 1000
    agg = make_aggregator({"name": "locality", "params": {"bandwidth": 1e3}})
    import random
    holder = {"name": "s1", "estimation": {"fetch_bytes": 0, "tcomp": 1.0, "num_waiting": 1, "num_running": 1}}
    idle = {"name": "s3", "estimation": {"fetch_bytes": 1000, "tcomp": 1.0, "num_waiting": 0, "num_running": 0}}
    # the holder is 2 s busy; fetching costs 1 s: the holder still wins unless far busier
    assert agg.rank([idle, holder], random.Random(1))[0]["name"] == "s3"
    holder["estimation"]["num_waiting"] = 0
    assert agg.rank([idle, holder], random.Random(1))[0]["name"] == "s1"


def test_held_bytes_count_against_the_users_limit():
    from gridrpc.core.datastore import DataStore, Mode
    from gridrpc.errors import DataError
    s = DataStore(memory_bytes=10_000, max_bytes_per_user=3000, holder="sed-1")
    s.add("r-1", "alice", Mode.PERSISTENT, 2000, now=1.0)
    with pytest.raises(DataError, match="user 'alice' holds 2000 bytes.*max_bytes_per_user=3000"):
        s.add("r-2", "alice", Mode.PERSISTENT, 2000, now=2.0)
    s.add("r-3", "bob", Mode.PERSISTENT, 2000, now=3.0)        # another user's budget
    assert s.held_by_user() == {"alice": 2000, "bob": 2000}


# -- fair use between users -------------------------------------------------------------------
def test_a_put_evicts_its_owners_data_before_anothers():
    """One user's puts made another's reference DataLost: now a put makes room
    from its own owner's data first."""
    s = DataStore(memory_bytes=300)
    s.add("alice-1", "alice", P, 100, now=1)          # the oldest: LRU's first victim before
    s.add("mal-1", "mallory", P, 100, now=2)
    s.add("mal-2", "mallory", P, 100, now=3)
    _, actions = s.add("mal-3", "mallory", P, 100, now=4)
    assert [a.ref for a in actions] == ["mal-1"]
    assert s.check("alice-1", "alice").size == 100


def test_data_within_its_users_share_is_never_evicted_for_another():
    s = DataStore(memory_bytes=300)
    s.add("alice-1", "alice", P, 100, now=1)          # within alice's share (150 of 300)
    s.add("mal-1", "mallory", P, 200, now=2)
    with pytest.raises(DataError, match="other users' data within their share"):
        s.add("mal-2", "mallory", P, 250, now=3)      # her own 200 are not enough: alice's would go
    assert s.check("alice-1", "alice").size == 100
    assert s.check("mal-1", "mallory").size == 200
    assert s.held_by_user() == {"alice": 100, "mallory": 200}


def test_a_user_over_their_share_gives_way_to_another():
    s = DataStore(memory_bytes=300)
    s.add("mal-1", "mallory", P, 150, now=1)
    s.add("mal-2", "mallory", P, 150, now=2)          # mallory holds everything
    _, actions = s.add("alice-1", "alice", P, 100, now=3)
    assert [a.ref for a in actions] == ["mal-1"]      # mallory is over her share (150): her oldest goes
    assert s.held_by_user() == {"mallory": 150, "alice": 100}


def test_a_put_that_fits_does_not_sort_the_store(monkeypatch):
    """Every put sorted every entry: 40,000 small puts slowed a SeD until its
    parent dropped it. A put within the budget looks at no other entry."""
    s = DataStore(memory_bytes=10**9, max_bytes_per_user=10**8)
    for i in range(1000):
        s.add(f"r{i}", f"u{i % 3}", P, 10, now=i)

    def no_sort(*a, **k):
        raise AssertionError("a put within the budget sorted the victims")
    monkeypatch.setattr(s, "_victims", no_sort)
    monkeypatch.setattr(s, "held_by_user", no_sort)
    s.add("more", "u1", P, 10, now=2000)
    assert s.statistics  # the store still answers
    assert s.check("more", "u1").size == 10


def test_held_bytes_follow_every_change():
    s = DataStore(memory_bytes=200, disk_bytes=100)
    s.add("a", "u", P, 100, now=1)
    s.add("b", "v", P, 100, now=2)
    s.add("c", "u", P, 50, now=3)                     # spills: held bytes unchanged by a spill
    assert s.held_by_user() == {"u": 150, "v": 100}
    s.free("a", "u")
    assert s.held_by_user() == {"u": 50, "v": 100}
    s.add("vol", "v", Mode.VOLATILE, 10, now=4)
    s.used_once("vol", now=5)
    assert s.held_by_user() == {"u": 50, "v": 100}
