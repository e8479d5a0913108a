"""Probing and waiting: ``grpc_probe``, ``grpc_probe_or`` and the wait
functions. The waits *collect* the sessions they report, so that
``grpc_wait_any`` returns each completed session once."""
from __future__ import annotations

from .codes import GRPC_SESSIONID_VOID, E, GridRPCErrorCode
from .state import FINALIZED, outcome, Session, State, api_entry, lookup, lookup_many, wait_until, cond

__all__ = ["grpc_probe", "grpc_probe_or", "grpc_wait", "grpc_wait_and", "grpc_wait_all", "grpc_wait_or",
           "grpc_wait_any", "grpc_wait_any_until"]


@api_entry()
def grpc_probe(state: State, session_id) -> GridRPCErrorCode:
    """GRPC_NO_ERROR if the session completed (even if it failed), else GRPC_NOT_COMPLETED."""
    s = lookup(state, session_id)
    if s is None:
        return E.GRPC_INVALID_SESSION_ID
    return E.GRPC_NO_ERROR if s.done() else E.GRPC_NOT_COMPLETED


def _pick(sessions: list[Session]) -> Session | None:
    """A completed session, preferring those not collected yet, earliest completion first."""
    done = [s for s in sessions if s.done()]
    if not done:
        return None
    # a session whose task just ended may not have its done_seq yet (its callback runs on the
    # client's loop): after every session that has one
    return min(done, key=lambda s: (s.collected, s.done_seq if s.done_seq is not None else float("inf"), s.id))


@api_entry(pair=True)
def grpc_probe_or(state: State, session_ids):
    """``(GRPC_NO_ERROR, id)`` of a completed session among ``session_ids``, or
    ``(GRPC_NONE_COMPLETED, GRPC_SESSIONID_VOID)`` (none completed, or no id given)."""
    sessions = lookup_many(state, session_ids)
    if sessions is None:
        return E.GRPC_INVALID_SESSION_ID, None
    with cond:
        s = _pick(sessions)
    return (E.GRPC_NONE_COMPLETED, GRPC_SESSIONID_VOID) if s is None else (E.GRPC_NO_ERROR, s.id)


@api_entry()
def grpc_wait(state: State, session_id) -> GridRPCErrorCode:
    """Block until the session completes: GRPC_NO_ERROR or GRPC_SESSION_FAILED."""
    s = lookup(state, session_id)
    if s is None:
        return E.GRPC_INVALID_SESSION_ID
    if wait_until(state, lambda: True if s.done() else None) is FINALIZED:
        return E.GRPC_NOT_INITIALIZED
    with cond:
        return outcome(s)


def _wait_every(state: State, sessions: list[Session]) -> GridRPCErrorCode:
    if wait_until(state, lambda: True if all(s.done() for s in sessions) else None) is FINALIZED:
        return E.GRPC_NOT_INITIALIZED
    with cond:
        codes = [outcome(s) for s in sessions]
    return E.GRPC_SESSION_FAILED if E.GRPC_SESSION_FAILED in codes else E.GRPC_NO_ERROR


@api_entry()
def grpc_wait_and(state: State, session_ids) -> GridRPCErrorCode:
    """Block until every listed session completes; GRPC_SESSION_FAILED if one
    failed (which: ``grpc_get_failed_sessionid``)."""
    sessions = lookup_many(state, session_ids)
    if sessions is None:
        return E.GRPC_INVALID_SESSION_ID
    return _wait_every(state, sessions)


@api_entry()
def grpc_wait_all(state: State) -> GridRPCErrorCode:
    """Block until every session not yet collected completes."""
    with cond:
        sessions = [s for s in state.sessions.values() if not s.collected]
    return _wait_every(state, sessions)


def _wait_one(state: State, candidates, timeout: float | None):
    """Shared by wait_or / wait_any / wait_any_until: (code, id)."""
    def pick():
        sessions = candidates()
        if not sessions:
            return _NOTHING
        s = _pick(sessions)
        if s is None:
            return None
        return s.id, outcome(s)          # collect under the lock: each session reported once
    out = wait_until(state, pick, timeout)
    if out is FINALIZED:
        return E.GRPC_NOT_INITIALIZED, None
    if out is None or out is _NOTHING:
        return E.GRPC_NONE_COMPLETED, None
    sid, code = out
    return code, sid                      # the id also on GRPC_SESSION_FAILED, as C sets idPtr


_NOTHING = object()


@api_entry(pair=True)
def grpc_wait_or(state: State, session_ids):
    """Block until one listed session completes: ``(GRPC_NO_ERROR, id)`` or
    ``(GRPC_SESSION_FAILED, id)``. An empty list gives ``(GRPC_NONE_COMPLETED, None)``."""
    sessions = lookup_many(state, session_ids)
    if sessions is None:
        return E.GRPC_INVALID_SESSION_ID, None
    return _wait_one(state, lambda: sessions, None)


def _uncollected(state: State):
    return lambda: [s for s in state.sessions.values() if not s.collected]


@api_entry(pair=True)
def grpc_wait_any(state: State):
    """Block until a session not yet collected completes; each session is
    returned once. ``(GRPC_NONE_COMPLETED, None)`` when none is left."""
    return _wait_one(state, _uncollected(state), None)


@api_entry(pair=True)
def grpc_wait_any_until(state: State, timeout_s: float):
    """Extension: ``grpc_wait_any`` for at most ``timeout_s`` seconds, then
    ``(GRPC_NONE_COMPLETED, None)``."""
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))):
        return E.GRPC_OTHER_ERROR_CODE, None
    return _wait_one(state, _uncollected(state), None if timeout_s is None else max(0.0, timeout_s))

