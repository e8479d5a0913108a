"""The blocking client: an :class:`AsyncClient` on an event loop that the
calling thread runs itself while it waits for a call, and a background
thread runs otherwise. Safe to use from several threads at once.

Whoever runs the loop holds the client's *baton* (a lock). ``call`` takes
it when it is free and runs the loop on the caller's thread until the call
ends: no hand-off to another thread and back, so a blocking call costs what
an :class:`AsyncClient` call does. The background thread runs the loop for
everything else: the other operations (``submit``, ``discover``, ``put``,
a ``Call``'s ``result``...), which reach the loop through
``call_soon_threadsafe`` and so wake it, and calls made while another thread
holds the baton (handed to the loop by a thread-safe callback). It runs
the loop until nothing is in progress (no operation handed over, nothing of
the client in flight, no callback ready), then parks and releases the baton.
"""
from __future__ import annotations

import _thread
import asyncio
import concurrent.futures as cf
import selectors
import threading
from typing import Any, Callable

from ..errors import CallCancelled, CommunicationError, Timeout
from .aio import AsyncClient
from .futures import Call, ServerInfo
from .options import ClientOptions


class _LoopSelector(selectors.DefaultSelector):
    """The client loop's selector: before a wait (``timeout`` not 0: no
    callback ready) it asks ``idle()``, which may park the background
    thread (stop the loop there) and then says so."""

    idle: Callable[[], bool] | None = None

    def select(self, timeout: float | None = None):
        if timeout != 0 and self.idle is not None and self.idle():
            return []
        return super().select(timeout)


class _ClientLoop(asyncio.SelectorEventLoop):
    """The blocking client's event loop: work handed to it from another
    thread wakes the background thread (which runs it once the baton is free)."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self.selector = _LoopSelector()
        super().__init__(self.selector)
        self.wake = wake

    def call_soon_threadsafe(self, callback, *args, context=None):
        handle = super().call_soon_threadsafe(callback, *args, context=context)
        self.wake()
        return handle


def _no_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return True
    return False


class Client:
    """``with gridrpc.Client("tcp://127.0.0.1:5555", user="alice") as client: ...``

    Keyword options (all optional), the fields of
    :class:`~gridrpc.client.options.ClientOptions`: ``user`` (default: login
    name), ``timeout`` (default per-call timeout, s), ``discovery_timeout``,
    ``discovery_budget``, ``ack_timeout`` (how long a SeD has to acknowledge
    before the next candidate is tried), ``ping_interval``/``ping_timeout``
    (liveness of the SeD during a call), ``failover`` (retry on another
    server when one dies), ``max_candidates``, ``max_message_size``,
    ``aggregator``, ``download_dir``; or ``options=ClientOptions(...)``. An
    unknown option is a TypeError raised before any thread or socket starts.
    """

    def __init__(self, master_agent: str | None = None, *, options: ClientOptions | None = None,
                 **kwargs: Any) -> None:
        self._closed = True
        self.options = ClientOptions.build("Client", options, **kwargs)   # before any thread or socket
        self._wanted = threading.Event()        # set: the background thread has loop work to do
        self._baton = threading.Lock()          # held by the thread running the loop
        self._stopping = False
        self._outstanding = 0                   # operations of _run not finished yet
        self._count = threading.Lock()
        self._loop = _ClientLoop(self._wanted.set)
        self._thread = threading.Thread(target=self._serve, name="gridrpc-client", daemon=True)
        self._loop.selector.idle = self._park
        self._thread.start()
        try:
            self._aclient = AsyncClient(master_agent, options=self.options)
            self._run(self._aclient.start())
        except BaseException:
            self._stop_loop()
            raise
        self._closed = False

    @property
    def user(self) -> str:
        return self._aclient.user

    @property
    def master_agent(self) -> str | None:
        return self._aclient.master_agent

    def _run(self, coro, timeout: float | None = None):
        with self._count:
            self._outstanding += 1
        fut = asyncio.run_coroutine_threadsafe(self._counted(coro), self._loop)
        try:
            return fut.result(timeout)
        except cf.TimeoutError:
            if fut.done():          # the operation's own Timeout (also a TimeoutError): as is
                raise
            fut.cancel()
            raise Timeout(f"operation not finished after {timeout}s") from None

    async def _counted(self, coro):
        try:
            return await coro
        finally:
            with self._count:
                self._outstanding -= 1

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._aclient.aclose(), timeout=10)
        finally:
            self._stop_loop()

    def _serve(self) -> None:
        """The background thread: runs the loop whenever work was handed to
        it, until the loop is idle (:meth:`_park`) or the client stops."""
        while not self._stopping:
            self._wanted.wait()
            self._wanted.clear()
            if self._stopping:
                break
            with self._baton:
                self._loop.run_forever()

    def _park(self) -> bool:
        """The loop is about to wait: on the background thread, when nothing
        is in progress (no operation handed over by :meth:`_run`, nothing of
        the client in flight), stop running it (the baton is released; timers
        left, such as the calls' shared ping slots, fire when it runs again);
        on a caller's thread, wait."""
        if threading.get_ident() == self._thread.ident and not self._outstanding and not self._aclient.busy():
            self._loop.stop()
            return True
        return False

    def _stop_loop(self) -> None:
        self._stopping = True
        self._wanted.set()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if self._baton.acquire(timeout=10):     # a caller's thread may still be leaving the loop
            self._baton.release()
        self._loop.close()

    def discover(self, service: str, max_servers: int = 10, **kw) -> list[ServerInfo]:
        return self._run(self._aclient.discover(service, max_servers, **kw))

    def tree(self) -> list[dict]:
        return self._run(self._aclient.tree())

    def services(self) -> dict[str, dict]:
        return self._run(self._aclient.services())

    def submit(self, service: str, *args, **kwargs) -> Call:
        async def _submit():
            return self._aclient.submit_nowait(service, *args, **kwargs)
        return self._run(_submit())

    def call(self, service: str, *args, **kwargs):
        """Call and wait for the result. When no other thread runs the
        client's loop, this thread runs it until the call ends (module
        docstring); else the call is started on the loop by one thread-safe
        callback and this thread waits on a lock the call's end releases.
        Ctrl-C cancels the call on its server and raises KeyboardInterrupt."""
        if self._baton.acquire(blocking=False):
            try:
                if not self._closed and _no_running_loop():
                    return self._call_here(service, args, kwargs)
            finally:
                self._baton.release()
        done = _thread.allocate_lock()
        done.acquire()
        box: list = []
        self._loop.call_soon_threadsafe(self._start_call, service, args, kwargs, done.release, box)
        try:
            done.acquire()
        except BaseException:           # interrupted (Ctrl-C): the call is cancelled on its server
            self._loop.call_soon_threadsafe(self._cancel_started, box)
            raise
        return _outcome(box)

    def _call_here(self, service: str, args: tuple, kwargs: dict):
        """The call on this thread, running the loop until its end stops it.
        Ctrl-C raises KeyboardInterrupt where this thread is, nearly always
        in the loop's wait for messages: the call is then cancelled on its
        server, and the background thread carries on with what the loop has
        left to do (the CANCEL leaving)."""
        loop = self._loop
        box: list = []
        loop.call_soon(self._start_call, service, args, kwargs, loop.stop, box)
        try:
            while not box or type(box[-1]) is not tuple:    # until the call ends (a stray stop: run on)
                if self._stopping:
                    self._cancel_started(box)
                    box.append((False, CommunicationError("client closed")))
                    break
                loop.run_forever()
        except BaseException:
            if not box:
                box.append((False, None))   # abandoned before it started: _start_call does nothing
            self._cancel_started(box)
            self._wanted.set()
            raise
        return _outcome(box)

    def _start_call(self, service: str, args: tuple, kwargs: dict, wake: Callable[[], None], box: list) -> None:
        """On the loop: submit the call; its end appends ``(ok, value)`` to
        ``box`` and calls ``wake`` (releases the waiting thread, or stops the
        loop that thread runs)."""
        if box:
            return                      # its caller was interrupted before it started
        try:
            call = self._aclient.submit_nowait(service, *args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - bad arguments, closed client: the caller raises it
            box.append((False, exc))
            wake()
            return
        box.append(call)

        def finished(fut) -> None:
            if fut.cancelled():
                box.append((False, CallCancelled(f"call to {service} was cancelled")))
            elif fut.exception() is not None:
                box.append((False, fut.exception()))
            else:
                box.append((True, fut.result()))
            wake()
        call._task.add_done_callback(finished)

    @staticmethod
    def _cancel_started(box: list) -> None:
        if box and isinstance(box[0], Call) and not box[0].done():
            box[0]._task.cancel()

    def cancel_calls(self, calls, timeout: float | None = None) -> int:
        """Cancel many calls at once (see :meth:`AsyncClient.cancel_calls`); returns
        how many were not finished yet."""
        return self._run(self._aclient.cancel_calls(list(calls), timeout),
                         None if timeout is None else timeout + 5.0)

    def put(self, value, **kw):
        """Store ``value`` on a SeD; returns a ``gridrpc.DataRef`` (see docs/data.md)."""
        return self._run(self._aclient.put(value, **kw))

    def get(self, ref, timeout: float | None = None):
        return self._run(self._aclient.get(ref, timeout))

    def free(self, ref) -> None:
        self._run(self._aclient.free(ref))

    def handle(self, service: str, server: str | ServerInfo | None = None) -> "Handle":
        return Handle(self, service, server)

    def resolve(self, server: str) -> ServerInfo:
        return self._run(self._aclient.resolve(server))

    def run_optional(self, service: str, mandatory=(), optional=(), deadline: float = 60.0,
                     max_servers: int | None = None, **kw):
        """Mandatory calls plus as many optional ones as fit before ``deadline``
        (seconds from now); blocks until done. See
        :func:`gridrpc.client.optional.run_optional`."""
        from .optional import run_optional
        return self._run(run_optional(self._aclient, service, mandatory, optional, deadline,
                                      max_servers, **kw))

    def run_coroutine(self, coro, timeout: float | None = None):
        """Run a coroutine on the client's loop (for extensions)."""
        return self._run(coro, timeout)

    @property
    def aclient(self) -> AsyncClient:
        return self._aclient


def _outcome(box: list):
    """The value a call's ``box`` holds, or its error raised."""
    ok, value = box[-1]
    if ok:
        return value
    raise value


class Handle:
    """A function handle (``client.handle("add", server=...)``): calling it
    skips discovery when bound to a server."""

    def __init__(self, client: Client, service: str, server=None, optional: bool = False) -> None:
        self.client, self.service, self.server, self.optional = client, service, server, optional
        if isinstance(server, str):
            self.server = client.resolve(server)     # one look-up, then direct calls

    def __call__(self, *args, **kwargs):
        return self.client.call(self.service, *args, server=self.server, optional=self.optional, **kwargs)

    def submit(self, *args, **kwargs) -> Call:
        return self.client.submit(self.service, *args, server=self.server, optional=self.optional, **kwargs)

    def __repr__(self) -> str:
        return f"<gridrpc.Handle {self.service} -> {getattr(self.server, 'name', None) or 'discovery'}>"
