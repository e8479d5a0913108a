"""The simulator's SeD, agent and client speak the daemons' protocol through
the same functions, so a protocol change cannot drift between the two.

- The SeD's answers (:mod:`gridrpc.core.sed_protocol`), a child's handling
  of its parent's acknowledgements (:mod:`gridrpc.core.parent_ack`) and a
  reply's event for the call machine (:mod:`gridrpc.core.client_call.replies`) are
  bound, as the very same function objects, by the runtime modules and the
  simulator's, and the simulator's modules build none of those messages or
  events themselves.
- Driven with messages, the simulated SeD answers exactly what those
  functions return (owner check, duplicates, busy probes, DISCOVER for
  several replicas, parent acknowledgements), and the simulated client
  hands the machine every field of an ACCEPTED (``idempotent``, ``state``).
"""
from __future__ import annotations

import inspect

import pytest

from gridrpc.client import driver
from gridrpc.core.client_call import machine as cm
from gridrpc.core import messages as m, parent_ack, sed_protocol
from gridrpc.core.client_call import replies as call_replies
from gridrpc.core.messages import MsgType
from gridrpc.sed import server
from gridrpc.sed.calls import receive as sed_calls, run as calls_run
from gridrpc.sim import World, elements_for
from gridrpc.sim import agent_node, client_node, sed_node
from gridrpc.sim.node import Out
from gridrpc.transport import parent_link


@pytest.mark.parametrize("name, runtime_modules, sim_modules", [
    ("discover_replicas", [server], [sed_node]),
    ("discover_reply", [server], [sed_node]),
    ("call_replica", [sed_calls], [sed_node]),
    ("not_owner_error", [sed_calls], [sed_node]),
    ("busy_error", [sed_calls], [sed_node]),
    ("accepted_header", [sed_calls], [sed_node]),
    ("gone_error", [sed_calls], [sed_node]),
    ("stop_error", [calls_run], [sed_node]),
    ("drop_error", [calls_run], [sed_node]),
])
def test_the_sed_runtime_and_the_sim_bind_the_same_answer_functions(name, runtime_modules, sim_modules):
    fn = getattr(sed_protocol, name)
    for mod in runtime_modules + sim_modules:
        assert getattr(mod, name, None) is fn, f"{mod.__name__} does not use core.sed_protocol.{name}"


def test_links_and_replies_are_the_same_functions():
    assert parent_link.parent_ack is agent_node.parent_ack is sed_node.parent_ack is parent_ack.parent_ack
    assert driver.reply_event is client_node.reply_event is call_replies.reply_event
    assert driver.pong_events is client_node.pong_events is call_replies.pong_events


@pytest.mark.parametrize("module, forbidden", [
    (sed_node, ("MsgType.SERVERS", "MsgType.ACCEPTED", '"busy"', '"result_gone"', '"known"',
                'h.get("view_missing")')),
    (agent_node, ('"known"', 'h.get("view_missing")')),
    (client_node, ("cm.Accepted(", "cm.Result(", "cm.Error(", "cm.CancelAck(", "cm.Pong(")),
])
def test_the_sim_builds_none_of_them_itself(module, forbidden):
    src = inspect.getsource(module)
    for text in forbidden:
        assert text not in src, f"{module.__name__} builds {text} itself: use the shared protocol function"


# -- behaviour: the simulated SeD answers what the functions say -------------------
def _sed_world():
    w = World(seed=3).build(elements_for("flat", 4, flat_procs=1))
    w.wait_registered()
    return w, next(iter(w.seds.values()))


def _send(node, src: bytes, dst: bytes, h: dict) -> list[dict]:
    out = Out(node)
    node.handle(src, dst, h, out)
    return [x[2] for x in out.sends]


def _call(cid: str, sed: str, **extra) -> dict:
    return m.make(MsgType.CALL, cid, sed=sed, service="noop", args=[], kwargs={}, user="u", **extra)


def test_the_simulated_sed_answers_calls_with_the_protocol_functions():
    w, node = _sed_world()
    first = sorted(node.by_name)[0]
    route = node.by_name[first].route
    assert _send(node, b"alice", route, _call("c1", first)) == []          # ACCEPTED held (ack_delay)
    again = _send(node, b"alice", route, _call("c1", first))
    assert again == [sed_protocol.accepted_header("c1", first, running=True, duplicate=True)]
    assert _send(node, b"mallory", route, _call("c1", first)) == [sed_protocol.not_owner_error("c1", node.name)]
    busy = _send(node, b"bob", route, _call("c2", first, start_now=True))
    assert len(busy) == 1 and busy[0]["error"]["kind"] == "busy"
    assert busy == [sed_protocol.busy_error("c2", first, "noop", busy[0]["error"]["est_wait"])]
    pong = _send(node, b"mallory", route, m.make(MsgType.PING, "p1", ids=["c1"]))
    assert pong[0]["calls"] == {"c1": "unknown"}                            # another client's call


def test_the_simulated_sed_answers_a_discover_for_several_replicas():
    w, node = _sed_world()
    names = sorted(node.by_name)
    r = node.by_name[names[0]]
    h = m.make(MsgType.DISCOVER, "d1", service="noop", k=3, names=names + ["elsewhere"])
    (reply,) = _send(node, node.parent, r.route, h)
    assert reply["names"] == names and [s["name"] for s in reply["servers"]] == names
    est = {s["name"]: s["estimation"] for s in reply["servers"]}
    expected = sed_protocol.discover_reply(h, r.name, names, [est[n] for n in names], address=node.address)
    assert reply == expected
    (none,) = _send(node, node.parent, r.route, m.make(MsgType.DISCOVER, "d2", service="nothing", k=3))
    assert none["servers"] == [] and "names" not in none


def test_parent_acknowledgements_are_decided_alike():
    w, node = _sed_world()
    r = next(iter(node.replicas.values()))
    assert r.attached                               # REGISTERED reached it
    # a parent that restarted: register again, detached until acknowledged
    sent = _send(node, node.parent, r.route, m.make(MsgType.HEARTBEAT_ACK, "a1", known=False))
    assert parent_ack.parent_ack(MsgType.HEARTBEAT_ACK, {"known": False}, True).register
    assert [h["type"] for h in sent] == ["register"] and not r.attached
    # view_missing is heeded only once attached again
    ack = m.make(MsgType.HEARTBEAT_ACK, "a2", view_missing=[r.name])
    assert parent_ack.parent_ack(MsgType.HEARTBEAT_ACK, ack, False) == parent_ack.ParentAck(attached_now=True)
    assert parent_ack.parent_ack(MsgType.HEARTBEAT_ACK, ack, True).view_missing == (r.name,)
    _send(node, node.parent, r.route, ack)
    assert r.attached
    ma = w.agents["MA"]
    assert ma.parent is None                       # the root has no parent link; an LA has one
    w2 = World(seed=3).build(elements_for("L2-2", 4))
    w2.wait_registered()
    la = w2.agents["LA1"]
    assert la.attached
    sent = _send(la, la.parent, la.route, m.make(MsgType.HEARTBEAT_ACK, "a3", known=False))
    assert [h["type"] for h in sent] == ["register"] and not la.attached


def test_the_simulated_client_hands_the_machine_every_accepted_field():
    """The runtime's ACCEPTED of a non-idempotent call says so; the machine must hear it in the sim too."""
    w = World(seed=1).build(elements_for("flat", 2))
    w.wait_registered()
    c = w.client("client")
    seen = []

    class _Machine:
        finished = False

        def handle(self, ev, now):
            seen.append(ev)
            return []

        def next_wakeup(self):
            return None

    u = client_node.User(c, "u", service="noop", k=1, call=True, calls=1, think=None, user="u")
    u.machine = _Machine()
    c.pending["c9"] = u
    h = sed_protocol.accepted_header("c9", "s1", running=False, idempotent=False)
    c.handle(b"s1", c.route, h, Out(c))
    assert seen == [call_replies.reply_event(MsgType.ACCEPTED, h)]
    assert seen[0] == cm.Accepted("c9", None, False, "queued")
