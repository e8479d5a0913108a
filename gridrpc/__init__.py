"""gridrpc — a GridRPC middleware: call remote solver services through a tree
of agents over ZeroMQ.

    import gridrpc
    with gridrpc.Client("tcp://127.0.0.1:5555") as client:
        client.call("add", 1, 2)

The public surface is ``__all__`` (pinned by tests/test_public_api.py; the
Python API is shown in README.md, "Tutorial"; the GridRPC standard API is the
``gridrpc.grpc`` module, docs/gridrpc-api.md).

``import gridrpc`` loads only the errors: every other public name is imported
on first use (PEP 562), so a process pays for the client, the agents or the
SeD only when it uses them, and for numpy, aiohttp, pydantic, rich, PyYAML,
psutil only on the paths that need them (tests/test_imports.py pins this).
"""
from .errors import (AuthenticationError, CallCancelled, CallPreempted, CommunicationError, ConfigError, DataAccessDenied, DataError,
                     DataLost, GridRPCError, InvalidArgument, MessageTooLarge, NoServerAvailable, ProtocolError,
                     Refused, RemoteError, ServerLost, ServiceNotFound, Timeout, WorkerDied)

__version__ = "0.1.0"

#: public name -> the module that defines it, imported when the name is first used
_LAZY = {
    **dict.fromkeys(("AsyncClient", "Call", "Client", "ClientOptions", "Handle", "ServerInfo", "wait"), ".client"),
    "DataRef": ".client.data",
    "File": ".files",
    "LocalAgent": ".local_agent",
    "MasterAgent": ".master_agent",
    "SeD": ".sed",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    # clients
    "Client", "AsyncClient", "ClientOptions", "Call", "Handle", "ServerInfo", "wait",
    # values
    "File", "DataRef",
    # elements of the tree
    "MasterAgent", "LocalAgent", "SeD",
    # errors (one root: GridRPCError)
    "GridRPCError", "ConfigError", "ProtocolError", "ServiceNotFound", "NoServerAvailable",
    "CommunicationError", "AuthenticationError", "Timeout", "CallCancelled", "CallPreempted", "MessageTooLarge", "InvalidArgument", "Refused",
    "RemoteError", "WorkerDied", "ServerLost", "DataError", "DataLost", "DataAccessDenied",
    "__version__",
]
