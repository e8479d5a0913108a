"""CURVE on a link with the ZAP authenticator: keys, identities, refusals."""
import zmq

from gridrpc.transport.channel import bind_router, connect_dealer, context
from gridrpc.transport.security import Identity, KeyStore, Security, public_key_from


def _pair(tmp_path):
    store = KeyStore(tmp_path / "keys")
    store.create("MA", "element")
    store.create("alice", "user")
    return store


def _roundtrip(router, dealer, timeout_ms=3000):
    try:     # a refused connection leaves the DEALER without a pipe: a blocking send would hang
        dealer.send_multipart([b"hello"], flags=zmq.NOBLOCK)
    except zmq.Again:
        return None
    if not router.poll(timeout_ms):
        return None
    frames = router.recv_multipart(copy=False)
    return frames[1].get("User-Id")


def test_curve_link_carries_the_keys_identity(tmp_path):
    store = _pair(tmp_path)
    server = Security(keys=store, name="MA", role="element")
    router, addr = bind_router("tcp://127.0.0.1:0", options=server.server_options("MA", context()))
    alice = Security(keys=store, name="alice", role="user")
    dealer = connect_dealer(addr, options=alice.client_options(store.public("MA", "element")))
    try:
        uid = _roundtrip(router, dealer)
        assert uid == "user:alice"
        assert Identity.parse(uid) == Identity("user", "alice")
    finally:
        dealer.close()
        router.close()


def test_unknown_key_and_plain_peer_are_refused(tmp_path):
    store = _pair(tmp_path)
    server = Security(keys=store, name="MA", role="element")
    router, addr = bind_router("tcp://127.0.0.1:0", options=server.server_options("MA2", context()))
    stranger_store = KeyStore(tmp_path / "elsewhere")
    stranger_store.create("mallory", "user")
    mallory = Security(keys=stranger_store, name="mallory", role="user")
    d1 = connect_dealer(addr, options=mallory.client_options(store.public("MA", "element")))
    d2 = connect_dealer(addr)                                   # no CURVE at all
    try:
        assert _roundtrip(router, d1, 800) is None
        assert _roundtrip(router, d2, 800) is None
        # adding mallory's public key to the directory is enough: no restart
        src = stranger_store.dir / "users" / "mallory.key"
        (store.dir / "users" / "mallory.key").write_bytes(src.read_bytes())
        d3 = connect_dealer(addr, options=mallory.client_options(store.public("MA", "element")))
        try:
            assert _roundtrip(router, d3) == "user:mallory"
        finally:
            d3.close()
    finally:
        d1.close()
        d2.close()
        router.close()


def test_keystore_lists_and_loads(tmp_path):
    store = _pair(tmp_path)
    entries = {(r, n): has for r, n, _pub, has in store.entries()}
    assert entries == {("element", "MA"): True, ("user", "alice"): True}
    pub = store.public("alice", "user")
    assert public_key_from(pub.decode()) == pub
    assert public_key_from(str(store.dir / "users" / "alice.key")) == pub
    import pytest
    from gridrpc.errors import ConfigError
    with pytest.raises(ConfigError, match="exists already"):
        store.create("alice", "user")
    with pytest.raises(ConfigError, match="letters"):
        store.create("../evil", "user")
    with pytest.raises(ConfigError, match="no secret key"):
        KeyStore(tmp_path / "none").load("bob", "user")


def test_keys_command(tmp_path):
    import subprocess
    import sys
    d = str(tmp_path / "k")
    run = lambda *a: subprocess.run([sys.executable, "-m", "gridrpc", "keys", *a, "--dir", d],  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    r = run("create", "MA", "LA1", "--element")
    assert r.returncode == 0, r.stderr
    assert run("create", "alice").returncode == 0
    r = run("create", "alice")
    assert r.returncode == 2 and "exists already" in r.stderr
    r = run("list")
    lines = r.stdout.splitlines()
    assert [ln.split()[:2] for ln in lines] == [["element", "LA1"], ["element", "MA"], ["user", "alice"]]
    r = run("show", "MA", "--element")
    assert r.returncode == 0 and len(r.stdout.strip()) == 40


def test_a_daemon_adding_its_key_ring_while_the_zap_thread_reads_them(tmp_path):
    """The ZAP thread names a key by walking every daemon's key ring while
    another daemon of the same process adds its own; the walk once raised
    "dictionary changed size during iteration", which killed the ZAP thread and
    every later CURVE handshake of the process (a tree in one process never
    registered). Reproduced deterministically: a ring's lookup adds a ring."""
    from gridrpc.transport import security as sec

    ctx = zmq.Context()
    try:
        auth = sec._Authenticator(ctx)           # not started: only its bookkeeping is used
        store = KeyStore(str(tmp_path / "k"))
        first = auth.add_ring("d1", store)
        added = []

        def identity_and_a_new_daemon(z):
            if not added:
                added.append(auth.add_ring("d2", store))
            return None
        first.identity = identity_and_a_new_daemon
        assert auth.curve_user_id(b"\x00" * 32).startswith("unknown:")
        assert set(auth.rings) == {"d1", "d2"} and auth.add_ring("d2", store) is added[0]
    finally:
        ctx.term()
