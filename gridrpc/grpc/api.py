"""The GridRPC functions: module state, function handles, sessions, waits.

One module-level condition (``_cond``, an RLock) guards the state; it is never
held while the client talks to the network, so the client loop thread can
take it in call-completion callbacks without deadlock."""
from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..client import Call, Client, ServerInfo
from ..errors import GridRPCError, InvalidArgument, Timeout
from .codes import GRPC_SESSIONID_VOID, E, GridRPCErrorCode, code_for
from .config import Config, load_config

log = logging.getLogger("gridrpc.grpc")


# -- state -------------------------------------------------------------------------------

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
class _Session:
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


class _State:
    def __init__(self, config: Config, client: Client) -> None:
        self.config = config
        self.client = client
        self.sessions: dict[int, _Session] = {}
        self.sync_calls: set[Call] = set()          # grpc_call in progress (other threads)
        self.closed = False
        self.done_counter = itertools.count(1)
        self.tls = threading.local()             # per-thread last error


_cond = threading.Condition(threading.RLock())   # guards _state and every _State/_Session field
_lifecycle = threading.Lock()                    # serializes grpc_initialize / grpc_finalize
_state: _State | None = None
_session_ids = itertools.count(1)                # never reused, even across initialize cycles


def _api(pair: bool = False, record: bool = True):
    """Check initialization, record the last error, turn unexpected exceptions
    into GRPC_OTHER_ERROR_CODE."""
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            state = _state
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


def _lookup(state: _State, sid) -> _Session | None:
    i = _session_id(sid)
    with _cond:
        return state.sessions.get(i) if i is not None else None


def _lookup_many(state: _State, ids) -> list[_Session] | None:
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        return None
    sessions = [_lookup(state, i) for i in ids]
    return None if any(s is None for s in sessions) else sessions


def _valid_handle(state: _State, handle) -> bool:
    return isinstance(handle, FunctionHandle) and handle._owner is state and not handle.destructed


def _wait_until(state: _State, predicate, timeout: float | None = None):
    """Block until ``predicate()`` (called under the lock) returns non-None;
    None on timeout, or ``_FINALIZED`` when finalized meanwhile."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with _cond:
        while True:
            if state.closed:
                return _FINALIZED
            out = predicate()
            if out is not None:
                return out
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            _cond.wait(left)


_FINALIZED = object()


def _on_done(state: _State, session: _Session) -> None:
    with _cond:
        if session.done_seq is None:
            session.done_seq = next(state.done_counter)
        _cond.notify_all()


def _outcome(session: _Session) -> GridRPCErrorCode:
    """GRPC_NO_ERROR or GRPC_SESSION_FAILED for a completed session (marks it collected)."""
    session.collected = True
    return E.GRPC_NO_ERROR if session.exception() is None else E.GRPC_SESSION_FAILED


# -- initialize / finalize --------------------------------------------------------------------

def grpc_initialize(config_path=None) -> GridRPCErrorCode:
    """Read the TOML configuration (``config_path``, else ``$GRIDRPC_CONFIG``)
    and start the client. The MA is contacted lazily (first handle or call)."""
    global _state
    with _lifecycle:
        if _state is not None:
            _state.tls.last = E.GRPC_ALREADY_INITIALIZED
            return E.GRPC_ALREADY_INITIALIZED
        config = load_config(config_path)
        if isinstance(config, GridRPCErrorCode):
            return config
        try:
            client = Client(config.master_agent, **config.client_options)
        except Exception as exc:  # noqa: BLE001 - zmq refuses the address, bad option...
            log.error("grpc_initialize: cannot start the client: %s", exc)
            return E.GRPC_CONFIGFILE_ERROR
        with _cond:
            _state = _State(config, client)
            _state.tls.last = E.GRPC_NO_ERROR
        return E.GRPC_NO_ERROR


def grpc_finalize() -> GridRPCErrorCode:
    """Cancel the sessions still running (their work stopped on the SeDs),
    close the client; every session id and handle becomes invalid."""
    global _state
    with _lifecycle:
        with _cond:
            state = _state
            if state is None:
                return E.GRPC_NOT_INITIALIZED
            _state = None
            state.closed = True
            pending = [s.call for s in state.sessions.values() if not s.done()]
            pending += [c for c in state.sync_calls if not c.done()]
            _cond.notify_all()
        try:
            if pending:
                _cancel_calls(state, pending)
        finally:
            state.client.close()
        return E.GRPC_NO_ERROR


def _cancel_calls(state: _State, calls: list[Call]) -> None:
    async def _all():
        await asyncio.gather(*(c.acancel() for c in calls), return_exceptions=True)
    try:
        # Call.acancel waits at most ack_timeout for the SeD's confirmation
        state.client.run_coroutine(_all(), timeout=state.client.aclient.ack_timeout + 2.0)
    except Timeout:
        log.warning("grpc: %d cancellation(s) not confirmed in time", len(calls))


# -- function handles --------------------------------------------------------------------------

@_api(pair=True)
def grpc_function_handle_default(state: _State, func_name: str):
    """A handle on ``func_name`` whose every call discovers the best server."""
    if not isinstance(func_name, str) or not func_name:
        return E.GRPC_FUNCTION_NOT_FOUND, None
    catalogue = state.client.services()
    if func_name not in catalogue:
        return E.GRPC_FUNCTION_NOT_FOUND, None
    return E.GRPC_NO_ERROR, FunctionHandle(func_name, None, _owner=state)


@_api(pair=True)
def grpc_function_handle_init(state: _State, server_name: str, func_name: str):
    """A handle bound to one SeD (by name, ``tcp://host:port[#name]`` or a
    ServerInfo from grpc_discover), resolved once: its calls skip discovery."""
    if isinstance(server_name, ServerInfo):
        server_name = server_name.name or server_name.address
    if not isinstance(server_name, str) or not server_name:
        return E.GRPC_SERVER_NOT_FOUND, None
    if not isinstance(func_name, str) or not func_name:
        return E.GRPC_FUNCTION_NOT_FOUND, None
    address, _, name = server_name.partition("#") if "://" in server_name else ("", "", server_name)
    seds = [e for e in state.client.tree() if e.get("kind") == "sed" and e.get("state", "alive") == "alive"
            and (not name or e.get("name") == name) and (not address or e.get("address") == address)]
    if not seds or (len(seds) > 1 and not name):
        return E.GRPC_SERVER_NOT_FOUND, None
    sed = seds[0]
    if func_name not in (sed.get("services") or []):
        return E.GRPC_FUNCTION_NOT_FOUND, None
    server = ServerInfo(name=sed["name"], address=sed["address"])
    return E.GRPC_NO_ERROR, FunctionHandle(func_name, server, _owner=state)


@_api()
def grpc_function_handle_destruct(state: _State, handle) -> GridRPCErrorCode:
    """Invalidate ``handle``; sessions started with it go on."""
    with _cond:
        if not _valid_handle(state, handle):
            return E.GRPC_INVALID_FUNCTION_HANDLE
        handle.destructed = True
    return E.GRPC_NO_ERROR


@_api(pair=True)
def grpc_get_handle(state: _State, session_id):
    """The handle a session was started with (even if destructed since)."""
    s = _lookup(state, session_id)
    return (E.GRPC_INVALID_SESSION_ID, None) if s is None else (E.GRPC_NO_ERROR, s.handle)


@_api()
def grpc_function_handle_set_optional(state: _State, handle, optional: bool = True) -> GridRPCErrorCode:
    """DIET-ethic extension: calls through ``handle`` are optional computations
    (a fair SeD queue may refuse or preempt them for mandatory ones)."""
    with _cond:
        if not _valid_handle(state, handle):
            return E.GRPC_INVALID_FUNCTION_HANDLE
        handle.optional = bool(optional)
    return E.GRPC_NO_ERROR


@_api(pair=True)
def grpc_discover(state: _State, func_name: str, max_servers: int = 10):
    """Extension: up to ``max_servers`` servers offering ``func_name``, best first."""
    if not isinstance(func_name, str) or not func_name:
        return E.GRPC_FUNCTION_NOT_FOUND, None
    if isinstance(max_servers, bool) or not isinstance(max_servers, int) or max_servers < 1:
        return E.GRPC_OTHER_ERROR_CODE, None
    return E.GRPC_NO_ERROR, state.client.discover(func_name, max_servers)[:max_servers]


# -- calls --------------------------------------------------------------------------------------

_HANDLE_KWARGS = frozenset({"server", "optional"})      # set by the handle, not per call


def _submit(state: _State, handle: FunctionHandle, args, kwargs) -> Call:
    if _HANDLE_KWARGS & kwargs.keys():
        raise InvalidArgument(f"{', '.join(sorted(_HANDLE_KWARGS & kwargs.keys()))}= cannot be passed to a "
                              "call: the function handle sets them")
    return state.client.submit(handle.function_name, *args, server=handle.server,
                               optional=handle.optional, **kwargs)


@_api(pair=True)
def grpc_call(state: _State, handle, *args, **kwargs):
    """Blocking call: ``(GRPC_NO_ERROR, result)``, or the error code of the
    failure (``grpc_get_error`` table) and None."""
    if not _valid_handle(state, handle):
        return E.GRPC_INVALID_FUNCTION_HANDLE, None
    call = _submit(state, handle, args, kwargs)
    with _cond:
        state.sync_calls.add(call)                  # so that grpc_finalize stops it too
    try:
        return E.GRPC_NO_ERROR, call.result()
    except GridRPCError as exc:
        log.info("grpc_call %s failed: %r", handle.function_name, exc)
        return code_for(exc), None
    finally:
        with _cond:
            state.sync_calls.discard(call)


@_api(pair=True)
def grpc_call_async(state: _State, handle, *args, **kwargs):
    """Start a call; returns ``(GRPC_NO_ERROR, session_id)`` at once. What
    fails later (discovery, the server, the service) fails the session."""
    if not _valid_handle(state, handle):
        return E.GRPC_INVALID_FUNCTION_HANDLE, None
    call = _submit(state, handle, args, kwargs)     # errors here are immediate: (code, None)
    with _cond:
        session = _Session(next(_session_ids), handle, call)
        state.sessions[session.id] = session
    call.add_done_callback(lambda _c: _on_done(state, session))
    return E.GRPC_NO_ERROR, session.id


@_api(pair=True)
def grpc_get_result(state: _State, session_id):
    """The result of a session, waiting for it if needed: ``(GRPC_NO_ERROR,
    value)``, or ``(GRPC_SESSION_FAILED, None)`` (cause: ``grpc_get_error``)."""
    s = _lookup(state, session_id)
    if s is None:
        return E.GRPC_INVALID_SESSION_ID, None
    if _wait_until(state, lambda: True if s.done() else None) is _FINALIZED:
        return E.GRPC_NOT_INITIALIZED, None
    with _cond:
        if _outcome(s) is not E.GRPC_NO_ERROR:
            return E.GRPC_SESSION_FAILED, None
    return E.GRPC_NO_ERROR, s.call.result(timeout=0)


# -- probe and wait -----------------------------------------------------------------------------

@_api()
def grpc_probe(state: _State, session_id) -> GridRPCErrorCode:
    """GRPC_NO_ERROR if the session completed (even if it failed), else GRPC_NOT_COMPLETED."""
    s = _lookup(state, session_id)
    if s is None:
        return E.GRPC_INVALID_SESSION_ID
    return E.GRPC_NO_ERROR if s.done() else E.GRPC_NOT_COMPLETED


def _pick(sessions: list[_Session]) -> _Session | None:
    """A completed session, preferring those not collected yet, earliest completion first."""
    done = [s for s in sessions if s.done()]
    if not done:
        return None
    return min(done, key=lambda s: (s.collected, s.done_seq or 0, s.id))


@_api(pair=True)
def grpc_probe_or(state: _State, session_ids):
    """``(GRPC_NO_ERROR, id)`` of a completed session among ``session_ids``, or
    ``(GRPC_NONE_COMPLETED, None)``."""
    sessions = _lookup_many(state, session_ids)
    if sessions is None:
        return E.GRPC_INVALID_SESSION_ID, None
    with _cond:
        s = _pick(sessions)
    return (E.GRPC_NONE_COMPLETED, None) if s is None else (E.GRPC_NO_ERROR, s.id)


@_api()
def grpc_wait(state: _State, session_id) -> GridRPCErrorCode:
    """Block until the session completes: GRPC_NO_ERROR or GRPC_SESSION_FAILED."""
    s = _lookup(state, session_id)
    if s is None:
        return E.GRPC_INVALID_SESSION_ID
    if _wait_until(state, lambda: True if s.done() else None) is _FINALIZED:
        return E.GRPC_NOT_INITIALIZED
    with _cond:
        return _outcome(s)


def _wait_every(state: _State, sessions: list[_Session]) -> GridRPCErrorCode:
    if _wait_until(state, lambda: True if all(s.done() for s in sessions) else None) is _FINALIZED:
        return E.GRPC_NOT_INITIALIZED
    with _cond:
        codes = [_outcome(s) for s in sessions]
    return E.GRPC_SESSION_FAILED if E.GRPC_SESSION_FAILED in codes else E.GRPC_NO_ERROR


@_api()
def grpc_wait_and(state: _State, session_ids) -> GridRPCErrorCode:
    """Block until every listed session completes; GRPC_SESSION_FAILED if one
    failed (which: ``grpc_get_failed_sessionid``)."""
    sessions = _lookup_many(state, session_ids)
    if sessions is None:
        return E.GRPC_INVALID_SESSION_ID
    return _wait_every(state, sessions)


@_api()
def grpc_wait_all(state: _State) -> GridRPCErrorCode:
    """Block until every session not yet collected completes."""
    with _cond:
        sessions = [s for s in state.sessions.values() if not s.collected]
    return _wait_every(state, sessions)


def _wait_one(state: _State, candidates, timeout: float | None):
    """Shared by wait_or / wait_any / wait_any_until: (code, id)."""
    def pick():
        sessions = candidates()
        if not sessions:
            return _NOTHING
        s = _pick(sessions)
        if s is None:
            return None
        return s.id, _outcome(s)          # collect under the lock: each session reported once
    out = _wait_until(state, pick, timeout)
    if out is _FINALIZED:
        return E.GRPC_NOT_INITIALIZED, None
    if out is None or out is _NOTHING:
        return E.GRPC_NONE_COMPLETED, None
    sid, code = out
    return code, sid                      # the id also on GRPC_SESSION_FAILED, as C sets idPtr


_NOTHING = object()


@_api(pair=True)
def grpc_wait_or(state: _State, session_ids):
    """Block until one listed session completes: ``(GRPC_NO_ERROR, id)`` or
    ``(GRPC_SESSION_FAILED, id)``. An empty list gives ``(GRPC_NONE_COMPLETED, None)``."""
    sessions = _lookup_many(state, session_ids)
    if sessions is None:
        return E.GRPC_INVALID_SESSION_ID, None
    return _wait_one(state, lambda: sessions, None)


def _uncollected(state: _State):
    return lambda: [s for s in state.sessions.values() if not s.collected]


@_api(pair=True)
def grpc_wait_any(state: _State):
    """Block until a session not yet collected completes; each session is
    returned once. ``(GRPC_NONE_COMPLETED, None)`` when none is left."""
    return _wait_one(state, _uncollected(state), None)


@_api(pair=True)
def grpc_wait_any_until(state: _State, timeout_s: float):
    """Extension: ``grpc_wait_any`` for at most ``timeout_s`` seconds, then
    ``(GRPC_NONE_COMPLETED, None)``."""
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))):
        return E.GRPC_OTHER_ERROR_CODE, None
    return _wait_one(state, _uncollected(state), None if timeout_s is None else max(0.0, timeout_s))


# -- cancel -------------------------------------------------------------------------------------

@_api()
def grpc_cancel(state: _State, session_id) -> GridRPCErrorCode:
    """Stop a session: removed from the SeD's queue or its worker killed. The
    session then fails (GRPC_SESSION_FAILED, cause CallCancelled). No effect on
    a completed session."""
    s = _lookup(state, session_id)
    if s is None:
        return E.GRPC_INVALID_SESSION_ID
    if not s.done():
        _cancel_calls(state, [s.call])
    return E.GRPC_NO_ERROR


@_api()
def grpc_cancel_all(state: _State) -> GridRPCErrorCode:
    """Cancel every running session (all at once)."""
    with _cond:
        calls = [s.call for s in state.sessions.values() if not s.done()]
    if calls:
        _cancel_calls(state, calls)
    return E.GRPC_NO_ERROR


# -- error reporting ---------------------------------------------------------------------------

@_api(record=False)
def grpc_get_error(state: _State, session_id) -> GridRPCErrorCode:
    """The session's error code: GRPC_NO_ERROR while running or on success,
    else the cause (EXCEPTION_CODES: GRPC_SESSION_FAILED for a remote error, a
    died worker, a cancel or a timeout; GRPC_COMMUNICATION_FAILED for a
    vanished server...)."""
    s = _lookup(state, session_id)
    if s is None:
        return E.GRPC_INVALID_SESSION_ID
    if not s.done():
        return E.GRPC_NO_ERROR
    exc = s.exception()
    return E.GRPC_NO_ERROR if exc is None else code_for(exc)


@_api(pair=True, record=False)
def grpc_get_exception(state: _State, session_id):
    """Extension: ``(GRPC_NO_ERROR, exception or None)`` — the gridrpc
    exception behind a failed session (RemoteError with the remote traceback,
    CallCancelled...)."""
    s = _lookup(state, session_id)
    if s is None:
        return E.GRPC_INVALID_SESSION_ID, None
    return E.GRPC_NO_ERROR, (s.exception() if s.done() else None)


@_api(record=False)
def grpc_get_last_error(state: _State) -> GridRPCErrorCode:
    """The code returned by the last GridRPC function called in this thread
    (the error-reporting functions excepted)."""
    return getattr(state.tls, "last", E.GRPC_NO_ERROR)


@_api(pair=True, record=False)
def grpc_get_failed_sessionid(state: _State):
    """``(GRPC_NO_ERROR, id)`` of a failed session not reported yet (in
    completion order), then ``(GRPC_NO_ERROR, GRPC_SESSIONID_VOID)``."""
    with _cond:
        failed = [s for s in state.sessions.values()
                  if not s.failure_reported and s.done() and s.exception() is not None]
        if not failed:
            return E.GRPC_NO_ERROR, GRPC_SESSIONID_VOID
        s = min(failed, key=lambda s: (s.done_seq or 0, s.id))
        s.failure_reported = True
        return E.GRPC_NO_ERROR, s.id
