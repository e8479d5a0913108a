"""The client's data requests (put, get, free) take a bulk session under CURVE
(gridrpc.transport.bulk), as calls do: real daemons, ``--secure``.

What the session carried is read from the data client's own counters (the
messages and bytes sealed through it), never from timing; values round-trip
intact; another user, through a session of her own, still cannot read or free
the reference; plain mode has no bulk path."""
from __future__ import annotations

import numpy as np
import psutil
import pytest

import gridrpc
from gridrpc.testing import wait_for
from tests.security_site import Site, listening_ports

MB = 1 << 20


def _data_bulk(c: gridrpc.Client):
    return c._aclient.data.bulk


def test_put_and_get_go_through_the_bulk_session(secure_site):
    site = secure_site
    before = listening_ports(site.sed.pid)
    a = np.random.default_rng(0).random(MB)                      # 8 MB
    with site.client("alice") as c:
        stats = _data_bulk(c).stats
        assert stats["sent"] == 0
        ref = c.put(a, server="sed-1")                 # the first request to that SeD: asked for the session first
        assert stats["sent"] == 1 and stats["sent_bytes"] >= a.nbytes    # the 8 MB went sealed
        s1 = dict(stats)
        back = c.get(ref)
        assert back.dtype == a.dtype and np.array_equal(back, a)
        assert stats["received"] > s1["received"] and stats["received_bytes"] - s1["received_bytes"] >= a.nbytes
        s2 = dict(stats)
        c.free(ref)
        assert stats["sent"] > s2["sent"]                              # small requests too, once it works
        with pytest.raises(gridrpc.DataLost):
            c.get(ref)
        # several sizes, a value of other types beside the array
        for value in (np.arange(3_000_000, dtype=np.int32), {"x": np.ones(100_000), "tag": "t"}, b"z" * (2 * MB)):
            r = c.put(value, server="sed-1")
            got = c.get(r)
            if isinstance(value, dict):
                assert got["tag"] == "t" and np.array_equal(got["x"], value["x"])
            elif isinstance(value, bytes):
                assert got == value
            else:
                assert np.array_equal(got, value)
        # the calls' own sessions are untouched by data: the data client opened its own
        assert c._aclient._bulk.stats["sent"] == 0
        bulk = listening_ports(site.sed.pid) - before
        assert len(bulk) == 1
        port = bulk.pop()
        mine = [x for x in psutil.Process().net_connections("tcp") if x.raddr and x.raddr.port == port]
        assert mine and all(x.status == psutil.CONN_ESTABLISHED for x in mine)


def test_a_large_reference_is_read_sealed_the_first_time(secure_site):
    """A client that only reads (another client of the same user): the reference says its size,
    so the session is asked for before the first get, whose value comes sealed."""
    a = np.random.default_rng(3).random(MB)
    with secure_site.client("alice") as writer, secure_site.client("alice") as reader:
        ref = writer.put(a, server="sed-1")
        stats = _data_bulk(reader).stats
        assert np.array_equal(reader.get(ref), a)
        assert stats["received"] == 1 and stats["received_bytes"] >= a.nbytes and stats["sent_bytes"] < MB


def test_a_large_answer_of_unknown_size_opens_the_session(secure_site):
    """A reference that does not say its size (as the reference to an unfinished call passed as
    another call's argument): the first large value a get brings back comes over CURVE and asks
    for the session; later ones come sealed."""
    a = np.random.default_rng(4).random(MB)
    with secure_site.client("alice") as writer, secure_site.client("alice") as reader:
        ref = writer.put(a, server="sed-1")
        bare = gridrpc.DataRef(reader._aclient, {k: v for k, v in ref._desc.items() if k != "size"})
        stats = _data_bulk(reader).stats

        def sealed():
            assert np.array_equal(reader.get(bare), a)
            return stats["received_bytes"] >= a.nbytes
        wait_for(sealed, 20, "a get's answer comes through the reader's session")
        assert stats["received"] >= 1 and stats["sent_bytes"] < MB


def test_another_user_through_her_own_session_cannot_get_nor_free_the_ref(secure_site):
    site = secure_site
    a = np.random.default_rng(1).random(MB)
    with site.client("alice") as alice, site.client("mallory") as mallory:
        ref = alice.put(a, server="sed-1")
        mallory.free(mallory.put(np.ones(MB // 2), server="sed-1"))     # 4 MB: her session opens first
        stats = _data_bulk(mallory).stats
        assert stats["sent"] >= 1
        s0 = dict(stats)
        with pytest.raises(gridrpc.DataAccessDenied):
            mallory.get(ref)
        assert stats["sent"] > s0["sent"]                       # the refused request went through her session
        mallory._aclient.user = "alice"                         # a forged name in the header changes nothing
        with pytest.raises(gridrpc.DataAccessDenied):
            mallory.get(ref)
        with pytest.raises(gridrpc.DataAccessDenied):
            mallory.free(ref)
        assert stats["received_bytes"] - s0["received_bytes"] < MB          # none of alice's bytes came back
        assert np.array_equal(alice.get(ref), a)                # still alice's, intact


def test_plain_mode_data_has_no_bulk_path(tmp_path):
    site = Site(tmp_path, False)
    try:
        before = listening_ports(site.sed.pid)
        with site.client("alice") as c:
            a = np.random.default_rng(2).random(MB)
            for _ in range(3):
                ref = c.put(a, server="sed-1")
                assert np.array_equal(c.get(ref), a)
                c.free(ref)
            assert _data_bulk(c) is None and not c._aclient.secure
        assert listening_ports(site.sed.pid) == before
    finally:
        site.close()


def test_large_reads_at_once_all_wait_for_the_one_session(secure_site):
    """Three large gets started together by a client with no session yet: the first asks for
    it, the others wait for that same session; all three values come sealed."""
    import asyncio
    a = np.random.default_rng(5).random(MB)
    with secure_site.client("alice") as writer, secure_site.client("alice") as reader:
        refs = [gridrpc.DataRef(reader._aclient, writer.put(a, server="sed-1")._desc) for _ in range(3)]
        stats = _data_bulk(reader).stats

        async def all_three():
            return await asyncio.gather(*(r.aget() for r in refs))
        for got in reader._run(all_three()):
            assert np.array_equal(got, a)
        assert stats["received_bytes"] >= 3 * a.nbytes        # every value came sealed
