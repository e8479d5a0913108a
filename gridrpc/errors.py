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
    ├── Refused                   refused by a rule (authorization, a per-user limit, a name taken)
    ├── RemoteError               the service raised; .remote_type, .remote_traceback
    │   └── WorkerDied            the worker process running the call died
    ├── ResultGone                the call ran, but the server no longer keeps its answer
    └── DataError                 a data reference cannot be stored or used
        ├── DataLost              freed, evicted, holder lost, producer failed (names ref + reason)
        └── DataAccessDenied      the reference belongs to another user

Transport errors are translated to these in one place (``gridrpc.transport``).
On the wire an error is a kind (a string); :data:`ERROR_KINDS` maps every
kind to its exception, :func:`wire_kind` an exception to the kind it is
answered with, :func:`error_from_wire` an ERROR reply back to the exception.
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


class ResultGone(GridRPCError):
    """The call already ran on the server, but its answer is no longer kept
    there (the byte-bounded result cache dropped it): a call repeated under
    the same request id is never run a second time."""


class DataError(GridRPCError):
    """A data reference cannot be stored or used (budget full, bad mode)."""


class DataLost(DataError):
    """A data reference is gone (freed, evicted, its holder lost, its producer failed);
    the message names the reference and the reason."""


class DataAccessDenied(DataError):
    """A data reference used by a user who does not own it."""


#: Every wire error kind and the exception a client raises for it. The first
#: kind naming a class is the one an error of that class is answered with
#: (:func:`wire_kind`); the others are only read: ``no_acceptable_server``
#: (no server met the request's constraints), ``rebuilding`` (a restarted MA
#: still rebuilding its tree; clients retry), ``busy`` (a CALL with
#: ``start_now`` found no free slot; the client tries another server),
#: ``peer_unreachable`` (federation: a peer site could not be asked; not
#: retried), ``unavailable`` (the server cannot run the call at all, e.g. a
#: cloud SeD whose image does not exist: the call never started; the client
#: tries its other candidates, then fails without a new discovery). ``internal``: a handler failed on something that is not a
#: gridrpc error (a bug), or a bare :class:`GridRPCError`.
ERROR_KINDS: dict[str, type[GridRPCError]] = {
    "internal": GridRPCError,
    "config": ConfigError,
    "protocol": ProtocolError,
    "service_not_found": ServiceNotFound,
    "no_server": NoServerAvailable,
    "no_acceptable_server": NoServerAvailable,
    "rebuilding": NoServerAvailable,
    "busy": NoServerAvailable,
    "unavailable": NoServerAvailable,
    "communication": CommunicationError,
    "peer_unreachable": CommunicationError,
    "authentication": AuthenticationError,
    "server_lost": ServerLost,
    "timeout": Timeout,
    "cancelled": CallCancelled,
    "preempted": CallPreempted,
    "too_large": MessageTooLarge,
    "invalid_argument": InvalidArgument,
    "refused": Refused,
    "remote": RemoteError,
    "worker_died": WorkerDied,
    "result_gone": ResultGone,
    "data": DataError,
    "data_lost": DataLost,
    "data_denied": DataAccessDenied,
}

#: exception class -> the kind it is answered with (the first kind of :data:`ERROR_KINDS` naming it)
KIND_OF: dict[type[GridRPCError], str] = {}
for _kind, _cls in ERROR_KINDS.items():
    KIND_OF.setdefault(_cls, _kind)
del _kind, _cls


def wire_kind(exc: BaseException) -> str:
    """The wire kind an error is answered with: that of its class or nearest
    base class in :data:`ERROR_KINDS` (``internal`` for anything not a
    gridrpc error)."""
    for cls in type(exc).__mro__:
        kind = KIND_OF.get(cls)
        if kind is not None:
            return kind
    return "internal"


def error_from_wire(err: dict, server: str | None = None) -> GridRPCError:
    """The exception for an ERROR reply's ``error`` object (the inverse of
    :func:`wire_kind`); an unknown kind gives a :class:`GridRPCError`. The
    exception's ``kind`` attribute keeps the wire kind (e.g. ``rebuilding``)."""
    kind = err.get("kind", "remote")
    msg = str(err.get("message", ""))
    cls = ERROR_KINDS.get(kind, GridRPCError) if isinstance(kind, str) else GridRPCError
    exc: GridRPCError
    if cls is ServerLost:
        cid = err.get("call_id")
        exc = ServerLost(msg, server=server, call_id=cid if isinstance(cid, str) else None)
    elif issubclass(cls, RemoteError):
        exc = cls(msg, remote_type=str(err.get("type", "Exception")),
                                remote_traceback=str(err.get("traceback", "")), server=server)
    else:
        exc = cls(msg)
    exc.kind = kind if isinstance(kind, str) else "remote"
    return exc


def kind_of(exc: BaseException) -> str:
    """The wire kind of an error raised while discovering, for the call
    machine's ``DiscoveryFailed``: the kind an answer carried, else the
    table's (``remote`` for anything not a gridrpc error)."""
    kind = getattr(exc, "kind", None)
    if isinstance(kind, str):
        return kind
    kind = wire_kind(exc)
    return "remote" if kind == "internal" else kind
