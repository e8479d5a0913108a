"""Every GridRPC function, from the modules that implement them (kept so
that ``gridrpc.grpc.api`` goes on importing): ``state`` (handles, sessions,
the lock), ``lifecycle`` (initialize, finalize), ``handles``, ``calls``,
``waits``, ``reporting``."""
from __future__ import annotations

from .calls import grpc_call, grpc_call_async, grpc_cancel, grpc_cancel_all, grpc_get_result
from .handles import (grpc_discover, grpc_function_handle_default, grpc_function_handle_destruct,
                      grpc_function_handle_init, grpc_function_handle_set_optional, grpc_get_handle)
from .lifecycle import grpc_finalize, grpc_initialize
from .reporting import grpc_get_error, grpc_get_exception, grpc_get_failed_sessionid, grpc_get_last_error
from .state import FunctionHandle
from .waits import (grpc_probe, grpc_probe_or, grpc_wait, grpc_wait_all, grpc_wait_and, grpc_wait_any,
                    grpc_wait_any_until, grpc_wait_or)

__all__ = [
    "FunctionHandle", "grpc_initialize", "grpc_finalize",
    "grpc_function_handle_default", "grpc_function_handle_init", "grpc_function_handle_destruct",
    "grpc_get_handle", "grpc_function_handle_set_optional", "grpc_discover",
    "grpc_call", "grpc_call_async", "grpc_get_result", "grpc_cancel", "grpc_cancel_all",
    "grpc_probe", "grpc_probe_or", "grpc_wait", "grpc_wait_and", "grpc_wait_all", "grpc_wait_or",
    "grpc_wait_any", "grpc_wait_any_until",
    "grpc_get_error", "grpc_get_exception", "grpc_get_last_error", "grpc_get_failed_sessionid",
]
