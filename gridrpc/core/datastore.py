"""Data held on a SeD by reference (pure): DIET's DAGDA, bounded.

A :class:`DataStore` keeps the *bookkeeping* of the values a SeD process
holds for clients (``client.put``, ``submit(..., keep_result=True)``): who
owns each reference, its mode, its size, where its bytes are (memory, the
spill directory, or not yet produced), how often and how recently it was
used, and which pending calls need it. It decides; the runtime
(:mod:`gridrpc.sed.data.store`) moves bytes and files. No I/O, no clock: ``now`` is
an argument.

Modes (DIET's names)::

    volatile           freed after its first use (a call that read it ended, a get, a fetch)
    persistent         kept until freed; a call keeping its result returns only the reference
    persistent_return  kept until freed; the value is returned too
    sticky             kept until freed, never moved: not spilled, not evicted, not replicated,
                       not fetched by another SeD (calls using it run where it lives)

Budget: ``memory_bytes`` of values in memory; past it the policy's victims
are *spilled* to the local directory (``disk_bytes``; 0: no spill); past
that they are *evicted* (the bytes are gone). Victims are chosen by the
policy — ``lru`` (least recently used, the default), ``lfu`` (least
frequently used, then LRU), ``fifo`` (oldest first) — and are never sticky
and never pinned (a pending call on this SeD needs them, or they are being
sent). A reference that is gone leaves a tombstone with the reason, so its
users get :class:`~gridrpc.errors.DataLost` naming the reference and why,
never a wrong value.

Ownership: a reference is usable only by its owner; :meth:`DataStore.check`
is the one place that decides (the runtime passes the authenticated user).

Fair use between users: a put makes room by evicting its owner's own data
first, then the data of users holding more than their share (the whole
budget split evenly between the users holding data here); a user within
their share never loses data to another's puts (that put is refused
instead). ``max_bytes_per_user`` caps what one user holds at all.

Cost: nothing here sorts or scans the store. The possible victims are
kept in the policy's order per tier and per owner
(:mod:`gridrpc.core.datastore_order`), re-placed as an entry moves, is pinned
or unpinned, or is used (its LRU/LFU key changes), and the owners are kept
sorted by the bytes they hold (counted as they change). A put that fits in the
budget costs O(log n) for n entries; a put that must make room costs
O(log n) per victim, plus, once it reaches other users' data, O(m) for the m
users over their share.
"""
from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import DataAccessDenied, DataError, DataLost
from .datastore_order import HeldOrder, VictimOrder

_FULL = ("its data budget is full of sticky data, data that pending calls need, or other users' data "
         "within their share")

__all__ = ["Mode", "Where", "Entry", "DataStore", "Spill", "Evict", "Freed", "MODES", "POLICIES",
           "parse_mode"]


class Mode(enum.StrEnum):
    VOLATILE = "volatile"
    PERSISTENT = "persistent"
    PERSISTENT_RETURN = "persistent_return"
    STICKY = "sticky"


MODES = tuple(m.value for m in Mode)
POLICIES = ("lru", "lfu", "fifo")


def parse_mode(mode: object) -> Mode:
    """A mode from user input (``persistent-return`` or ``persistent_return``)."""
    if isinstance(mode, Mode):
        return mode
    if isinstance(mode, str):
        try:
            return Mode(mode.replace("-", "_").lower())
        except ValueError:
            pass
    raise ValueError(f"unknown data mode {mode!r}; one of {', '.join(MODES)}")


class Where(enum.StrEnum):
    PENDING = "pending"      # a call will produce it
    MEMORY = "memory"
    DISK = "disk"


@dataclass(eq=False, kw_only=True)
class Entry:
    id: str
    owner: str
    mode: Mode
    size: int = 0
    where: Where = Where.PENDING
    producer: str | None = None     # call id producing it (pending)
    created: float = 0.0
    last_used: float = 0.0
    uses: int = 0
    pins: int = 0
    seq: int = 0
    error: str | None = None        # set if the producer failed


# -- actions ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Spill:
    """Write the entry's bytes to the spill directory and drop them from memory."""
    ref: str


@dataclass(frozen=True, slots=True)
class Evict:
    """Drop the entry's bytes (memory or spill file): they are gone."""
    ref: str
    where: Where
    reason: str


@dataclass(frozen=True, slots=True)
class Freed:
    """Drop the entry's bytes: freed by its owner, or volatile and used."""
    ref: str
    where: Where
    reason: str


class DataStore:
    def __init__(self, *, memory_bytes: int = 1 << 30, disk_bytes: int = 0, policy: str = "lru",
                 holder: str = "this SeD", max_tombstones: int = 100_000,
                 max_bytes_per_user: int | None = None) -> None:
        self.max_bytes_per_user = max_bytes_per_user     # held bytes one user may have here (None: no limit)
        if policy not in POLICIES:
            raise ValueError(f"unknown eviction policy {policy!r}; one of {', '.join(POLICIES)}")
        if memory_bytes < 0 or disk_bytes < 0:
            raise ValueError("data budgets must be >= 0")
        self.memory_bytes, self.disk_bytes, self.policy, self.holder = memory_bytes, disk_bytes, policy, holder
        self.entries: dict[str, Entry] = {}
        self.tombstones: OrderedDict[str, str] = OrderedDict()
        self.max_tombstones = max_tombstones
        self.used = {Where.MEMORY: 0, Where.DISK: 0}
        self.counts = {"put": 0, "spilled": 0, "evicted": 0, "freed": 0, "refused": 0}
        self._seq = 0
        self._held_order = HeldOrder()       # owner -> bytes held (memory and disk), and sorted by them
        self._held = self._held_order.held
        self._order = VictimOrder(self._key, (Where.MEMORY, Where.DISK))   # the possible victims, in order

    # -- queries ----------------------------------------------------------------------------
    def __contains__(self, ref: str) -> bool:
        return ref in self.entries

    def get(self, ref: str) -> Entry | None:
        return self.entries.get(ref)

    def check(self, ref: str, user: str | None) -> Entry:
        """The entry ``user`` may use, or raise: :class:`DataLost` (unknown,
        freed, evicted: the reason) or :class:`DataAccessDenied` (not the
        owner). The one ownership check."""
        e = self.entries.get(ref)
        if e is None:
            why = self.tombstones.get(ref)
            if why is not None:
                raise DataLost(f"data reference {ref} is gone from {self.holder}: {why}")
            raise DataLost(f"data reference {ref} is unknown on {self.holder}")
        if user != e.owner:
            raise DataAccessDenied(f"data reference {ref} belongs to another user; {user!r} may not use it")
        if e.error is not None:
            raise DataLost(f"data reference {ref} will never exist: {e.error}")
        return e

    def held_by_user(self) -> dict[str, int]:
        return dict(self._held)

    def statistics(self) -> dict:
        return {"refs": len(self.entries), "memory_bytes": self.used[Where.MEMORY],
                "disk_bytes": self.used[Where.DISK], "memory_budget": self.memory_bytes,
                "disk_budget": self.disk_bytes, "policy": self.policy, "by_user": self.held_by_user(),
                **self.counts}

    # -- changes ----------------------------------------------------------------------------
    def expect(self, ref: str, owner: str, mode: Mode, producer: str, now: float) -> Entry:
        """A call will produce ``ref`` (keep_result)."""
        if ref in self.entries:
            raise DataError(f"data reference {ref} already exists on {self.holder}")
        self._seq += 1
        e = Entry(id=ref, owner=owner, mode=mode, producer=producer, created=now, last_used=now, seq=self._seq)
        self.entries[ref] = e
        return e

    def add(self, ref: str, owner: str, mode: Mode, size: int, now: float) -> tuple[Entry, list]:
        """Store ``size`` bytes under ``ref`` (new, or the value of an expected
        one). Returns the entry and the spills/evictions that make room.
        Raises :class:`DataError` when it cannot fit (sticky and pinned data
        fill the budget)."""
        e = self.entries.get(ref)
        if e is not None and e.where is not Where.PENDING:
            raise DataError(f"data reference {ref} already exists on {self.holder}")
        total = self.memory_bytes + self.disk_bytes
        if size > (self.memory_bytes if mode is Mode.STICKY else total):
            self.counts["refused"] += 1
            self._drop_pending(ref, "it was larger than the SeD's data budget")
            raise DataError(f"data reference {ref} of {size} bytes exceeds the data budget of {self.holder} "
                            f"({self.memory_bytes} bytes in memory, {self.disk_bytes} on disk)")
        if self.max_bytes_per_user is not None:
            held = self._held.get(owner, 0)
            if held + size > self.max_bytes_per_user:
                self.counts["refused"] += 1
                self._drop_pending(ref, "refused: over its owner's data limit")
                raise DataError(f"data reference {ref} ({size} bytes) refused on {self.holder}: user {owner!r} "
                                f"holds {held} bytes here (limit max_bytes_per_user={self.max_bytes_per_user})")
        could_spill = self.disk_bytes and mode is not Mode.STICKY and size <= self.disk_bytes
        if self.used[Where.MEMORY] + size > self.memory_bytes and not could_spill:
            if size > self.memory_bytes - (self.used[Where.MEMORY] - self._evictable(owner)):
                self.counts["refused"] += 1          # refuse before evicting anything for nothing
                self._drop_pending(ref, f"refused: {_FULL}")
                raise DataError(f"no room for data reference {ref} ({size} bytes) on {self.holder}: {_FULL}")
        if e is None:
            self._seq += 1
            e = Entry(id=ref, owner=owner, mode=mode, created=now, seq=self._seq)
            self.entries[ref] = e
        e.size, e.where, e.last_used, e.producer = size, Where.MEMORY, now, None
        self.used[Where.MEMORY] += size
        self.counts["put"] += 1
        e.pins += 1                      # never its own victim
        self._hold(owner, size)
        try:
            actions = self._make_room(owner) if self.used[Where.MEMORY] > self.memory_bytes else []
        finally:
            e.pins -= 1
            self._file(e)
        if self.used[Where.MEMORY] > self.memory_bytes and not (self.disk_bytes and mode is not Mode.STICKY
                                                                 and self._spill_one(e, actions)):
            # nothing evictable: refuse rather than exceed the budget (what was made room for stays done:
            # the runtime carries out ``refused.actions``)
            self.used[Where.MEMORY] -= size
            self._unhold(owner, size)
            del self.entries[ref]
            self._order.drop(ref)
            self._tomb(ref, f"refused: {_FULL}")
            self.counts["refused"] += 1
            err = DataError(f"no room for data reference {ref} ({size} bytes) on {self.holder}: {_FULL}")
            err.actions = actions
            raise err
        return e, actions

    def fail(self, ref: str, reason: str) -> None:
        """The call producing ``ref`` failed: it never exists."""
        self._drop_pending(ref, reason)

    def touch(self, ref: str, now: float) -> None:
        e = self.entries.get(ref)
        if e is not None:
            e.last_used, e.uses = now, e.uses + 1
            self._file(e)                # its LRU/LFU key changed

    def pin(self, ref: str) -> None:
        e = self.entries.get(ref)
        if e is not None:
            e.pins += 1
            self._file(e)

    def unpin(self, ref: str) -> list:
        e = self.entries.get(ref)
        if e is None:
            return []
        e.pins = max(0, e.pins - 1)
        self._file(e)
        return self._make_room()

    def loaded(self, ref: str) -> None:
        """The runtime read a spilled entry back (bookkeeping unchanged: it stays on disk)."""

    def used_once(self, ref: str, now: float) -> list:
        """A use ended (a call that read it, a get, a fetch): volatile data is freed."""
        e = self.entries.get(ref)
        if e is None:
            return []
        self.touch(ref, now)
        if e.mode is Mode.VOLATILE and e.pins == 0:
            return [self._remove(e, "volatile data, freed after its use")]
        return []

    def free(self, ref: str, user: str | None) -> Freed | None:
        e = self.entries.get(ref)
        if e is None:
            if ref in self.tombstones:
                return None              # freeing twice is harmless
            raise DataLost(f"data reference {ref} is unknown on {self.holder}")
        if e.owner != user:
            raise DataAccessDenied(f"data reference {ref} belongs to another user; {user!r} may not free it")
        return self._remove(e, "freed by its owner")

    # -- internals ----------------------------------------------------------------------------
    def _drop_pending(self, ref: str, reason: str) -> None:
        e = self.entries.get(ref)
        if e is not None and e.where is Where.PENDING:
            del self.entries[ref]
            self._tomb(ref, reason)

    def _file(self, e: Entry) -> None:
        """Keep ``e`` in the victim order iff it may be a victim: placed,
        unpinned, not sticky (called whenever one of those or its key changes)."""
        self._order.place(e, e.where is not Where.PENDING and e.pins == 0 and e.mode is not Mode.STICKY)

    def _hold(self, owner: str, size: int) -> None:
        self._held_order.add(owner, size)

    def _unhold(self, owner: str, size: int) -> None:
        self._held_order.add(owner, -size)

    def _remove(self, e: Entry, reason: str) -> Freed:
        where = e.where
        if where is not Where.PENDING:
            self.used[where] -= e.size
            self._unhold(e.owner, e.size)
        del self.entries[e.id]
        self._order.drop(e.id)
        self._tomb(e.id, reason)
        self.counts["freed"] += 1
        return Freed(e.id, where, reason)

    def _tomb(self, ref: str, reason: str) -> None:
        self.tombstones[ref] = reason
        self.tombstones.move_to_end(ref)
        while len(self.tombstones) > self.max_tombstones:
            self.tombstones.popitem(last=False)

    def _key(self, e: Entry):
        if self.policy == "lfu":
            return (e.uses, e.last_used, e.seq)
        if self.policy == "fifo":
            return (e.seq,)
        return (e.last_used, e.seq)

    def _over_share(self, for_owner: str) -> list[str]:
        """The users other than ``for_owner`` holding more than their share:
        the whole budget split evenly between the users holding data and
        ``for_owner``."""
        n = len(self._held) + (for_owner not in self._held)
        share = (self.memory_bytes + self.disk_bytes) / n
        return [o for o in self._held_order.over(share) if o != for_owner]

    def _evictable(self, for_owner: str) -> int:
        """The bytes in memory a put of ``for_owner`` may evict: the victims'
        sizes, counted per owner as entries are filed."""
        sizes = self._order.bytes[Where.MEMORY]
        return sizes.get(for_owner, 0) + sum(sizes.get(o, 0) for o in self._over_share(for_owner))

    def _victims(self, where: Where, for_owner: str | None = None) -> Iterator[Entry]:
        """What may go to make room, in the order it goes: for a put of
        ``for_owner``, that owner's own data first, then that of users over
        their share (as they hold now, when this is called); never another
        user's data within their share. Lazy: the caller spills or evicts
        each entry before taking the next, or stops."""
        if for_owner is None:
            return self._order.victims(where, None, self._order.owners(where))
        return self._order.victims(where, for_owner, self._over_share(for_owner))

    def _spill_one(self, e: Entry, actions: list) -> bool:
        if self.used[Where.DISK] + e.size > self.disk_bytes:
            return False
        self.used[Where.MEMORY] -= e.size
        self.used[Where.DISK] += e.size
        e.where = Where.DISK
        self._file(e)
        self.counts["spilled"] += 1
        actions.append(Spill(e.id))
        return True

    def _make_room(self, for_owner: str | None = None) -> list:
        actions: list = []
        mem, disk = Where.MEMORY, Where.DISK
        if self.used[mem] > self.memory_bytes:
            for v in self._victims(mem, for_owner):
                if self.used[mem] <= self.memory_bytes:
                    break
                if self.disk_bytes and v.size <= self.disk_bytes:
                    # room on disk: evict disk victims first if needed
                    for d in self._victims(disk, for_owner):
                        if self.used[disk] + v.size <= self.disk_bytes:
                            break
                        actions.append(self._evict(d, "its spill space was needed"))
                    if self._spill_one(v, actions):
                        continue
                actions.append(self._evict(v, "memory was needed"))
        return actions

    def _evict(self, e: Entry, why: str) -> Evict:
        where = e.where
        self.used[where] -= e.size
        self._unhold(e.owner, e.size)
        del self.entries[e.id]
        self._order.drop(e.id)
        reason = f"evicted ({self.policy.upper()}) because {why} (budget {self.memory_bytes} bytes in memory, " \
                 f"{self.disk_bytes} on disk)"
        self._tomb(e.id, reason)
        self.counts["evicted"] += 1
        return Evict(e.id, where, reason)
