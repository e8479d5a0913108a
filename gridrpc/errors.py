"""The gridrpc exception tree.

::

    GridRPCError
    ├── ConfigError               bad or missing configuration
    ├── ProtocolError             malformed message, wrong version, unknown type
    ├── ServiceNotFound           no server in the tree offers the service
    ├── NoServerAvailable         the service exists but no server answered / all failed
    ├── CommunicationError        a peer could not be reached or vanished
    │   └── AuthenticationError   a secure peer refused the handshake (key refused, missing or wrong)
    ├── ServerLost                a non-idempotent call's server died after the call started
    ├── Timeout (also TimeoutError)
    ├── CallCancelled             the call was cancelled (work stopped on the server)
    │   └── CallPreempted         killed by the server's fair queue for a mandatory call
    ├── MessageTooLarge           a message exceeds the configured maximum size
    ├── InvalidArgument           a value gridrpc cannot send (object arrays, ...)
    ├── RemoteError               the service raised; .remote_type, .remote_traceback
    │   └── WorkerDied            the worker process running the call died
    └── DataError                 a data reference cannot be stored or used
        ├── DataLost              freed, evicted, holder lost, producer failed (names ref + reason)
        └── DataAccessDenied      the reference belongs to another user

Transport errors are translated to these in one place (``gridrpc.transport``).
"""
from __future__ import annotations


class GridRPCError(Exception):
    """Root of every gridrpc error."""


class ConfigError(GridRPCError):
    pass


class ProtocolError(GridRPCError):
    pass


class ServiceNotFound(GridRPCError):
    pass


class NoServerAvailable(GridRPCError):
    pass


class CommunicationError(GridRPCError):
    pass


class AuthenticationError(CommunicationError):
    """The CURVE handshake with a peer failed: the message says whether the
    peer refused this side's key, this side gave no key to a secure peer, or
    the peer's public key given to this side is wrong."""


class ServerLost(GridRPCError):
    """The server running a non-idempotent call died (or lost the call) after
    the call may have started: it is not run again by surprise. ``server``
    and ``call_id`` say where to look (docs/reliability.md: the SeD's log and
    event stream show whether call ``call_id`` finished)."""

    def __init__(self, message: str, *, server: str | None = None, call_id: str | None = None):
        super().__init__(message)
        self.server = server
        self.call_id = call_id


class Timeout(GridRPCError, TimeoutError):
    pass


class CallCancelled(GridRPCError):
    pass


class CallPreempted(CallCancelled):
    """The server killed the call to run a more urgent one (fair queue)."""


class MessageTooLarge(GridRPCError):
    pass


class InvalidArgument(GridRPCError, TypeError):
    pass


class Refused(GridRPCError):
    """The request was refused by a rule (authorization, a per-user limit,
    a name already taken); the message names the rule."""


class RemoteError(GridRPCError):
    """The remote service raised. ``remote_type`` is the exception's type name,
    ``remote_traceback`` the formatted traceback text on the server."""

    def __init__(self, message: str, *, remote_type: str = "Exception",
                 remote_traceback: str = "", server: str | None = None):
        super().__init__(f"{remote_type}: {message}")
        self.remote_message = message
        self.remote_type = remote_type
        self.remote_traceback = remote_traceback
        self.server = server


class WorkerDied(RemoteError):
    """The worker process running the call exited or crashed."""


# wire error kinds -> exception classes (used by the client to rebuild errors)
ERROR_KINDS: dict[str, type[GridRPCError]] = {
    "remote": RemoteError,
    "worker_died": WorkerDied,
    "service_not_found": ServiceNotFound,
    "no_server": NoServerAvailable,
    "no_acceptable_server": NoServerAvailable,
    "cancelled": CallCancelled,
    "preempted": CallPreempted,
    "protocol": ProtocolError,
    "too_large": MessageTooLarge,
    "invalid_argument": InvalidArgument,
    "refused": Refused,
    "communication": CommunicationError,
    "server_lost": ServerLost,
    "rebuilding": NoServerAvailable,
    "busy": NoServerAvailable,
    "peer_unreachable": CommunicationError,   # federation: a peer site could not be asked (not retried)            # a CALL with start_now found no free slot (the client tries another)      # a restarted MA still rebuilding its tree (retried by clients)
    "timeout": Timeout,
    "unavailable": NoServerAvailable,         # the server cannot run the call at all (never started)
}


def error_from_wire(err: dict, server: str | None = None) -> GridRPCError:
    kind = err.get("kind", "remote")
    msg = str(err.get("message", ""))
    cls = ERROR_KINDS.get(kind, GridRPCError)
    if cls is ServerLost:
        cid = err.get("call_id")
        return ServerLost(msg, server=server, call_id=cid if isinstance(cid, str) else None)
    if issubclass(cls, RemoteError):
        exc: GridRPCError = cls(msg, remote_type=str(err.get("type", "Exception")),
                                remote_traceback=str(err.get("traceback", "")), server=server)
    else:
        exc = cls(msg)
    exc.kind = kind if isinstance(kind, str) else "remote"     # the wire kind (e.g. "rebuilding")
    return exc


class DataError(GridRPCError):
    """A data reference cannot be stored or used (budget full, bad mode)."""


class DataLost(DataError):
    """A data reference is gone (freed, evicted, its holder lost, its producer failed);
    the message names the reference and the reason."""


class DataAccessDenied(DataError):
    """A data reference used by a user who does not own it."""


ERROR_KINDS.update({"data": DataError, "data_lost": DataLost, "data_denied": DataAccessDenied,
                    "authentication": AuthenticationError})

#: exception class -> its wire kind (the first kind of ERROR_KINDS naming the class)
_KIND_OF: dict[type, str] = {cls: kind for kind, cls in reversed(ERROR_KINDS.items())}


def kind_of(exc: BaseException) -> str:
    """The wire kind of an error raised while discovering, for the call
    machine's ``DiscoveryFailed``: the kind an answer carried, else the
    table's (``remote`` for anything not in it)."""
    kind = getattr(exc, "kind", None)
    if isinstance(kind, str):
        return kind
    kind = wire_kind(exc)
    return "remote" if kind == "internal" else kind


def wire_kind(exc: BaseException) -> str:
    """The wire kind an error is answered with (``internal`` for anything not
    a gridrpc error): the inverse of :data:`ERROR_KINDS`."""
    for cls in type(exc).__mro__:
        kind = _KIND_OF.get(cls)
        if kind is not None:
            return kind
    return "internal"
