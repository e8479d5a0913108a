"""The GridRPC module's state: function handles, sessions, the one lock,
the ``api_entry`` decorator every function goes through, and the wait primitive.

One module-level condition (``cond``, an RLock) guards the state; it is never
held while the client talks to the network, so the client loop thread can
take it in call-completion callbacks without deadlock. ``current`` is the
state between ``grpc_initialize`` and ``grpc_finalize`` (None otherwise)."""
from __future__ import annotations

import functools
import inspect
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..client import Call, Client, ServerInfo
from ..errors import GridRPCError
from .codes import E, GridRPCErrorCode, code_for
from .config import Config

log = logging.getLogger("gridrpc.grpc")


@dataclass(eq=False)
class FunctionHandle:
    """A GridRPC function handle. ``server`` is None for a default handle
    (discovery at every call), else the SeD it is bound to."""
    function_name: str
    server: ServerInfo | None = None
    optional: bool = False
    destructed: bool = field(default=False, repr=False)
    _owner: Any = field(default=None, repr=False)

    @property
    def server_name(self) -> str | None:
        return self.server.name if self.server is not None else None


@dataclass(eq=False)
class Session:
    id: int
    handle: FunctionHandle
    call: Call
    done_seq: int | None = None               # completion order
    collected: bool = False                   # reported by a wait function / grpc_get_result
    failure_reported: bool = False            # returned by grpc_get_failed_sessionid

    def done(self) -> bool:
        return self.call.done()

    def exception(self) -> BaseException | None:
        """The failure of a completed session (None if it succeeded)."""
        try:
            self.call.result(timeout=0)
        except Exception as exc:  # noqa: BLE001 - includes a call that failed with Timeout
            return exc
        return None


class State:
    def __init__(self, config: Config, client: Client) -> None:
        self.config = config
        self.client = client
        self.sessions: dict[int, Session] = {}
        self.sync_calls: set[Call] = set()          # grpc_call in progress (other threads)
        self.closed = False
        self.done_counter = itertools.count(1)
        self.tls = threading.local()             # per-thread last error


cond = threading.Condition(threading.RLock())    # guards current and every State/Session field
lifecycle = threading.Lock()                     # serializes grpc_initialize / grpc_finalize
current: State | None = None
session_ids = itertools.count(1)                 # never reused, even across initialize cycles


def api_entry(pair: bool = False, record: bool = True):
    """Check initialization, record the last error, turn unexpected exceptions
    into GRPC_OTHER_ERROR_CODE."""
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            state = current
            if state is None or state.closed:
                return (E.GRPC_NOT_INITIALIZED, None) if pair else E.GRPC_NOT_INITIALIZED
            try:
                out = fn(state, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the C API has no exceptions
                if isinstance(exc, GridRPCError):
                    log.info("%s: %r", fn.__name__, exc)
                else:
                    log.exception("%s failed", fn.__name__)
                code = E.GRPC_NOT_INITIALIZED if state.closed else code_for(exc)
                out = (code, None) if pair else code
            if state.closed and (out[0] if pair else out) is not E.GRPC_NO_ERROR:
                out = (E.GRPC_NOT_INITIALIZED, None) if pair else E.GRPC_NOT_INITIALIZED
            if record:
                state.tls.last = out[0] if pair else out
            return out
        sig = inspect.signature(fn)
        wrapper.__signature__ = sig.replace(parameters=list(sig.parameters.values())[1:])
        return wrapper
    return deco


def _session_id(value) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return int(value.__index__())
    except (AttributeError, TypeError):
        return None


def lookup(state: State, sid) -> Session | None:
    i = _session_id(sid)
    with cond:
        return state.sessions.get(i) if i is not None else None


def lookup_many(state: State, ids) -> list[Session] | None:
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        return None
    sessions = [lookup(state, i) for i in ids]
    return None if any(s is None for s in sessions) else sessions


def valid_handle(state: State, handle) -> bool:
    return isinstance(handle, FunctionHandle) and handle._owner is state and not handle.destructed


def wait_until(state: State, predicate, timeout: float | None = None):
    """Block until ``predicate()`` (called under the lock) returns non-None;
    None on timeout, or ``FINALIZED`` when finalized meanwhile."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with cond:
        while True:
            if state.closed:
                return FINALIZED
            out = predicate()
            if out is not None:
                return out
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            cond.wait(left)


FINALIZED = object()


def on_done(state: State, session: Session) -> None:
    with cond:
        if session.done_seq is None:
            session.done_seq = next(state.done_counter)
        cond.notify_all()


def outcome(session: Session) -> GridRPCErrorCode:
    """GRPC_NO_ERROR or GRPC_SESSION_FAILED for a completed session (marks it collected)."""
    session.collected = True
    return E.GRPC_NO_ERROR if session.exception() is None else E.GRPC_SESSION_FAILED

