"""The eviction order of a :class:`~gridrpc.core.datastore.DataStore` (pure),
kept as the store changes so that choosing victims never sorts the store.

:class:`VictimOrder` keeps, per tier (memory, disk) and per owner, the
entries that may be victims (placed, unpinned, not sticky), sorted by the
policy's key, with their bytes. The store re-places an entry whenever its
tier, pins or key change (:meth:`VictimOrder.place`) and drops it when it
goes. :meth:`VictimOrder.victims` then yields, lazily, one owner's entries in
key order followed by the entries of a set of other owners merged in key
order: O(log n) per victim, plus O(m) once to start the merge over m owners.

:class:`HeldOrder` keeps the owners sorted by the bytes they hold, so that
the users over a share are found without looking at the others:
O(log u + m) for m of them among u owners.

Keys are unique (the policy's key ends with the entry's sequence number), so
the order is total and equal to a full sort of the same entries.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterable, Iterator

from sortedcontainers import SortedDict, SortedKeyList

__all__ = ["VictimOrder", "HeldOrder"]


class VictimOrder:
    """The possible victims per tier and owner, in the policy's order.

    An entry is anything with ``id``, ``owner``, ``where`` and ``size``;
    ``key(entry)`` is its place in the order (unique per entry)."""

    def __init__(self, key: Callable[[object], tuple], tiers: Iterable[Hashable]) -> None:
        self.key = key
        self.by_owner: dict[Hashable, dict[str, SortedDict]] = {t: {} for t in tiers}
        self.bytes: dict[Hashable, dict[str, int]] = {t: {} for t in self.by_owner}
        self.slots: dict[str, tuple] = {}        # entry id -> (tier, owner, key, size) it is filed under

    def __len__(self) -> int:
        return len(self.slots)

    def place(self, e, eligible: bool) -> None:
        """File ``e`` under its present tier and key when ``eligible``; else
        make sure it is not filed (its old place, if any, is dropped)."""
        if not eligible:
            self.drop(e.id)
            return
        tier, owner, k, size = e.where, e.owner, self.key(e), e.size
        old = self.slots.get(e.id)
        if old is not None:
            if old[2] == k and old[0] == tier and old[1] == owner and old[3] == size:
                return                   # already in place (a use that leaves a FIFO key as it was)
            self.drop(e.id)
        group = self.by_owner[tier].get(owner)
        if group is None:
            group = self.by_owner[tier][owner] = SortedDict()
        group[k] = e
        sizes = self.bytes[tier]
        sizes[owner] = sizes.get(owner, 0) + size
        self.slots[e.id] = (tier, owner, k, size)

    def drop(self, ref: str) -> None:
        slot = self.slots.pop(ref, None)
        if slot is None:
            return
        tier, owner, k, size = slot
        groups = self.by_owner[tier]
        group = groups[owner]
        del group[k]
        if not group:
            del groups[owner]
        sizes = self.bytes[tier]
        left = sizes[owner] - size
        if group:
            sizes[owner] = left
        else:
            del sizes[owner]

    def owners(self, tier: Hashable) -> list[str]:
        return list(self.by_owner[tier])

    def victims(self, tier: Hashable, own: str | None, others: Iterable[str]) -> Iterator:
        """``own``'s entries in ``tier`` in key order, then those of
        ``others`` merged in key order. Lazy: each step looks up the next key
        after the last one yielded, so the caller may spill or evict each
        entry it is given before asking for the next."""
        groups = self.by_owner[tier]
        if own is not None:
            k = None
            while (nxt := _after(groups.get(own), k)) is not None:
                k, e = nxt
                yield e
        heap = []
        for o in others:
            group = groups.get(o)
            if group:
                heap.append((group.peekitem(0)[0], o))
        heapq.heapify(heap)
        while heap:
            k, o = heap[0]
            group = groups.get(o)
            e = group.get(k) if group is not None else None
            if e is not None:
                yield e
            nxt = _after(groups.get(o), k)
            if nxt is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (nxt[0], o))


def _after(group: SortedDict | None, k) -> tuple | None:
    """The first (key, entry) of ``group`` after key ``k`` (None: from the start)."""
    if not group:
        return None
    i = 0 if k is None else group.bisect_right(k)
    return group.peekitem(i) if i < len(group) else None


class HeldOrder:
    """The bytes each owner holds (:attr:`held`, only owners holding some), and the owners
    sorted by them."""

    def __init__(self) -> None:
        self.held: dict[str, int] = {}
        self.sorted = SortedKeyList(key=lambda t: t[0])   # (held, owner)

    def add(self, owner: str, delta: int) -> None:
        """``owner`` holds ``delta`` bytes more (less, when negative): an owner who puts a value
        holds, even 0 bytes; one whose data goes down to 0 bytes no longer does."""
        before = self.held.get(owner)
        after = (before or 0) + delta
        if before is not None:
            self.sorted.remove((before, owner))
        if after > 0 or (delta >= 0 and after == 0):
            self.held[owner] = after
            self.sorted.add((after, owner))
        else:
            self.held.pop(owner, None)

    def over(self, share: float) -> list[str]:
        """The owners holding more than ``share`` bytes."""
        s = self.sorted
        return [o for _, o in s.islice(s.bisect_key_right(share))]
