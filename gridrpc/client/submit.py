"""Calls of :class:`~gridrpc.client.aio.AsyncClient`: ``call``, ``submit``,
``submit_nowait`` and ``cancel_calls``.

A call is made in three steps: its arguments encoded (:meth:`_encode`), its
call machine launched in the driver (:meth:`_launch`: the CALL, or the
discovery before it, leaves from there), and the machine's outcome turned
into a value or an exception (:meth:`_settle`). Between the last two, the
caller waits:

- ``await client.call(...)`` and a submitted call that needs a wait before
  its CALL (a server given by name to resolve, data references or pending
  calls among its arguments, ``keep_result``) run in a coroutine
  (:meth:`_run`; a task for ``submit``), awaiting the flight's ``waiter``;
- any other submitted call (discovery, or a :class:`ServerInfo` from one)
  runs without a task: launched from ``submit_nowait`` itself, its
  :class:`~gridrpc.client.futures.Call` bound to a :class:`_DirectFuture` that
  the driver settles when the call ends (the flight's ``on_end``, no waiter
  and no done callback; cancelling the future sends the CANCEL). Why: a
  task per call costs two loop steps (to send, to end) and, cancelled, an
  exception the cyclic GC must walk, and every extra future or callback per
  call in flight is more for the GC to walk in a burst of thousands of calls
  (docs/performance.md, "Bursts"). Both ways give the same results, errors
  and cancellation.
"""
from __future__ import annotations

import asyncio
from typing import Any

from ..core import codec
from ..core import messages as m
from ..core.client_call.machine import CallMachine, Done
from ..core.messages import MsgType
from ..errors import CallCancelled, CommunicationError, MessageTooLarge
from ..files import read_file
from .futures import Call, ServerInfo
from .driver import Flight, exception_for
from .ids import new_id
from .reuse import server_failed


def _data():
    from . import data
    return data


#: argument types that are never a data reference or a pending call
_SCALARS = frozenset({int, float, str, bool, bytes, type(None)})


def _has_data(args: tuple, kwargs: dict) -> bool:
    """Whether a data reference or a pending call is among the arguments; for
    scalars only, answered without importing :mod:`gridrpc.client.data`."""
    if all(type(v) in _SCALARS for v in args) and all(type(v) in _SCALARS for v in kwargs.values()):
        return False
    return _data().has_data(args, kwargs)


class _DirectFuture(asyncio.Future):
    """The future of a submitted call run without a task. Cancelling it (a
    task awaiting it cancelled, ``cancel_calls`` before the CALL left, the
    client closing) sends the call's CANCEL at once, as a cancelled task's
    call does: no done callback per call for that (each was a partial, a
    bound method and a list for the cyclic GC to walk)."""

    __slots__ = ("call", "countdown")

    def cancel(self, msg: Any = None) -> bool:
        if not super().cancel(msg):
            return False
        call, self.call = self.call, None
        if call is not None:
            call._client._direct_cancelled(call, self)
        _ended(self)
        return True


class _Countdown:
    """What ``cancel_calls`` waits on: a future set when ``left`` reaches 0.
    It starts at 1, a hold its owner releases (``one_ended()``) once every
    call is counted, so a call that ends while the others are still being
    cancelled cannot set it early. A direct call's future tells it itself
    (its ``countdown``), with no done callback each: a callback, a list and a
    scheduled handle per call would be most of the cost of cancelling a
    burst."""

    __slots__ = ("left", "fut")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.left, self.fut = 1, loop.create_future()

    def one_ended(self, _f: Any = None) -> None:
        self.left -= 1
        if self.left <= 0 and not self.fut.done():
            self.fut.set_result(None)


def _drop(flight: Flight) -> None:
    """A direct call is over: what only its sending and settling needed goes
    now, not when its ``Call`` does (a user keeping 14,000 ended calls kept
    their headers, arguments and outcomes for the cyclic GC to walk)."""
    flight.header, flight.buffers, flight.outcome = None, (), None


def _ended(fut: _DirectFuture) -> None:
    c = fut.countdown
    if c is not None:
        fut.countdown = None
        c.one_ended()


class SubmitMixin:
    """The calls of the asyncio client (mixed into :class:`~gridrpc.client.aio.AsyncClient`)."""

    async def call(self, service: str, *args, optional: bool = False, server: str | ServerInfo | None = None,
                   timeout: float | None = None, aggregator: Any = None, keep_result: Any = False, **kwargs):
        """Call and wait for the result (no Task per call: the fast path).
        ``keep_result``: True or a data mode: the result stays on the SeD and
        a :class:`~gridrpc.client.data.DataRef` is returned."""
        if self.closed:
            raise CommunicationError("client is closed")
        call = Call(self, service, self.loop)
        call.optional = bool(optional)
        return await self._run(call, args, kwargs, server, timeout if timeout is not None else self.timeout,
                               aggregator, keep_result)

    async def submit(self, service: str, *args, optional: bool = False, server: str | ServerInfo | None = None,
                     timeout: float | None = None, aggregator: Any = None, keep_result: Any = False,
                     **kwargs) -> Call:
        """Start a call; returns its :class:`Call` at once (``await call`` for the result)."""
        return self.submit_nowait(service, *args, optional=optional, server=server, timeout=timeout,
                                  aggregator=aggregator, keep_result=keep_result, **kwargs)

    def submit_nowait(self, service: str, *args, optional: bool = False, server: str | ServerInfo | None = None,
                      timeout: float | None = None, aggregator: Any = None, keep_result: Any = False,
                      **kwargs) -> Call:
        """Like :meth:`submit`, as a plain function (call it from the client's loop)."""
        if self.closed:
            raise CommunicationError("client is closed")
        call = Call(self, service, self.loop)
        call.optional = bool(optional)
        timeout = timeout if timeout is not None else self.timeout
        if (not keep_result and (server is None or (type(server) is ServerInfo and (
                self._security is None or server.address in self._server_keys)))
                and not ((args or kwargs) and _has_data(args, kwargs))):
            self._submit_direct(call, args, kwargs, server, timeout, aggregator)
            return call
        if keep_result:
            call._keep = _data().keep_spec(keep_result)
        task = self.loop.create_task(self._run(call, args, kwargs, server, timeout, aggregator, keep_result))
        self._tasks.add(task)
        task.add_done_callback(self._call_task_done)
        call._bind(task)
        return call

    def _submit_direct(self, call: Call, args: tuple, kwargs: dict, server: ServerInfo | None,
                       timeout: float | None, aggregator: Any) -> None:
        """A submitted call without a task (module docstring): what the task's
        first step did is done here; :meth:`_direct_end`, called by the driver
        when the call ends, does its last."""
        fut = _DirectFuture(loop=self.loop)
        fut.call, fut.countdown = call, None
        call._bind(fut)
        self._tasks.add(fut)
        try:
            deadline = None if timeout is None else self.loop.time() + timeout
            encoded = self._encode(call, args, kwargs)
            self._launch(call, encoded, [] if server is None else [server], server is None, deadline,
                         aggregator, None, (), on_end=self._on_direct_end)
        except Exception as exc:  # noqa: BLE001 - too large, not encodable, closed: the call fails, as a task's
            if not fut.done():
                self._direct_set(fut, False, exc)

    def _direct_end(self, flight: Flight) -> None:
        """The driver's ``on_end`` of a direct call: its future gets the value or the error."""
        call = flight.context
        if call is not None:            # (None: cancelled and landed meanwhile, _DirectFuture.cancel)
            self._landed(call, flight)
            fut = call._task
            if not fut.done():
                self._direct_set(fut, *self._settle(call, flight.outcome))
        _drop(flight)

    def _direct_set(self, fut: "_DirectFuture", ok: bool, value: Any) -> None:
        fut.call = None
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)
            fut.exception()     # retrieved: a failure is reported by its Call, asyncio need not log it
        self._tasks.discard(fut)
        _ended(fut)

    def _direct_cancelled(self, call: Call, fut: "_DirectFuture") -> None:
        """A direct call's future was cancelled (as a task cancelled while it waits): CANCEL to the server."""
        flight = call._flight
        if flight is not None:
            self._driver.abandon(flight)
            self._landed(call, flight)
            _drop(flight)
        self._tasks.discard(fut)

    async def cancel_calls(self, calls, timeout: float | None = None) -> int:
        """Cancel many calls of this client at once and wait until each is over
        (its server confirmed, or ``ack_timeout`` passed; at most ``timeout``
        seconds in all). The CANCELs of one server leave as one batch, as they
        do for ``await call.acancel()`` one by one, but without a task and a
        wait per call (the cost of cancelling a burst one by one). Returns how
        many were not finished yet (so were cancelled)."""
        calls = list(calls)
        for call in calls:
            if call._client is not self:
                raise ValueError(f"{call!r} belongs to another client (nothing was cancelled)")
        countdown = _Countdown(self.loop)
        waiting = 0
        for call in calls:
            task = call._task
            if task is None or task.done():
                continue
            waiting += 1
            countdown.left += 1
            if type(task) is _DirectFuture and task.countdown is None:
                task.countdown = countdown
            else:                               # a task, or a call another cancel_calls waits for
                task.add_done_callback(countdown.one_ended)
            flight = call._flight
            if flight is None:
                task.cancel()                   # not sent yet (discovery): stop it here
            elif not flight.machine.finished:
                self._driver.cancel(flight)     # the call fails with CallCancelled when confirmed
            # else: answered, its task has not resumed yet: the answer stands
        countdown.one_ended()               # every call counted: the hold goes
        if not countdown.fut.done():
            await asyncio.wait([countdown.fut], timeout=timeout)
        return waiting

    def _call_task_done(self, task: asyncio.Future) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()    # retrieved: a failure is reported by its Call, asyncio need not log it

    async def _run(self, call: Call, args: tuple, kwargs: dict, server, timeout, aggregator, keep_result=False):
        keep = light = None
        if keep_result or (args or kwargs) and _has_data(args, kwargs):
            d = _data()          # references and pending calls as arguments (gridrpc.client.data)
            keep = getattr(call, "_keep", None) or d.keep_spec(keep_result)
            call._keep = keep
            args, kwargs, refs = await d.prepare_args(self, args, kwargs)
            if refs:
                server = server or d.sticky_holder(refs)
                light = list(args) + list(kwargs.values())
                if aggregator is None and self.options.aggregator in (None, "default"):
                    aggregator = "locality"
        encoded = self._encode(call, args, kwargs)
        deadline = None if timeout is None else self.loop.time() + timeout
        discover = server is None
        candidates = [] if discover else await self._candidates(call, server, aggregator)
        flight = self._launch(call, encoded, candidates, discover, deadline, aggregator, keep, light or ())
        try:
            outcome = await self._driver.wait(flight)      # cancelled: CANCEL to the server
        finally:
            self._landed(call, flight)
        ok, value = self._settle(call, outcome)
        if ok:
            return value
        raise value

    def _encode(self, call: Call, args: tuple, kwargs: dict) -> tuple[Any, Any, list]:
        """The arguments as the CALL carries them: ``(args, kwargs, binary frames)``."""
        buffers: list = []
        tree_args = codec.encode(list(args), buffers, read_file)
        tree_kwargs = codec.encode(dict(kwargs), buffers, read_file)
        if buffers:
            size = sum(len(memoryview(b).cast("B")) if not isinstance(b, bytes) else len(b) for b in buffers)
            if size > self.options.max_message_size:
                raise MessageTooLarge(f"arguments of {call.service} are {size} bytes; the maximum message "
                                      f"size is {self.options.max_message_size} (Client(max_message_size=...))")
        return tree_args, tree_kwargs, buffers or ()     # () : no list kept per call without buffers

    def _launch(self, call: Call, encoded: tuple, candidates: list, discover: bool, deadline: float | None,
                aggregator: Any, keep: dict | None, light, on_end=None) -> Flight:
        """The call machine of ``call`` started in the driver (its CALL or discovery leaves from here)."""
        if self.closed:
            raise CommunicationError("client is closed")
        tree_args, tree_kwargs, buffers = encoded
        header = m.make(MsgType.CALL, "", service=call.service, args=tree_args, kwargs=tree_kwargs,
                        user=self.user, optional=call.optional, ack_ms=self._policy.ack_ms)
        call._discovery = (aggregator, self.max_candidates if self.failover else 1, light)
        if keep is not None:
            header["keep"] = keep
        machine = CallMachine(call.service, candidates, policy=self._policy, deadline=deadline, new_id=new_id,
                              discover=discover, late_binding=not light)    # data refs: locality decides
        flight = call._flight = self._driver.launch(machine, header, buffers, call, on_end)
        return flight

    def _landed(self, call: Call, flight: Flight) -> None:
        """The caller stops waiting on ``flight`` (answered, failed or cancelled)."""
        # call <-> flight is a reference cycle holding the result's buffers until the
        # cyclic GC runs (measured: 8 MB round trips 3x slower, memory growing 8 MB a call)
        flight.context = None
        chosen = call._chosen
        if chosen is not None:
            call._chosen = None
            self._reuse.ended(chosen, failed=server_failed(flight.machine, flight.outcome), now=self.loop.time())

    def _settle(self, call: Call, outcome) -> tuple[bool, Any]:
        """``(True, value)`` or ``(False, exception)`` for the machine's outcome (the exception is
        made, not raised: a direct call's future holds it without a traceback)."""
        if type(outcome) is Done:
            call.timing = outcome.timing
            keep = getattr(call, "_keep", None)
            return True, (outcome.value if keep is None else _data().to_ref(self, outcome.value))
        exc = exception_for(outcome.error)
        if isinstance(exc, CallCancelled):
            exc.timing = call.timing = outcome.error.timing      # the server's, when it sent them
        else:
            call.timing = {}
        return False, exc
