"""The three drivers of the call machine against a scripted fake SeD: the
asyncio client (gridrpc.Client), the gevent client (GreenClient) and the
relay to a remote SeD (SeDLink, as the cloud and pilot back-ends use). Misbehaving servers: garbage replies, silence, a
batch SeD asking for patience; and every driver cancels what it gives up."""
from __future__ import annotations

import asyncio
import threading
import time

import orjson
import pytest
import zmq

import gridrpc
from gridrpc.core import messages as m
from gridrpc.core.messages import MsgType

pytestmark = pytest.mark.timeout(60)


class FakeSeD:
    """A ROUTER in a thread. ``script(header)`` returns what to answer a CALL:
    a list of ``(delay_s, frames)`` (frames without the route). PINGs are
    answered with ``pong_state`` unless it is None (a silent server); CANCELs
    are recorded and acknowledged."""

    def __init__(self, script, pong_state: str | None = "running", name: str = "fake") -> None:
        self.script, self.pong_state, self.name = script, pong_state, name
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self.received: list[dict] = []
        self._later: list[tuple[float, list]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    @property
    def target(self) -> str:
        return f"{self.address}#{self.name}"

    def of_type(self, t: str) -> list[dict]:
        return [h for h in list(self.received) if h.get("type") == t]

    def wait_for(self, pred, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, f"fake SeD: condition not met; received {self.received}"
            time.sleep(0.01)

    def _loop(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            due = [x for x in self._later if x[0] <= now]
            self._later = [x for x in self._later if x[0] > now]
            for _, frames in due:
                self.sock.send_multipart(frames)
            if not self.sock.poll(10):
                continue
            route, raw, *_ = self.sock.recv_multipart()
            h = orjson.loads(raw)
            self.received.append(h)
            if h["type"] == "call":
                for delay, frames in self.script(h):
                    self._later.append((time.monotonic() + delay, [route, *frames]))
            elif h["type"] == "ping" and self.pong_state is not None:
                states = {i: self.pong_state for i in h.get("ids", [])}
                self.sock.send_multipart([route, m.dumps(m.make(MsgType.PONG, h["id"], calls=states))])
            elif h["type"] == "cancel":
                self.sock.send_multipart([route, m.dumps(m.make(MsgType.CANCELLED, h["id"], state="running"))])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def fake(request):
    seds = []

    def make(script, **kw):
        s = FakeSeD(script, **kw)
        seds.append(s)
        return s
    yield make
    for s in seds:
        s.close()


def accepted(h, **extra):
    return [m.dumps(m.make(MsgType.ACCEPTED, h["id"], sed="fake", **extra))]


def result(h, value):
    return [m.dumps(m.make(MsgType.RESULT, h["id"], value=value, server="fake"))]




def garbage_header(h):
    return [(0, accepted(h)), (0.1, [b"\x00 not json"])]


def undecodable_result(h):
    # nested 600 deep: valid JSON (orjson parses 1024 levels), refused when read (over 255 levels)
    deep = b"[" * 600 + b"]" * 600
    raw = b'{"v":1,"type":"result","id":"%s","server":"fake","value":%s}' % (h["id"].encode(), deep)
    return [(0, accepted(h)), (0.1, [raw])]


def never_answers(h):
    return []


def accept_then_silence(h):
    return [(0, accepted(h))]


def patient_batch_sed(h):
    # a batch SeD restarting: it asked for 5 s of patience and answers after 1.5 s of silence
    return [(0, accepted(h, patience=5.0)), (1.5, result(h, 42))]


# -- garbage from the server: a clear error naming it, even without a timeout -------------------

@pytest.mark.parametrize("script,reason", [(garbage_header, "header is not valid JSON"),
                                           (undecodable_result, "nested deeper than 255 levels")])
def test_asyncio_client_fails_on_garbage_without_timeout(fake, script, reason):
    sed = fake(script)
    with gridrpc.Client(None, ping_interval=0.2) as c:
        call = c.submit("add", 1, 2, server=sed.target)
        with pytest.raises(gridrpc.ProtocolError) as exc:
            call.result(timeout=10)
    assert f"server fake ({sed.address}) sent a malformed reply" in str(exc.value) and reason in str(exc.value)
    sed.wait_for(lambda: [h["id"] for h in sed.of_type("cancel")] == [call.id])


@pytest.mark.parametrize("script", [garbage_header, undecodable_result])
def test_green_client_fails_on_garbage_without_timeout(fake, script):
    from gridrpc.loadtest.green import GreenClient
    sed = fake(script)
    with GreenClient(None, timeout=None, ping_interval=0.2) as c:
        t0 = time.monotonic()
        with pytest.raises(gridrpc.ProtocolError, match="server fake .* sent a malformed reply"):
            c.call("add", 1, 2, server=sed.target)
        assert time.monotonic() - t0 < 5


# -- patience ---------------------------------------------------------------------------------

def test_green_client_honours_patience(fake):
    from gridrpc.loadtest.green import GreenClient
    sed = fake(patient_batch_sed, pong_state=None)          # silent to pings meanwhile
    with GreenClient(None, ping_interval=0.2, ping_timeout=0.5) as c:
        assert c.call("add", 1, 2, server=sed.target) == 42
    assert sed.of_type("ping"), "the client kept pinging"
    assert not sed.of_type("cancel")


def test_asyncio_client_honours_patience(fake):
    sed = fake(patient_batch_sed, pong_state=None)
    with gridrpc.Client(None, ping_interval=0.2, ping_timeout=0.5) as c:
        assert c.call("add", 1, 2, server=sed.target) == 42


# -- every driver cancels what it gives up -----------------------------------------------------

def test_asyncio_client_cancels_on_timeout_before_accepted(fake):
    sed = fake(never_answers)
    with gridrpc.Client(None, ack_timeout=5.0) as c:
        call = c.submit("add", 1, 2, server=sed.target, timeout=0.3)
        with pytest.raises(gridrpc.Timeout, match="before fake accepted it"):
            call.result(timeout=5)
    sed.wait_for(lambda: [h["id"] for h in sed.of_type("cancel")] == [call.id])


def test_asyncio_client_cancels_a_silent_server(fake):
    sed = fake(accept_then_silence, pong_state=None)
    with gridrpc.Client(None, ping_interval=0.1, ping_timeout=0.4) as c:
        call = c.submit("add", 1, 2, server=sed.target)
        with pytest.raises(gridrpc.CommunicationError, match="stopped answering"):
            call.result(timeout=5)
    sed.wait_for(lambda: [h["id"] for h in sed.of_type("cancel")] == [call.id])


@pytest.mark.parametrize("script,kw,error", [
    (never_answers, {"timeout": 0.3}, gridrpc.Timeout),
    (never_answers, {"ack_timeout": 0.3}, gridrpc.CommunicationError),
    (accept_then_silence, {"ping_interval": 0.1, "ping_timeout": 0.4}, gridrpc.CommunicationError),
], ids=["deadline", "ack-timeout", "silent"])
def test_green_client_cancels_what_it_gives_up(fake, script, kw, error):
    from gridrpc.loadtest.green import GreenClient
    sed = fake(script, pong_state=None)
    with GreenClient(None, **kw) as c:
        with pytest.raises(error):
            c.call("add", 1, 2, server=sed.target)
    calls = [h["id"] for h in sed.of_type("call")]
    sed.wait_for(lambda: [h["id"] for h in sed.of_type("cancel")] == calls)


def test_green_client_killed_greenlet_cancels(fake):
    import gevent
    from gridrpc.loadtest.green import GreenClient
    sed = fake(accept_then_silence)
    with GreenClient(None) as c:
        g = gevent.spawn(c.call, "add", 1, 2, server=sed.target)
        gevent.sleep(0.2)
        g.kill()
        gevent.sleep(0.1)
    calls = [h["id"] for h in sed.of_type("call")]
    sed.wait_for(lambda: [h["id"] for h in sed.of_type("cancel")] == calls)


def _relay(sed, coro_fn):
    from gridrpc.sed.backends.relay import SeDLink

    async def main():
        link = SeDLink("fake", sed.address, ack_timeout=0.3, ping_interval=0.1, ping_timeout=0.4)
        try:
            return await coro_fn(link)
        finally:
            link.close()
    return asyncio.run(main())


@pytest.mark.parametrize("script", [never_answers, accept_then_silence], ids=["ack-timeout", "silent"])
def test_relay_cancels_what_it_gives_up(fake, script):
    from gridrpc.sed.backends.relay import RelayFailed
    sed = fake(script, pong_state=None)
    header = m.make(MsgType.CALL, "client-1", service="add", args=[1, 2], kwargs={}, user="u")

    async def go(link):
        with pytest.raises(RelayFailed):
            await link.run("client-1.1", header, [])
    _relay(sed, go)
    sed.wait_for(lambda: [h["id"] for h in sed.of_type("cancel")] == ["client-1.1"])


def test_relay_forwards_answers_unchanged(fake):
    def script(h):
        if h["args"] == [1, 2]:
            return [(0, accepted(h)), (0.05, result(h, 3) + [b"extra-frame"])]
        err = m.error_header(h["id"], "remote", "boom", type_="ValueError", server="fake")
        return [(0, [m.dumps(err)])]
    sed = fake(script)

    async def go(link):
        base = m.make(MsgType.CALL, "c", service="add", kwargs={}, user="u")
        mt, h, frames = await link.run("c.1", dict(base, args=[1, 2]), [])
        assert mt is MsgType.RESULT and h["value"] == 3 and h["id"] == "c.1" and bytes(frames[0]) == b"extra-frame"
        mt, h, frames = await link.run("c.2", dict(base, args=[0]), [])
        assert mt is MsgType.ERROR and h["error"]["message"] == "boom"
        task = asyncio.ensure_future(link.run("c.3", dict(base, args=[1, 2]), []))
        await asyncio.sleep(0.01)
        task.cancel()
        link.cancel("c.3")
        with pytest.raises(asyncio.CancelledError):
            await task
        return True
    assert _relay(sed, go)
    calls = [h for h in sed.of_type("call")]
    assert [h["id"] for h in calls] == ["c.1", "c.2", "c.3"] and all(h["sed"] == "fake" for h in calls)
    sed.wait_for(lambda: [h["id"] for h in sed.of_type("cancel")] == ["c.3"])


# -- options ----------------------------------------------------------------------------------

def test_option_typo_fails_before_any_thread_starts():
    from gridrpc.loadtest.green import GreenClient
    before = threading.active_count()
    with pytest.raises(TypeError, match=r"'timout' \(did you mean 'timeout'\?\)"):
        gridrpc.Client("tcp://127.0.0.1:1", timout=3)
    with pytest.raises(TypeError, match="'pingtimeout'"):
        gridrpc.AsyncClient("tcp://127.0.0.1:1", pingtimeout=3)
    with pytest.raises(TypeError, match="GreenClient.*'failovr'"):
        GreenClient("tcp://127.0.0.1:1", failovr=False)
    with pytest.raises(TypeError, match="ack_timeout"):
        gridrpc.Client("tcp://127.0.0.1:1", ack_timeout="5")
    with pytest.raises(ValueError, match="ping_interval"):
        gridrpc.Client("tcp://127.0.0.1:1", ping_interval=0)
    assert threading.active_count() == before


def test_client_options_shared_and_frozen():
    import dataclasses
    from gridrpc.grpc.config import CONFIG_KEYS
    from gridrpc.loadtest.green import GreenClient
    opts = gridrpc.ClientOptions(timeout=3.0, ack_timeout=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.timeout = 4                                                # type: ignore[misc]
    with pytest.raises(TypeError):
        gridrpc.ClientOptions(3.0)                                      # keyword-only
    with gridrpc.Client(None, options=opts, failover=False) as c:
        assert c.options == dataclasses.replace(opts, failover=False)
        assert c.aclient.timeout == 3.0 and c.aclient.ack_timeout == 1.0 and c.aclient.failover is False
    assert GreenClient(None).options.timeout == 60.0                   # its own default
    assert GreenClient(None, timeout=None).options.timeout is None
    assert GreenClient(None, options=opts).timeout == 3.0
    assert set(CONFIG_KEYS) - {"master_agent"} <= set(gridrpc.ClientOptions.names())
