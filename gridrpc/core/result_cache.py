"""The answers of a SeD's finished calls (pure): bounded in bytes.

A SeD answers a repeated request id of a finished call from here, and never
runs it again. Two bounds:

- ``max_bytes`` (default 64 MiB): the frames (header and binary parts) of the
  answers kept. The oldest answers are dropped first; an answer larger than
  the whole cache is never kept. A dropped answer leaves its id behind, so a
  duplicate still learns that the call ran and that its answer is gone.
- ``max_entry_bytes`` (default 4 MiB): a larger answer is not kept (its id
  is): holding big results would keep their memory from being reused, and a
  client repeating a call whose result is that large gets ``result_gone``
  rather than a copy held for it. (Measured: keeping 8 MB answers made every
  8 MB round trip 2-3x slower, fresh pages on every allocation.)
- ``max_ids`` (default 200,000, about 100 bytes each): the finished ids
  remembered. Past it the oldest ids are forgotten; a request repeating one
  of those (after 200,000 newer calls) would be taken for a new call.

Ids whose answer the back-end *holds* (the batch SeD keeps an undelivered
answer on disk until its client asks) are never forgotten; the back-end
releases them.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_IDS = 200_000
DEFAULT_MAX_ENTRY_BYTES = 4 * 1024 * 1024


def frames_nbytes(frames) -> int:
    """Bytes of a list of frames (bytes, memoryviews, numpy arrays, zmq frames)."""
    n = 0
    for f in frames:
        nb = getattr(f, "nbytes", None)
        n += nb if nb is not None else len(f)
    return n


@dataclass(frozen=True, slots=True)
class CacheStats:
    answers: int          # answers kept in memory
    bytes: int            # their size
    max_bytes: int
    ids: int              # finished ids remembered (with or without an answer)
    held: int             # ids whose answer the back-end holds
    dropped: int          # answers dropped (too old for the byte bound, or larger than it)


class ResultCache:
    """Finished ids and, within ``max_bytes``, their answers."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, max_ids: int = DEFAULT_MAX_IDS,
                 max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES) -> None:
        self.max_entry_bytes = max_entry_bytes
        if max_bytes < 0 or max_ids < 1:
            raise ValueError("max_bytes must be >= 0 and max_ids >= 1")
        self.max_bytes = max_bytes
        self.max_ids = max_ids
        self._answers: collections.OrderedDict[str, tuple[list, int]] = collections.OrderedDict()
        self._ids: set[str] = set()
        self._order: collections.deque[str] = collections.deque()
        self._held: set[str] = set()
        self._owners: dict[str, object] = {}      # who may ask again for a finished id
        self._users: dict[str, str] = {}          # whose result it is (data requests check it)
        self.bytes = 0
        self.dropped = 0

    # -- queries ------------------------------------------------------------
    def __contains__(self, call_id: str) -> bool:
        return call_id in self._ids

    def answer(self, call_id: str) -> list | None:
        """The frames of the answer, None if never kept or dropped."""
        e = self._answers.get(call_id)
        return None if e is None else e[0]

    def held(self, call_id: str) -> bool:
        return call_id in self._held

    def owner(self, call_id: str) -> object:
        """Who made the call (None: anyone may ask)."""
        return self._owners.get(call_id)

    def user(self, call_id: str) -> str | None:
        """The user the call was made for, as long as its id is remembered."""
        return self._users.get(call_id)

    def statistics(self) -> CacheStats:
        return CacheStats(answers=len(self._answers), bytes=self.bytes, max_bytes=self.max_bytes,
                          ids=len(self._ids), held=len(self._held), dropped=self.dropped)

    # -- changes ------------------------------------------------------------
    def put(self, call_id: str, frames: list | None, owner: object = None, user: str | None = None) -> None:
        """Remember a finished id (made by ``owner`` for ``user``) and, if it fits, its answer."""
        self.remember(call_id, owner, user)
        old = self._answers.pop(call_id, None)
        if old is not None:
            self.bytes -= old[1]
        if frames is None:
            return
        n = frames_nbytes(frames)
        if n > self.max_bytes or n > self.max_entry_bytes:
            self.dropped += 1
            return
        self._answers[call_id] = (frames, n)
        self.bytes += n
        while self.bytes > self.max_bytes:
            _, (_, size) = self._answers.popitem(last=False)
            self.bytes -= size
            self.dropped += 1

    def drop_answers(self) -> None:
        """Forget every kept answer (the ids stay known): a stopped SeD frees
        their memory (answers may hold shared-memory segments)."""
        self.dropped += len(self._answers)
        self._answers.clear()
        self.bytes = 0

    def remember(self, call_id: str, owner: object = None, user: str | None = None) -> None:
        """Remember a finished id (its answer, if any, is given to :meth:`put`)."""
        if owner is not None:
            self._owners[call_id] = owner
        if user is not None:
            self._users[call_id] = user
        if call_id in self._ids:
            return
        self._ids.add(call_id)
        self._order.append(call_id)
        if len(self._order) > self.max_ids:
            self._forget_oldest()

    def hold(self, call_id: str) -> None:
        """The back-end keeps this id's answer until it is delivered or released."""
        self.remember(call_id)
        self._held.add(call_id)

    def release(self, call_id: str) -> None:
        """The back-end no longer holds this id's answer."""
        self._held.discard(call_id)

    def _forget_oldest(self) -> None:
        for _ in range(len(self._order)):
            old = self._order.popleft()
            if old in self._held:              # held answers are the back-end's to release
                self._order.append(old)
                continue
            self._ids.discard(old)
            self._owners.pop(old, None)
            self._users.pop(old, None)
            e = self._answers.pop(old, None)
            if e is not None:
                self.bytes -= e[1]
            return
