"""Calls: ``grpc_call``, ``grpc_call_async``, ``grpc_get_result``, and
cancelling them."""
from __future__ import annotations

from ..client import Call
from ..errors import GridRPCError, InvalidArgument
from .codes import E, GridRPCErrorCode, code_for
from .lifecycle import cancel_calls
from .state import (FINALIZED, FunctionHandle, on_done, outcome, Session, State, api_entry, lookup,
                    valid_handle, wait_until, cond, log, session_ids)

__all__ = ["grpc_call", "grpc_call_async", "grpc_get_result", "grpc_cancel", "grpc_cancel_all"]

_HANDLE_KWARGS = frozenset({"server", "optional"})      # set by the handle, not per call


def _submit(state: State, handle: FunctionHandle, args, kwargs) -> Call:
    if _HANDLE_KWARGS & kwargs.keys():
        raise InvalidArgument(f"{', '.join(sorted(_HANDLE_KWARGS & kwargs.keys()))}= cannot be passed to a "
                              "call: the function handle sets them")
    return state.client.submit(handle.function_name, *args, server=handle.server,
                               optional=handle.optional, **kwargs)


@api_entry(pair=True)
def grpc_call(state: State, handle, *args, **kwargs):
    """Blocking call: ``(GRPC_NO_ERROR, result)``, or the error code of the
    failure (``grpc_get_error`` table) and None."""
    if not valid_handle(state, handle):
        return E.GRPC_INVALID_FUNCTION_HANDLE, None
    call = _submit(state, handle, args, kwargs)
    with cond:
        state.sync_calls.add(call)                  # so that grpc_finalize stops it too
    try:
        return E.GRPC_NO_ERROR, call.result()
    except GridRPCError as exc:
        log.info("grpc_call %s failed: %r", handle.function_name, exc)
        return code_for(exc), None
    finally:
        with cond:
            state.sync_calls.discard(call)


@api_entry(pair=True)
def grpc_call_async(state: State, handle, *args, **kwargs):
    """Start a call; returns ``(GRPC_NO_ERROR, session_id)`` at once. What
    fails later (discovery, the server, the service) fails the session."""
    if not valid_handle(state, handle):
        return E.GRPC_INVALID_FUNCTION_HANDLE, None
    call = _submit(state, handle, args, kwargs)     # errors here are immediate: (code, None)
    with cond:
        session = Session(next(session_ids), handle, call)
        state.sessions[session.id] = session
    call.add_done_callback(lambda _c: on_done(state, session))
    return E.GRPC_NO_ERROR, session.id


@api_entry(pair=True)
def grpc_get_result(state: State, session_id):
    """The result of a session, waiting for it if needed: ``(GRPC_NO_ERROR,
    value)``, or ``(GRPC_SESSION_FAILED, None)`` (cause: ``grpc_get_error``)."""
    s = lookup(state, session_id)
    if s is None:
        return E.GRPC_INVALID_SESSION_ID, None
    if wait_until(state, lambda: True if s.done() else None) is FINALIZED:
        return E.GRPC_NOT_INITIALIZED, None
    with cond:
        if outcome(s) is not E.GRPC_NO_ERROR:
            return E.GRPC_SESSION_FAILED, None
    return E.GRPC_NO_ERROR, s.call.result(timeout=0)


@api_entry()
def grpc_cancel(state: State, session_id) -> GridRPCErrorCode:
    """Stop a session: removed from the SeD's queue or its worker killed. The
    session then fails (GRPC_SESSION_FAILED, cause CallCancelled). No effect on
    a completed session."""
    s = lookup(state, session_id)
    if s is None:
        return E.GRPC_INVALID_SESSION_ID
    if not s.done():
        cancel_calls(state, [s.call])
    return E.GRPC_NO_ERROR


@api_entry()
def grpc_cancel_all(state: State) -> GridRPCErrorCode:
    """Cancel every running session (all at once)."""
    with cond:
        calls = [s.call for s in state.sessions.values() if not s.done()]
    if calls:
        cancel_calls(state, calls)
    return E.GRPC_NO_ERROR

