"""The data store's kept eviction order (gridrpc.core.datastore_order) chooses
the same victims, in the same order, as sorting every entry of the tier.

The oracle is a :class:`DataStore` whose victims are chosen the plain way:
build the list of every candidate in the tier, keep other users' data only
while they hold more than their share, and sort it: the putter's own data
first, then by the policy's key. Both stores are driven by the same random sequence of
puts, expected results, uses, pins, unpins, frees and budget cuts from several
owners, under each policy; every answer (entries, spills, evictions, errors),
the resulting state and the full victim order must be the same."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gridrpc.core.datastore import DataStore, Mode, Where
from gridrpc.errors import DataError

OWNERS = ("alice", "bob", "carol", "dave")
MODES = (Mode.PERSISTENT,) * 5 + (Mode.PERSISTENT_RETURN, Mode.VOLATILE, Mode.VOLATILE, Mode.STICKY)


class SortingStore(DataStore):
    """The reference: victims by a full sort of the tier's entries."""

    def _victims(self, where, for_owner=None):
        c = [e for e in self.entries.values() if e.where is where and e.pins == 0 and e.mode is not Mode.STICKY]
        if for_owner is None:
            c.sort(key=self._key)
            return c
        owners = self._held.keys() | {for_owner}
        share = (self.memory_bytes + self.disk_bytes) / len(owners)
        c = [e for e in c if e.owner == for_owner or self._held.get(e.owner, 0) > share]
        c.sort(key=lambda e: (e.owner != for_owner, self._key(e)))
        return c

    def _evictable(self, for_owner):
        return sum(v.size for v in self._victims(Where.MEMORY, for_owner))


SIZES = (0, 10, 25, 50, 75, 100, 150)      # sums that land on a share exactly, and odd sizes too


def next_operation(rng, s: DataStore, n: int) -> tuple:
    """One random operation on ``s``, mostly on references it holds; the
    clock repeats and steps back now and then (ties broken by creation
    order). ``alice`` puts the most, as a flooding user would."""
    held = list(s.entries)

    def some():
        return rng.choice(held) if held and rng.random() < 0.9 else f"r{rng.randrange(n + 1)}"

    def owner_of(r, who):
        e = s.entries.get(r)
        return e.owner if e is not None and rng.random() < 0.9 else who

    dt = rng.choice((0.0, 1.0, 1.0, 2.5, -1.0))
    who = rng.choice(("alice", "alice", *OWNERS))
    size = rng.choice(SIZES) if rng.random() < 0.6 else rng.randint(0, 130)
    mode = rng.choice(MODES)
    k = rng.random()
    if k < 0.35:
        return ("put", f"r{n}" if rng.random() < 0.95 else some(), who, mode, size, dt)
    if k < 0.40:
        return ("expect", f"r{n}", who, mode, dt)
    if k < 0.45:                     # an expected result arrives (or a put on a known reference)
        r = some()
        return ("put", r, owner_of(r, who), mode, size, dt)
    if k < 0.47:
        return ("fail", some())
    if k < 0.60:
        return ("touch", some(), dt)
    if k < 0.65:
        return ("used", some(), dt)
    if k < 0.71:
        return ("pin", some())
    if k < 0.80:
        return ("unpin", some())
    if k < 0.88:
        r = some()
        return ("free", r, owner_of(r, who))
    if k < 0.90:
        return ("budget", rng.choice((150, 250, 300, 300, 400)))
    return ("order", rng.choice((Where.MEMORY, Where.DISK)), rng.choice((None, *OWNERS)))


def apply(s: DataStore, o: tuple, now: float):
    """Run one operation; its outcome as comparable values."""
    kind = o[0]
    try:
        if kind == "put":
            e, actions = s.add(o[1], o[2], o[3], o[4], now)
            return "ok", e.id, actions
        if kind == "expect":
            return "ok", s.expect(o[1], o[2], o[3], "call-" + o[1], now).id
        if kind == "fail":
            return "ok", s.fail(o[1], "its call failed")
        if kind == "touch":
            return "ok", s.touch(o[1], now)
        if kind == "used":
            return "ok", s.used_once(o[1], now)
        if kind == "pin":
            return "ok", s.pin(o[1])
        if kind == "unpin":
            return "ok", s.unpin(o[1])
        if kind == "free":
            return "ok", s.free(o[1], o[2])
        if kind == "budget":        # a smaller budget: the next unpin makes room by the policy alone
            s.memory_bytes = o[1]
            return "ok", None
        if kind == "order":
            return "ok", [e.id for e in s._victims(o[1], o[2])]
    except Exception as ex:         # noqa: BLE001 - the same error, message and actions on both
        return "err", type(ex).__name__, str(ex), getattr(ex, "actions", None)
    raise AssertionError(kind)


def state(s: DataStore) -> tuple:
    return (sorted((e.id, e.owner, e.mode, e.where, e.size, e.pins, e.uses, e.last_used, e.seq)
                   for e in s.entries.values()),
            dict(s.used), s.held_by_user(), list(s.tombstones.items()), s.statistics())


def check_kept_order(s: DataStore) -> None:
    """The kept order holds exactly the entries that may be victims, with their bytes."""
    may = {e.id: e for e in s.entries.values()
           if e.where is not Where.PENDING and e.pins == 0 and e.mode is not Mode.STICKY}
    assert set(s._order.slots) == set(may)
    for where in (Where.MEMORY, Where.DISK):
        sizes: dict[str, int] = {}
        for e in may.values():
            if e.where is where:
                sizes[e.owner] = sizes.get(e.owner, 0) + e.size
        assert s._order.bytes[where] == sizes


@pytest.mark.parametrize("policy", ["lru", "lfu", "fifo"])
@pytest.mark.parametrize("disk,per_user", [(0, None), (200, None), (150, 260)])
@settings(max_examples=25, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32 - 1))
def test_kept_order_matches_a_full_sort(policy, disk, per_user, seed):
    rng = random.Random(seed)
    kw = dict(memory_bytes=300, disk_bytes=disk, policy=policy, max_bytes_per_user=per_user, holder="sed-1")
    new, ref_store = DataStore(**kw), SortingStore(**kw)
    now = 0.0
    for n in range(400):
        o = next_operation(rng, ref_store, n)
        now += o[-1] if o[0] in ("put", "expect", "touch", "used") else 0.0
        got, want = apply(new, o, now), apply(ref_store, o, now)
        assert got == want, o
        assert state(new) == state(ref_store), o
        check_kept_order(new)
    assert new.counts["evicted"] + new.counts["spilled"] > 0      # the sequence did make room


@pytest.mark.parametrize("policy", ["lru", "lfu", "fifo"])
def test_a_long_flood_evicts_the_same_victims_as_a_full_sort(policy):
    """One user's small puts against another's large values at the budget:
    the same spills and evictions, in the same order, over 3,000 puts."""
    rng = random.Random(7)
    kw = dict(memory_bytes=20_000, disk_bytes=8_000, policy=policy)
    new, ref_store = DataStore(**kw), SortingStore(**kw)
    for s in (new, ref_store):
        for i in range(6):
            s.add(f"big{i}", "alice", Mode.PERSISTENT, 2_500, now=i)
    seen = 0
    for i in range(3_000):
        now = 10.0 + i
        if rng.random() < 0.2:
            r = f"big{rng.randrange(6)}" if rng.random() < 0.5 else f"m{rng.randrange(max(1, i))}"
            for s in (new, ref_store):
                s.touch(r, now)
        o = ("put", f"m{i}", "mallory", Mode.PERSISTENT, rng.randint(1, 40), 0.0)
        got, want = apply(new, o, now), apply(ref_store, o, now)
        assert got == want
        seen += len(got[2]) if got[0] == "ok" else 0
    assert state(new) == state(ref_store)
    assert seen > 2_000             # the flood did make room, over and over


def test_victims_run_out_cleanly_and_a_put_that_cannot_fit_is_refused():
    s = DataStore(memory_bytes=100, policy="lfu")
    s.add("a", "alice", Mode.STICKY, 60, now=1)
    s.add("b", "bob", Mode.PERSISTENT, 30, now=2)
    assert [e.id for e in s._victims(Where.MEMORY, "carol")] == []      # bob is within his share
    assert [e.id for e in s._victims(Where.MEMORY, None)] == ["b"]
    with pytest.raises(DataError, match="no room"):
        s.add("c", "carol", Mode.PERSISTENT, 20, now=3)
    assert sorted(s.entries) == ["a", "b"] and len(s._order) == 1
