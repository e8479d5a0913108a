"""Raw ZeroMQ peers for the attack tests: what a hostile client sends, byte
for byte, without gridrpc's client in the way. Every receive is bounded."""
from __future__ import annotations

import time
from contextlib import contextmanager

import orjson
import zmq


def dealer(address: str, options: dict | None = None) -> zmq.Socket:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVHWM, 0)
    for opt, value in (options or {}).items():
        s.setsockopt(opt, value)
    s.connect(address)
    return s


def send(sock: zmq.Socket, header: dict, buffers: list = ()) -> bool:
    """Never blocks: a DEALER refused by CURVE has no pipe to queue on."""
    try:
        sock.send_multipart([orjson.dumps(header), *buffers], flags=zmq.NOBLOCK)
        return True
    except zmq.Again:
        return False


def recv(sock: zmq.Socket, timeout: float) -> dict | None:
    if not sock.poll(int(timeout * 1000)):
        return None
    return orjson.loads(sock.recv_multipart()[0])


def reply_to(sock: zmq.Socket, id_: str, timeout: float, others: list | None = None) -> dict | None:
    """The next message with id ``id_`` (others are appended to ``others``), or None."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        h = recv(sock, left)
        if h is None:
            return None
        if h.get("id") == id_:
            return h
        if others is not None:
            others.append(h)
    return None


def replies(sock: zmq.Socket, ids, timeout: float) -> dict[str, dict]:
    """The answers to every id of ``ids`` (in any order) that come within ``timeout``."""
    want, got = set(ids), {}
    deadline = time.monotonic() + timeout
    while want and (left := deadline - time.monotonic()) > 0:
        h = recv(sock, left)
        if h is None:
            break
        if h.get("id") in want:
            want.discard(h["id"])
            got[h["id"]] = h
    return got


def ask(sock: zmq.Socket, header: dict, timeout: float = 5.0) -> dict | None:
    """Send and wait for the answer to that id; None when refused or silent."""
    if not send(sock, header):
        return None
    return reply_to(sock, header["id"], timeout)


def final(sock: zmq.Socket, cid: str, timeout: float) -> dict | None:
    """The answer to call ``cid`` past its ACCEPTED, or None."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        r = reply_to(sock, cid, left)
        if r is None or r["type"] != "accepted":
            return r
    return None


@contextmanager
def closing(*socks: zmq.Socket):
    try:
        yield socks
    finally:
        for s in socks:
            s.close()


def secure_args(keys, parent_key: str | None = None) -> list[str]:
    """The daemon options for CURVE."""
    args = ["--keys", str(keys), "--secure"]
    if parent_key:
        args += ["--parent-key", parent_key]
    return args
