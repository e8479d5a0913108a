"""A whole tree on CURVE (in-process): calls work with keys; the identity the
SeD's queue sees is the key's user, not the header; strangers without keys
get nowhere; clients pin only the MA's key."""
import time

import pytest
import zmq

import gridrpc
from gridrpc.core import messages as m
from gridrpc.testing import LocalTree, wait_for
from gridrpc.transport.security import KeyStore, Security


def _story(t, call_id):
    return t.lt.call(lambda: [e for _, e in t.ma.events.log.story(call_id)])


@pytest.fixture(scope="module")
def secure_tree(tmp_path_factory):
    keys = str(tmp_path_factory.mktemp("keys"))
    with LocalTree(las=1, seds_per_la=2, keys=keys, users=["alice", "bob"], http=False) as t:
        yield t, keys


def test_calls_discovery_and_bound_handles_over_curve(secure_tree):
    t, keys = secure_tree
    with gridrpc.Client(t.ma_address, keys=keys, user="alice") as c:
        assert c.call("add", 1, 2) == 3
        servers = c.discover("add", 5)
        assert len(servers) == 2
        h = c.handle("add", server=servers[0].name)
        assert h(20, 22) == 42
        import numpy as np
        a = np.arange(100000.0)
        assert (c.call("echo", a) == a).all()


def test_the_queue_sees_the_keys_user_not_the_header(secure_tree):
    t, keys = secure_tree
    with gridrpc.Client(t.ma_address, keys=keys, key="bob", user="bob") as c:
        call = c.submit("sleep", 0.01)
        assert call.result(10) == 0.01
    # the SeD's events, as the MA received them, record who ran it
    wait_for(lambda: len(_story(t, call.id)) >= 3, 10, "the call's events at the MA")
    assert {e.user for e in _story(t, call.id) if e.kind.value.startswith("call_")} == {"bob"}


def test_a_forged_header_user_is_ignored(secure_tree):
    """alice's key, a raw CALL saying user=root: the SeD accounts it to alice."""
    t, keys = secure_tree
    store = KeyStore(keys)
    sed = t.seds[0]
    sec = Security(keys=store, name="alice", role="user")
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    for k, v in sec.client_options(store.public(sed.name, "element")).items():
        s.setsockopt(k, v)
    s.connect(sed.address)
    try:
        s.send_multipart([m.dumps(m.make(m.MsgType.CALL, "forged-1", service="add", args=[1, 1], kwargs={},
                                         sed=sed.name, user="root"))])
        got = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (got is None or got["type"] == "accepted"):
            assert s.poll(5000)
            got = m.parse_header(s.recv_multipart()[0])[1]
        assert got["type"] == "result"
    finally:
        s.close()
    wait_for(lambda: len(_story(t, "forged-1")) >= 3, 10, "the call's events at the MA")
    assert {e.user for e in _story(t, "forged-1")} == {"alice"}


def test_strangers_without_a_known_key_get_nothing(secure_tree, tmp_path):
    t, keys = secure_tree
    other = KeyStore(tmp_path / "mallory")
    other.create("mallory", "user")
    with pytest.raises(gridrpc.CommunicationError):
        with gridrpc.Client(t.ma_address, keys=str(other.dir), key="mallory", ma_key=str(
                KeyStore(keys).dir / "elements" / "MA.key"), discovery_timeout=1.0) as c:
            c.discover("add", 1)
    # no CURVE at all: the MA does not answer
    with pytest.raises(gridrpc.CommunicationError):
        with gridrpc.Client(t.ma_address, discovery_timeout=1.0) as c:
            c.discover("add", 1)


def test_a_user_key_cannot_register_an_element(secure_tree):
    t, keys = secure_tree
    store = KeyStore(keys)
    sec = Security(keys=store, name="alice", role="user")
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    for k, v in sec.client_options(store.public("MA", "element")).items():
        s.setsockopt(k, v)
    s.connect(t.ma_address)
    try:
        s.send_multipart([m.dumps(m.make(m.MsgType.REGISTER, "r1", name="rogue", kind="sed", services=["add"],
                                         address="tcp://127.0.0.1:9"))])
        assert s.poll(5000)
        r = m.parse_header(s.recv_multipart()[0])[1]
        assert r["type"] == "error" and r["error"]["kind"] == "refused"
        assert "only the key of element" in r["error"]["message"]
    finally:
        s.close()
    assert "rogue" not in t.registered_seds()


def test_replicas_register_under_their_process_key(tmp_path):
    keys = str(tmp_path / "k")
    with LocalTree(las=0, seds_under_ma=1, replicas=3, keys=keys, users=["alice"], http=False) as t:
        assert sorted(t.registered_seds()) == ["sed-ma-1-1", "sed-ma-1-2", "sed-ma-1-3"]
        with gridrpc.Client(t.ma_address, keys=keys, user="alice") as c:
            assert c.call("add", 2, 2) == 4


def test_data_references_belong_to_the_keys_user(tmp_path):
    """Under CURVE a reference is usable only by the key that stored it,
    whatever user name the other key's header claims."""
    keys = str(tmp_path / "k")
    with LocalTree(las=0, seds_under_ma=2, keys=keys, users=["alice", "mallory"], http=False) as t:
        with gridrpc.Client(t.ma_address, keys=keys, user="alice") as a, \
                gridrpc.Client(t.ma_address, keys=keys, key="mallory", user="mallory") as b:
            ref = a.put([1, 2, 3], server="sed-ma-1")
            assert ref.get() == [1, 2, 3]
            b._aclient.user = "alice"         # a forged name in the headers changes nothing: the key decides
            with pytest.raises(gridrpc.DataAccessDenied):
                b.get(ref)


def test_data_moves_server_to_server_under_curve(tmp_path):
    keys = str(tmp_path / "k")
    with LocalTree(las=0, seds_under_ma=2, keys=keys, users=["alice"], http=False) as t:
        with gridrpc.Client(t.ma_address, keys=keys, user="alice") as a:
            import numpy as np
            ref = a.put(np.arange(1000.0), server="sed-ma-1")
            assert (a.call("echo", ref, server="sed-ma-2") == np.arange(1000.0)).all()   # fetched SeD to SeD


def test_authorization_and_per_user_limits(tmp_path):
    """Per service, which users may call it; per user, calls in flight; a
    refusal names the rule. Under CURVE the user is the key's."""
    from gridrpc.sed.access import AccessRules
    keys = str(tmp_path / "k")
    rules = AccessRules.build(allow={"sleep": ["@staff"], "fail": ["nobody"]}, groups={"staff": ["alice"]},
                              max_calls_per_user=2)
    with LocalTree(las=0, seds_under_ma=1, keys=keys, users=["alice", "bob"], http=False,
                   sed_options={"access": rules, "max_concurrent": 4}) as t:
        with gridrpc.Client(t.ma_address, keys=keys, user="alice") as a, \
                gridrpc.Client(t.ma_address, keys=keys, key="bob", user="bob") as b:
            assert b.call("add", 1, 1) == 2                     # not covered by a rule: open
            with pytest.raises(gridrpc.Refused, match="may not call 'sleep'.*allow rule for 'sleep'"):
                b.call("sleep", 0.01)
            b._aclient.user = "alice"                           # the header cannot make bob alice
            with pytest.raises(gridrpc.Refused, match="user 'bob'"):
                b.call("sleep", 0.01)
            calls = [a.submit("sleep", 2) for _ in range(2)]
            wait_for(lambda: all(c.server for c in calls), 10, "alice's two calls accepted")
            with pytest.raises(gridrpc.Refused, match="2 calls in flight.*max_calls_per_user=2"):
                a.call("sleep", 0.01)
            for c in calls:
                c.cancel()
            wait_for(lambda: a.call("add", 2, 2) == 4, 10, "slots free again")


def test_optional_computations_over_curve(tmp_path):
    """The fair optional-computation scheduler behind CURVE: users are keys."""
    keys = str(tmp_path / "k")
    with LocalTree(las=1, seds_per_la=2, keys=keys, users=["alice"], http=False,
                   sed_options={"queue": "ethic"}) as t:
        with gridrpc.Client(t.ma_address, keys=keys, user="alice") as c:
            out = c.run_optional("add", mandatory=[(1, 1), (2, 2)], optional=((i, i) for i in range(200)),
                                 deadline=2.0)
            assert out.mandatory == [2, 4]
            assert len(out.optional) > 0            # optional calls ran in the time left
        wait_for(lambda: _story_users(t), 10, "events at the MA")
        assert _story_users(t) == {"alice"}


def _story_users(t) -> set:
    return t.lt.call(lambda: {e.user for _, e in t.ma.events.log.latest(500)
                              if e.kind.value.startswith("call_") and e.user})


def test_a_data_source_is_checked_against_its_own_key_not_the_whole_directory(tmp_path, monkeypatch):
    """A SeD pins a data holder's key by the holder's name (a replica's by its process's name)
    and refuses a holder with no element key, reading only those key files: a flood of
    ``data_put``s naming new sources read every key of the site for each."""
    from types import SimpleNamespace
    from gridrpc.errors import DataError
    from gridrpc.sed.data.fetch import Fetching
    store = KeyStore(tmp_path / "k")
    for name in ("sed-1", "sed-2"):
        store.create(name, "element")
    store.create("alice", "user")
    f = Fetching()
    f.sed = SimpleNamespace(security=Security(keys=store, name="sed-2", role="element"))
    f._holder_keys = {}

    def scanned():
        raise AssertionError("the whole key directory was read")
    monkeypatch.setattr(KeyStore, "entries", lambda self: scanned())
    for holder, key in (("sed-1", "sed-1"), ("sed-1-01", "sed-1")):
        assert f._peer_options({"sed": holder})[zmq.CURVE_SERVERKEY] == store.public(key, "element")
    for stranger in ("sed-9", "alice", "../elements/sed-1"):
        with pytest.raises(DataError, match="is not an element of this site"):
            f._peer_options({"sed": stranger})


def test_a_holder_key_or_its_absence_is_remembered_for_a_while(tmp_path, monkeypatch):
    """A flood of puts naming the same unknown holder looks for its key files once per
    KEY_MEMORY, not once per put; a key added to the directory is found after that time."""
    from types import SimpleNamespace
    from gridrpc.errors import DataError
    from gridrpc.sed.data import fetch
    store = KeyStore(tmp_path / "k")
    store.create("sed-1", "element")
    f = fetch.Fetching()
    f.sed = SimpleNamespace(security=Security(keys=store, name="sed-1", role="element"))
    f._holder_keys = {}
    looked = []
    real = KeyStore.public
    monkeypatch.setattr(KeyStore, "public", lambda self, name, role: looked.append(name) or real(self, name, role))
    for _ in range(50):
        with pytest.raises(DataError, match="is not an element"):
            f._peer_options({"sed": "sed-7"})
    assert looked == ["sed-7", "sed"]               # its own key and its process's, once
    store.create("sed-7", "element")
    with pytest.raises(DataError):                  # still remembered as absent
        f._peer_options({"sed": "sed-7"})
    until, known = f._holder_keys["sed-7"]
    assert known is None and until > time.monotonic()
    f._holder_keys["sed-7"] = (time.monotonic() - 0.001, None)   # KEY_MEMORY has passed
    assert f._peer_options({"sed": "sed-7"})[zmq.CURVE_SERVERKEY] == store.public("sed-7", "element")
    monkeypatch.setattr(fetch, "MAX_KEYS_REMEMBERED", 3)
    for i in range(10):                            # bounded: the oldest names are forgotten
        with pytest.raises(DataError):
            f._peer_options({"sed": f"nobody-{i}"})
    assert len(f._holder_keys) <= 3
