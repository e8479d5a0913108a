"""A call's data on the SeD (:mod:`gridrpc.sed.data.store`): a CALL whose
arguments hold references is acknowledged at once and its references are
resolved before it is queued (it holds no execution slot meanwhile); a CALL
with ``keep`` stores its result here and answers with the reference; the
waiters of a result are woken, or told why it will not come.

:class:`CallData` holds those hooks, called by the SeD's call runtime
(:mod:`gridrpc.sed.calls.receive`); :class:`~gridrpc.sed.data.store.SedData` inherits them
and owns the state (``call_waiters``, ``resolving``, ``keeps``, ``pins``).

The result of a call is its user's only: a ``data_get`` for it is refused to
anyone else, also when it waits for a call that has not arrived yet (the
waiter's user is checked again when the call ends). The owner is read from
the call itself while it lives and from the result cache after (its ids are
bounded, held answers never forgotten), so ownership is never lost while a
result can still be reached.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from ...core import codec
from ...core import messages as m
from ...core.datastore import Mode, parse_mode
from ...core.messages import MsgType
from ...core.refs import RefTag, find_refs, substitute
from ...errors import DataAccessDenied, DataError, DataLost, InvalidArgument, wire_kind
from .held_bytes import value_nbytes

_RESULT = MsgType.RESULT.value

__all__ = ["CallData"]


def not_yours(cid: str, user: str) -> DataAccessDenied:
    return DataAccessDenied(f"the result of call {cid} belongs to another user; {user!r} may not use it")


class CallData:
    """The call hooks of :class:`~gridrpc.sed.data.store.SedData`."""

    def call_user(self, cid: str) -> str | None:
        """Whose result call ``cid``'s is (None: no such call known here)."""
        live = self.sed.calls.get(cid)
        if live is not None:
            return live.user
        item = self.resolving.get(cid)
        if item is not None:
            return item[0].user
        return self.sed.lifecycle.cache.user(cid)

    def on_call(self, call, header: dict) -> bool:
        """A new call (decoded, checked). Registers its kept result; True if
        its inputs must be resolved first (then it is acknowledged here and
        admitted later)."""
        keep = header.get("keep")
        if keep is not None:
            mode = parse_mode(keep["mode"])
            self.store.expect(keep["ref"], call.user, mode, call.id, time.time())
            self.keeps[call.id] = (keep["ref"], mode)
        tags = find_refs(call.args) + find_refs(call.kwargs)
        if not tags:
            return False
        self.sed.endpoint.send(call.route, self.sed._accepted(call))
        task = self.sed._spawn(self._resolve(call, tags))
        self.resolving[call.id] = (call, task)
        return True

    async def _resolve(self, call, tags: list[RefTag]) -> None:
        values: dict[int, Any] = {}
        pinned: list[str] = []
        try:
            cache: dict[str, Any] = {}
            for tag in tags:
                if tag.id not in cache:
                    tree, buffers = await self.fetch(tag, call.user)
                    ex = self.sed.execution
                    cache[tag.id] = codec.decode(tree, buffers, ex.file_sink(call.workdir), ex.copy_args)
                    if tag.id in self.store and not tag.desc.get("call"):
                        self.store.pin(tag.id)          # a pending call needs it: never evicted
                        pinned.append(tag.id)
                values[id(tag)] = cache[tag.id]
        except asyncio.CancelledError:
            self._unpin(pinned)
            raise
        except Exception as exc:  # noqa: BLE001 - any failure fails this call only, with a clear error
            self.resolving.pop(call.id, None)
            kind = wire_kind(exc) if isinstance(exc, DataError) else "protocol"
            return self._not_resolved(call, pinned, kind, f"call {call.id} ({call.service}) could not get its "
                                      f"data: {exc}", type(exc).__name__)
        self.resolving.pop(call.id, None)
        call.args = substitute(call.args, values)
        call.kwargs = substitute(call.kwargs, values)
        try:
            call.svc.check(call.args, call.kwargs)      # the types the references stood for
        except InvalidArgument as exc:
            return self._not_resolved(call, pinned, "invalid_argument", f"call {call.id}: {exc}", "InvalidArgument")
        self.pins[call.id] = pinned
        self.sed.admit(call)

    def _not_resolved(self, call, pinned: list[str], kind: str, msg: str, type_: str) -> None:
        """The call cannot run with its inputs: release them, fail what waits on its result, answer it."""
        self._unpin(pinned)
        self._producer_failed(call.id, msg)
        self.sed.endpoint.send(call.route, m.error_header(call.id, kind, msg, type_=type_, server=call.replica.name))

    def _unpin(self, refs: list[str]) -> None:
        for r in refs:
            self._carry_out(self.store.unpin(r))
            self._carry_out(self.store.used_once(r, time.time()))

    def state(self, cid: str) -> str | None:
        return "queued" if cid in self.resolving else None

    def cancel(self, cid: str) -> bool:
        item = self.resolving.pop(cid, None)
        if item is None:
            return False
        call, task = item
        task.cancel()
        self._producer_failed(cid, f"call {cid} was cancelled")
        self.sed.endpoint.send(call.route, m.error_header(cid, "cancelled", "call cancelled while fetching its data"))
        return True

    def _producer_failed(self, cid: str, message: str) -> None:
        keep = self.keeps.pop(cid, None)
        if keep is not None:
            self.store.fail(keep[0], message)
            self._wake(keep[0])
        for fut, _user in self.call_waiters.pop(cid, []):
            if not fut.done():
                fut.set_exception(DataLost(message))

    def answering(self, call, header: dict, buffers, ok: bool) -> tuple[dict, list, bool]:
        """A call ends: release its inputs, keep its result, wake its waiters."""
        self._unpin(self.pins.pop(call.id, []))
        is_result = header.get("type") == _RESULT
        waiters = self.call_waiters.pop(call.id, [])
        if waiters:
            for fut, user in waiters:
                if fut.done():
                    continue
                if user != call.user:
                    fut.set_exception(not_yours(call.id, user))
                elif is_result:
                    fut.set_result((header.get("value"), list(buffers)))
                else:
                    err = header.get("error") or {}
                    fut.set_exception(DataLost(f"call {call.id} ({call.service}) that produces this argument "
                                               f"failed: {err.get('type')}: {err.get('message')}"))
        keep = self.keeps.get(call.id)
        if keep is None:
            return header, list(buffers), ok
        if not is_result:
            err = header.get("error") or {}
            self._producer_failed(call.id, f"call {call.id} ({call.service}) that was to produce it failed: "
                                           f"{err.get('type')}: {err.get('message')}")
            return header, list(buffers), ok
        self.keeps.pop(call.id, None)
        ref, mode = keep
        tree, buffers = header.get("value"), list(buffers)
        size = value_nbytes(tree, buffers)
        try:
            _, actions = self.store.add(ref, call.user, mode, size, time.time())
        except DataError as exc:
            self._carry_out(getattr(exc, "actions", ()))
            self._wake(ref)
            return (m.error_header(call.id, "data", str(exc), type_=type(exc).__name__,
                                   **{k: header[k] for k in ("server", "timing") if k in header}), [], False)
        self._keep_bytes(ref, tree, buffers, actions)
        self._wake(ref)
        desc = {"__t": "ref", "id": ref, "holder": call.replica.name, "address": self.sed.address, "size": size,
                "mode": mode.value, "replicas": []}
        out = dict(header)
        if mode is Mode.PERSISTENT_RETURN:
            desc["value"] = tree
            return {**out, "value": desc}, buffers, ok
        return {**out, "value": desc}, [], ok
