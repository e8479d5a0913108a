"""``Call`` (a submitted call), ``ServerInfo`` and ``wait``."""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
from dataclasses import dataclass, field
from typing import Iterable

from ..errors import CallCancelled, Timeout

_CF_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """One server from a discovery, ranked best first."""
    name: str
    address: str
    estimation: dict = field(default_factory=dict, compare=False)
    idempotent: bool = field(default=True, compare=False)   # False: a lost call is not re-run


class Call:
    """A submitted call. Usable from threads (``result``, ``done``, ``cancel``)
    and from the client's event loop (``await call``, ``await call.aresult()``,
    ``await call.acancel()``)."""

    def __init__(self, client, service: str, loop: asyncio.AbstractEventLoop) -> None:
        self._client = client
        self.service = service
        self._loop = loop
        self._cf: cf.Future | None = None       # the thread side's future, made on first use (_future)
        self._task: asyncio.Future | None = None   # its task, or the future of a call run without one (client.submit)
        self.server: str | None = None          # name of the SeD it was sent to
        self.address: str | None = None
        self.id: str | None = None               # request id of the current attempt
        self.attempts: list[str] = []
        self.timing: dict = {}
        self.optional = False
        self._flight = None                      # set by the client once the call is sent
        self._chosen = None                      # the kept answer's server it took (client.reuse), until it ends

    # set by the client
    def _bind(self, task: asyncio.Future) -> None:
        self._task = task

    def _future(self) -> cf.Future:
        """The ``concurrent.futures`` mirror of the task, for threads: made when first
        asked for (a burst of 14,000 submits made 14,000 of them, each with a lock and a
        condition, for loop code that never looks at them)."""
        f = self._cf
        if f is not None:
            return f
        with _CF_LOCK:
            if self._cf is not None:
                return self._cf
            f = cf.Future()
            task = self._task
            self._cf = f
        if task is None:
            return f                            # a direct await's Call: never handed out
        if self._in_loop():
            task.add_done_callback(self._mirror)    # done callbacks run on the loop, as they always did
        else:
            try:
                self._loop.call_soon_threadsafe(self._watch)
            except RuntimeError:                # the loop is closed: nothing will run there again
                if task.done():
                    self._mirror(task)
                elif not f.done():
                    f.set_exception(CallCancelled(f"call to {self.service} cancelled: its client is closed"))
        return f

    def _watch(self) -> None:
        """On the loop: mirror the task into the thread-side future when it ends (at once if it has)."""
        task = self._task
        if task.done():
            self._mirror(task)
        else:
            task.add_done_callback(self._mirror)

    def _settled(self):
        """For a finished task, read in any thread without completing the thread-side future (its
        callbacks are the loop's to run): ``(True, value)`` or ``(False, exception)``; None if
        not finished."""
        task = self._task
        if task is None or not task.done():
            return None
        if task.cancelled():
            return False, CallCancelled(f"call to {self.service} cancelled")
        exc = task.exception()
        return (False, exc) if exc is not None else (True, task.result())

    def _mirror(self, task: asyncio.Task) -> None:
        f = self._cf
        if f.done():
            return
        try:
            if task.cancelled():
                f.set_exception(CallCancelled(f"call to {self.service} cancelled"))
            elif task.exception() is not None:
                f.set_exception(task.exception())
            else:
                f.set_result(task.result())
        except cf.InvalidStateError:            # set meanwhile by the loop's callback or another thread
            pass

    # -- thread API -------------------------------------------------------
    def _in_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def result(self, timeout: float | None = None):
        if self._in_loop() and not self.done():
            raise RuntimeError("Call.result() would block the event loop; use 'await call' instead")
        settled = self._settled()
        if settled is not None:
            ok, value = settled
            if ok:
                return value
            raise value
        f = self._future()
        try:
            return f.result(timeout)
        except cf.TimeoutError:             # also the call's own gridrpc.Timeout (a TimeoutError)
            if f.done():
                raise
            raise Timeout(f"call to {self.service} not finished after {timeout}s") from None
        except cf.CancelledError:
            raise CallCancelled(f"call to {self.service} cancelled") from None

    def exception(self, timeout: float | None = None):
        try:
            self.result(timeout)
        except Timeout as exc:
            if not self.done():
                raise                   # not finished in time
            return exc                  # the call itself failed with Timeout
        except BaseException as exc:  # noqa: BLE001
            return exc
        return None

    def done(self) -> bool:
        task = self._task
        if task is not None:
            return task.done()
        return self._cf is not None and self._cf.done()

    def cancelled(self) -> bool:
        settled = self._settled()
        if settled is None:
            return self._cf is not None and self._cf.done() and isinstance(self._cf.exception(), CallCancelled)
        return not settled[0] and isinstance(settled[1], CallCancelled)

    def cancel(self, timeout: float = 5.0) -> bool:
        """Stop the call: removed from the server's queue or its worker killed.
        Returns False if it had already finished."""
        if self.done():
            return False
        if self._in_loop():
            raise RuntimeError("use 'await call.acancel()' inside the event loop")
        fut = asyncio.run_coroutine_threadsafe(self.acancel(), self._loop)
        try:
            return fut.result(timeout)
        except cf.TimeoutError:
            return True

    def add_done_callback(self, fn) -> None:
        self._future().add_done_callback(lambda _f: fn(self))

    # -- async API --------------------------------------------------------
    def __await__(self):
        return self.aresult().__await__()

    async def aresult(self, timeout: float | None = None):
        fut = asyncio.wrap_future(self._future()) if not self._in_loop() or self._task is None else self._task
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:        # also the call's own gridrpc.Timeout (a TimeoutError)
            if fut.done():
                raise
            raise Timeout(f"call to {self.service} not finished after {timeout}s") from None
        except asyncio.CancelledError:
            if self.done():
                return self.result()
            raise

    async def acancel(self) -> bool:
        if self._task is None or self._task.done():
            return False
        await self._client._cancel_remote(self)     # returns once the server confirmed (or gave up)
        flight = self._flight
        if flight is None or not flight.machine.finished:
            self._task.cancel()                     # not sent yet (discovery): stop it here
        try:
            await self._task
        except BaseException:  # noqa: BLE001
            pass
        return True

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<gridrpc.Call {self.service} on {self.server or '?'} {state}>"


def wait(calls: Iterable[Call], timeout: float | None = None, return_when: str = "ALL_COMPLETED"):
    """Like ``concurrent.futures.wait``: returns ``(done, pending)`` sets of calls."""
    calls = list(calls)
    if return_when not in ("ALL_COMPLETED", "FIRST_COMPLETED", "FIRST_EXCEPTION"):
        raise ValueError("return_when must be 'ALL_COMPLETED', 'FIRST_COMPLETED' or 'FIRST_EXCEPTION'")
    by_future = {c._future(): c for c in calls}
    done, pending = cf.wait(list(by_future), timeout=timeout, return_when=return_when)
    return {by_future[f] for f in done}, {by_future[f] for f in pending}


