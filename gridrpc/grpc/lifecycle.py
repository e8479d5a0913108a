"""``grpc_initialize`` and ``grpc_finalize``."""
from __future__ import annotations

from ..client import Call, Client
from ..errors import Timeout
from . import state as st
from .codes import E, GridRPCErrorCode
from .config import load_config
from .state import State, log

__all__ = ["grpc_initialize", "grpc_finalize"]


def grpc_initialize(config_path=None) -> GridRPCErrorCode:
    """Read the TOML configuration (``config_path``, else ``$GRIDRPC_CONFIG``)
    and start the client. The MA is contacted lazily (first handle or call)."""
    with st.lifecycle:
        if st.current is not None:
            st.current.tls.last = E.GRPC_ALREADY_INITIALIZED
            return E.GRPC_ALREADY_INITIALIZED
        config = load_config(config_path)
        if isinstance(config, GridRPCErrorCode):
            return config
        try:
            client = Client(config.master_agent, **config.client_options)
        except Exception as exc:  # noqa: BLE001 - zmq refuses the address, bad option...
            log.error("grpc_initialize: cannot start the client: %s", exc)
            return E.GRPC_CONFIGFILE_ERROR
        with st.cond:
            st.current = State(config, client)
            st.current.tls.last = E.GRPC_NO_ERROR
        return E.GRPC_NO_ERROR


def grpc_finalize() -> GridRPCErrorCode:
    """Cancel the sessions still running (their work stopped on the SeDs),
    close the client; every session id and handle becomes invalid."""
    with st.lifecycle:
        with st.cond:
            state = st.current
            if state is None:
                return E.GRPC_NOT_INITIALIZED
            st.current = None
            state.closed = True
            pending = [s.call for s in state.sessions.values() if not s.done()]
            pending += [c for c in state.sync_calls if not c.done()]
            st.cond.notify_all()
        try:
            if pending:
                cancel_calls(state, pending)
        finally:
            state.client.close()
        return E.GRPC_NO_ERROR


def cancel_calls(state: State, calls: list[Call]) -> None:
    async def _all():
        await state.client.aclient.cancel_calls(calls)
    try:
        # Call.acancel waits at most ack_timeout for the SeD's confirmation
        state.client.run_coroutine(_all(), timeout=state.client.aclient.ack_timeout + 2.0)
    except Timeout:
        log.warning("grpc: %d cancellation(s) not confirmed in time", len(calls))
