"""GridRPC error codes (GFD-R.052 values), the gridrpc exception -> code
table, and ``grpc_error_string``."""
from __future__ import annotations

import enum

from ..errors import (CallCancelled, CommunicationError, ConfigError, GridRPCError, InvalidArgument,
                      MessageTooLarge, NoServerAvailable, ProtocolError, RemoteError, ServiceNotFound,
                      Timeout)


class GridRPCErrorCode(enum.IntEnum):
    GRPC_NO_ERROR = 0
    GRPC_NOT_INITIALIZED = 1
    GRPC_CONFIGFILE_NOT_FOUND = 2
    GRPC_CONFIGFILE_ERROR = 3
    GRPC_SERVER_NOT_FOUND = 4
    GRPC_FUNCTION_NOT_FOUND = 5
    GRPC_INVALID_FUNCTION_HANDLE = 6
    GRPC_INVALID_SESSION_ID = 7
    GRPC_RPC_REFUSED = 8
    GRPC_COMMUNICATION_FAILED = 9
    GRPC_SESSION_FAILED = 10
    GRPC_NOT_COMPLETED = 11
    GRPC_NONE_COMPLETED = 12
    GRPC_OTHER_ERROR_CODE = 13
    GRPC_UNKNOWN_ERROR_CODE = 14
    GRPC_ALREADY_INITIALIZED = 15
    GRPC_LAST_ERROR_CODE = 16


E = GridRPCErrorCode
GRPC_NO_ERROR = E.GRPC_NO_ERROR
GRPC_NOT_INITIALIZED = E.GRPC_NOT_INITIALIZED
GRPC_CONFIGFILE_NOT_FOUND = E.GRPC_CONFIGFILE_NOT_FOUND
GRPC_CONFIGFILE_ERROR = E.GRPC_CONFIGFILE_ERROR
GRPC_SERVER_NOT_FOUND = E.GRPC_SERVER_NOT_FOUND
GRPC_FUNCTION_NOT_FOUND = E.GRPC_FUNCTION_NOT_FOUND
GRPC_INVALID_FUNCTION_HANDLE = E.GRPC_INVALID_FUNCTION_HANDLE
GRPC_INVALID_SESSION_ID = E.GRPC_INVALID_SESSION_ID
GRPC_RPC_REFUSED = E.GRPC_RPC_REFUSED
GRPC_COMMUNICATION_FAILED = E.GRPC_COMMUNICATION_FAILED
GRPC_SESSION_FAILED = E.GRPC_SESSION_FAILED
GRPC_NOT_COMPLETED = E.GRPC_NOT_COMPLETED
GRPC_NONE_COMPLETED = E.GRPC_NONE_COMPLETED
GRPC_OTHER_ERROR_CODE = E.GRPC_OTHER_ERROR_CODE
GRPC_UNKNOWN_ERROR_CODE = E.GRPC_UNKNOWN_ERROR_CODE
GRPC_ALREADY_INITIALIZED = E.GRPC_ALREADY_INITIALIZED
GRPC_LAST_ERROR_CODE = E.GRPC_LAST_ERROR_CODE
GRPC_SESSIONID_VOID = -1

#: gridrpc exception -> session error code (first match wins, subclasses first)
EXCEPTION_CODES: tuple[tuple[type[BaseException], GridRPCErrorCode], ...] = (
    (ServiceNotFound, E.GRPC_FUNCTION_NOT_FOUND),
    (NoServerAvailable, E.GRPC_SERVER_NOT_FOUND),
    (CommunicationError, E.GRPC_COMMUNICATION_FAILED),
    (ProtocolError, E.GRPC_COMMUNICATION_FAILED),
    (MessageTooLarge, E.GRPC_RPC_REFUSED),
    (CallCancelled, E.GRPC_SESSION_FAILED),      # includes CallPreempted
    (RemoteError, E.GRPC_SESSION_FAILED),        # includes WorkerDied
    (Timeout, E.GRPC_SESSION_FAILED),
    (InvalidArgument, E.GRPC_OTHER_ERROR_CODE),
    (ConfigError, E.GRPC_OTHER_ERROR_CODE),
    (GridRPCError, E.GRPC_OTHER_ERROR_CODE),
)


def code_for(exc: BaseException) -> GridRPCErrorCode:
    """The GridRPC error code for a gridrpc exception."""
    for cls, code in EXCEPTION_CODES:
        if isinstance(exc, cls):
            return code
    return E.GRPC_OTHER_ERROR_CODE


def grpc_error_string(error_code) -> str:
    """The name of the code (``"GRPC_NO_ERROR"``...), as DIET returns it;
    ``"GRPC_UNKNOWN_ERROR_CODE"`` for anything else. Works before initialize."""
    if isinstance(error_code, bool):
        return E.GRPC_UNKNOWN_ERROR_CODE.name
    try:
        return E(error_code).name
    except (ValueError, TypeError):
        return E.GRPC_UNKNOWN_ERROR_CODE.name


#: one line per code, for messages (grpc_error_string returns the names)
DESCRIPTIONS: dict[GridRPCErrorCode, str] = {
    E.GRPC_NO_ERROR: "success",
    E.GRPC_NOT_INITIALIZED: "grpc_initialize() has not been called (or grpc_finalize() has)",
    E.GRPC_CONFIGFILE_NOT_FOUND: "the configuration file does not exist",
    E.GRPC_CONFIGFILE_ERROR: "the configuration file is malformed",
    E.GRPC_SERVER_NOT_FOUND: "no such server, or no server available",
    E.GRPC_FUNCTION_NOT_FOUND: "no server offers this function",
    E.GRPC_INVALID_FUNCTION_HANDLE: "the function handle is not valid",
    E.GRPC_INVALID_SESSION_ID: "the session id is not valid",
    E.GRPC_RPC_REFUSED: "the server refused the call",
    E.GRPC_COMMUNICATION_FAILED: "communication with the agent or server failed",
    E.GRPC_SESSION_FAILED: "the session failed (remote error, cancelled, worker died, timeout)",
    E.GRPC_NOT_COMPLETED: "the session has not completed",
    E.GRPC_NONE_COMPLETED: "no session completed",
    E.GRPC_OTHER_ERROR_CODE: "other error (e.g. an argument gridrpc cannot send)",
    E.GRPC_UNKNOWN_ERROR_CODE: "unknown error code",
    E.GRPC_ALREADY_INITIALIZED: "grpc_initialize() was already called",
    E.GRPC_LAST_ERROR_CODE: "end of the error codes",
}
