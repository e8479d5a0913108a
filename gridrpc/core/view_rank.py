"""Ranking a view answer (pure): the herding guard (near-equal servers at
the top split by a power-of-two choice) and an incremental ranking of the
view, so that a view answer at the root of a large tree costs what its
best places and the snapshots changed since the last answer cost, not
what all of its SeDs cost.

:class:`ViewRanking` keeps the SeDs of a view offering one service sorted
by an aggregator's ``view_key`` (an order that does not change as the
snapshots age; ``default``'s: the time of the last solve). A view answer
then walks the first places only, and the few servers the root chose
recently (shown to the aggregator as loaded) are keyed again when chosen
and when the choice is forgotten. Same estimates, same order as
:func:`~gridrpc.core.view.candidates` and the aggregator's ``rank`` give
(``tests/test_core_view_rank.py``); only exact ties are broken by a draw
kept per snapshot instead of one per answer.
"""
from __future__ import annotations

import bisect
import heapq
import math
import random

HERD_GROUP = 64                 # near-equal servers looked for among the first places only

#: tags that change with time or by a little without the server changing:
#: tolerances under which two vectors are "near-equal" (absolute; ``rel``: relative)
VOLATILE = {"time_since_last_solve": None, "eft": 0.002, "est_wait": 0.002, "free_cpu": 0.1,
             "free_mem": ("rel", 0.1), "tcomp": ("rel", 0.1)}


# -- herding ----------------------------------------------------------------------
def num(v: object) -> float | None:
    return float(v) if type(v) in (int, float) and math.isfinite(v) else None


_NUMBER = (int, float)
_isfinite = math.isfinite


def near_equal(a: dict, b: dict) -> bool:
    """Two estimation vectors the same but for time and small host noise:
    the tags of ``VOLATILE`` within their tolerance, every other tag equal,
    the same load (waiting + running)."""
    return near_equal_to(a)(b)


def near_equal_to(a: dict):
    """``near_equal(a, ·)`` with ``a``'s side worked out once: the test
    :func:`power_of_two` applies to every server of a view answer (100,000
    at the root of a big tree). ``tests/test_core_view.py`` checks it against
    a tag-by-tag reference."""
    load = (num(a.get("num_waiting")) or 0) + (num(a.get("num_running")) or 0)
    fixed = {t: x for t, x in a.items() if t not in VOLATILE}
    vol = [(t, num(a.get(t)), tol) for t, tol in VOLATILE.items() if tol is not None]
    nfixed = len(fixed)

    def near(b: dict) -> bool:
        if load != (num(b.get("num_waiting")) or 0) + (num(b.get("num_running")) or 0):
            return False
        seen = 0
        for tag, y in b.items():
            if tag in VOLATILE:
                continue
            if tag in fixed:
                seen += 1
                if fixed[tag] != y:
                    return False
            elif None != y:             # noqa: E711 - absent from ``a``: near_equal compares None != y
                return False
        if seen != nfixed:              # tags of ``a`` absent from ``b`` compare with None
            for tag, x in fixed.items():
                if tag not in b and x != None:      # noqa: E711
                    return False
        for tag, fx, tol in vol:
            y = b.get(tag)
            fy = float(y) if type(y) in _NUMBER and _isfinite(y) else None     # num, inlined
            if fx is None or fy is None:
                if (fx is None) != (fy is None):
                    return False
                continue
            if isinstance(tol, tuple):
                tol = tol[1] * max(abs(fx), abs(fy))
            if abs(fx - fy) > tol:
                return False
        return True
    return near


def power_of_two(ranked: list[dict], k: int, rng: random.Random) -> list[dict]:
    """The aggregator's ranking with its first place given by a
    power-of-two choice among the servers near-equal to the best: two drawn
    at random, the better ranked wins. Returns the best ``k``. The group is
    looked for among the first ``HERD_GROUP`` places only: on thousands of
    idle, equal servers, comparing all of them cost more than the rest of a
    view answer (2,000 SeDs: 10 ms of 14), and spreading first choices over
    64 servers (with the recent-choice memory on top) already stops a herd."""
    if len(ranked) < 2 or k <= 0:
        return ranked[:k]
    near = near_equal_to(ranked[0].get("estimation") or {})
    group, limit = 1, min(len(ranked), HERD_GROUP)
    while group < limit and near(ranked[group].get("estimation") or {}):
        group += 1
    if group < 2:
        return ranked[:k]
    i, j = rng.randrange(group), rng.randrange(group)
    pick = min(i, j)
    return [ranked[pick], *ranked[:pick], *ranked[pick + 1:k + 1]][:k]


def age_vector(est: dict, age: float) -> dict:
    """A snapshot's vector as it stands ``age`` seconds after it was taken
    (in place): the time since the last solve grows, the expected wait
    shrinks. What a view answer ranks."""
    if age > 0:
        t = est.get("time_since_last_solve")
        if type(t) in (int, float):
            est["time_since_last_solve"] = t + age
        w = est.get("est_wait")
        if type(w) in (int, float):
            est["est_wait"] = max(0.0, w - age)
    return est


# -- the incremental ranking -------------------------------------------------------
class SortedBlocks:
    """A sorted sequence kept in blocks of at most ``2 * BLOCK`` items (a
    full one is split in two, an empty one dropped): adding or removing one
    moves a block, not the whole sequence (at 100,000 SeDs a plain list
    moved 800 kB per change)."""

    BLOCK = 512

    def __init__(self) -> None:
        self.blocks: list[list] = []
        self.maxes: list = []                   # the last item of every block

    def reset(self, items: list) -> None:
        """Hold ``items`` (sorted)."""
        b = self.BLOCK
        self.blocks = [items[i:i + b] for i in range(0, len(items), b)]
        self.maxes = [x[-1] for x in self.blocks]

    def add(self, item) -> None:
        blocks, maxes = self.blocks, self.maxes
        if not blocks:
            blocks.append([item])
            maxes.append(item)
            return
        i = min(bisect.bisect_left(maxes, item), len(blocks) - 1)
        block = blocks[i]
        bisect.insort(block, item)
        maxes[i] = block[-1]
        if len(block) > 2 * self.BLOCK:
            half = len(block) // 2
            blocks[i:i + 1] = [block[:half], block[half:]]
            maxes[i:i + 1] = [block[half - 1], block[-1]]

    def remove(self, item) -> bool:
        """Remove ``item`` (that very object); False when it is not found
        where its key says (then the caller sorts again)."""
        i = bisect.bisect_left(self.maxes, item)
        if i == len(self.maxes):
            return False
        block = self.blocks[i]
        j = bisect.bisect_left(block, item)
        if j == len(block) or block[j] is not item:
            return False
        del block[j]
        if block:
            self.maxes[i] = block[-1]
        else:
            del self.blocks[i], self.maxes[i]
        return True

    def __iter__(self):
        for block in self.blocks:
            yield from block

    def __len__(self) -> int:
        return sum(len(b) for b in self.blocks)


class ViewRanking:
    """The SeDs of a view offering ``service``, sorted by ``view_key(vector,
    taken_at)`` of an aggregator (see :class:`~gridrpc.core.aggregators.
    DefaultAggregator`), ties by a draw per snapshot.

    The view tells it which SeDs changed (:meth:`changed`, called by
    :class:`~gridrpc.core.view.SubtreeView`), and so does ``table`` (the
    root's :class:`~gridrpc.core.discovery.DiscoveryTable`) of the servers
    it chose: a recent choice shows the server as loaded
    (``with_recent_since``) and is part of its key until it leaves the
    table's memory. :meth:`answer` moves those (or sorts again when many
    changed) and walks the first places. What the last answer did, which
    its CPU grows with: ``moved`` (changed snapshots keyed and moved),
    ``sorted`` (snapshots keyed and sorted anew, or counted again after the
    tree changed) and ``walked`` (first places looked at)."""

    RESORT = 8          # more changed than 1/RESORT of the ranked SeDs: sort them all again

    def __init__(self, service: str, view_key, rng: random.Random, table) -> None:
        self.service = service
        self.view_key = view_key
        self.rng = rng
        self.table = table
        self.order = SortedBlocks()             # (*key, tie, name)
        self.entry: dict[str, tuple] = {}       # name -> its entry in ``order``
        self.dirty: set[str] = set()            # changed since the last answer
        self.matched: set[str] = set()          # ranked and offering the service under the child it came through
        self._expected: dict | None = None      # the registry's offers ``matched`` was counted against
        self.expiry: list = []                  # heap: (a choice in a key, the server): re-keyed when it is forgotten
        self.moved = self.sorted = self.walked = 0

    def changed(self, name: str) -> None:
        self.dirty.add(name)

    def _key(self, name: str, seds: dict, now: float) -> tuple | None:
        s = seds.get(name)
        est = s.vector(self.service) if s is not None else None
        if est is None:
            self.entry.pop(name, None)
            return None
        key = self.view_key(est, s.at)
        table = self.table
        ts = table.recent.get(name) if table.remember else None
        if ts and ts[-1] > s.at:                # chosen since its snapshot: ranked as loaded
            aged = age_vector(est, now - s.at)
            server = {"name": name, "estimation": aged, "_at": s.at}
            table.with_recent_since([server], now)
            if server["estimation"] is not aged:
                key = self.view_key(server["estimation"], now)
                first = next(t for t in table.recent[name] if t > s.at)
                heapq.heappush(self.expiry, (first, name))
        e = (*key, self.rng.random(), name)     # flat: cheaper to compare
        self.entry[name] = e
        return e

    def sync(self, seds: dict, expected: dict, now: float) -> None:
        """Apply the changes since the last answer; ``expected``: SeD name ->
        (address, child) of the SeDs offering the service (the registry)."""
        dirty, order, entry, expiry = self.dirty, self.order, self.entry, self.expiry
        horizon = now - self.table.memory       # as the table forgets its choices
        while expiry and expiry[0][0] < horizon:
            dirty.add(heapq.heappop(expiry)[1])
        resort = len(dirty) * self.RESORT > len(entry)
        for name in dirty:
            old = entry.get(name)
            if old is not None and not resort and not order.remove(old):
                resort = True                   # keys that do not order (a plug-in's): sort again
            new = self._key(name, seds, now)
            if new is not None and not resort:
                order.add(new)
        if resort:
            order.reset(sorted(entry.values()))
            self.sorted += len(entry)
        else:
            self.moved += len(dirty)
        if expected is not self._expected:      # the tree changed: count again
            self._expected = expected
            self.matched = {n for n in entry if _offers(expected, n, seds)}
            self.sorted += len(entry)
        else:
            for name in dirty:
                if name in entry and _offers(expected, name, seds):
                    self.matched.add(name)
                else:
                    self.matched.discard(name)
        dirty.clear()

    def complete(self, expected: dict) -> bool:
        """Every SeD offering the service has a snapshot (from the child it is under)."""
        return len(self.matched) == len(expected)

    def answer(self, seds: dict, expected: dict, now: float, silent_after: float, k: int) -> list[dict] | None:
        """The first ``max(HERD_GROUP, k + 1)`` places of the ranking
        (``{name, address, estimation}``, aged, the table's choices
        applied), or None when a SeD offering the service has no snapshot
        (the caller ranks the whole view, or fans out). SeDs silent for
        longer than ``silent_after`` are left out, as
        :func:`~gridrpc.core.view.candidates` leaves them out."""
        self.moved = self.sorted = self.walked = 0
        self.sync(seds, expected, now)
        if not self.complete(expected):
            return None
        want = max(HERD_GROUP, k + 1)
        service = self.service
        out: list = []
        walked = 0
        for e in self.order:
            walked += 1
            name = e[-1]
            server = _server(seds[name], name, service, expected, now, silent_after)
            if server is not None:
                out.append(server)
                if len(out) >= want:
                    break
        self.walked = walked
        return self.table.with_recent_since(out, now)


def _offers(expected: dict, name: str, seds: dict) -> bool:
    exp = expected.get(name)
    return exp is not None and exp[1] == seds[name].via


def _server(s, name: str, service: str, expected: dict, now: float, silent_after: float) -> dict | None:
    exp = expected.get(name)
    if exp is None or exp[1] != s.via or now - s.seen > silent_after:
        return None
    est = age_vector(s.vector(service), now - s.at)
    return {"name": name, "address": exp[0], "estimation": est, "_at": s.at}
