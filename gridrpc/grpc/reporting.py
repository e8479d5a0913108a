"""Error reporting: ``grpc_get_error``, ``grpc_get_exception``,
``grpc_get_last_error``, ``grpc_get_failed_sessionid``."""
from __future__ import annotations

from .codes import GRPC_SESSIONID_VOID, E, GridRPCErrorCode, code_for
from .state import State, api_entry, lookup, cond

__all__ = ["grpc_get_error", "grpc_get_exception", "grpc_get_last_error", "grpc_get_failed_sessionid"]


@api_entry(record=False)
def grpc_get_error(state: State, session_id) -> GridRPCErrorCode:
    """The session's error code: GRPC_NO_ERROR while running or on success,
    else the cause (EXCEPTION_CODES: GRPC_SESSION_FAILED for a remote error, a
    died worker, a cancel or a timeout; GRPC_COMMUNICATION_FAILED for a
    vanished server...)."""
    s = lookup(state, session_id)
    if s is None:
        return E.GRPC_INVALID_SESSION_ID
    if not s.done():
        return E.GRPC_NO_ERROR
    exc = s.exception()
    return E.GRPC_NO_ERROR if exc is None else code_for(exc)


@api_entry(pair=True, record=False)
def grpc_get_exception(state: State, session_id):
    """Extension: ``(GRPC_NO_ERROR, exception or None)`` — the gridrpc
    exception behind a failed session (RemoteError with the remote traceback,
    CallCancelled...)."""
    s = lookup(state, session_id)
    if s is None:
        return E.GRPC_INVALID_SESSION_ID, None
    return E.GRPC_NO_ERROR, (s.exception() if s.done() else None)


@api_entry(record=False)
def grpc_get_last_error(state: State) -> GridRPCErrorCode:
    """The code returned by the last GridRPC function called in this thread
    (the error-reporting functions excepted)."""
    return getattr(state.tls, "last", E.GRPC_NO_ERROR)


@api_entry(pair=True, record=False)
def grpc_get_failed_sessionid(state: State):
    """``(GRPC_NO_ERROR, id)`` of a failed session not reported yet (in
    completion order), then ``(GRPC_NO_ERROR, GRPC_SESSIONID_VOID)``."""
    with cond:
        failed = [s for s in state.sessions.values()
                  if not s.failure_reported and s.done() and s.exception() is not None]
        if not failed:
            return E.GRPC_NO_ERROR, GRPC_SESSIONID_VOID
        s = min(failed, key=lambda s: (s.done_seq or 0, s.id))
        s.failure_reported = True
        return E.GRPC_NO_ERROR, s.id
