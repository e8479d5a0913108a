"""What one authenticated user could do to another, replayed against real
daemons on real sockets, in plain mode and under CURVE (user keys).

Each test sends what a hostile user sent (raw ZeroMQ where the attack needs
it) and asserts that the victim keeps its results, its call ids and its
server, while the attacker gets a clear refusal.
"""
from __future__ import annotations

import socket
import time

import psutil
import pytest

import gridrpc
from gridrpc.core import messages as m
from gridrpc.core.messages import MsgType
from gridrpc.testing import wait_for
from gridrpc.transport.security import KeyStore, Security
from tests.proc_tree import ProcTree
from tests.raw_peer import ask, closing, dealer, final, replies, reply_to, send
from tests.security_site import Site

pytestmark = pytest.mark.real


@pytest.fixture(params=["plain", "secure"])
def site(request, tmp_path):
    s = Site(tmp_path, request.param == "secure")
    yield s
    s.close()


def _call(cid: str, service: str, *args, user: str) -> dict:
    return {"v": 1, "type": "call", "id": cid, "service": service, "args": list(args), "kwargs": {},
            "sed": "sed-1", "user": user}


# == 1. waiting for another user's result ====================================================
def test_a_user_cannot_wait_for_anothers_result(site):
    """Attack: a ``data_get`` with ``call: true`` and ``wait`` for a call id
    not seen yet registered a waiter; when the victim's call with that id
    ended, the waiter got its result. Now the waiter is refused at the end
    (the result's user is checked again) and the victim gets its result."""
    cid = "alice-next-7f3"
    with closing(site.raw("alice"), site.raw("mallory")) as (alice, mallory):
        waits = [f"steal-{i}" for i in range(20)]
        for w in waits:
            assert send(mallory, m.make(MsgType.DATA_GET, w, ref=cid, call=True, wait=10, user="mallory"))
        time.sleep(0.3)                 # the waits are registered before the victim's call arrives
        assert send(alice, _call(cid, "echo", "SECRET-of-alice-42", user="alice"))
        got = final(alice, cid, 10)
        assert got is not None and got["type"] == "result" and got["value"] == "SECRET-of-alice-42", got
        answers = [reply_to(mallory, w, 10) for w in waits]
        assert all(a is not None for a in answers), "a waiter was never answered"
        assert not [a for a in answers if a["type"] == "data" or "SECRET" in str(a.get("value"))], \
            "another user received alice's result"
        assert {a["error"]["kind"] for a in answers} == {"data_denied"}, answers[0]
        # and once the result is kept, a direct request is refused too
        r = ask(mallory, m.make(MsgType.DATA_GET, "steal-after", ref=cid, call=True, wait=0, user="mallory"))
        assert r is not None and r["type"] == "error" and r["error"]["kind"] == "data_denied", r


# == 2. call-id squatting ==================================================================
def test_call_ids_cannot_be_taken_before_their_owner(site):
    """Attack: one id of alice's seen (the dashboard's events show them),
    mallory computed alice's next ids (a prefix and a counter) and sent CALLs
    with them first; alice's own calls then failed with ``Refused: call id
    ... belongs to another client``. Ids now carry a random part per call:
    the predicted ids are not alice's, and her calls succeed."""
    with site.client("alice") as a, closing(site.raw("mallory")) as (mallory,):
        seen = a.submit("add", 1, 1)
        assert seen.result(10) == 2
        head, dot, _rand = seen.id.partition(".")
        prefix, counter = head[:16], int(head[16:], 16)
        predicted = [f"{prefix}{counter + k:x}" + (dot + _rand if dot else "") for k in range(1, 61)]
        for cid in predicted:
            assert send(mallory, _call(cid, "sleep", 0.0, user="mallory"))
        for cid in predicted[-1:]:
            assert final(mallory, cid, 10) is not None
        results = [a.call("add", i, 1) for i in range(40)]
        assert results == [i + 1 for i in range(40)]


# == 3. sockets to data sources =============================================================
def _fds(pid: int) -> int:
    return psutil.Process(pid).num_fds()


def test_data_sources_cannot_exhaust_a_seds_descriptors(site):
    """Attack: every ``data_put`` with a new ``source`` address opened a
    socket that was never closed; 1,100 of them locked new clients out of a
    SeD with 1,024 descriptors. Now only tcp:// addresses are accepted, the
    connections to holders are pooled and bounded, copies in progress are
    bounded per user, under CURVE a source that is not an element of the
    tree is refused before any copy starts, and the SeD keeps serving."""
    base = _fds(site.sed.pid)
    with closing(site.raw("mallory")) as (mallory,):
        n = 300
        for i in range(n):      # plain mode: each under another user name, as a forger would
            user = "mallory" if site.secure else f"mallory{i}"
            assert send(mallory, m.make(MsgType.DATA_PUT, f"p{i}", ref=f"r-{i}", user=user,
                                        source={"name": "sed-9", "address": f"tcp://127.0.0.1:{20000 + i}"}))
        time.sleep(1.0)                 # every put read and its copy started (or refused)
        peak = _fds(site.sed.pid)
        answers = list(replies(mallory, [f"p{i}" for i in range(n)], 40).values())
        assert len(answers) == n, f"{n - len(answers)} puts never answered"
        assert all(a["type"] == "error" for a in answers), [a for a in answers if a["type"] != "error"][:2]
        assert peak - base < 100, f"SeD descriptors grew from {base} to {peak}"
        if site.secure:     # no element key for sed-9: refused before any copy starts
            assert all("not an element of this site" in a["error"]["message"] for a in answers), answers[:2]
        else:
            limits = [a for a in answers if "limit" in a["error"]["message"] or "already" in a["error"]["message"]]
            assert limits, "no answer named the limit"
        r = ask(mallory, m.make(MsgType.DATA_PUT, "p-ipc", ref="r-ipc", user="mallory",
                                source={"name": "sed-9", "address": "ipc:///tmp/anything.sock"}))
        assert r is not None and r["type"] == "error" and "tcp://host:port" in r["error"]["message"], r
    with site.client("alice") as c:
        assert c.call("add", 2, 3) == 5


# == 4. example services that opened any path ================================================
def test_example_file_services_take_files_not_paths(site, tmp_path):
    """Attack: ``wc('/etc/shadow')`` answered and ``upper_file(<the MA's
    secret key>)`` returned it upper-cased. The file services now take a
    ``gridrpc.File`` sent with the call; a path string is refused before it
    runs, and nothing is written beside the named file."""
    victim = tmp_path / "secret.txt"
    victim.write_text("do not read me\n")
    with site.client("mallory") as c:
        for svc in ("wc", "upper_file"):
            for path in ("/etc/passwd", str(victim)):
                with pytest.raises(gridrpc.InvalidArgument, match="gridrpc.File"):
                    c.call(svc, path)
        assert not (tmp_path / "secret.txt.upper").exists()
        mine = tmp_path / "mine.txt"
        mine.write_text("two words\nthree more words\n")
        assert c.call("wc", gridrpc.File(mine)) == {"lines": 2, "words": 5, "bytes": 27}
        out = c.call("upper_file", gridrpc.File(mine))
        assert open(out, "rb").read() == b"TWO WORDS\nTHREE MORE WORDS\n"


# == 7. handler errors answered and logged within bounds =====================================
def test_deep_nesting_is_an_invalid_argument_and_logs_little(site):
    """Attack: deeply nested arguments raised RecursionError in a handler;
    each 1.3 KB message was answered ``internal`` with a 185 KB traceback in
    the log. Now each is answered ``invalid_argument`` and the log grows by a
    bounded amount."""
    deep = "[" * 900 + "]" * 900
    with closing(site.raw("mallory")) as (mallory,):
        before = site.sed.log.stat().st_size
        for i in range(60):
            mallory.send_multipart([(f'{{"v":1,"type":"call","id":"deep-{i}","service":"echo",'
                                     f'"args":[{deep}],"kwargs":{{}},"sed":"sed-1","user":"mallory"}}').encode()])
        answers = list(replies(mallory, [f"deep-{i}" for i in range(60)], 20).values())
        assert len(answers) == 60 and all(a["type"] == "error" for a in answers), answers[:2]
        assert {a["error"]["kind"] for a in answers} <= {"invalid_argument", "protocol"}, \
            {a["error"]["kind"] for a in answers}
        assert all(len(a["error"]["message"]) < 2000 for a in answers)
        time.sleep(0.5)
        grown = site.sed.log.stat().st_size - before
        assert grown < 20_000, f"the SeD's log grew by {grown} bytes for 60 bad messages"
    with site.client("alice") as c:
        assert c.call("add", 2, 3) == 5


# == 5 and 9. data held by its real size, and fairly between users ===========================
@pytest.fixture(params=["plain", "secure"])
def small_data_site(request, tmp_path):
    s = Site(tmp_path, request.param == "secure", "--data-memory-bytes", "1000000")
    yield s
    s.close()


def test_data_is_counted_by_its_real_size_and_shared_fairly(small_data_site):
    """Attacks: strings were held as 0 bytes (six 100 MB strings under a 50 MB
    budget), and one user's puts evicted another's reference (DataLost). Now
    a string counts what it weighs, and a user within their share keeps it."""
    site = small_data_site
    with site.client("alice") as a, site.client("mallory") as b:
        with pytest.raises(gridrpc.DataError, match="exceeds the data budget"):
            b.put("x" * 2_000_000, server="sed-1")
        mine = a.put("a" * 300_000, server="sed-1")
        for _ in range(12):
            try:
                b.put(b"m" * 100_000, server="sed-1")
            except gridrpc.DataError:
                pass                    # refused once her own data cannot make room: fine
        assert a.get(mine) == "a" * 300_000


# == 8. connections before authentication ===================================================
@pytest.fixture
def low_limit_site(tmp_path):
    # under CURVE, the case of the attack (connections before authentication); the limit and the
    # handshake timeout act on the socket whatever its mechanism
    s = Site(tmp_path, True, nofile=1024)
    yield s
    s.close()


def test_idle_connections_do_not_lock_users_out(low_limit_site):
    """Attack: 1,100 idle TCP connections to the MA's port (before any
    handshake) against a 1,024-descriptor limit: the MA spun at 100 % CPU and
    other users timed out. Now a daemon raises its descriptor limit at start
    and closes connections that do not complete their handshake in 5 s."""
    site = low_limit_site
    host, port = site.ma.address[len("tcp://"):].rsplit(":", 1)
    idle = []
    try:
        for _ in range(1100):
            idle.append(socket.create_connection((host, int(port)), timeout=5))
        with site.client("alice") as c:
            assert c.call("add", 1, 2) == 3
        ma = psutil.Process(site.ma.pid)
        wait_for(lambda: ma.num_fds() < 500, 15, "the idle connections closed by the MA")
    finally:
        for s in idle:
            s.close()


# == 12. a forged subtree in a heartbeat =====================================================
@pytest.fixture
def plain_site(tmp_path):
    s = Site(tmp_path, secure=False)
    yield s
    s.close()


def test_a_heartbeat_cannot_take_a_live_sed_s_name(plain_site):
    """Attack (plain mode): a rogue child registered under a free name, then
    heartbeated ``elements`` describing ``sed-1`` at its own address; the MA
    listed it and sent sed-1's named calls there. Now the forged elements are
    left out: the tree has one sed-1, at its real address, and its calls
    reach it. (Under CURVE only element keys register at all:
    tests/test_security_attacks_open.py.)"""
    site = plain_site
    rogue = dealer(site.ma.address)
    with closing(rogue):
        r = ask(rogue, m.make(MsgType.REGISTER, "reg-rogue", name="rogue", kind="la", address="tcp://127.0.0.1:9",
                              host="127.0.0.1", pid=4242, started=time.time(), services=[], elements=[]))
        assert r is not None and r["type"] == "registered", r
        forged = [{"name": "sed-1", "parent": "rogue", "kind": "sed", "address": "tcp://127.0.0.1:9",
                   "services": ["add"], "state": "alive"}]
        for i in range(5):
            assert send(rogue, m.make(MsgType.HEARTBEAT, f"hb-{i}", name="rogue", elements=forged))
            time.sleep(0.05)
        with site.client("alice") as c:
            tree = c.tree()
            seds = [e for e in tree if e.get("name") == "sed-1"]
            assert len(seds) == 1 and seds[0]["address"] == site.sed.address, seds
            assert [c.call("add", i, 1, server="sed-1") for i in range(5)] == [1, 2, 3, 4, 5]


# == 10. errors that name the key problem ====================================================
def test_key_problems_are_named_within_the_discovery_timeout(secure_site, tmp_path):
    """A client with an unknown key, with no key, or with the wrong MA key got
    only "master agent ... did not answer within 5.0s" after 10 s. Each now
    gets an AuthenticationError saying which, well within the timeout."""
    site = secure_site
    stranger = KeyStore(tmp_path / "stranger")
    stranger.create("eve", "user")
    cases = {
        "refused this client's key": dict(keys=str(stranger.dir), key="eve",
                                          ma_key=site.store.public("MA", "element").decode()),
        "gave no key": dict(),
        "does not match": dict(keys=site.keys, key="alice", ma_key=site.store.public("sed-1", "element").decode()),
    }
    for expected, kw in cases.items():
        t0 = time.monotonic()
        with gridrpc.Client(site.ma.address, discovery_timeout=5, **kw) as c:
            with pytest.raises(gridrpc.CommunicationError, match=expected) as info:
                c.call("add", 1, 2)
        assert isinstance(info.value, gridrpc.AuthenticationError), info.value
        # named within the discovery timeout (5 s), not after it
        assert time.monotonic() - t0 < 5, f"{expected}: took {time.monotonic() - t0:.1f}s"
    with site.client("alice") as c:           # and a good key still works
        assert c.call("add", 1, 2) == 3


def test_direct_calls_under_curve_work_before_any_discovery(secure_site):
    """A call to a ``ServerInfo`` (or a handle bound by address) made before
    any discovery failed with "public key ... unknown": the client now asks
    the MA for the SeD's key first."""
    site = secure_site
    with site.client("alice") as c:
        assert c.call("add", 1, 2, server=gridrpc.ServerInfo(name="sed-1", address=site.sed.address)) == 3
    with site.client("alice") as c:
        assert c.handle("add", server=site.sed.address)(2, 2) == 4


# == 9. fair service between users ==========================================================
def test_a_users_flood_does_not_delay_another_users_call(site):
    """Attack: 10,000 queued calls from one user and the next user's call
    waited behind all of them (FCFS). Now a SeD's FCFS queue serves users in
    turn: alice's call runs as soon as the running one ends."""
    with site.client("mallory") as b, site.client("alice") as a:
        flood = [b.submit("sleep", 0.05, server="sed-1") for _ in range(200)]
        wait_for(lambda: all(c.server for c in flood[:5]), 10, "the flood queued")
        t0 = time.monotonic()
        assert a.call("add", 1, 2, server="sed-1") == 3
        waited = time.monotonic() - t0
        done = sum(1 for c in flood if c.done())
        assert done <= 5, f"alice's call waited behind {done} of mallory's calls ({waited:.2f} s)"
        for c in flood:
            c.cancel()


def test_a_discovery_carries_descriptions_not_values(site):
    """Attack: a DISCOVER with 8 MB of ``args`` and ``max_age_ms=0`` was
    copied to every SeD of the service (480 MB received by each of 4 SeDs
    for 60 such requests). Now the MA refuses it at the boundary, naming the
    field, and forwards nothing."""
    opts = None
    if site.secure:
        opts = Security(keys=site.store, name="mallory", role="user").client_options(
            site.store.public("MA", "element"))
    with closing(dealer(site.ma.address, opts)) as (ma,):
        r = ask(ma, m.make(MsgType.DISCOVER, "big-d", service="add", k=5, max_age_ms=0, user="mallory",
                           args=["x" * 8_000_000]), 10)
        assert r is not None and r["type"] == "error" and "args" in r["error"]["message"], r
        r = ask(ma, m.make(MsgType.DISCOVER, "many-d", service="add", k=5, max_age_ms=0, user="mallory",
                           args=[{"type": "str", "v": "y" * 200}] * 1000), 10)
        assert r is not None and r["type"] == "error" and "args" in r["error"]["message"], r
        r = ask(ma, m.make(MsgType.DISCOVER, "ok-d", service="add", k=5, max_age_ms=0, user="mallory",
                           args=[1, {"type": "ndarray", "dtype": "<f8", "shape": [1000, 1000]}]), 10)
        assert r is not None and r["type"] == "servers" and r["servers"], r


# == 9. event-stream slots ===================================================================
def _open_stream(url: str) -> tuple[socket.socket, bytes]:
    """A raw event-stream request; returns the socket and the status line."""
    u = url[len("http://"):]
    host, port = u.split("/")[0].rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(f"GET /api/events HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    return s, s.recv(200).split(b"\r\n", 1)[0]


def test_one_address_cannot_hold_every_event_stream_and_left_slots_free_at_once(tmp_path):
    """Attack: one process held all 64 event-stream slots of the MA, and a
    slot stayed taken 14 s after its reader left. Now one address gets at
    most 16 streams and a stream whose reader left frees its slot within
    about a second."""
    with ProcTree(tmp_path) as pt:
        ma = pt.start("ma", "MA", "--http-port", "0")
        url = ma.info["http"]
        held = []
        try:
            for _ in range(16):
                s, status = _open_stream(url)
                held.append(s)
                assert b"200" in status, status
            s, status = _open_stream(url)
            s.close()
            assert b"503" in status, status
            for s in held:
                s.close()
            held = []

            def reopened():
                s, status = _open_stream(url)
                ok = b"200" in status
                (held.append(s) if ok else s.close())
                return ok
            wait_for(reopened, 5, "a stream slot freed after its reader left")     # not 14 s later
        finally:
            for s in held:
                s.close()


# == 9. argument bytes per user ==============================================================
@pytest.fixture(params=["plain", "secure"])
def bounded_args_site(request, tmp_path):
    s = Site(tmp_path, request.param == "secure", "--max-message-size", "20000000")
    yield s
    s.close()


def test_one_users_big_calls_are_bounded_not_others(bounded_args_site):
    """Attack: five legal 400 MB calls took a SeD to 3.5 GB and its parent
    dropped it. Now the bytes of arguments one user has in calls queued or
    running on a SeD are bounded (default: one message of the largest
    size); past it the call is refused, naming the limit, and other users
    are not affected."""
    site = bounded_args_site
    blob = b"x" * 8_000_000
    with site.client("mallory") as b, site.client("alice") as a:
        blocker = b.submit("sleep", 1.0, server="sed-1")
        wait_for(lambda: blocker.server is not None, 10, "the slot taken")
        queued = [b.submit("echo", blob, server="sed-1") for _ in range(2)]
        wait_for(lambda: all(c.server for c in queued), 10, "two 8 MB calls queued")
        with pytest.raises(gridrpc.Refused, match="max_arg_bytes_per_user=20000000"):
            b.call("echo", blob, server="sed-1")
        assert a.call("echo", blob, server="sed-1") == blob          # another user: not counted against
        assert all(c.result(30) == blob for c in queued)
        assert b.call("echo", blob, server="sed-1") == blob          # freed when the calls ended


# == a mixed attack =========================================================================
@pytest.mark.slow
@pytest.mark.parametrize("secure", [False, True], ids=["plain", "curve"])
def test_under_a_mixed_attack_a_well_behaved_user_keeps_working(secure):
    """Two hostile users flood a tree at once (data sources, big values, tiny
    puts, nesting, big discoveries, calls): the well-behaved user's calls all
    succeed, no element is dropped from the tree, and every daemon's
    descriptors stay bounded. (Latency figures: python -m benchmarks.attack,
    docs/security.md.)"""
    from benchmarks.attack import run
    r = run(3.0, secure=secure)
    # served in every attacked window (each window's calls either answer or count as failed), none failed
    assert r["attack"]["calls"] >= r["rounds"] and not r["attack"]["failed"], r["attack"]
    assert r["dropped"] == [], r["tree_after"]
    assert all(p["fds"] < 200 for p in r["daemons"].values()), r["daemons"]
    assert sum(s["sent"] for s in r["attackers"].values()) > 1000          # the attack did happen
    answered = {k for s in r["attackers"].values() for k in s["answers"]}
    assert {"error:protocol", "error:refused"} <= answered, answered      # refused, clearly, not ignored
