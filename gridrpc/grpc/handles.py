"""Function handles (default, bound to a server, optional) and the
``grpc_discover`` extension."""
from __future__ import annotations

from ..client import ServerInfo
from .codes import E, GridRPCErrorCode
from .state import FunctionHandle, State, api_entry, lookup, valid_handle, cond

__all__ = ["grpc_function_handle_default", "grpc_function_handle_init", "grpc_function_handle_destruct",
           "grpc_get_handle", "grpc_function_handle_set_optional", "grpc_discover"]


@api_entry(pair=True)
def grpc_function_handle_default(state: State, func_name: str):
    """A handle on ``func_name`` whose every call discovers the best server."""
    if not isinstance(func_name, str) or not func_name:
        return E.GRPC_FUNCTION_NOT_FOUND, None
    catalogue = state.client.services()
    if func_name not in catalogue:
        return E.GRPC_FUNCTION_NOT_FOUND, None
    return E.GRPC_NO_ERROR, FunctionHandle(func_name, None, _owner=state)


@api_entry(pair=True)
def grpc_function_handle_init(state: State, server_name: str, func_name: str):
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


@api_entry()
def grpc_function_handle_destruct(state: State, handle) -> GridRPCErrorCode:
    """Invalidate ``handle``; sessions started with it go on."""
    with cond:
        if not valid_handle(state, handle):
            return E.GRPC_INVALID_FUNCTION_HANDLE
        handle.destructed = True
    return E.GRPC_NO_ERROR


@api_entry(pair=True)
def grpc_get_handle(state: State, session_id):
    """The handle a session was started with (even if destructed since)."""
    s = lookup(state, session_id)
    return (E.GRPC_INVALID_SESSION_ID, None) if s is None else (E.GRPC_NO_ERROR, s.handle)


@api_entry()
def grpc_function_handle_set_optional(state: State, handle, optional: bool = True) -> GridRPCErrorCode:
    """DIET-ethic extension: calls through ``handle`` are optional computations
    (a fair SeD queue may refuse or preempt them for mandatory ones)."""
    with cond:
        if not valid_handle(state, handle):
            return E.GRPC_INVALID_FUNCTION_HANDLE
        handle.optional = bool(optional)
    return E.GRPC_NO_ERROR


@api_entry(pair=True)
def grpc_discover(state: State, func_name: str, max_servers: int = 10):
    """Extension: up to ``max_servers`` servers offering ``func_name``, best first."""
    if not isinstance(func_name, str) or not func_name:
        return E.GRPC_FUNCTION_NOT_FOUND, None
    if isinstance(max_servers, bool) or not isinstance(max_servers, int) or max_servers < 1:
        return E.GRPC_OTHER_ERROR_CODE, None
    return E.GRPC_NO_ERROR, state.client.discover(func_name, max_servers)[:max_servers]

