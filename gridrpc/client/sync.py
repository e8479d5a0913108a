"""The blocking client: an :class:`AsyncClient` on an event loop in a
background thread. Safe to use from several threads at once."""
from __future__ import annotations

import _thread
import asyncio
import concurrent.futures as cf
import threading
from typing import Any

from ..errors import CallCancelled, Timeout
from .aio import AsyncClient
from .call import Call, ServerInfo
from .options import ClientOptions


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
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gridrpc-client", daemon=True)
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
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except cf.TimeoutError:
            if fut.done():          # the operation's own Timeout (also a TimeoutError): as is
                raise
            fut.cancel()
            raise Timeout(f"operation not finished after {timeout}s") from None

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

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
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
        """Call and wait for the result. The call is started on the client's
        loop by one thread-safe callback and this thread waits on a lock the
        call's own future releases: no coroutine, task or concurrent future
        per call (a blocking call costs about what an ``AsyncClient`` call
        does, plus one wake-up of the loop)."""
        done = _thread.allocate_lock()
        done.acquire()
        box: list = []
        self._loop.call_soon_threadsafe(self._start_call, service, args, kwargs, done, box)
        try:
            done.acquire()
        except BaseException:           # interrupted (Ctrl-C): the call is cancelled on its server
            self._loop.call_soon_threadsafe(self._cancel_started, box)
            raise
        ok, value = box[-1]
        if ok:
            return value
        raise value

    def _start_call(self, service: str, args: tuple, kwargs: dict, done, box: list) -> None:
        """On the loop: submit the call; its future's end releases the caller."""
        try:
            call = self._aclient.submit_nowait(service, *args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - bad arguments, closed client: the caller raises it
            box.append((False, exc))
            done.release()
            return
        box.append(call)

        def finished(fut) -> None:
            if fut.cancelled():
                box.append((False, CallCancelled(f"call to {service} was cancelled")))
            elif fut.exception() is not None:
                box.append((False, fut.exception()))
            else:
                box.append((True, fut.result()))
            done.release()
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
