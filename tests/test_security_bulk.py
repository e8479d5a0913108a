"""The bulk data path of a secure tree (gridrpc.transport.bulk): AES-256-GCM
sessions opened over CURVE carry the messages between a client and a SeD.

Pure tests of the sealing first (tampering, replays, reordering, moved and
reflected frames, another key), then real daemons: bulk data end to end under
``--secure``, sealed messages a hostile peer forges, replays, tampers or moves
are refused with a reason in the SeD's log while the SeD keeps serving,
another user can neither join nor read a victim's session, and plain mode is
unchanged."""
from __future__ import annotations

import os
import time

import numpy as np
import orjson
import psutil
import pytest
import zmq

from gridrpc.core import codec
from gridrpc.testing import wait_for
from gridrpc.transport.bulk import (PREAMBLE, RESET, TO_CLIENT, BulkRefused, OutputBuffers, Sealer,
                                    SessionAuth)
from gridrpc.transport.handshake import HandshakeWatch
from gridrpc.transport.security import Security
from tests.raw_peer import closing, reply_to, send
from tests.security_site import Site, listening_ports

MB = 1 << 20


def _frames(msg: list) -> list[zmq.Frame]:
    """What a receiver gets: fresh (writable) zmq Frames with the same bytes."""
    return [zmq.Frame(bytes(f.buffer if isinstance(f, zmq.Frame) else f)) for f in msg]


def _pair(session: bytes = b"s" * 16, key: bytes = b"k" * 32) -> tuple[Sealer, Sealer]:
    return Sealer(session, key, server=False), Sealer(session, key, server=True)


# -- sealing (pure) ------------------------------------------------------------
def test_sealed_frames_round_trip_large_ones_decrypted_in_place():
    client, server = _pair()
    big = np.random.default_rng(1).bytes(3 * MB)
    sealed = client.seal([b'{"type":"call"}', big, b"tail"])
    assert len(sealed) == 4 and len(sealed[0]) == PREAMBLE.size
    assert big[:4096] not in bytes(sealed[2].buffer)            # ciphertext, not the data
    received = _frames(sealed)
    plain = server.open(received)
    assert [bytes(f.buffer) for f in plain] == [b'{"type":"call"}', big, b"tail"]
    # the large frame's plaintext lives in the received buffer: no copy
    assert np.shares_memory(np.frombuffer(plain[1].buffer, np.uint8), np.frombuffer(received[2].buffer, np.uint8))
    # and back the other way, with the server's own counter
    back = client.open(_frames(server.seal([b"answer"])))
    assert [f.bytes for f in back] == [b"answer"]
    # what the codec and a SeD hand over: memoryviews of arrays (any shape), bytearrays, zmq Frames
    grid = np.arange(120_000, dtype=np.float32).reshape(300, 400)
    parts = [memoryview(grid), bytearray(b"ab"), zmq.Frame(b"cd"), memoryview(grid.view(np.uint8).reshape(-1))]
    got = server.open(_frames(client.seal(parts)))
    assert [len(f) for f in got] == [grid.nbytes, 2, 2, grid.nbytes] and got[0].bytes == grid.tobytes()


def test_a_tampered_frame_is_refused_and_the_counter_does_not_move():
    client, server = _pair()
    msg = _frames(client.seal([b"header", os.urandom(100_000)]))
    buf = msg[2].buffer
    buf[5000] ^= 1
    with pytest.raises(BulkRefused, match="frame 1 fails authentication"):
        server.open(msg)
    assert server.seq_in == 0
    assert [f.bytes for f in server.open(_frames(client.seal([b"next"])))] == [b"next"]


def test_replayed_and_reordered_messages_are_refused():
    client, server = _pair()
    first, second = client.seal([b"one"]), client.seal([b"two"])
    assert server.open(_frames(second))[0].bytes == b"two"
    with pytest.raises(BulkRefused, match="replayed or reordered"):
        server.open(_frames(first))                              # older than one accepted
    with pytest.raises(BulkRefused, match="replayed or reordered"):
        server.open(_frames(second))                             # the same one again


def test_frames_swapped_or_moved_between_messages_are_refused():
    client, server = _pair()
    a = client.seal([b"header-a", b"buffer-a"])
    b = client.seal([b"header-b", b"buffer-b"])
    with pytest.raises(BulkRefused, match="fails authentication"):
        server.open(_frames([a[0], a[2], a[1]]))                 # reordered inside a message
    with pytest.raises(BulkRefused, match="fails authentication"):
        server.open(_frames([b[0], b[1], a[2]]))                 # a frame moved to another message
    with pytest.raises(BulkRefused, match="2 frames"):
        server.open(_frames([b[0], b[1]]))                       # a frame dropped
    assert [f.bytes for f in server.open(_frames(b))] == [b"header-b", b"buffer-b"]


def test_a_reflected_message_and_another_sessions_key_are_refused():
    client, server = _pair()
    with pytest.raises(BulkRefused, match="other direction"):
        client.open(_frames(client.seal([b"to the server"])))    # sent back to its sender
    other_client, other_server = _pair(key=b"K" * 32)            # same session id, another key
    with pytest.raises(BulkRefused, match="fails authentication"):
        server.open(_frames(other_client.seal([b"forged"])))
    with pytest.raises(BulkRefused, match="another session"):
        _pair(session=b"t" * 16)[1].open(_frames(client.seal([b"x"])))


def test_output_buffers_are_reused_only_once_sent():
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    aead, pool = AESGCM(b"k" * 32), OutputBuffers()
    data = b"x" * MB
    f1 = pool.sealed(aead, b"n" * 12, data, b"")
    f2 = pool.sealed(aead, b"m" * 12, data, b"")                 # f1 not sent yet: a second buffer
    assert not np.shares_memory(np.frombuffer(f1.buffer, np.uint8), np.frombuffer(f2.buffer, np.uint8))
    assert bytes(f1.buffer) == aead.encrypt(b"n" * 12, data, b"")
    assert pool.held == 2 * (MB + 16)
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        a.connect("inproc://pool")
        b.bind("inproc://pool")
        tracker = f1.tracker
        a.send(f1, copy=False)
        del f1
        b.recv()
        wait_for(lambda: tracker.done, 5, "libzmq lets go of the frame")
        pool.sealed(aead, b"o" * 12, data, b"")                  # reuses the first buffer
        assert pool.held == 2 * (MB + 16)
    finally:
        a.close(0)
        b.close(0)
        ctx.term()


def test_session_auth_stands_for_a_user_id():
    auth = SessionAuth("user:alice")
    assert auth.get("User-Id") == "user:alice"
    with pytest.raises(KeyError):
        auth.get("Peer-Address")


# -- real daemons ------------------------------------------------------------------
def test_bulk_data_end_to_end_under_curve(secure_site):
    site = secure_site
    before = listening_ports(site.sed.pid)
    assert len(before) == 1                                      # the CURVE socket only
    a = np.random.default_rng(0).random(MB)                      # 8 MB
    with site.client("alice") as c:
        h = c.handle("echo", server="sed-1")
        for _ in range(4):
            back = h(a)
            assert back.dtype == a.dtype and np.array_equal(back, a)
        assert h("small") == "small" and c.call("add", 2, 3) == 5
        sizes = [c.call("echo", np.arange(n, dtype=np.int32)) for n in (0, 1, 16_384, 3_000_000)]
        assert [len(x) for x in sizes] == [0, 1, 16_384, 3_000_000] and sizes[-1][-1] == 2_999_999
        # the SeD bound a second port, and this client is connected to it
        bulk = listening_ports(site.sed.pid) - before
        assert len(bulk) == 1
        port = bulk.pop()
        mine = [x for x in psutil.Process().net_connections("tcp") if x.raddr and x.raddr.port == port]
        assert mine and mine[0].status == psutil.CONN_ESTABLISHED


class _Session:
    """A hand-made session with sed-1 as ``user``: the CURVE socket, the answer to its
    bulk_open, a bulk socket admitted with its token, and its sealer."""

    def __init__(self, site: Site, user: str, tag: str) -> None:
        self.site = site
        self.curve = site.raw(user)
        self.ident = b"g" + os.urandom(15)
        self.opened = _ask(self.curve, {"v": 1, "type": "bulk_open", "id": f"open-{tag}",
                                        "route": self.ident.hex()})
        assert self.opened and self.opened["type"] == "bulk_opened", self.opened
        self.sealer = Sealer(bytes.fromhex(self.opened["session"]), bytes.fromhex(self.opened["key"]),
                             server=False)
        self.bulk, self.watch = self.connect(self.opened["session"], self.opened["token"], self.ident)
        assert self.watch.succeeded

    def connect(self, session: str, token: str, ident: bytes) -> tuple[zmq.Socket, HandshakeWatch]:
        """A bulk socket admitted (or not) with ``session`` and ``token``, once its handshake ended."""
        s = zmq.Context.instance().socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.IDENTITY, ident)
        s.setsockopt(zmq.PLAIN_USERNAME, session.encode())
        s.setsockopt(zmq.PLAIN_PASSWORD, token.encode())
        watch = HandshakeWatch(s)
        s.connect(f"tcp://127.0.0.1:{self.opened['port']}")
        wait_for(lambda: watch.failed() is not None or watch.succeeded, 10, "bulk handshake")
        return s, watch

    def call(self, cid: str, value) -> list:
        """A sealed CALL of echo(value)."""
        buffers: list = []
        args = [codec.encode(value, buffers)]
        header = orjson.dumps({"v": 1, "type": "call", "id": cid, "service": "echo", "args": args, "kwargs": {}})
        return self.sealer.seal([header, *buffers])

    def result(self, cid: str, timeout: float = 10.0):
        """The decoded value of ``cid``'s RESULT through the session, or None when none comes."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not self.bulk.poll(int(left * 1000)):
                return None
            frames = self.bulk.recv_multipart(copy=False)
            assert frames[0].bytes[:4] == b"GRB1" and frames[0].bytes[20] == TO_CLIENT
            plain = self.sealer.open(frames)
            h = orjson.loads(plain[0].bytes)
            if h["id"] == cid and h["type"] in ("result", "error"):
                assert h["type"] == "result", h
                return codec.decode(h.get("value"), [f.buffer for f in plain[1:]])
        return None

    def close(self) -> None:
        self.watch.close()
        self.bulk.close(0)
        self.curve.close(0)


def _ask(sock, header: dict, timeout: float = 10.0) -> dict | None:
    assert send(sock, header)
    return reply_to(sock, header["id"], timeout)


def _log(site: Site) -> str:
    return site.sed.log.read_text(errors="replace")


def test_forged_replayed_and_moved_sealed_messages_are_refused(secure_site):
    site = secure_site
    alice = _Session(site, "alice", "a1")
    other = _Session(site, "alice", "a2")                        # alice's second connection
    try:
        value = np.arange(200_000, dtype=np.float64)
        good = alice.call("bulk-good-1", value)
        alice.bulk.send_multipart(good)
        assert np.array_equal(alice.result("bulk-good-1"), value)
        # replayed as it was seen on the wire: refused, nothing runs again
        alice.bulk.send_multipart(good)
        # tampered: one bit of the array's ciphertext
        bad = alice.call("bulk-tampered", value)
        flipped = bytearray(bad[2].buffer if isinstance(bad[2], zmq.Frame) else bad[2])
        flipped[1234] ^= 0x10
        alice.bulk.send_multipart([bad[0], bad[1], bytes(flipped)])
        # moved: alice's valid sealed message sent on her other session's connection
        moved = alice.call("bulk-moved", "x")
        other.bulk.send_multipart(moved)
        # not a sealed message at all
        alice.bulk.send_multipart([b"garbage", b"more"])
        assert alice.result("bulk-tampered", 1.5) is None
        assert other.result("bulk-moved", 0.5) is None
        wait_for(lambda: all(s in _log(site) for s in (
            "a replayed or reordered message", "fails authentication (tampered",
            "a session's message on a connection not admitted for it", "not a sealed message")),
            10, "the SeD's log names each refusal")
        # the session goes on (the counter did not move for refused ones), the SeD keeps serving
        alice.bulk.send_multipart(alice.call("bulk-good-2", "still here"))
        assert alice.result("bulk-good-2") == "still here"
        # a message sent over CURVE is answered over CURVE, the session being live or not
        answer = _ask(alice.curve, {"v": 1, "type": "call", "id": "curve-1", "service": "echo", "args": ["c"],
                                    "kwargs": {}})
        while answer is not None and answer["type"] == "accepted":
            answer = reply_to(alice.curve, "curve-1", 10)
        assert answer["type"] == "result" and answer["value"] == "c"
        assert not alice.bulk.poll(200)
        with site.client("alice") as c:
            a = np.ones(2 * MB)
            assert np.array_equal(c.call("echo", a, server="sed-1"), a)
        assert site.sed.popen.poll() is None
    finally:
        alice.close()
        other.close()


def test_another_user_can_neither_join_nor_read_nor_inject(secure_site):
    site = secure_site
    alice = _Session(site, "alice", "victim")
    mallory = _Session(site, "mallory", "thief")
    try:
        assert mallory.opened["key"] != alice.opened["key"] and mallory.opened["session"] != alice.opened["session"]
        # joining alice's session: her session id with mallory's own token is refused at the handshake
        intruder, watch = mallory.connect(alice.opened["session"], mallory.opened["token"], b"g" + os.urandom(15))
        assert watch.failed() is not None and not watch.succeeded
        watch.close()
        intruder.close(0)
        # reading: a sealed result of alice's does not open with mallory's key
        alice.bulk.send_multipart(alice.call("victim-1", "SECRET-of-alice"))
        wait_for(lambda: alice.bulk.poll(0), 10, "alice's sealed answer")
        frames = alice.bulk.recv_multipart(copy=False)
        stolen = Sealer(bytes.fromhex(alice.opened["session"]), bytes.fromhex(mallory.opened["key"]), server=False)
        with pytest.raises(BulkRefused, match="fails authentication"):
            stolen.open(_frames(frames))
        assert b"SECRET-of-alice" not in b"".join(f.bytes for f in frames)
        # injecting: a message in alice's session sealed with mallory's key, on mallory's connection and on none
        forged = stolen.seal([orjson.dumps({"v": 1, "type": "call", "id": "forged", "service": "echo",
                                            "args": ["from mallory"], "kwargs": {}})])
        mallory.bulk.send_multipart(forged)
        # many sessions of mallory's own do not close alice's
        for i in range(300):
            assert _ask(mallory.curve, {"v": 1, "type": "bulk_open", "id": f"flood-{i}",
                                        "route": (b"g" + os.urandom(15)).hex()})["type"] == "bulk_opened"
        # alice's own sealed message, seen on the wire and sent first on mallory's connection: refused,
        # and it does not burn alice's sequence number
        genuine = alice.call("victim-2", "alice still works")
        mallory.bulk.send_multipart(genuine)
        assert mallory.result("victim-2", 0.5) is None
        alice.bulk.send_multipart(genuine)
        assert alice.result("victim-2") == "alice still works"
        assert alice.result("forged", 0.5) is None and mallory.result("forged", 0.5) is None
        assert site.sed.popen.poll() is None
    finally:
        alice.close()
        mallory.close()


def test_an_unknown_session_is_told_to_go_back_to_curve(secure_site):
    """A sealed message in a session the SeD no longer holds (its peer opened a new one) gets
    the clear RESET answer, and a client given it goes on over CURVE."""
    site = secure_site
    s = _Session(site, "alice", "old")
    try:
        old_sealer, old_bulk = s.sealer, s.bulk
        again = _ask(s.curve, {"v": 1, "type": "bulk_open", "id": "open-new", "route": (b"g" + os.urandom(15)).hex()})
        assert again["type"] == "bulk_opened" and again["session"] != s.opened["session"]
        old_bulk.send_multipart(old_sealer.seal([b'{"v":1,"type":"ping","id":"p"}']))
        assert old_bulk.poll(5000)
        assert old_bulk.recv() == RESET
    finally:
        s.close()


def test_plain_mode_has_no_bulk_path(tmp_path):
    site = Site(tmp_path, False)
    try:
        before = listening_ports(site.sed.pid)
        with site.client("alice") as c:
            a = np.random.default_rng(2).random(MB)
            assert np.array_equal(c.call("echo", a, server="sed-1"), a)
        assert listening_ports(site.sed.pid) == before
        with closing(site.raw("alice")) as (raw,):
            answer = _ask(raw, {"v": 1, "type": "bulk_open", "id": "open-plain", "route": "67" * 16})
        assert answer["type"] == "error" and "does not handle 'bulk_open'" in answer["error"]["message"]
    finally:
        site.close()


def test_bulk_open_needs_an_authenticated_user_and_a_valid_route(secure_site):
    site = secure_site
    with closing(site.raw("alice")) as (raw,):
        bad = _ask(raw, {"v": 1, "type": "bulk_open", "id": "open-bad", "route": "00" * 16})
        assert bad["type"] == "error" and "route" in bad["error"]["message"]
    key = Security(keys=site.store, name="alice", role="user")
    assert key.zap_domain("sed-1") != key.zap_domain("sed-2")


def test_a_restarted_sed_is_reached_over_curve_again(secure_site):
    """The SeD restarts on the same port with no memory of the session (and another bulk port):
    the client's next calls go over CURVE instead of waiting on the old bulk connection."""
    from tests.proc_tree import free_port
    site = secure_site
    port = free_port()
    site.store.create("sed-9", "element")
    first = site.pt.sed("sed-9", site.ma.address, "--keys", site.keys, "--secure", "--parent-key", "MA",
                        port=port)
    a = np.random.default_rng(3).random(MB // 2)
    with site.client("alice") as c:
        wait_for(lambda: "sed-9" in {s.name for s in c.discover("echo", 10)}, 20, "sed-9 registered")
        h = c.handle("echo", server="sed-9")
        for _ in range(3):
            assert np.array_equal(h(a), a)
        assert len(listening_ports(first.pid)) == 2                    # the bulk port is up
        first.stop()
        site.pt.sed("sed-9", site.ma.address, "--keys", site.keys, "--secure", "--parent-key", "MA", port=port)
        wait_for(lambda: "sed-9" in {s.name for s in c.discover("echo", 10)}, 20, "sed-9 back")
        t0 = time.monotonic()
        assert np.array_equal(c.submit("echo", a, server="sed-9").result(20), a)
        assert time.monotonic() - t0 < 10


def test_the_interleaved_benchmark_runs(tmp_path):
    """``python -m benchmarks.curve_bulk``: both trees answer, one line per round with the ratio."""
    import re
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "benchmarks.curve_bulk", "--calls", "3", "--rounds", "1", "--mb", "1"],
                       capture_output=True, text=True, timeout=120, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r"round 1: plain ([\d.]+) ms/rt .* CURVE ([\d.]+) ms/rt .*: ([\d.]+)x", r.stdout)
    assert m, r.stdout
    assert float(m[3]) == pytest.approx(float(m[2]) / float(m[1]), rel=0.1)
