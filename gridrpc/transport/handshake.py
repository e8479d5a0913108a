"""Why a connection is not working: libzmq's handshake events on a socket.

A client whose key the master agent refuses, a client without a key in
front of a secure tree, or a client given the wrong public key for the MA
would otherwise only see silence ("did not answer within 5s"). A
:class:`HandshakeWatch` listens to the socket's monitor (attached before the
socket connects, or the first events are missed) and says which it was,
as soon as libzmq knows.
"""
from __future__ import annotations

import asyncio

import zmq
from zmq.utils.monitor import recv_monitor_message

__all__ = ["HandshakeWatch", "explain"]

_SUCCEEDED = zmq.EVENT_HANDSHAKE_SUCCEEDED
_AUTH = zmq.EVENT_HANDSHAKE_FAILED_AUTH
_PROTOCOL = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
_NO_DETAIL = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL


class HandshakeWatch:
    """The last handshake outcome of one connecting socket."""

    EVENTS = _SUCCEEDED | _AUTH | _PROTOCOL | _NO_DETAIL

    def __init__(self, sock: zmq.Socket) -> None:
        self._sock = sock
        self._mon: zmq.Socket | None = sock.get_monitor_socket(self.EVENTS)
        self.succeeded = False
        self.failure: tuple[int, int] | None = None      # (event, value) of the last failed handshake
        self._reader: tuple[asyncio.AbstractEventLoop, int] | None = None

    def on_event(self, callback) -> None:
        """Call ``callback()`` on the running loop each time the monitor reports (after reading
        it), until :meth:`close`: a waiter learns the outcome when libzmq does."""
        loop = asyncio.get_running_loop()
        fd = self._mon.getsockopt(zmq.FD)

        def ready() -> None:
            if self._mon is not None:
                self.poll()                 # reads until empty: the descriptor signals edges only
                callback()
        loop.add_reader(fd, ready)
        self._reader = (loop, fd)
        loop.call_soon(ready)               # what came before the reader was added

    def poll(self) -> None:
        """Read what the monitor reported (never blocks)."""
        while self._mon is not None:
            try:
                msg = recv_monitor_message(self._mon, zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:
                return
            if msg["event"] == _SUCCEEDED:
                self.succeeded, self.failure = True, None
            else:
                self.failure = (int(msg["event"]), int(msg["value"]))

    def failed(self) -> tuple[int, int] | None:
        """The failure of the handshake when none succeeded since, else None."""
        self.poll()
        return self.failure

    def close(self) -> None:
        if self._mon is None:
            return
        if self._reader is not None:
            loop, fd = self._reader
            self._reader = None
            if not loop.is_closed():
                loop.remove_reader(fd)
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._mon.close(linger=0)
        self._mon = None


def explain(failure: tuple[int, int], *, what: str, secure: bool, key: str | None = None) -> str:
    """One sentence for a failed handshake with ``what`` (e.g. "the master
    agent at tcp://..."), knowing whether this side used CURVE and its key."""
    event, value = failure
    if event == _AUTH:
        return (f"{what} refused this client's key{f' {key!r}' if key else ''} (status {value}): its public key "
                "is not in the tree's key directory (users/NAME.key; `gridrpc keys create NAME --role user`)")
    if not secure:
        return (f"{what} is secure (CURVE) and this client gave no key: pass keys=DIR and key=NAME "
                "(command line: --keys DIR --key NAME)")
    if event == _PROTOCOL:
        return (f"the handshake with {what} failed ({_protocol_error(value)}): it may not be secure "
                "(then connect without keys), or it does not speak gridrpc's protocol")
    return (f"the handshake with {what} failed: the master agent's key this client was given does not match "
            "the MA's own (check ma_key / --ma-key, or the key directory's elements/MA.key)")


def _protocol_error(value: int) -> str:
    try:
        return zmq.Event(value).name.lower().replace("protocol_error_", "").replace("_", " ")
    except ValueError:
        return f"protocol error {value:#x}"
