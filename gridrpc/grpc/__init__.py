"""The GridRPC API of the OGF standard (GFD-R.052), for users who know it from
DIET, Ninf-G or GridSolve.

Every function returns an error code; functions that produce a value return
``(code, value)`` with ``value`` None on error. Underneath is one blocking
:class:`gridrpc.Client` (its own event loop thread) created by
:func:`grpc_initialize` from a TOML file::

    from gridrpc.grpc import *
    grpc_initialize("client.toml")            # master_agent = "tcp://host:5555"
    code, h = grpc_function_handle_default("add")
    code, sid = grpc_call_async(h, 1, 2)
    grpc_wait(sid)                             # GRPC_NO_ERROR
    code, value = grpc_get_result(sid)         # (GRPC_NO_ERROR, 3)
    grpc_finalize()

Semantics (see docs/gridrpc-api.md for the full table):

- a *session* is a :class:`gridrpc.Call`; its id stays valid (for
  ``grpc_get_result``, ``grpc_get_error``, ``grpc_get_handle``) until
  ``grpc_finalize``. The wait functions and ``grpc_get_result`` *collect* the
  sessions they report; ``grpc_wait_any``/``grpc_wait_all`` only look at
  sessions not yet collected, so each completed session is returned once;
- a failed session makes the wait functions return ``GRPC_SESSION_FAILED``;
  ``grpc_get_error(id)`` gives the cause (table ``EXCEPTION_CODES``); a pending
  or successful session gives ``GRPC_NO_ERROR``;
- ``grpc_cancel`` stops the work on the SeD (queued call removed, running
  worker killed); the cancelled session fails (``GRPC_SESSION_FAILED``);
- ``grpc_get_last_error`` is per thread (like ``errno``): the code returned by
  the last function called in this thread, the error-reporting functions
  aside;
- the module is thread-safe: one module-level condition guards the shared
  state, and it is never held while talking to the network.
"""
from __future__ import annotations

from ..client import ServerInfo
from .api import (FunctionHandle, grpc_call, grpc_call_async, grpc_cancel, grpc_cancel_all, grpc_discover,
                  grpc_finalize, grpc_function_handle_default, grpc_function_handle_destruct,
                  grpc_function_handle_init, grpc_function_handle_set_optional, grpc_get_error,
                  grpc_get_exception, grpc_get_failed_sessionid, grpc_get_handle, grpc_get_last_error,
                  grpc_get_result, grpc_initialize, grpc_probe, grpc_probe_or, grpc_wait, grpc_wait_all,
                  grpc_wait_and, grpc_wait_any, grpc_wait_any_until, grpc_wait_or)
from .codes import (DESCRIPTIONS, EXCEPTION_CODES, GRPC_ALREADY_INITIALIZED, GRPC_COMMUNICATION_FAILED,
                    GRPC_CONFIGFILE_ERROR, GRPC_CONFIGFILE_NOT_FOUND, GRPC_FUNCTION_NOT_FOUND,
                    GRPC_INVALID_FUNCTION_HANDLE, GRPC_INVALID_SESSION_ID, GRPC_LAST_ERROR_CODE,
                    GRPC_NO_ERROR, GRPC_NONE_COMPLETED, GRPC_NOT_COMPLETED, GRPC_NOT_INITIALIZED,
                    GRPC_OTHER_ERROR_CODE, GRPC_RPC_REFUSED, GRPC_SERVER_NOT_FOUND, GRPC_SESSION_FAILED,
                    GRPC_SESSIONID_VOID, GRPC_UNKNOWN_ERROR_CODE, GridRPCErrorCode, code_for,
                    grpc_error_string)
from .config import CONFIG_KEYS

__all__ = [
    "GridRPCErrorCode", "FunctionHandle", "ServerInfo", "GRPC_SESSIONID_VOID", "CONFIG_KEYS",
    "DESCRIPTIONS", "EXCEPTION_CODES", "code_for",
    "grpc_initialize", "grpc_finalize",
    "grpc_function_handle_default", "grpc_function_handle_init", "grpc_function_handle_destruct",
    "grpc_get_handle", "grpc_call", "grpc_call_async", "grpc_get_result",
    "grpc_probe", "grpc_probe_or", "grpc_wait", "grpc_wait_and", "grpc_wait_or", "grpc_wait_all",
    "grpc_wait_any", "grpc_cancel", "grpc_cancel_all",
    "grpc_error_string", "grpc_get_error", "grpc_get_last_error", "grpc_get_failed_sessionid",
    "grpc_discover", "grpc_function_handle_set_optional", "grpc_wait_any_until", "grpc_get_exception",
    *GridRPCErrorCode.__members__,
]
