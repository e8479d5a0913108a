"""The data request machine (gridrpc.core.data_request): pure, on a fake clock.

Each transition on its own (send, ping, give up on silence or timeout, next
holder, done, failed), then invariants over random event sequences
(hypothesis); last, its runtime (gridrpc.runtime.data_request) over fake
channels: pings on the wire, channels released, nothing left pending."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gridrpc.core import messages as m
from gridrpc.core.data_request import (Answer, DataRequest, Done, Failed, GiveUp, Ping, Send, Start, Tick,
                                       Unreachable, poll_interval)
from gridrpc.core.ids import IdGenerator
from gridrpc.core.messages import MsgType
from gridrpc.errors import CommunicationError, DataError
from gridrpc.runtime.data_request import DataRequests

H = [("a", "tcp://a:1"), ("b", "tcp://b:1"), ("c", "tcp://c:1")]
LOST = {"kind": "data_lost", "type": "DataLost", "message": "gone from a"}
DENIED = {"kind": "data_denied", "type": "DataAccessDenied", "message": "not yours"}


def request(holders=H, *, timeout=10.0, silence=3.0, retry=None) -> DataRequest:
    return DataRequest(holders, timeout=timeout, silence=silence, new_id=IdGenerator("q-"), retry=retry)


def started(**kw) -> tuple[DataRequest, Send]:
    r = request(**kw)
    (send,) = r.handle(Start(), 0.0)
    return r, send


def test_start_sends_to_the_first_holder_and_its_answer_is_done():
    r, send = started()
    assert send == Send("q-1", "a", "tcp://a:1") and r.current == ("q-1", "a", "tcp://a:1")
    assert r.next_wakeup() == poll_interval(3.0) == 1.0
    assert r.handle(Answer("q-1"), 0.2) == [Done("q-1", "a", "tcp://a:1")]
    assert r.finished and r.next_wakeup() is None
    assert r.handle(Tick(), 50.0) == [] and r.handle(Answer("q-1"), 51.0) == [] and r.handle(Start(), 52.0) == []


def test_a_silent_holder_is_pinged_then_given_up_and_the_next_one_asked():
    r, _ = started(silence=3.0)
    assert r.handle(Tick(), 0.5) == []                                   # not due yet
    assert r.handle(Tick(), 1.0) == [Ping("q-2", "tcp://a:1")]
    assert r.next_wakeup() == 2.0
    assert r.handle(Tick(), 2.0) == [Ping("q-3", "tcp://a:1")]
    assert r.handle(Tick(), 3.0) == [Ping("q-4", "tcp://a:1")]              # 3.0 - 0.0 is not over 3 s
    out = r.handle(Tick(), 4.0)
    assert out == [GiveUp("q-1", "a", "tcp://a:1", "silent for 3.0s"), Send("q-5", "b", "tcp://b:1")]
    assert r.next_wakeup() == 5.0                                        # the new holder's own clock
    assert r.handle(Answer("q-1"), 4.1) == []                            # the first holder's late answer
    assert r.handle(Answer("q-5"), 4.2) == [Done("q-5", "b", "tcp://b:1")]


def test_a_holder_heard_from_stays_until_the_timeout():
    r, _ = started(timeout=5.0, silence=3.0)
    now, out = 0.0, []
    while not out or type(out[0]) is Ping:
        now += 1.0
        out = r.handle(Tick(heard=now - 0.1), now)       # answers every ping: alive, but slow
    assert now == 6.0
    assert out[0] == GiveUp("q-1", "a", "tcp://a:1", "did not answer within 5s")
    assert type(out[1]) is Send and out[1].name == "b"


def test_a_sign_of_life_before_the_request_does_not_count():
    r2 = request(silence=3.0)
    r2.handle(Start(), 10.0)
    for t in (11.0, 12.0, 13.0):
        assert type(r2.handle(Tick(heard=9.0), t)[0]) is Ping     # heard before it was sent
    assert type(r2.handle(Tick(heard=9.0), 14.0)[0]) is GiveUp


def test_error_answers_give_way_to_the_next_holder_only_when_retry_says_so():
    retry = lambda err: err["kind"] == "data_lost"       # noqa: E731
    r, _ = started(retry=retry)
    out = r.handle(Answer("q-1", LOST), 0.1)
    assert out == [GiveUp("q-1", "a", "tcp://a:1", "gone from a", LOST), Send("q-2", "b", "tcp://b:1")]
    out = r.handle(Answer("q-2", DENIED), 0.2)
    assert out == [Failed((GiveUp("q-1", "a", "tcp://a:1", "gone from a", LOST),), DENIED, "b")]
    assert r.finished
    # by default an error answer is final
    r, _ = started()
    assert r.handle(Answer("q-1", LOST), 0.1) == [Failed((), LOST, "a")]


def test_every_holder_given_up_fails_listing_them_in_order():
    r = request([("a", "tcp://a:1"), ("nowhere", ""), ("c", "tcp://c:1")], retry=lambda err: True)
    assert r.handle(Start(), 0.0) == [Send("q-1", "a", "tcp://a:1")]
    out = r.handle(Unreachable("q-1", "cannot connect"), 0.1)
    ga = GiveUp("q-1", "a", "tcp://a:1", "cannot connect")
    gn = GiveUp("", "nowhere", "", "no address")
    assert out == [ga, gn, Send("q-2", "c", "tcp://c:1")]
    assert r.handle(Unreachable("q-1", "late"), 0.2) == []              # not the current request
    gc = GiveUp("q-2", "c", "tcp://c:1", "gone from a", LOST)
    assert r.handle(Answer("q-2", LOST), 0.3) == [gc, Failed((ga, gn, gc))]
    assert r.finished and r.current[0] == ""


def test_no_holder_at_all_fails_at_once():
    r = request([])
    assert r.handle(Start(), 0.0) == [Failed(())] and r.finished


def test_bad_settings_and_events_are_refused():
    with pytest.raises(ValueError):
        request(timeout=0.0)
    with pytest.raises(ValueError):
        request(silence=-1.0)
    r, _ = started()
    with pytest.raises(TypeError):
        r.handle("tick", 1.0)


EVENTS = st.lists(st.tuples(st.sampled_from(["tick", "heard", "answer", "lost", "denied", "unreachable", "old"]),
                            st.floats(0.0, 2.5)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(EVENTS, st.integers(0, 3))
def test_invariants_over_random_events(events, n):
    """At most one Done/Failed, always last; each holder is sent to at most
    once, in order, under a fresh id; every Send but the last is given up;
    a request ticked at its wake-ups always ends."""
    r = request(H[:n], timeout=4.0, silence=2.0, retry=lambda err: err["kind"] == "data_lost")
    now, out = 0.0, list(r.handle(Start(), 0.0))
    for kind, dt in events:
        now += dt
        rid = r.current[0]
        ev = {"tick": Tick(), "heard": Tick(heard=now), "answer": Answer(rid), "lost": Answer(rid, LOST),
              "denied": Answer(rid, DENIED), "unreachable": Unreachable(rid, "x"), "old": Answer("q-0")}[kind]
        out += r.handle(ev, now)
    events_end = now
    while not r.finished:                                   # the clock alone ends it
        now = max(now, r.next_wakeup())
        out += r.handle(Tick(), now)
    ends = [a for a in out if type(a) in (Done, Failed)]
    assert len(ends) == 1 and out[-1] is ends[0]
    sends = [a for a in out if type(a) is Send]
    assert [s.name for s in sends] == [h[0] for h in H[:n]][:len(sends)]
    ids = [a.id for a in out if type(a) in (Send, Ping)]
    assert len(ids) == len(set(ids))
    given_up = {g.id for g in out if type(g) is GiveUp}
    assert all(s.id in given_up for s in sends[:-1])
    if type(ends[0]) is Done:
        assert ends[0].id == sends[-1].id
    assert now <= events_end + n * (2.0 + poll_interval(2.0)) + 1e-9


# -- the runtime over fake channels --------------------------------------------------------------------
class FakeChannel:
    def __init__(self, address: str, sent: list, fail: bool = False) -> None:
        self.address, self.sent, self.fail, self.closed = address, sent, fail, False

    def send(self, frames) -> None:
        if self.fail:
            raise CommunicationError(f"cannot send to {self.address}")
        self.sent.append((self.address, m.parse_header(frames[0])[1]))


class FakeLinks:
    def __init__(self, unreachable=(), refused=()) -> None:
        self.sent: list = []
        self.unreachable, self.refused = set(unreachable), set(refused)
        self.busy: dict[str, int] = {}

    async def holder_channel(self, name, address, header):
        if address in self.refused:
            raise DataError(f"{address} refused")
        self.busy[address] = self.busy.get(address, 0) + 1
        return FakeChannel(address, self.sent, address in self.unreachable)

    def holder_done(self, address):
        self.busy[address] -= 1


def frame(header: dict) -> SimpleNamespace:
    raw = m.dumps(header)
    return SimpleNamespace(bytes=raw, buffer=memoryview(raw))


def header_for(send):
    return m.make(MsgType.DATA_GET, send.id, ref="r1", user="u", wait=0.0, call=False), ()


async def _answer_when_sent(reqs: DataRequests, links: FakeLinks, address: str, error: dict | None = None):
    while not any(a == address and h["type"] == "data_get" for a, h in links.sent):
        await asyncio.sleep(0.005)
    h = next(h for a, h in links.sent if a == address and h["type"] == "data_get")
    reply = m.error_header(h["id"], error["kind"], error["message"]) if error else m.make(MsgType.DATA, h["id"],
                                                                                            ref="r1")
    reqs.on_message(address, [frame(reply)])


def test_runtime_pings_a_silent_holder_gives_it_up_and_takes_the_next_answer():
    async def go():
        reqs, links = DataRequests(), FakeLinks(unreachable={"tcp://b:1"})
        req = DataRequest(H, timeout=5.0, silence=0.3, new_id=IdGenerator("q-"))
        answering = asyncio.ensure_future(_answer_when_sent(reqs, links, "tcp://c:1"))
        end, reply = await asyncio.wait_for(reqs.run(req, links, header_for), 5)
        await answering
        return reqs, links, end, reply
    reqs, links, end, reply = asyncio.run(go())
    assert type(end) is Done and end.name == "c" and reply[0] is MsgType.DATA
    kinds = [(a, h["type"]) for a, h in links.sent]
    assert kinds[0] == ("tcp://a:1", "data_get") and ("tcp://a:1", "ping") in kinds        # a: silent, pinged
    assert all(p["ids"] == [] for _, p in links.sent if p["type"] == "ping")
    assert "tcp://b:1" not in {a for a, _ in links.sent}                                  # b: could not send
    assert links.busy == {"tcp://a:1": 0, "tcp://b:1": 0, "tcp://c:1": 0}                 # each released once
    assert reqs.in_flight == 0


def test_runtime_final_error_and_refused_holder():
    async def go():
        reqs, links = DataRequests(), FakeLinks()
        req = DataRequest(H, timeout=5.0, silence=1.0, new_id=IdGenerator("q-"))
        answering = asyncio.ensure_future(_answer_when_sent(reqs, links, "tcp://a:1", DENIED))
        end, reply = await asyncio.wait_for(reqs.run(req, links, header_for), 5)
        await answering
        assert type(end) is Failed and end.error["kind"] == "data_denied" and reply is None
        assert links.busy == {"tcp://a:1": 0} and reqs.in_flight == 0
        refusing = FakeLinks(refused={"tcp://a:1"})
        with pytest.raises(DataError, match="refused"):        # not a CommunicationError: ends the request
            await reqs.run(DataRequest(H, timeout=5.0, silence=1.0, new_id=IdGenerator("p-")), refusing,
                           header_for)
        assert refusing.busy == {} and reqs.in_flight == 0
    asyncio.run(go())
