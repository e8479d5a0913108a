"""The call machine (gridrpc.core.client_call.machine): pure, on a fake clock.

Each rule of the protocol on its own, then invariants over random event
sequences (hypothesis): at most one Done/Fail, every server given up on
receives a CANCEL, a machine ticked at its wakeups always ends."""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gridrpc.core.client_call.machine import (Abort, Accepted, Cancel, CancelAck, CallMachine, CallPolicy, CallSent,
                                              Discover, Discovered, Done, Error, Fail, FailOver, Malformed, Phase, Pong,
                                              Result, SendCall, SendCancel, SendFailed, SendPing, Start, Tick)
from gridrpc.core.ids import IdGenerator
from gridrpc.core.messages import valid_id
from gridrpc.errors import (CallCancelled, CommunicationError, NoServerAvailable, ProtocolError, RemoteError,
                            Timeout, error_from_wire)


@dataclass(frozen=True)
class Srv:
    name: str
    address: str


SERVERS = [Srv("a", "tcp://a:1"), Srv("b", "tcp://b:1"), Srv("c", "tcp://c:1")]


def machine(n: int = 2, *, deadline: float | None = None, **policy) -> CallMachine:
    return CallMachine("add", SERVERS[:n], policy=CallPolicy(**policy), deadline=deadline,
                       new_id=IdGenerator("t-"))


def started(n: int = 2, now: float = 0.0, **kw) -> tuple[CallMachine, list]:
    mc = machine(n, **kw)
    return mc, mc.handle(Start(), now)


def exc(action: Fail):
    return error_from_wire(action.error.to_wire(), server=action.error.server)


# -- one rule at a time -------------------------------------------------------------------------

def test_happy_path_and_nothing_after_done():
    mc, acts = started()
    assert acts == [SendCall("t-1", "a", "tcp://a:1")] and mc.phase is Phase.WAITING
    assert mc.next_wakeup() == 5.0                               # ack_timeout
    assert mc.handle(Accepted("t-1"), 0.01) == [] and mc.phase is Phase.RUNNING
    acts = mc.handle(Result("t-1", 3, {"started": 1.0}, "a"), 0.02)
    assert acts == [Done(3, "a", {"started": 1.0})] and mc.finished
    for ev in (Tick(), Cancel(), Abort("communication", "x"), Result("t-1", 4), Malformed("x")):
        assert mc.handle(ev, 9.0) == []
    assert mc.next_wakeup() is None


def test_result_without_accepted():
    mc, _ = started()
    assert mc.handle(Result("t-1", 7), 0.1) == [Done(7, "a", {})]


def test_ack_timeout_cancels_and_fails_over_then_exhausts():
    mc, _ = started(2)
    assert mc.handle(Tick(), 4.9) == []
    acts = mc.handle(Tick(), 5.0)
    assert acts == [SendCancel("t-1", "a", "tcp://a:1"), FailOver("t-1", "a", "no answer within 5.0s", "b"),
                    SendCall("t-2", "b", "tcp://b:1")]
    acts = mc.handle(Tick(), 10.0)
    assert acts[0] == SendCancel("t-2", "b", "tcp://b:1") and type(acts[1]) is Fail
    e = exc(acts[1])
    assert type(e) is CommunicationError
    assert str(e) == "no candidate server could run add: a: no answer within 5.0s; b: no answer within 5.0s"
    assert mc.attempts == ["t-1", "t-2"]


def test_call_sent_restarts_the_ack_clock():
    mc, _ = started(1)
    mc.handle(CallSent(), 2.0)
    assert mc.next_wakeup() == 7.0 and mc.handle(Tick(), 5.0) == []


def test_no_failover_uses_the_first_candidate_only():
    mc, _ = started(3, failover=False)
    acts = mc.handle(Tick(), 5.0)
    assert [type(a) for a in acts] == [SendCancel, Fail]


def test_send_failed_fails_over_without_cancel():
    mc, _ = started(2)
    acts = mc.handle(SendFailed("peer gone"), 0.0)
    assert acts == [FailOver("t-1", "a", "peer gone", "b"), SendCall("t-2", "b", "tcp://b:1")]
    acts = mc.handle(SendFailed("peer gone"), 0.0)
    assert [type(a) for a in acts] == [Fail] and "a: peer gone; b: peer gone" in acts[0].error.message


def test_no_candidates():
    mc, acts = started(0)
    assert type(exc(acts[0])) is NoServerAvailable and str(exc(acts[0])) == "no server available for 'add'"


@pytest.mark.parametrize("kind,cls", [("no_server", NoServerAvailable), ("service_not_found", None)])
def test_server_refusal_while_waiting_fails_over_then_is_raised(kind, cls):
    mc, _ = started(2)
    err = {"kind": kind, "type": kind, "message": "not here", "traceback": ""}
    acts = mc.handle(Error("t-1", err), 0.1)
    assert [type(a) for a in acts] == [FailOver, SendCall]          # no CANCEL: the server answered
    acts = mc.handle(Error("t-2", err), 0.2)
    assert [type(a) for a in acts] == [Fail] and acts[0].error.from_server and acts[0].error.kind == kind
    assert str(exc(acts[0])) == "not here"


def test_remote_error_is_final_and_keeps_the_wire_error():
    mc, _ = started(2)
    mc.handle(Accepted("t-1"), 0.1)
    err = {"kind": "remote", "type": "ValueError", "message": "boom", "traceback": "tb"}
    acts = mc.handle(Error("t-1", err, {"started": 1}, "a", reply="raw"), 0.2)
    e = exc(acts[0])
    assert type(e) is RemoteError and e.remote_type == "ValueError" and e.server == "a"
    assert acts[0].error.reply == "raw" and acts[0].error.timing == {"started": 1}


def test_pings_on_the_grid_and_silence_fails_over_with_cancel():
    mc, _ = started(2, ping_interval=1.0, ping_timeout=4.0)
    mc.handle(Accepted("t-1"), 0.05)
    assert mc.next_wakeup() == 1.0
    assert mc.handle(Tick(), 1.0) == [SendPing("t-1", "a", "tcp://a:1")]
    assert mc.next_wakeup() == 2.0
    mc.handle(Pong("t-1", "running"), 1.01)
    assert mc.handle(Tick(), 2.0) == [SendPing("t-1", "a", "tcp://a:1")]       # silent 0.99 s: ask
    for t in (3.0, 4.0, 5.0):
        assert mc.handle(Tick(), t) == [SendPing("t-1", "a", "tcp://a:1")]
    acts = mc.handle(Tick(), 6.0)                                              # silent 4.99 s > 4
    assert acts[:2] == [SendCancel("t-1", "a", "tcp://a:1"), FailOver("t-1", "a", "silent for 5.0s", "b")]


def test_two_calls_wake_together():
    m1, _ = started(1, ping_interval=0.5)
    m2, _ = started(1, now=0.3, ping_interval=0.5)
    m1.handle(Accepted("t-1"), 0.11)
    m2.handle(Accepted("t-1"), 0.37)
    assert m1.next_wakeup() == m2.next_wakeup() == 0.5


def test_silence_on_the_last_server_is_a_communication_error():
    mc, _ = started(1, ping_timeout=2.0)
    mc.handle(Accepted("t-1"), 0.0)
    acts = mc.handle(Tick(), 3.0)
    assert acts[0] == SendCancel("t-1", "a", "tcp://a:1")
    e = exc(acts[1])
    assert type(e) is CommunicationError and str(e) == "server a (tcp://a:1) stopped answering for 3.0s"


def test_patience_of_accepted():
    mc, _ = started(1, ping_timeout=2.0)
    mc.handle(Accepted("t-1", patience=30), 0.0)
    assert mc.handle(Tick(), 29.0) == [SendPing("t-1", "a", "tcp://a:1")]
    assert type(mc.handle(Tick(), 31.0)[-1]) is Fail
    for bad in (True, float("nan"), -3, "30", None):
        mc, _ = started(1, ping_timeout=2.0)
        mc.handle(Accepted("t-1", patience=bad), 0.0)
        assert mc.patience == 0.0 and type(mc.handle(Tick(), 3.0)[-1]) is Fail
    mc, _ = started(1, max_patience=10.0)
    mc.handle(Accepted("t-1", patience=1e9), 0.0)
    assert mc.patience == 10.0


def test_pong_unknown_fails_over_without_cancel():
    mc, _ = started(2)
    mc.handle(Accepted("t-1"), 0.0)
    acts = mc.handle(Pong("t-1", "unknown"), 1.0)
    assert [type(a) for a in acts] == [FailOver, SendCall]
    mc.handle(Accepted("t-2"), 1.1)
    acts = mc.handle(Pong("t-2", "unknown"), 2.0)
    assert str(exc(acts[0])) == "b lost call t-2 (restarted?)"


def test_pong_unknown_before_accepted_is_not_a_loss():
    mc, _ = started(1)
    assert mc.handle(Pong("t-1", "unknown"), 0.5) == [] and mc.phase is Phase.WAITING


def test_pong_done_without_result_asks_again_under_the_same_id():
    mc, _ = started(1)
    mc.handle(Accepted("t-1"), 0.0)
    assert mc.handle(Pong("t-1", "done"), 1.0) == [SendCall("t-1", "a", "tcp://a:1")]
    assert mc.attempts == ["t-1"] and mc.handle(Result("t-1", 5), 1.1) == [Done(5, "a", {})]


def test_deadline_while_waiting_and_while_running():
    mc, _ = started(2, deadline=2.0)
    assert mc.next_wakeup() == 2.0
    acts = mc.handle(Tick(), 2.0)
    assert acts[0] == SendCancel("t-1", "a", "tcp://a:1")
    e = exc(acts[1])
    assert type(e) is Timeout and str(e) == "call to add timed out before a accepted it"
    mc, _ = started(2, deadline=2.5)
    mc.handle(Accepted("t-1"), 0.1)
    assert mc.next_wakeup() == 1.0
    mc.handle(Tick(), 2.0)
    assert mc.next_wakeup() == 2.5
    acts = mc.handle(Tick(), 2.5)
    assert acts[0] == SendCancel("t-1", "a", "tcp://a:1") and str(exc(acts[1])) == "call to add on a timed out"
    mc, acts = started(1, now=3.0, deadline=2.0)                # discovery ate the whole budget
    assert type(exc(acts[0])) is Timeout


def test_no_failover_after_the_deadline():
    mc, _ = started(2, deadline=1.0)
    acts = mc.handle(SendFailed("gone"), 1.5)
    assert [type(a) for a in acts] == [Fail] and type(exc(acts[0])) is Timeout


def test_user_cancel_waits_for_the_server():
    mc, _ = started(1)
    mc.handle(Accepted("t-1"), 0.0)
    assert mc.handle(Cancel(), 1.0) == [SendCancel("t-1", "a", "tcp://a:1")] and mc.phase is Phase.CANCELLING
    assert mc.handle(Cancel(), 1.1) == [] and mc.next_wakeup() == 6.0
    acts = mc.handle(CancelAck("t-1", "running"), 1.2)
    e = exc(acts[0])
    assert type(e) is CallCancelled and str(e) == "call to add cancelled"


def test_a_cancel_ack_carries_the_servers_timing_to_the_error():
    """The CANCELLED reply may come before the call's own answer: its timing
    (the killed work) is what the caller gets."""
    mc, _ = started(1)
    mc.handle(Accepted("t-1"), 0.0)
    mc.handle(Cancel(), 1.0)
    timing = {"received": 10.0, "started": 10.5, "ended": 11.0}
    (fail,) = mc.handle(CancelAck("t-1", "running", timing), 1.2)
    assert fail.error.kind == "cancelled" and fail.error.timing == timing
    mc2, _ = started(1)
    mc2.handle(Accepted("t-1"), 0.0)
    mc2.handle(Cancel(), 1.0)
    (fail2,) = mc2.handle(CancelAck("t-1", "queued"), 1.2)
    assert fail2.error.timing == {}


def test_user_cancel_outcomes():
    err = {"kind": "cancelled", "type": "cancelled", "message": "call cancelled while queued", "traceback": ""}
    mc, _ = started(1)
    mc.handle(Cancel(), 0.5)
    acts = mc.handle(Error("t-1", err, {"received": 1.0}), 0.6)       # queued: the server's own error
    assert type(exc(acts[0])) is CallCancelled and acts[0].error.timing == {"received": 1.0}
    mc, _ = started(1)
    mc.handle(Cancel(), 0.5)
    assert mc.handle(Result("t-1", 1), 0.6) == [Done(1, "a", {})]       # finished first
    mc, _ = started(1)
    mc.handle(Cancel(), 0.5)
    assert mc.handle(Tick(), 5.4) == [] and type(exc(mc.handle(Tick(), 5.5)[0])) is CallCancelled
    mc = machine(1)
    assert type(exc(mc.handle(Cancel(), 0.0)[0])) is CallCancelled       # never started


def test_abort_cancels_and_fails():
    mc, _ = started(1)
    acts = mc.handle(Abort("communication", "client closed"), 1.0)
    assert acts[0] == SendCancel("t-1", "a", "tcp://a:1") and str(exc(acts[1])) == "client closed"


def test_malformed_reply_names_the_server():
    mc, _ = started(2)
    mc.handle(Accepted("t-1"), 0.0)
    acts = mc.handle(Malformed("header is not valid JSON"), 0.5)
    assert acts[:2] == [SendCancel("t-1", "a", "tcp://a:1"),
                        FailOver("t-1", "a", "sent a malformed reply: header is not valid JSON", "b")]
    acts = mc.handle(Malformed("undecodable result: too deep", "t-2"), 0.6)
    e = exc(acts[-1])
    assert type(e) is ProtocolError
    assert str(e) == "server b (tcp://b:1) sent a malformed reply: undecodable result: too deep"
    mc, _ = started(1)
    assert mc.handle(Malformed("x", id="other"), 0.0) == []


def test_late_answers_of_an_earlier_attempt_are_ignored():
    mc, _ = started(2)
    mc.handle(Tick(), 5.0)                                  # a given up, b tried
    for ev in (Result("t-1", 1), Error("t-1", {"kind": "remote"}), Accepted("t-1"), Pong("t-1", "unknown"),
               CancelAck("t-1")):
        assert mc.handle(ev, 5.1) == []
    assert mc.handle(Result("t-2", 2), 5.2) == [Done(2, "b", {})]


@dataclass(frozen=True)
class Est:
    name: str
    address: str
    estimation: dict


FREE = {"num_running": 0, "max_concurrent": 1, "num_waiting": 0}
BUSY = {"num_running": 1, "max_concurrent": 1, "num_waiting": 0}


def test_late_binding_probes_while_the_view_was_wrong_and_moves_on_busy():
    """The best server was shown free: it gets ``start_now``; its ``busy``
    answer (nothing queued there) moves the call on, without a CANCEL, and
    the next candidate is probed too."""
    cands = [Est("a", "tcp://a:1", FREE), Est("b", "tcp://b:1", FREE), Est("c", "tcp://c:1", BUSY)]
    mc = CallMachine("add", cands, policy=CallPolicy(), new_id=IdGenerator("t-"))
    assert mc.handle(Start(), 0.0) == [SendCall("t-1", "a", "tcp://a:1", True)]
    busy = {"kind": "busy", "message": "SeD a has no free slot for add now", "est_wait": 3.0}
    acts = mc.handle(Error("t-1", busy, server="a"), 0.001)
    assert [type(a) for a in acts] == [FailOver, SendCall]           # no SendCancel: nothing queued on a
    assert acts[1] == SendCall("t-2", "b", "tcp://b:1", True)
    assert mc.handle(Result("t-2", 5, {}, "b"), 0.01) == [Done(5, "b", {})]


def test_every_candidate_busy_queues_where_the_wait_is_shortest():
    cands = [Est(n, f"tcp://{n}:1", FREE) for n in "abc"]
    mc = CallMachine("add", cands, policy=CallPolicy(), new_id=IdGenerator("t-"))
    mc.handle(Start(), 0.0)
    for i, (name, wait) in enumerate([("a", 5.0), ("b", 0.5), ("c", "x")]):    # c: a malformed wait
        acts = mc.handle(Error(f"t-{i + 1}", {"kind": "busy", "message": "full", "est_wait": wait}, server=name),
                         0.01 * (i + 1))
    assert acts[-1] == SendCall("t-4", "b", "tcp://b:1", False)     # queued (no probe) on the shortest wait
    # a busy answer to a call that was not a probe is an ordinary failover, never a loop
    acts = mc.handle(Error("t-4", {"kind": "busy", "message": "full"}, server="b"), 0.05)
    assert acts[-1] == SendCall("t-5", "c", "tcp://c:1", False)
    acts = mc.handle(Error("t-5", {"kind": "busy", "message": "full"}, server="c"), 0.06)
    assert isinstance(acts[-1], Fail)


@pytest.mark.parametrize("ests", [
    [BUSY, FREE, FREE],                                   # the best was seen busy: the view is believed
    [{"num_running": 0, "max_concurrent": 1, "num_waiting": 2}, FREE],    # waiting calls: not free
    [{"num_running": "0", "max_concurrent": 1}, FREE],   # malformed tags are not trusted
    [None, FREE],                                         # no estimation (a bound server)
    [FREE],                                               # nobody else to go to
])
def test_no_probe_unless_the_best_was_seen_free_and_there_are_others(ests):
    cands = [Est(n, f"tcp://{n}:1", e) for n, e in zip("abc", ests)]
    mc = CallMachine("add", cands, policy=CallPolicy(), new_id=IdGenerator("t-"))
    assert mc.handle(Start(), 0.0) == [SendCall("t-1", "a", "tcp://a:1", False)]


@pytest.mark.parametrize("first, ests, probe", [
    (None, [FREE, FREE], True),             # the caller gives no count: the estimation decides
    (None, [BUSY, FREE], False),
    (False, [FREE, FREE], False),           # free as shown, full of the caller's own calls: queued there
    (True, [BUSY, FREE], True),             # shown busy by calls of the caller's that ended: probed
    (True, [FREE], False),                  # nobody else to go to
])
def test_the_callers_count_of_the_first_server_decides_the_probe(first, ests, probe):
    """``Discovered.first_free``: a burst of one client whose calls fill every
    server by its own count queues, each call where its count put it, instead
    of probing servers that all answer busy and then queueing together on the
    one with the shortest wait; a server shown busy by the caller's own ended
    calls is probed."""
    cands = [Est(n, f"tcp://{n}:1", e) for n, e in zip("abc", ests)]
    mc = CallMachine("add", policy=CallPolicy(), new_id=IdGenerator("t-"), discover=True)
    assert [type(a) for a in mc.handle(Start(), 0.0)] == [Discover]
    assert mc.handle(Discovered(cands, first_free=first), 0.01) == [SendCall("t-1", "a", "tcp://a:1", probe)]
    if probe:                               # a busy probe moves on, probing the next candidate too
        acts = mc.handle(Error("t-1", {"kind": "busy", "message": "full", "est_wait": 1.0}, server="a"), 0.02)
        assert acts[-1] == SendCall("t-2", "b", "tcp://b:1", True)


def test_the_callers_count_is_for_the_first_server_it_ranked():
    """A rediscovery leaves out the servers given up on: when the answer's
    first is one of them, the caller's count of it says nothing of the
    server tried first, whose estimation decides."""
    cands = [Est("a", "tcp://a:1", FREE), Est("b", "tcp://b:1", FREE), Est("c", "tcp://c:1", FREE)]
    mc = CallMachine("add", policy=CallPolicy(backoff_jitter=0), new_id=IdGenerator("t-"), discover=True)
    mc.handle(Start(), 0.0)
    assert mc.handle(Discovered(cands[:1], first_free=True), 0.01) == [SendCall("t-1", "a", "tcp://a:1", False)]
    assert mc.handle(SendFailed("a is gone"), 0.02) == [] and mc.phase is Phase.BACKOFF
    assert [type(a) for a in mc.handle(Tick(), mc.retry_at)] == [Discover]
    acts = mc.handle(Discovered(cands, first_free=False), mc.retry_at + 0.01)    # a, given up on, left out
    assert acts == [SendCall("t-2", "b", "tcp://b:1", True)]


def test_busy_on_the_last_candidate_is_transient():
    """A ``busy`` answer from the only server fails as "no server" (with
    discovery, the machine discovers again instead: client_call.rediscovery)."""
    mc = machine(1)
    mc.handle(Start(), 0.0)
    acts = mc.handle(Error("t-1", {"kind": "busy", "message": "full"}, server="a"), 0.0)
    assert isinstance(acts[-1], Fail) and isinstance(exc(acts[-1]), NoServerAvailable)


def test_runtime_ids_cannot_be_predicted_from_one_another():
    """Two consecutive ids of one process share the prefix and counter but
    not the random part: one id seen tells nothing of the next."""
    from gridrpc.client.ids import new_id
    ids = [new_id() for _ in range(2000)]
    assert len(set(ids)) == 2000 and all(valid_id(i) for i in ids)
    randoms = [i.rsplit(".", 1)[1] for i in ids]
    assert all(len(r) == 16 for r in randoms) and len(set(randoms)) == 2000
    # the random parts are not a counter: consecutive ones differ by more than a small step
    steps = [abs(int(a, 16) - int(b, 16)) for a, b in zip(randoms, randoms[1:])]
    assert sum(s < 2 ** 32 for s in steps) < 5


def test_ids_are_valid_and_unique():
    gen = IdGenerator("0123456789abcdef")
    ids = [gen() for _ in range(1000)]
    assert len(set(ids)) == 1000 and all(valid_id(i) for i in ids)
    assert valid_id(IdGenerator("p" * 93, start=2 ** 70, random=lambda: "f" * 16)())
    for bad in ("a/b", "x" * 94, "é", 5):
        with pytest.raises(ValueError):
            IdGenerator(bad)


# -- invariants over random runs ----------------------------------------------------------------

KINDS = ["remote", "no_server", "service_not_found", "communication", "cancelled", "timeout", 7]
EVENT = st.tuples(
    st.sampled_from(["tick", "accepted", "pong", "result", "error", "malformed", "send_failed", "cancel_ack",
                     "cancel", "abort", "sent"]),
    st.floats(0, 3),                                        # time step
    st.sampled_from(["current", "previous", "other", "none"]),  # which id the event carries
    st.sampled_from(["running", "queued", "done", "unknown"]),
    st.sampled_from(KINDS),
    st.one_of(st.none(), st.floats(-1, 20), st.booleans()),  # patience
)


class Run:
    """Feeds events to a machine and checks, after each, what must always hold."""

    def __init__(self, n: int, failover: bool, deadline: float | None) -> None:
        self.mc = CallMachine("svc", SERVERS[:n], deadline=deadline, new_id=IdGenerator("r-"),
                              policy=CallPolicy(ack_timeout=1.0, ping_interval=0.5, ping_timeout=2.0,
                                                failover=failover, max_patience=5.0))
        self.now = 0.0
        self.actions: list = []
        self.ends = 0
        self.settled: set[str] = set()      # attempts the server itself ended (or never got)
        self.feed(Start())

    def feed(self, ev) -> list:
        mc = self.mc
        before = (mc.phase, mc.id)
        acts = mc.handle(ev, self.now)
        if before[0] in (Phase.WAITING, Phase.RUNNING, Phase.CANCELLING) and getattr(ev, "id", None) == before[1]:
            if type(ev) in (Result, Error) or (type(ev) is Pong and ev.state == "unknown"
                                               and before[0] is Phase.RUNNING):
                self.settled.add(before[1])
        if type(ev) is SendFailed and before[0] is Phase.WAITING:
            self.settled.add(before[1])
        if self.ends:
            assert acts == [], "actions after the end"
        self.ends += sum(type(a) in (Done, Fail) for a in acts)
        assert self.ends <= 1, "more than one Done/Fail"
        for a in acts:
            if type(a) is SendCall:
                assert a.id == mc.id and a.server == mc.candidates[mc.index].name
        if type(ev) is Tick and not mc.finished:
            assert mc.next_wakeup() > self.now, "a timer that would spin"
        self.actions += acts
        return acts

    def event(self, kind, dt, which, state, ekind, patience):
        self.now += dt
        mc = self.mc
        ids = {"current": mc.id, "previous": mc.attempts[-2] if len(mc.attempts) > 1 else "zz",
               "other": "zz", "none": None}
        i = ids[which] or "zz"
        ev = {"tick": Tick(), "accepted": Accepted(i, patience), "pong": Pong(i, state),
              "result": Result(i, 42), "error": Error(i, {"kind": ekind, "message": "m"}),
              "malformed": Malformed("bad", ids[which]), "send_failed": SendFailed("gone"),
              "cancel_ack": CancelAck(i), "cancel": Cancel(), "abort": Abort("communication", "closed"),
              "sent": CallSent()}[kind]
        self.feed(ev)

    def run_out(self) -> None:
        for _ in range(10_000):
            w = self.mc.next_wakeup()
            if w is None:
                break
            self.now = max(self.now, w)
            self.feed(Tick())
        assert self.mc.finished and self.ends == 1

    def check_cancels(self) -> None:
        mc = self.mc
        cancelled = {a.id for a in self.actions if type(a) is SendCancel}
        done_ok = any(type(a) is Done for a in self.actions)
        for i in mc.attempts:
            given_up = i != mc.attempts[-1] or not done_ok
            if given_up and i not in self.settled:
                assert i in cancelled, f"attempt {i} given up without CANCEL: {mc.statistics()}"
        if not mc.policy.failover:
            assert {a.server for a in self.actions if type(a) is SendCall} <= {SERVERS[0].name}


@settings(max_examples=400, deadline=None)
@given(n=st.integers(0, 3), failover=st.booleans(), deadline=st.one_of(st.none(), st.floats(0.5, 30)),
       events=st.lists(EVENT, max_size=40))
def test_invariants(n, failover, deadline, events):
    run = Run(n, failover, deadline)
    for ev in events:
        run.event(*ev)
    run.run_out()                       # left alone, every call ends
    run.check_cancels()
    assert math.isfinite(run.now)


def test_no_late_binding_for_a_call_on_data_references():
    """Where the data is was the discovery's choice: such a call is not
    moved off a busy holder by a probe (the client builds it with late_binding=False)."""
    cands = [Est(n, f"tcp://{n}:1", FREE) for n in "ab"]
    mc = CallMachine("add", cands, policy=CallPolicy(), new_id=IdGenerator("t-"), late_binding=False)
    assert mc.handle(Start(), 0.0) == [SendCall("t-1", "a", "tcp://a:1", False)]
