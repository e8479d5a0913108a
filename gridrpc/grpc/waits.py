"""Probing and waiting: ``grpc_probe``, ``grpc_probe_or`` and the wait
functions. The waits *collect* the sessions they report, so that
``grpc_wait_any`` returns each completed session once."""
from __future__ import annotations

from .codes import GRPC_SESSIONID_VOID, E, GridRPCErrorCode
from .state import _FINALIZED, _outcome, _Session, _State, _api, _lookup, _lookup_many, _wait_until, cond

__all__ = ["grpc_probe", "grpc_probe_or", "grpc_wait", "grpc_wait_and", "grpc_wait_all", "grpc_wait_or",
           "grpc_wait_any", "grpc_wait_any_until"]


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
    # a session whose task just ended may not have its done_seq yet (its callback runs on the
    # client's loop): after every session that has one
    return min(done, key=lambda s: (s.collected, s.done_seq if s.done_seq is not None else float("inf"), s.id))


@_api(pair=True)
def grpc_probe_or(state: _State, session_ids):
    """``(GRPC_NO_ERROR, id)`` of a completed session among ``session_ids``, or
    ``(GRPC_NONE_COMPLETED, GRPC_SESSIONID_VOID)`` (none completed, or no id given)."""
    sessions = _lookup_many(state, session_ids)
    if sessions is None:
        return E.GRPC_INVALID_SESSION_ID, None
    with cond:
        s = _pick(sessions)
    return (E.GRPC_NONE_COMPLETED, GRPC_SESSIONID_VOID) if s is None else (E.GRPC_NO_ERROR, s.id)


@_api()
def grpc_wait(state: _State, session_id) -> GridRPCErrorCode:
    """Block until the session completes: GRPC_NO_ERROR or GRPC_SESSION_FAILED."""
    s = _lookup(state, session_id)
    if s is None:
        return E.GRPC_INVALID_SESSION_ID
    if _wait_until(state, lambda: True if s.done() else None) is _FINALIZED:
        return E.GRPC_NOT_INITIALIZED
    with cond:
        return _outcome(s)


def _wait_every(state: _State, sessions: list[_Session]) -> GridRPCErrorCode:
    if _wait_until(state, lambda: True if all(s.done() for s in sessions) else None) is _FINALIZED:
        return E.GRPC_NOT_INITIALIZED
    with cond:
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
    with cond:
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

