"""The bulk data path of a secure tree: AES-256-GCM on a second connection.

Under CURVE, libzmq encrypts every message with XSalsa20-Poly1305 and copies
each frame into and out of the cipher: an 8 MB echo costs ~2.7x its plain
round trip, and raw libzmq sockets do no better. AES-256-GCM (``cryptography``,
AES-NI) runs at ~19 GB/s here and can decrypt a received frame in place. So
once a client and a SeD have authenticated each other over CURVE, their
messages travel sealed with AES-256-GCM over a second connection:

1. **Opening, over CURVE.** The client sends ``bulk_open`` (the routing id it
   will use on the bulk connection). The endpoint answers ``bulk_opened``: a
   random 16-byte session id, a random 256-bit key and a random 256-bit
   connection token, and the port of its bulk socket (bound on first use).
   The answer travels on that client's CURVE connection: nobody else learns
   them. The session belongs to the CURVE peer that asked and to its key's
   user.
2. **Connecting.** The client connects a DEALER to the bulk port with
   ZeroMQ's PLAIN mechanism (user name = session id, password = token). The
   daemon's ZAP thread admits only a (session, token) pair it handed out, so
   a peer without one cannot send a single frame (as before CURVE's handshake).
3. **Sealed messages**, either way: frame 0 is a preamble in clear (magic,
   session id, direction, sequence number, number of frames); every other
   frame is ``AES-256-GCM(key, nonce = direction | frame index | sequence,
   frame, associated data = preamble)``. A receiver accepts a message only if
   the session is known, the connection was admitted for that session with
   the routing id given at opening, the direction is towards it, the sequence
   number is above every one accepted before (replays and reorderings are
   refused), the frame count matches and every tag verifies. A message
   delivered from a session counts as sent by the CURVE peer that opened it,
   with the user of that peer's key.

Once a session is up, the client sends every message to that server through
it (small ones too) and the server answers each message the way it came, so
a call's messages stay in one ordered pipe each way, as on the CURVE
connection. A side that cannot use it (the bulk connection is down or
refused, a session is unknown after a restart) falls back to the CURVE
connection, which stays open.
"""
from __future__ import annotations

import hmac
import logging
import os
import struct
import time
from collections import OrderedDict
from typing import Callable

import zmq
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import CommunicationError, ProtocolError

log = logging.getLogger(__name__)

__all__ = ["BulkRefused", "Sealer", "BulkServer", "SessionAuth", "check_preamble", "ZERO_COPY", "PREAMBLE", "TO_SERVER",
           "TO_CLIENT", "RESET", "decode_route", "OutputBuffers", "BulkRoute"]

#: magic (4), session id (16), direction (1), sequence number (8), number of frames (4)
PREAMBLE = struct.Struct("!4s16sBQI")
MAGIC = b"GRB1"
#: what a server answers, in clear, to a sealed message of a session it does not know (a restart,
#: a session replaced): the client goes back to CURVE. Forging it costs the client speed, not data.
RESET = b"GRB1-reset"
TO_SERVER, TO_CLIENT = 1, 2
SESSION_BYTES, KEY_BYTES, TOKEN_BYTES = 16, 32, 32
TAG = 16
#: ``cryptography``'s AES-GCM takes at most 2**31 - 1 bytes at once
MAX_FRAME = (1 << 31) - 1 - TAG
#: the frame index has 3 bytes of the nonce
MAX_FRAMES = (1 << 24) - 1
#: decrypted frames this large stay in the received buffer (zero-copy); smaller ones are copied
ZERO_COPY = 64 * 1024


class BulkRefused(ProtocolError):
    """A sealed message that is not accepted; the message says why."""


def _view(f) -> memoryview | bytes:
    """A frame to send as flat bytes (``len`` is its size in bytes)."""
    if isinstance(f, zmq.Frame):
        return f.buffer
    if type(f) is bytes:
        return f
    v = memoryview(f)
    return v if v.ndim == 1 and v.itemsize == 1 else v.cast("B")


def decode_route(text: str) -> bytes:
    """A routing id from its hex (validated by the message's field table)."""
    return bytes.fromhex(text)


class OutputBuffers:
    """Buffers that large frames are sealed into, reused once ZeroMQ has sent them.

    A fresh buffer per frame costs its page faults: sealing 8 MB into new
    memory took ~19 ms on the busy 2-core machine here, into a buffer already
    mapped 0.45 ms. A buffer is
    reused when the tracker of the frame last sealed into it says libzmq let
    go of it; at most :attr:`MAX_BYTES` are kept, and a frame above
    :attr:`MAX_ONE` gets memory of its own."""

    MAX_BYTES = 64 << 20
    MAX_ONE = 32 << 20

    __slots__ = ("_slots", "_bytes", "fresh", "reused")

    @property
    def held(self) -> int:
        """Bytes of buffers kept for reuse."""
        return self._bytes

    def __init__(self) -> None:
        self._slots: list[list] = []        # [bytearray, MessageTracker of its last frame or None]
        self._bytes = 0
        self.fresh = 0                      # frames sealed into new memory (none of the kept buffers free)
        self.reused = 0                     # frames sealed into a kept buffer

    def sealed(self, aead: AESGCM, nonce: bytes, data, aad: bytes) -> zmq.Frame:
        size = len(data) + TAG
        buf = None
        for slot in self._slots:             # the smallest free buffer that fits
            tracker = slot[1]
            if len(slot[0]) >= size and (tracker is None or tracker.done) \
                    and (buf is None or len(slot[0]) < len(buf[0])):
                buf = slot
        if buf is None:
            self.fresh += 1
            if size > self.MAX_ONE or self._bytes + size > self.MAX_BYTES:
                return zmq.Frame(aead.encrypt(nonce, data, aad), copy=False)
            buf = [bytearray(size), None]
            self._slots.append(buf)
            self._bytes += size
        else:
            self.reused += 1
        out = memoryview(buf[0])[:size]
        aead.encrypt_into(nonce, data, aad, out)
        frame = zmq.Frame(out, copy=False, track=True)
        buf[1] = frame.tracker
        return frame


class Sealer:
    """One session's key with this side's two counters: the sequence number
    of the last message sealed, and of the last one accepted from the peer."""

    __slots__ = ("session", "_aead", "out_dir", "in_dir", "seq_out", "seq_in", "_buffers")

    def __init__(self, session: bytes, key: bytes, *, server: bool, buffers: "OutputBuffers | None" = None) -> None:
        if len(session) != SESSION_BYTES or len(key) != KEY_BYTES:
            raise ValueError("a bulk session needs a 16-byte id and a 32-byte key")
        self.session = session
        self._aead = AESGCM(key)
        self.out_dir, self.in_dir = (TO_CLIENT, TO_SERVER) if server else (TO_SERVER, TO_CLIENT)
        self.seq_out = 0
        self.seq_in = 0
        self._buffers = buffers if buffers is not None else OutputBuffers()

    @staticmethod
    def fits(frames) -> bool:
        """Whether a message can be sealed (frame count and sizes within AES-GCM's limits)."""
        return len(frames) <= MAX_FRAMES and all(len(_view(f)) <= MAX_FRAME for f in frames)

    def seal(self, frames) -> list:
        """``[preamble, *ciphertexts]`` for a message's frames (header, buffers)."""
        self.seq_out += 1
        seq = self.seq_out
        pre = PREAMBLE.pack(MAGIC, self.session, self.out_dir, seq, len(frames))
        head, tail = bytes((self.out_dir,)), seq.to_bytes(8, "big")
        out = [pre]
        for i, f in enumerate(frames):
            v = _view(f)
            nonce = head + i.to_bytes(3, "big") + tail
            if len(v) >= ZERO_COPY:
                out.append(self._buffers.sealed(self._aead, nonce, v, pre))
            else:
                out.append(self._aead.encrypt(nonce, v, pre))
        return out

    def open(self, frames: list) -> list:
        """The message inside ``[preamble, *ciphertexts]`` (received zmq Frames), decrypted in
        place; raises :class:`BulkRefused`. The sequence number moves only when every frame
        verified."""
        pre = frames[0].bytes
        magic, session, direction, seq, n = PREAMBLE.unpack(pre)      # length checked by the caller
        if session != self.session:
            raise BulkRefused("sealed for another session")
        if direction != self.in_dir:
            raise BulkRefused("sealed for the other direction (a reflected message)")
        if seq <= self.seq_in:
            raise BulkRefused(f"sequence number {seq} not above {self.seq_in}: a replayed or reordered message")
        if n != len(frames) - 1 or n == 0:
            raise BulkRefused(f"the preamble says {n} frames, the message has {len(frames) - 1}")
        head, tail = bytes((direction,)), seq.to_bytes(8, "big")
        dec = self._aead.decrypt_into
        out = []
        for i, f in enumerate(frames[1:]):
            mv = f.buffer
            size = len(mv) - TAG
            if size < 0:
                raise BulkRefused(f"frame {i} is shorter than its tag")
            plain = mv[:size]
            try:
                # in place: the plaintext overwrites the ciphertext (OpenSSL's GCM allows exactly this
                # overlap); a frame that fails is dropped with the message
                dec(head + i.to_bytes(3, "big") + tail, mv, pre, plain)
            except InvalidTag:
                raise BulkRefused(f"frame {i} fails authentication (tampered, moved, or another key)") from None
            out.append(zmq.Frame(plain, copy=False) if size >= ZERO_COPY else zmq.Frame(bytes(plain)))
        self.seq_in = seq
        return out


def check_preamble(frames: list) -> bytes:
    """The session id of a sealed message; raises :class:`BulkRefused` when it cannot be one."""
    if len(frames) < 2:
        raise BulkRefused("a sealed message has a preamble and at least one frame")
    pre = frames[0].bytes if isinstance(frames[0], zmq.Frame) else bytes(frames[0])
    if len(pre) != PREAMBLE.size or pre[:4] != MAGIC:
        raise BulkRefused("not a sealed message (bad preamble)")
    return pre[4:4 + SESSION_BYTES]


class SessionAuth:
    """Stands for a received frame's ``User-Id`` (what :attr:`Incoming.user` reads) for a message
    that came through a session: the user of the CURVE key that opened it."""

    __slots__ = ("user_id",)

    def __init__(self, user_id: str) -> None:
        self.user_id = user_id

    def get(self, prop: str):
        if prop == "User-Id":
            return self.user_id
        raise KeyError(prop)


class BulkRoute:
    """The route of a message that came through a session: it names the peer that opened the
    session (``bytes``, what the endpoint keys peers by) and its answers go back the same way
    (:meth:`BulkServer.send`); an answer to a message that came over CURVE goes over CURVE."""

    __slots__ = ("bytes", "session")

    def __init__(self, peer: bytes, session: "_Session") -> None:
        self.bytes = peer
        self.session = session

    def __eq__(self, other) -> bool:
        return self.bytes == (other.bytes if hasattr(other, "bytes") else other)

    def __hash__(self) -> int:
        return hash(self.bytes)


class _Session:
    __slots__ = ("sid", "token", "user", "peer", "ident", "sealer", "auth", "live", "used")

    def __init__(self, sid: bytes, token: bytes, key: bytes, user: str, peer: bytes, ident: bytes,
                 buffers: OutputBuffers) -> None:
        self.sid, self.token, self.user, self.peer, self.ident = sid, token, user, peer, ident
        self.sealer = Sealer(sid, key, server=True, buffers=buffers)
        self.auth = SessionAuth(user)
        self.live = False           # a valid message came over the bulk connection: answers may take it
        self.used = time.monotonic()


class BulkServer:
    """The bulk socket of one endpoint and its sessions.

    ``deliver(frames, auth)`` gets each accepted message as if it came over the
    CURVE socket (``frames[0]`` the opening peer's routing id). Bounds: at most
    :attr:`MAX_PER_USER` sessions per user (opening one more closes that user's
    least recently used: another user's sessions are never touched) and
    :attr:`MAX_SESSIONS` in all: beyond, a session idle for :attr:`IDLE_S` makes
    room (clients give up theirs after half that, ``bulk_client.BulkLinks.IDLE_S``, so
    none sends on a session closed this way), else ``bulk_open`` is refused and
    the client stays on CURVE."""

    MAX_PER_USER = 256
    MAX_SESSIONS = 16384
    IDLE_S = 600.0

    def __init__(self, *, name: str, host: str, domain: str, security, context: zmq.Context,
                 deliver: Callable[[list, SessionAuth], None], max_message_size: int, queue_limit: int,
                 around_drain=None, bad_log: Callable | None = None) -> None:
        from .channel import Channel, bind_router
        self.name = name
        self.deliver = deliver
        self.domain = domain
        self.context = context
        self.bad_log = bad_log or (lambda level, fmt, *a: log.log(level, fmt, *a))
        self._by_sid: OrderedDict[bytes, _Session] = OrderedDict()     # least recently used first
        self._by_peer: dict[bytes, _Session] = {}
        self._by_user: dict[str, OrderedDict] = {}
        self._buffers = OutputBuffers()             # shared by every session of this socket
        #: refused sealed messages by reason, and accepted ones
        self.stats: dict[str, int] = {"accepted": 0}
        options = {zmq.MAXMSGSIZE: int(max_message_size) + TAG, zmq.RCVHWM: int(queue_limit),
                   zmq.SNDHWM: int(queue_limit), **security.bulk_options(domain, context, self._admit)}
        sock, self.address = bind_router(f"tcp://{host}:0", options=options)
        self.port = int(self.address.rsplit(":", 1)[1])
        self.channel = Channel(sock, self._on_frames, name=f"{name}.bulk", around_drain=around_drain)

    # -- sessions -------------------------------------------------------------
    def open(self, peer: bytes, user: str, ident: bytes) -> dict:
        """A new session for the CURVE peer ``peer`` (its key's user ``user``), whose bulk socket
        will use the routing id ``ident``: the fields of the ``bulk_opened`` answer. A session
        the same peer opened before is closed."""
        from ..errors import Refused
        old = self._by_peer.get(peer)
        if old is not None:
            self._close(old)
        mine = self._by_user.setdefault(user, OrderedDict())
        while len(mine) >= self.MAX_PER_USER:
            self._close(self._by_sid[next(iter(mine))])
        now = time.monotonic()
        while len(self._by_sid) >= self.MAX_SESSIONS:
            idle = self._by_sid[next(iter(self._by_sid))]
            if now - idle.used < self.IDLE_S:
                break
            self._close(idle)
        if len(self._by_sid) >= self.MAX_SESSIONS:
            raise Refused(f"{self.name}: {len(self._by_sid)} bulk sessions open (limit {self.MAX_SESSIONS})")
        sid, key, token = os.urandom(SESSION_BYTES), os.urandom(KEY_BYTES), os.urandom(TOKEN_BYTES)
        s = _Session(sid, token, key, user, peer, ident, self._buffers)
        self._by_sid[sid] = s
        self._by_peer[peer] = s
        mine[sid] = None
        return {"session": sid.hex(), "key": key.hex(), "token": token.hex(), "port": self.port}

    def _close(self, s: _Session) -> None:
        self._by_sid.pop(s.sid, None)
        if self._by_peer.get(s.peer) is s:
            del self._by_peer[s.peer]
        mine = self._by_user.get(s.user)
        if mine is not None:
            mine.pop(s.sid, None)
            if not mine:
                del self._by_user[s.user]

    def sessions(self) -> int:
        return len(self._by_sid)

    def _admit(self, username: str, password: str) -> bool:
        """ZAP thread: a bulk connection is admitted with a session id and its token."""
        try:
            sid, token = bytes.fromhex(username), bytes.fromhex(password)
        except ValueError:
            return False
        s = self._by_sid.get(sid)
        return s is not None and hmac.compare_digest(s.token, token)

    # -- receiving --------------------------------------------------------------
    def _refuse(self, reason: str, detail: str) -> None:
        self.stats[reason] = self.stats.get(reason, 0) + 1
        self.bad_log(logging.WARNING, "%s: refused a sealed message on the bulk socket: %s", self.name, detail)

    def _on_frames(self, frames: list) -> None:
        ident = frames[0].bytes
        try:
            sid = check_preamble(frames[1:])
        except BulkRefused as exc:
            self._refuse("malformed", str(exc))
            return
        s = self._by_sid.get(sid)
        if s is None:
            self._refuse("unknown_session", "unknown session (closed, or opened before a restart): "
                                            "told the sender to go back to CURVE")
            try:
                self.channel.send([ident, RESET])
            except CommunicationError:
                pass
            return
        try:
            uid = frames[1].get("User-Id")
        except (zmq.ZMQError, KeyError):
            uid = None
        if uid != sid.hex() or ident != s.ident:
            self._refuse("wrong_connection", "a session's message on a connection not admitted for it")
            return
        try:
            plain = s.sealer.open(frames[1:])
        except BulkRefused as exc:
            self._refuse("refused", f"session of user {s.user!r}: {exc}")
            return
        self.stats["accepted"] += 1
        s.live = True
        s.used = time.monotonic()
        self._by_sid.move_to_end(sid)
        mine = self._by_user.get(s.user)
        if mine is not None and sid in mine:
            mine.move_to_end(sid)
        self.deliver([BulkRoute(s.peer, s), *plain], s.auth)

    # -- sending ----------------------------------------------------------------
    def send(self, route, frames: list) -> bool:
        """Send a message (header, buffers) back the way ``route`` (a route's first frame) came:
        through its session when it is a :class:`BulkRoute` whose session is still open and its
        connection up; False otherwise (then the caller sends over CURVE)."""
        s = getattr(route, "session", None)
        if s is None or not s.live or self._by_sid.get(s.sid) is not s or not Sealer.fits(frames):
            return False
        try:
            self.channel.send([s.ident, *s.sealer.seal(frames)])
        except CommunicationError:
            s.live = False          # its bulk connection is gone: CURVE until a message comes again
            return False
        return True

    def close(self) -> None:
        from .security import Security
        Security.forget_bulk(self.domain, self.context)
        self.channel.close()
        self._by_sid.clear()
        self._by_peer.clear()
        self._by_user.clear()
