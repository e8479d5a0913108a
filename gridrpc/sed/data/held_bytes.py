"""Where a SeD's data bytes live (:mod:`gridrpc.sed.data.store`): in memory as the
codec's ``(tree, buffers)``, or in a spill file this SeD names; carrying out
the store's decisions (spill, evict, free); waiting for a reference still to
be produced here.

:class:`HeldBytes` holds those methods; :class:`~gridrpc.sed.data.store.SedData`
inherits them and owns the state (``store``, ``values``, ``files``,
``appear``, ``directory``, ``_files``).
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import orjson

from ...core.datastore import Evict, Freed, Mode, Spill, Where
from ...errors import DataError, DataLost

__all__ = ["HeldBytes"]

log = logging.getLogger("gridrpc.sed.data.store")      # the data runtime's one logger


def nbytes(b) -> int:
    return b.nbytes if isinstance(b, memoryview) else len(memoryview(b).cast("B")) if not isinstance(
        b, (bytes, bytearray)) else len(b)


def value_nbytes(tree: Any, buffers: list) -> int:
    """What a value held here costs: its binary buffers and its JSON part
    (a string or a list is as large as it is, not 0)."""
    n = sum(nbytes(b) for b in buffers)
    if tree is not None:
        n += len(orjson.dumps(tree))
    return n


class HeldBytes:
    """The bytes of the references held by :class:`~gridrpc.sed.data.store.SedData`."""

    def _keep_bytes(self, ref: str, tree: Any, buffers: list, actions: list) -> None:
        self.values[ref] = (tree, buffers)
        self._carry_out(actions)

    def _carry_out(self, actions: list) -> None:
        for a in actions:
            if isinstance(a, Spill):
                tree, buffers = self.values.pop(a.ref)
                os.makedirs(self.directory, exist_ok=True)
                self._files += 1
                path = os.path.join(self.directory, f"d{self._files}.bin")   # named here, never from a message
                with open(path, "wb") as fh:
                    for b in buffers:
                        fh.write(b)
                self.files[a.ref] = (tree, [nbytes(b) for b in buffers], path)
                log.info("SeD %s: data %s spilled to disk", self.sed.name, a.ref)
            elif isinstance(a, (Evict, Freed)):
                self.values.pop(a.ref, None)
                f = self.files.pop(a.ref, None)
                if f is not None:
                    try:
                        os.unlink(f[2])
                    except OSError:
                        pass
                if isinstance(a, Evict):
                    log.info("SeD %s: data %s %s", self.sed.name, a.ref, a.reason)

    def _load(self, ref: str) -> tuple[Any, list]:
        v = self.values.get(ref)
        if v is not None:
            return v
        f = self.files.get(ref)
        if f is None:
            raise DataLost(f"data reference {ref} has no bytes on SeD {self.sed.name}")
        tree, sizes, path = f
        with open(path, "rb") as fh:
            raw = memoryview(fh.read())
        out, off = [], 0
        for n in sizes:
            out.append(raw[off:off + n])
            off += n
        return tree, out

    async def _wait_local(self, ref: str, timeout: float) -> None:
        """Until ``ref`` is here with its bytes (or gone, or ``timeout``)."""
        e = self.store.get(ref)
        if e is not None and e.where is not Where.PENDING:
            return
        if e is None and ref in self.store.tombstones:
            return
        fut = asyncio.get_running_loop().create_future()
        self.appear.setdefault(ref, []).append(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            lst = self.appear.get(ref)
            if lst and fut in lst:
                lst.remove(fut)

    def _wake(self, ref: str) -> None:
        for fut in self.appear.pop(ref, []):
            if not fut.done():
                fut.set_result(None)

    async def local_value(self, ref: str, user: str, *, transfer: bool, wait: float) -> tuple[Any, list, Any]:
        """``(tree, buffers, entry)`` of a reference held (or to be produced) here."""
        e = self.store.get(ref)
        if e is None and ref not in self.store.tombstones:
            await self._wait_local(ref, min(wait, self.config.appear_grace))
        elif e is not None and e.where is Where.PENDING:
            if e.owner == user:
                await self._wait_local(ref, wait)
        e = self.store.check(ref, user)
        if e.where is Where.PENDING:
            raise DataLost(f"data reference {ref} not produced yet on SeD {self.sed.name} after {wait}s")
        if transfer and e.mode is Mode.STICKY:
            raise DataError(f"data reference {ref} is sticky: it stays on {self.sed.name} and is never moved; "
                            f"run the call there (server={self.sed.name!r})")
        tree, buffers = self._load(ref)
        self.store.touch(ref, time.time())
        return tree, buffers, e
