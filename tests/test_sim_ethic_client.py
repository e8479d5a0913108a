"""The simulated ethic client drives the runtime's client behaviour: a
user's mandatory calls first, in a batch of their own, and a loop
iteration's CALLs and CANCELs to a SeD process as one message, which the SeD
process reads with its queues paused (``gridrpc.experiments.sim_runtime``)."""
from __future__ import annotations

import random

import pytest

from gridrpc.cli import main
from gridrpc.core.dispatcher import Cancel, Finish, OptionalDispatcher, Submit, mandatory_first, send_order
from gridrpc.core.scenarios import ClientPlan, generate
from gridrpc.experiments import sim_runtime
from gridrpc.experiments.overheads import BATCH_ITEM, Overheads
from gridrpc.experiments.sim_runtime import ScenarioSim
from gridrpc.experiments.sim_validate import client_of

pytestmark = pytest.mark.timeout(120)

CAL = Overheads.from_costs()


# -- the pure pieces the runtime's client and the simulator share -------------------------------------
def test_mandatory_first_splits_the_first_actions():
    d = OptionalDispatcher([1.0] * 2, [1.0] * 3, 100.0, ["a", "b", "c"])
    first = d.start(0.0)
    mand, rest = mandatory_first(first)
    assert [a.optional for a in mand] == [False, False]
    assert rest and all(isinstance(a, Submit) and a.optional for a in rest)
    assert mand + rest == sorted(first, key=lambda a: a.optional)         # nothing lost, order kept
    only_mand = [Submit("m0", "a", 1, False)]
    assert mandatory_first(only_mand) == ([], only_mand)                   # nothing to split
    assert mandatory_first([Submit("o0", "a", 1, True)]) == ([], [Submit("o0", "a", 1, True)])


def test_send_order_puts_cancels_last_newest_first():
    acts = [Cancel("k1"), Submit("o5", "a", 1, True), Cancel("k2"), Finish(), Cancel("k3")]
    assert send_order(acts) == [Submit("o5", "a", 1, True), Finish(), Cancel("k3"), Cancel("k2"), Cancel("k1")]


def test_the_runtime_and_the_simulator_use_the_same_split():
    from gridrpc.client import optional
    assert optional.mandatory_first is mandatory_first and optional.send_order is send_order
    assert sim_runtime.mandatory_first is mandatory_first and sim_runtime.send_order is send_order


# -- the simulated client ----------------------------------------------------------------------------
class _Recorder:
    """A SeD's scheduler that notes every submitted request (time, user, optional)."""

    def __init__(self, inner, log):
        self._inner, self._log = inner, log

    def submit(self, req, now):
        self._log.append((now, req.user, req.optional))
        return self._inner.submit(req, now)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _recorded(overheads=CAL, **kw):
    plans = generate("night-simultaneous", random.Random(0), n_users=20, n_max=100, time_scale=0.1)
    sim = ScenarioSim(plans, 20, overheads=overheads, sed_processes=2, seed=0, **kw)
    log: list = []
    sim.sed_of = {n: _Recorder(s, log) for n, s in sim.sed_of.items()}
    events, m = sim.run()
    return sim, log, events, m


def test_every_users_mandatory_calls_reach_the_seds_before_any_optional_one():
    """20 users arriving together on one client process (their clients up
    beforehand, one shared discovery): with the runtime's mandatory-first
    batch no optional request reaches a SeD before the last mandatory one,
    and no mandatory call preempts anything."""
    _sim, log, events, m = _recorded()
    mand = [t for t, _u, opt in log if not opt]
    opt = [t for t, _u, opt in log if opt]
    assert len(mand) == 20 * 3 and max(mand) < min(opt)
    assert not [e for e in events if e["type"] == "call_end" and e["status"] == "killed"]
    assert m.unhappy_users == 0

    # the client sending each user's first calls as one burst: the first users' optional calls
    # reach the SeDs before later users' mandatory ones, which preempt them
    _sim, log, events, _m = _recorded(mandatory_first=False, batches=False, shared_discovery=False)
    mand = [t for t, _u, opt in log if not opt]
    opt = [t for t, _u, opt in log if opt]
    assert min(opt) < max(mand)
    assert [e for e in events if e["type"] == "call_end" and e["status"] == "killed"]


def test_batches_are_one_message_per_sed_process_and_cost_less_client_cpu():
    batched, _, _, _ = _recorded()
    per_call, _, _, _ = _recorded(mandatory_first=False, batches=False, shared_discovery=False)
    b, p = batched.cpu()["clients"], per_call.cpu()["clients"]
    assert b["messages"] < p["messages"] and b["cpu_s"] < p["cpu_s"]
    assert CAL.client_batch_item == BATCH_ITEM["client"] and CAL.sed_batch_item == BATCH_ITEM["sed"]


def test_a_batch_of_cancels_kills_each_running_call_once():
    """At the common deadline every user's cancels reach the SeD processes as
    batches read with the queues paused (and CANCEL_GRACE after a freed
    slot): each of the 20 SeDs loses the one call it was running, and no
    call starts only to be cancelled by the next user's batch."""
    def ends(**kw):
        _s, _l, events, m = _recorded(**kw)
        return sum(1 for e in events if e["type"] == "call_end" and e["status"] == "cancelled"), m.killed

    cancelled, killed = ends()
    assert cancelled == killed == 20
    _cancelled, killed = ends(mandatory_first=False, batches=False, shared_discovery=False)
    assert killed > 20                 # one message per call: preemptions at the start as well


def test_hand_computed_timeline_with_todays_client():
    """1 SeD, 1 user (n_min 1, n_max 2), costs chosen to be worked out by hand."""
    o = Overheads(client_msg=0.01, sed_msg=0.02, latency=0.001, client_start=0.005, ping_interval=0.0,
                  ack_delay=0.0, client_batch_item=0.002, sed_batch_item=0.003)
    plan = ClientPlan(user="u0", t0=1.0, deadline=3.0, n_min=1, n_max=2, task_time=0.5)
    events, m = ScenarioSim([plan], 1, overheads=o).run()
    at = {e["call"] if "call" in e else e["type"]: e["t"] for e in events if e["type"] != "call_end"}
    # the client is up beforehand (no start-up): DISCOVER 10 ms, hop, MA, hop, SeD process 2 messages
    # (40 ms), hop, MA, hop, SERVERS read (10 ms): the dispatcher starts at
    t_start = 1.0 + 0.01 + 0.001 + 0.001 + 0.04 + 0.001 + 0.001 + 0.01
    assert at["user_arrive"] == pytest.approx(t_start)
    # m0 leaves alone at the end of that loop iteration (10 ms), hop, the SeD reads it (20 ms), starts it
    m0 = t_start + 0.01 + 0.001 + 0.02
    assert at["u0/m0"] == pytest.approx(m0)
    # o0 leaves in the next iteration (t_start + 20 ms), waits while the SeD process answers ACCEPTED for
    # m0 (20 ms) and reads it (20 ms); m0 ends T later, the worker's result is read (20 ms): o0 starts
    assert at["u0/o0"] == pytest.approx(m0 + 0.5 + 0.02)
    assert m.completed == 2 and m.unhappy_users == 0


def test_the_validation_simulates_each_point_with_the_client_it_was_measured_with():
    assert client_of("scale-twelfth.ethic-cumulative") == {"batches": True, "mandatory_first": True,
                                                           "shared_discovery": True}
    assert client_of("scale-burst.ethic-cumulative") == {"batches": True, "mandatory_first": False,
                                                         "shared_discovery": False}
    assert client_of("night-simultaneous.ethic-virtual") == {"batches": False, "mandatory_first": False,
                                                             "shared_discovery": False}


def test_cli_per_call_client(tmp_path):
    import json
    out = tmp_path / "x.json"
    argv = ["experiment", "ethic", "--simulate", "--scenario", "night-simultaneous", "--clients", "4",
            "--seds", "4", "--n-max", "20", "--time-scale", "0.05", "--json", str(out)]
    assert main([*argv, "--per-call-client"]) == 0
    assert json.loads(out.read_text())["config"]["per_call_client"] is True
    assert main(argv) == 0
    assert json.loads(out.read_text())["config"]["per_call_client"] is False


def test_users_arriving_together_share_one_discovery_with_rotated_rankings():
    from gridrpc.client.ma_requests import joined_ranking
    sim, log, _events, _m = _recorded()
    users = sorted(sim.disps, key=lambda u: int(u.lstrip("u")))
    asker = list(sim.disps[users[0]].servers)
    for j, u in enumerate(users):
        assert list(sim.disps[u].servers) == joined_ranking(asker, j)
    # one DISCOVER: the MA read it, forwarded it to the 2 SeD processes, read their 2 answers, sent SERVERS
    assert sim.cpu()["ma"]["messages"] == 1 + 2 + 2 + 1
    alone, _, _, _ = _recorded(shared_discovery=False)
    assert alone.cpu()["ma"]["messages"] == 20 * 6
    # the mandatory calls are spread over the servers as by separate discoveries
    first_servers = {sim.disps[u].records[0].server for u in users}
    assert len(first_servers) == 20
