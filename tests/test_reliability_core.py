"""Reliability rules in the pure cores (issue #15): the call machine's
discovery retries with backoff, transient vs permanent failures, execution
semantics (a non-idempotent call is never re-run by surprise), and the
master agent's "rebuilding" answer after a restart."""
from __future__ import annotations

import random
from dataclasses import dataclass

from gridrpc.core import messages as m
from gridrpc.core.agent.machine import AgentConfig, AgentState, MasterRole, Received, Send
from gridrpc.core.client_call.machine import (Accepted, CallMachine, CallPolicy, Discover, Discovered, DiscoveryFailed,
                                              Fail, FailOver, Phase, Pong, Result, SendCall, SendCancel, SendFailed,
                                              Start, Tick, Done, Error)
from gridrpc.core.ids import IdGenerator
from gridrpc.core.messages import MsgType
from gridrpc.errors import (NoServerAvailable, ServerLost, ServiceNotFound, Timeout, error_from_wire)


@dataclass(frozen=True)
class Srv:
    name: str
    address: str
    idempotent: bool = True


A, B = Srv("a", "tcp://a:1"), Srv("b", "tcp://b:1")
NA, NB = Srv("a", "tcp://a:1", False), Srv("b", "tcp://b:1", False)


def disc(deadline=None, **policy) -> CallMachine:
    policy.setdefault("backoff_jitter", 0.0)            # exact delays, except in the jitter test
    return CallMachine("svc", (), policy=CallPolicy(**policy), deadline=deadline, new_id=IdGenerator("t-"),
                       discover=True)


def exc(a: Fail):
    return error_from_wire(a.error.to_wire(), server=a.error.server)


def run_until_discover(mc, now):
    """Tick at the machine's wakeups until it asks to discover again."""
    for _ in range(100):
        w = mc.next_wakeup()
        assert w is not None
        now = max(now, w)
        acts = mc.handle(Tick(), now)
        if acts:
            return acts, now
    raise AssertionError("never discovered again")


# -- discovery retries -----------------------------------------------------------------

def test_start_discovers_then_calls_the_first_candidate():
    mc = disc()
    assert mc.handle(Start(), 0.0) == [Discover(1, None)] and mc.phase is Phase.DISCOVERING
    assert mc.handle(Discovered([A, B]), 0.1) == [SendCall("t-1", "a", "tcp://a:1")]
    assert mc.handle(Result("t-1", 5), 0.2)[0] == Done(5, "a", {})


def test_rebuilding_and_unreachable_ma_are_retried_with_backoff_within_the_deadline():
    mc = disc(deadline=10.0)
    mc.handle(Start(), 0.0)
    assert mc.handle(DiscoveryFailed("rebuilding", "MA rebuilding"), 0.01) == []
    assert mc.phase is Phase.BACKOFF and abs(mc.next_wakeup() - 0.06) < 1e-9       # 50 ms
    acts, now = run_until_discover(mc, 0.01)
    assert acts == [Discover(2, 10.0 - now)]
    mc.handle(DiscoveryFailed("communication", "no MA answered"), now)
    acts, now2 = run_until_discover(mc, now)
    assert abs((now2 - now) - 0.1) < 1e-9                                         # doubled
    assert mc.handle(Discovered([A]), now2) == [SendCall("t-1", "a", "tcp://a:1")]


def test_backoff_is_capped_and_the_deadline_ends_retries_with_a_timeout_naming_the_cause():
    mc = disc(deadline=5.0)
    mc.handle(Start(), 0.0)
    now, delays = 0.0, []
    while True:
        acts = mc.handle(DiscoveryFailed("rebuilding", "MA X rebuilding"), now)
        if acts:
            break
        before = now
        acts, now = run_until_discover(mc, now)
        delays.append(now - before)
    assert max(delays) <= 1.0 + 1e-9 and now < 5.0
    (fail,) = acts
    e = exc(fail)
    assert isinstance(e, Timeout) and "MA X rebuilding" in str(e)


def test_backoff_jitter_spreads_clients_that_failed_together():
    """Many clients meet a rebuilding MA at the same instant: their retries
    are spread over [d (1 - jitter), d], not synchronized."""
    retry_at = []
    for _ in range(50):
        mc = disc(backoff_jitter=0.5)
        mc.handle(Start(), 0.0)
        assert mc.handle(DiscoveryFailed("rebuilding", "MA rebuilding"), 0.0) == []
        retry_at.append(mc.next_wakeup())
    assert all(0.025 - 1e-9 <= t <= 0.05 + 1e-9 for t in retry_at)
    assert len({round(t, 6) for t in retry_at}) > 10


def test_without_deadline_the_retry_window_bounds_retries():
    mc = disc(retry_timeout=0.5)
    mc.handle(Start(), 0.0)
    now = 0.0
    for _ in range(50):
        acts = mc.handle(DiscoveryFailed("no_server", "nobody answered"), now)
        if acts:
            break
        _, now = run_until_discover(mc, now)
    assert isinstance(exc(acts[0]), NoServerAvailable) and now <= 0.5


def test_permanent_failures_are_not_retried():
    for kind, cls in (("service_not_found", ServiceNotFound), ("invalid_argument", Exception),
                      ("unauthorized", Exception)):
        mc = disc(deadline=10.0)
        mc.handle(Start(), 0.0)
        (fail,) = mc.handle(DiscoveryFailed(kind, "no"), 0.1)
        assert isinstance(exc(fail), cls) and mc.discoveries == 1


def test_every_candidate_lost_before_start_rediscovers_without_the_failed_ones():
    mc = disc(deadline=30.0)
    mc.handle(Start(), 0.0)
    mc.handle(Discovered([A]), 0.0)
    assert mc.handle(SendFailed("gone"), 0.1) == []                     # not a failure: retry
    acts, now = run_until_discover(mc, 0.1)
    assert isinstance(acts[0], Discover)
    # the MA still lists the dead server for a few seconds: it is skipped
    assert mc.handle(Discovered([A, B]), now) == [SendCall("t-2", "b", "tcp://b:1")]


# -- execution semantics ---------------------------------------------------------------

def test_idempotent_call_lost_while_running_is_rerun_elsewhere():
    mc = CallMachine("svc", [A, B], policy=CallPolicy(), new_id=IdGenerator("t-"))
    mc.handle(Start(), 0.0)
    mc.handle(Accepted("t-1", state="running"), 0.1)
    acts = mc.handle(Tick(), 10.0)
    assert [type(a) for a in acts] == [SendCancel, FailOver, SendCall]


def test_non_idempotent_call_lost_while_running_raises_server_lost():
    mc = CallMachine("svc", [NA, NB], policy=CallPolicy(), new_id=IdGenerator("t-"))
    mc.handle(Start(), 0.0)
    mc.handle(Accepted("t-1", idempotent=False, state="queued"), 0.1)
    mc.handle(Pong("t-1", "running"), 0.5)
    acts = mc.handle(Tick(), 10.0)
    assert [type(a) for a in acts] == [SendCancel, Fail]
    e = exc(acts[1])
    assert isinstance(e, ServerLost) and e.server == "a" and e.call_id == "t-1" and "t-1" in str(e)


def test_non_idempotent_call_still_queued_moves_safely():
    mc = CallMachine("svc", [NA, NB], policy=CallPolicy(), new_id=IdGenerator("t-"))
    mc.handle(Start(), 0.0)
    mc.handle(Accepted("t-1", idempotent=False, state="queued"), 0.1)
    mc.handle(Pong("t-1", "queued"), 0.5)
    acts = mc.handle(Tick(), 10.0)
    assert [type(a) for a in acts] == [SendCancel, FailOver, SendCall]


def test_non_idempotent_unknown_state_is_treated_as_started():
    # the CALL left, no answer at all: it may be running there
    mc = CallMachine("svc", [NA, NB], policy=CallPolicy(), new_id=IdGenerator("t-"))
    mc.handle(Start(), 0.0)
    acts = mc.handle(Tick(), 6.0)                       # ack timeout
    assert isinstance(exc(acts[-1]), ServerLost)
    # never sent at all: safe
    mc = CallMachine("svc", [NA, NB], policy=CallPolicy(), new_id=IdGenerator("t-"))
    mc.handle(Start(), 0.0)
    assert [type(a) for a in mc.handle(SendFailed("x"), 0.0)] == [FailOver, SendCall]


def test_running_never_goes_back_to_queued():
    mc = CallMachine("svc", [NA, NB], policy=CallPolicy(), new_id=IdGenerator("t-"))
    mc.handle(Start(), 0.0)
    mc.handle(Pong("t-1", "running"), 0.05)             # the unasked PONG may come before ACCEPTED
    mc.handle(Accepted("t-1", idempotent=False, state="queued"), 0.1)
    assert mc.server_state == "running"


# -- the master agent after a restart ------------------------------------------------------

def test_restarted_ma_says_rebuilding_then_service_not_found():
    s = AgentState(AgentConfig(name="MA", hb_interval=1.0, hb_timeout=3.0), MasterRole(), random.Random(0))
    peer = b"client"

    def ask(now):
        mt, h = m.parse_header(m.dumps(m.make(MsgType.DISCOVER, "d", service="nope", k=1)))
        (send,) = s.handle(Received(peer, mt, h), now)
        assert isinstance(send, Send)
        return send.header["error"]["kind"]

    assert ask(100.0) == "rebuilding"
    assert ask(103.9) == "rebuilding"                   # hb_timeout + hb_interval after the first event
    assert ask(104.1) == "service_not_found"


def test_unavailable_moves_even_a_running_non_idempotent_call_then_fails_without_rediscovery():
    """``unavailable``: the server cannot run the call at all and says it never
    started there (a cloud SeD whose image does not exist)."""
    err = {"kind": "unavailable", "type": "CloudUnavailable", "message": "cloud SeD a: unknown image ami-1",
           "traceback": ""}
    mc = disc()
    mc.handle(Start(), 0.0)
    mc.handle(Discovered([NA, NB]), 0.1)
    mc.handle(Accepted("t-1", idempotent=False, state="running"), 0.2)
    acts = mc.handle(Error("t-1", err, server="a"), 0.3)
    assert [type(a) for a in acts] == [FailOver, SendCall]           # no CANCEL: it answered
    # the last candidate: the call fails at once with that error, no new discovery, no backoff
    acts = mc.handle(Error("t-2", dict(err, message="cloud SeD b: unknown image ami-2"), server="b"), 0.4)
    assert [type(a) for a in acts] == [Fail] and mc.finished
    e = exc(acts[0])
    assert isinstance(e, NoServerAvailable) and "ami-2" in str(e)
