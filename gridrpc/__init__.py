"""gridrpc — a GridRPC middleware: call remote solver services through a tree
of agents over ZeroMQ.

    import gridrpc
    with gridrpc.Client("tcp://127.0.0.1:5555") as client:
        client.call("add", 1, 2)

The public surface is ``__all__`` (pinned by tests/test_public_api.py; the
contract is docs/api.md). The GridRPC standard API is the ``gridrpc.grpc``
module.
"""
from .client import AsyncClient, Call, Client, ClientOptions, Handle, ServerInfo, wait
from .client.data import DataRef
from .errors import (CallCancelled, CallPreempted, CommunicationError, ConfigError, DataAccessDenied, DataError,
                     DataLost, GridRPCError, InvalidArgument, MessageTooLarge, NoServerAvailable, ProtocolError,
                     Refused, RemoteError, ServerLost, ServiceNotFound, Timeout, WorkerDied)
from .files import File
from .local_agent import LocalAgent
from .sed import SeD

__version__ = "0.1.0"


def __getattr__(name: str):
    # the MA brings its HTTP API (aiohttp, ~10 MB and ~0.1 s to import): loaded when first
    # used, not in every SeD, LA and client process that imports gridrpc
    if name == "MasterAgent":
        from .master_agent import MasterAgent
        globals()["MasterAgent"] = MasterAgent
        return MasterAgent
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    # clients
    "Client", "AsyncClient", "ClientOptions", "Call", "Handle", "ServerInfo", "wait",
    # values
    "File", "DataRef",
    # elements of the tree
    "MasterAgent", "LocalAgent", "SeD",
    # errors (one root: GridRPCError)
    "GridRPCError", "ConfigError", "ProtocolError", "ServiceNotFound", "NoServerAvailable",
    "CommunicationError", "Timeout", "CallCancelled", "CallPreempted", "MessageTooLarge", "InvalidArgument", "Refused",
    "RemoteError", "WorkerDied", "ServerLost", "DataError", "DataLost", "DataAccessDenied",
    "__version__",
]
