"""One endpoint for every daemon: the ROUTER that faces children and clients.

Agents and SeDs (plain, batch, cloud) all receive through an
:class:`Endpoint`. It binds, drains the socket in batches (via
:class:`~gridrpc.transport.channel.Channel`), parses and validates each
message at the boundary (:func:`gridrpc.core.messages.parse_routed`), answers
protocol errors itself, dispatches through a ``{MsgType: handler}`` table,
turns exceptions of a handler into an error reply (a handler bug never goes
unanswered and never kills the daemon), keeps statistics and rate-limits its
log lines about bad input (a flood of bad messages cannot fill the disk).

Authentication plugs in here: :attr:`Incoming.user` is the authenticated
identity of the sender when the socket runs CURVE with a ZAP handler
(the frame's ``User-Id`` property), else ``None``.

A handler gets one :class:`Incoming` and answers with :meth:`Endpoint.reply`
(or later with :meth:`Endpoint.send` to the saved ``route``)::

    ep = Endpoint("LA1", "tcp://127.0.0.1:0", {MsgType.PING: on_ping})
    ep.start()

    def on_ping(msg):
        ep.reply(msg, m.make(MsgType.PONG, msg.id, name="LA1"))
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import zmq

from ..core import messages as m
from ..core.messages import MsgType
from ..errors import GridRPCError, InvalidArgument, ProtocolError, Refused, wire_kind
from .channel import Channel, bind_router, context, has_big, host_of

#: largest frame an agent accepts (headers, subtree lists); SeDs pass their own
DEFAULT_MAX_MESSAGE = 16 * 1024 * 1024
#: messages queued per peer in each direction
DEFAULT_QUEUE_LIMIT = 10000

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # pragma: no cover
    from .security import Security


@dataclass(slots=True)
class Incoming:
    """A validated message from a peer."""
    route: list                      # routing frames (opaque; give back to reply/send)
    type: MsgType
    header: dict
    buffers: list                    # extra frames (zmq.Frame), binary parts of values
    frames: list                     # every frame as received (routing + header + buffers)
    received: float = 0.0            # time.monotonic() at parse
    secure: bool = True              # False: the socket runs no CURVE, so no frame carries a User-Id
    #: the frame whose User-Id says who sent it: the header's, or for a message of a batch whose
    #: headers came packed in one frame, the envelope's (every frame of a zmq message has one sender)
    auth: Any = None

    @property
    def id(self) -> str:
        return self.header["id"]

    @property
    def peer(self) -> bytes:
        """The zmq routing id of the sender's connection (stable while it stays connected)."""
        r = self.route[0]
        return r.bytes if hasattr(r, "bytes") else bytes(r)

    @property
    def user(self) -> str | None:
        """Authenticated user (ZAP User-Id) when the socket runs CURVE, else None."""
        if not self.secure:
            return None
        f = self.auth if self.auth is not None else self.frames[1] if len(self.frames) > 1 else None
        try:
            uid = f.get("User-Id") if f is not None and hasattr(f, "get") else None
        except (zmq.ZMQError, KeyError, TypeError):
            return None
        return uid or None


Handler = Callable[[Incoming], None]


class RateLimitedLog:
    """At most ``burst`` lines per ``interval`` seconds; the rest are counted
    and summarised in one line when the next interval starts."""

    def __init__(self, logger: logging.Logger, burst: int = 10, interval: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger, self.burst, self.interval, self.clock = logger, burst, interval, clock
        self.window_start = -1e18
        self.in_window = 0
        self.suppressed = 0

    def __call__(self, level: int, fmt: str, *args, **kwargs) -> bool:
        now = self.clock()
        if now - self.window_start >= self.interval:
            if self.suppressed:
                self.logger.log(level, "... %d similar lines suppressed in the last %gs",
                                self.suppressed, self.interval)
            self.window_start, self.in_window, self.suppressed = now, 0, 0
        if self.in_window < self.burst:
            self.in_window += 1
            self.logger.log(level, fmt, *args, **kwargs)
            return True
        self.suppressed += 1
        return False


@dataclass
class EndpointStats:
    received: int = 0
    sent: int = 0
    bad_messages: int = 0           # rejected at the boundary (malformed, unknown type, bad field)
    handler_errors: int = 0         # a handler raised: answered with an error
    unhandled_types: int = 0        # valid message of a type this daemon does not handle
    batches: int = 0                # BATCH envelopes received (their messages count in ``received``)
    by_type: dict = field(default_factory=dict)

    def snapshot(self) -> dict:
        return {"received": self.received, "sent": self.sent, "bad_messages": self.bad_messages,
                "handler_errors": self.handler_errors, "unhandled_types": self.unhandled_types, "batches": self.batches,
                "by_type": dict(self.by_type)}


class Endpoint:
    """A bound ROUTER with a handler table. ``start()`` binds (``address``
    ``tcp://host:0`` picks a free port; :attr:`address` is the bound one)."""

    def __init__(self, name: str, address: str, handlers: Mapping[MsgType, Handler], *,
                 what: str = "", bad_input_log: RateLimitedLog | None = None,
                 socket_options: Mapping[int, object] | None = None,
                 on_rejected: Callable[[ProtocolError], None] | None = None,
                 max_message_size: int = DEFAULT_MAX_MESSAGE, queue_limit: int = DEFAULT_QUEUE_LIMIT,
                 security: "Security | None" = None) -> None:
        self.name = name
        self.max_message_size = max_message_size
        self.queue_limit = queue_limit
        self.security = security
        self.bind_address = address
        self.handlers: dict[MsgType, Handler] = dict(handlers)
        self.what = what or name              # how error messages name this daemon ("SeD sed-1")
        self.socket_options = dict(socket_options or {})
        self.stats = EndpointStats()
        self.bad_log = bad_input_log or RateLimitedLog(log)
        self.on_rejected = on_rejected        # told of every message refused at the boundary
        self.address: str | None = None
        self.channel: Channel | None = None
        self._secure = False
        self._held: list | None = None         # answers held while a batch is handled
        #: ``(begin, end)`` called around the messages of each wake-up of the socket (several
        #: clients' batches at once; a SeD pauses its queues); set before :meth:`start`
        self.around_read: tuple[Callable[[], None], Callable[[], None]] | None = None
        self._held_route: list = []
        self._lingering: dict[bytes, tuple[list, list]] = {}   # peer -> (route, answers waiting)
        self._batchers: dict[bytes, None] = {}      # peers that sent a batch (the latest MAX_BATCHERS)
        self._bulk = None                           # BulkServer, bound on the first bulk_open

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> "Endpoint":
        # every socket facing a peer: frames bounded in size (a bigger one
        # disconnects its sender before it is buffered), queues bounded per peer
        options: dict = {zmq.MAXMSGSIZE: int(self.max_message_size),
                         zmq.RCVHWM: int(self.queue_limit), zmq.SNDHWM: int(self.queue_limit)}
        if self.security is not None and self.security.enabled:
            options.update(self.security.server_options(self.name, context()))
        options.update(self.socket_options)
        self._secure = self.security is not None and self.security.enabled
        if self._secure and self.bind_address.startswith("tcp://"):
            # the bulk data path (gridrpc.transport.bulk): any CURVE peer may open a session
            self.handlers.setdefault(MsgType.BULK_OPEN, self._on_bulk_open)
        sock, self.address = bind_router(self.bind_address, options=options)
        self.channel = Channel(sock, self._on_frames, name=f"{self.name}.router", around_drain=self.around_read)
        return self

    def close(self) -> None:
        if self.channel is not None:
            self._flush_lingering()
            if self._bulk is not None:
                self._bulk.close()
                self._bulk = None
            self.channel.close()

    @property
    def closed(self) -> bool:
        return self.channel is None or self.channel.closed

    # -- sending --------------------------------------------------------------
    def send(self, route: list, header: dict, buffers=()) -> bool:
        """Send to a peer; False (logged at debug) when it is gone. While a
        batch from that peer is being handled, small answers to it are held
        and go back as one batch when it is done (then True means queued)."""
        head = m.dumps(header)
        if self._hold(route, head, buffers):
            return True
        if self._held:
            self._flush_held()              # keep the order of what this peer gets
        if self._lingering:
            self._flush_lingering(route)
        try:
            self._out(route, [head, *buffers])
        except GridRPCError as exc:
            log.debug("%s: could not send %s %s: %s", self.name, header.get("type"), header.get("id"), exc)
            return False
        self.stats.sent += 1
        return True

    def send_many(self, route: list, headers: list[dict]) -> bool:
        """Several small messages (headers only) to one peer, as one batch
        (up to ``MAX_BATCH`` per zmq message)."""
        if self._held:
            self._flush_held()
        if self._lingering:
            self._flush_lingering(route)
        ok = True
        for i in range(0, len(headers), m.MAX_BATCH):
            part = [[m.dumps(h)] for h in headers[i:i + m.MAX_BATCH]]
            try:
                self._out(route, m.packed(part))
            except GridRPCError as exc:
                log.debug("%s: could not send %d messages: %s", self.name, len(part), exc)
                ok = False
                continue
            self.stats.sent += len(part)
        return ok

    def send_frames(self, route: list, frames: list) -> bool:
        """Send already-encoded frames (an answer, a cached one) to a peer;
        held like :meth:`send`'s small answers while a batch from that peer is
        handled (a batch of CANCELs is answered by a CANCELLED and the call's
        own ERROR each: both go back in the batch)."""
        # a cached answer may hold zmq Frames, whose size has_big does not see: only bytes are held
        if all(type(f) is bytes for f in frames) and self._hold(route, frames[0], frames[1:]):
            return True
        if self._held:
            self._flush_held()
        if self._lingering:
            self._flush_lingering(route)
        try:
            self._out(route, frames)
        except GridRPCError as exc:
            log.debug("%s: could not send cached frames: %s", self.name, exc)
            return False
        self.stats.sent += 1
        return True

    def linger(self, route: list, frames: list, delay: float) -> bool:
        """Send an answer that may wait up to ``delay`` s for others to the
        same peer (:func:`gridrpc.core.messages.linger`): they leave as one
        batch when the first has waited ``delay``, when an envelope is full, or
        before anything else is sent to that peer (its order is kept). Held as
        :meth:`send_frames` holds while a batch of that peer is handled; big or
        non-bytes frames, ``delay <= 0``, and any answer to a peer that has
        never sent a batch (it may not read one) leave at once."""
        if delay <= 0 or self._held is not None or not all(type(f) is bytes for f in frames) \
                or has_big(frames[1:]) or self.closed:
            return self.send_frames(route, frames)
        key = _peer_key(route[0])
        if key not in self._batchers:           # a peer that never batches never gets a batch
            return self.send_frames(route, frames)
        waiting = self._lingering.get(key)
        if waiting is None:
            waiting = self._lingering[key] = (route, [])
            self.channel.loop.call_later(delay, self._flush_lingering, route)
        waiting[1].append(frames)
        self.stats.sent += 1
        if len(waiting[1]) >= m.MAX_BATCH:
            self._flush_lingering(route)
        return True

    def _flush_lingering(self, route: list | None = None) -> None:
        """Send what waits for ``route``'s peer (every peer's when None)."""
        if route is None:
            keys = list(self._lingering)
        else:
            keys = [_peer_key(route[0])]
        for key in keys:
            waiting = self._lingering.pop(key, None)
            if not waiting or self.closed:
                continue
            to, answers = waiting
            try:
                self._out(to, m.packed(answers))
            except GridRPCError as exc:
                log.debug("%s: could not send %d answers: %s", self.name, len(answers), exc)

    def _out(self, route: list, frames: list) -> None:
        """Send one message to a peer, back the way the message it answers came: through a bulk
        session (gridrpc.transport.bulk) or over the socket (raises CommunicationError)."""
        bulk = self._bulk
        if bulk is not None:
            if bulk.send(route[0], frames):
                return
            route = [_peer_key(route[0])]        # a message's route through a session names its peer
        self.channel.send([*route, *frames])

    def _on_bulk_open(self, msg: Incoming) -> None:
        """``bulk_open`` from a CURVE peer: a session of the bulk data path for it
        (gridrpc.transport.bulk), answered over CURVE."""
        user = msg.user
        if user is None:
            raise Refused(f"{self.what}: a bulk session needs a peer authenticated by CURVE")
        if self._bulk is None:
            from .bulk import BulkServer
            self._bulk = BulkServer(name=self.name, host=host_of(self.bind_address),
                                    # a ZAP domain of its own, even beside a same-named endpoint of this process
                                    domain=f"{self.security.zap_domain(self.name)}.bulk.{os.urandom(4).hex()}",
                                    security=self.security,
                                    context=context(), deliver=self._on_sealed,
                                    max_message_size=self.max_message_size, queue_limit=self.queue_limit,
                                    around_drain=self.around_read, bad_log=self.bad_log)
        from .bulk import decode_route
        fields = self._bulk.open(msg.peer, user, decode_route(msg.header["route"]))
        self.reply(msg, m.make(MsgType.BULK_OPENED, msg.id, **fields))

    def _on_sealed(self, frames: list, auth: Any) -> None:
        """A message that came through a bulk session, handled as if it came over the socket
        from the peer that opened the session (``frames[0]``), sent by ``auth``'s user."""
        self._on_frames(frames, auth=auth)

    @property
    def bulk_stats(self) -> dict:
        """Sealed messages accepted and refused (by reason), and sessions open; empty before the
        first ``bulk_open``."""
        if self._bulk is None:
            return {}
        return {**self._bulk.stats, "sessions": self._bulk.sessions()}

    def _hold(self, route: list, head: bytes, buffers) -> bool:
        """Hold a small answer to the peer whose batch is being handled (it goes
        back in that batch, :meth:`_flush_held`); False when not held."""
        held = self._held
        if held is None or not _same_peer(route[0], self._held_route[0]) or has_big(buffers):
            return False
        held.append([head, *buffers])
        self.stats.sent += 1
        return True

    def reply(self, msg: Incoming, header: dict, buffers=()) -> bool:
        return self.send(msg.route, header, buffers)

    def reply_error(self, msg: Incoming | list, kind: str, message: str, **extra) -> bool:
        route = msg.route if isinstance(msg, Incoming) else msg
        id_ = msg.header.get("id", "") if isinstance(msg, Incoming) else ""
        return self.send(route, m.error_header(id_, kind, message, **extra))

    def _flush_held(self) -> None:
        held, self._held = self._held, []
        # a message of a batch may have two answers (a CANCEL: its CANCELLED and the call's ERROR),
        # so what is held can exceed one envelope
        for i in range(0, len(held), m.MAX_BATCH):
            part = held[i:i + m.MAX_BATCH]
            try:
                self._out(self._held_route, m.packed(part))
            except GridRPCError as exc:
                log.debug("%s: could not send %d held answers: %s", self.name, len(part), exc)

    # -- receiving ------------------------------------------------------------
    def _on_frames(self, frames: list, in_batch: bool = False, auth: Any = None) -> None:
        try:
            route, mt, h, buffers = m.parse_routed(frames)
            if mt is MsgType.BATCH:
                if in_batch:
                    raise ProtocolError("a batch cannot hold a batch")
                parts = m.unbatch(h, buffers)
                if auth is None:            # (a batch through a bulk session has its session's sender)
                    auth = frames[1]        # the envelope: its sender is every part's sender
        except ProtocolError as exc:
            self.stats.received += 1
            self.stats.bad_messages += 1
            self.bad_log(logging.WARNING, "%s: rejected message: %s", self.name, exc)
            hid = getattr(exc, "header_id", None)         # set when the header itself was decoded
            self.send(frames[:1], m.error_header(_safe_id(frames) if hid is None else hid, "protocol", str(exc)))
            if self.on_rejected is not None:
                self.on_rejected(exc)
            return
        if mt is MsgType.BATCH:             # an envelope is not a message: its parts are
            self._on_batch(route, parts, auth)
            return
        self.stats.received += 1
        self.dispatch(Incoming(route=route, type=mt, header=h, buffers=buffers, frames=frames,
                               received=time.monotonic(), secure=self._secure, auth=auth))

    def _on_batch(self, route: list, parts: list[list], auth: Any = None) -> None:
        """Each message of a batch handled in order, as if it came alone; the
        answers to its sender go back together."""
        self.stats.batches += 1
        key = _peer_key(route[0])
        if key not in self._batchers:
            if len(self._batchers) >= MAX_BATCHERS:
                del self._batchers[next(iter(self._batchers))]
            self._batchers[key] = None
        # answers waiting for this peer (linger) go back first, with the batch's
        waiting = self._lingering.pop(key, None) if self._lingering else None
        self._held, self._held_route = (waiting[1] if waiting else []), route
        try:
            for part in parts:
                self._on_frames([*route, *part], in_batch=True, auth=auth)
        finally:
            self._flush_held()
            self._held = None

    def dispatch(self, msg: Incoming) -> None:
        bt = self.stats.by_type
        name = m.VALUE[msg.type]
        bt[name] = bt.get(name, 0) + 1
        handler = self.handlers.get(msg.type)
        if handler is None:
            self.stats.unhandled_types += 1
            self.bad_log(logging.INFO, "%s: does not handle %s (id %s)", self.name, msg.type.value, msg.id)
            self.reply_error(msg, "protocol", f"{self.what} does not handle {msg.type.value!r}")
            return
        try:
            handler(msg)
        except (ProtocolError, InvalidArgument, ValueError) as exc:
            # a field the schema does not cover was malformed: the sender's fault
            self.stats.bad_messages += 1
            kind = wire_kind(exc) if isinstance(exc, GridRPCError) else "protocol"
            self.bad_log(logging.WARNING, "%s: bad %s %s: %s", self.name, msg.type.value, msg.id, exc)
            self.reply_error(msg, kind, f"bad {msg.type.value}: {exc}")
        except GridRPCError as exc:
            # a request this element refuses (a limit, data it does not hold): answered with its kind
            self.bad_log(logging.INFO, "%s: %s %s refused: %s", self.name, msg.type.value, msg.id,
                         _short(str(exc)))
            self.reply_error(msg, wire_kind(exc), _short(str(exc)), type_=type(exc).__name__)
        except RecursionError:
            # nested beyond what this element walks: the sender's fault, whatever handler met it
            self.stats.bad_messages += 1
            self.bad_log(logging.WARNING, "%s: bad %s %s: nested too deeply", self.name, msg.type.value, msg.id)
            self.reply_error(msg, "invalid_argument", f"bad {msg.type.value}: values nested too deeply",
                             type_="InvalidArgument")
        except Exception as exc:  # noqa: BLE001 - a handler bug: answer, log (bounded), keep serving
            self.stats.handler_errors += 1
            self.bad_log(logging.ERROR, "%s: error while handling %s %s: %s: %s", self.name, msg.type.value,
                         msg.id, type(exc).__name__, _short(str(exc)), exc_info=True)
            self.reply_error(msg, "internal", f"{self.what} failed to handle {msg.type.value}: "
                                              f"{type(exc).__name__}: {_short(str(exc))}")


#: longest error text put in an answer or a log line
MAX_ERROR_TEXT = 1000


def _short(text: str) -> str:
    return text if len(text) <= MAX_ERROR_TEXT else text[:MAX_ERROR_TEXT] + "..."


def _safe_id(frames: list) -> str:
    """The id of an unparseable message when it can be read safely, for the error reply."""
    try:
        import orjson
        h = orjson.loads(frames[1].bytes if hasattr(frames[1], "bytes") else frames[1])
        i = h.get("id") if isinstance(h, dict) else None
        return i if m.valid_id(i) else ""
    except Exception:  # noqa: BLE001
        return ""


#: peers remembered as sending batches (one routing id per connection; the oldest forgotten first)
MAX_BATCHERS = 65536


def _peer_key(frame) -> bytes:
    """A routing frame (bytes, or the zmq Frame of a received message) as bytes."""
    return frame.bytes if hasattr(frame, "bytes") else frame


def _same_peer(a, b) -> bool:
    """Whether two routing frames (bytes, or zmq Frames of received messages) name one peer: a
    call's answer carries the route of its CALL, not of the CANCEL being handled."""
    if a is b:
        return True
    return (a.bytes if hasattr(a, "bytes") else a) == (b.bytes if hasattr(b, "bytes") else b)
