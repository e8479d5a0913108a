"""gridrpc — a GridRPC middleware: call remote solver services through a tree
of agents over ZeroMQ.

    import gridrpc
    with gridrpc.Client("tcp://127.0.0.1:5555") as client:
        client.call("add", 1, 2)
"""
from .client import AsyncClient, Call, Client, Handle, ServerInfo, wait  # noqa: F401
from .errors import (CallCancelled, CallPreempted, CommunicationError, ConfigError, GridRPCError,  # noqa: F401
                     InvalidArgument, MessageTooLarge, NoServerAvailable, ProtocolError, RemoteError,
                     ServiceNotFound, Timeout, WorkerDied)
from .files import File  # noqa: F401
from .local_agent import LocalAgent  # noqa: F401
from .master_agent import MasterAgent  # noqa: F401
from .sed import SeD  # noqa: F401

__version__ = "0.1.0"
