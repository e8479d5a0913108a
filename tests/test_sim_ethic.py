"""The ethic scenarios simulated with the runtime's overheads
(``gridrpc.experiments.sim_runtime``, ``gridrpc experiment ethic --simulate``)."""
from __future__ import annotations

import dataclasses
import json
import math
import random

import pytest

from gridrpc.cli import main
from gridrpc.core.dispatcher import LegacyDispatcher, OptionalDispatcher
from gridrpc.core.queue import FCFSPolicy, SedScheduler
from gridrpc.core.queue_ethic import EthicPolicy
from gridrpc.core.scenarios import ClientPlan, generate
from gridrpc.experiments.ethic import EthicConfig
from gridrpc.experiments.overheads import Overheads
from gridrpc.experiments.sim import simulate
from gridrpc.experiments.sim_run import run_simulated
from gridrpc.experiments.sim_runtime import ScenarioSim
from gridrpc.experiments.sim_validate import validate_point
from gridrpc.sim.model import DEFAULT_COSTS

pytestmark = pytest.mark.timeout(120)

CAL = Overheads.from_costs()


# -- the real core objects -----------------------------------------------------------------------
def test_runs_the_real_core_objects():
    plans = generate("night-consecutive", random.Random(0), n_users=3, time_scale=0.05, n_max=50)
    sim = ScenarioSim(plans, 4, queue="ethic", queue_options={"accounting": "virtual"}, overheads=CAL, seed=2)
    events, m = sim.run()
    assert all(type(s) is SedScheduler and type(s.policy) is EthicPolicy and s.policy.accounting == "virtual"
               for s in sim.sed_of.values())
    assert all(type(d) is OptionalDispatcher and d.finished for d in sim.disps.values())
    # the dispatchers' own records agree with the log the SeD side wrote
    completed = {e["call"] for e in events if e["type"] == "call_end" and e["status"] == "completed"}
    for user, d in sim.disps.items():
        done = {f"{user}/{r.key}" for r in d.records if r.status == "completed"}
        assert done <= completed
    assert m.completed == len(completed) > 0

    legacy = ScenarioSim(plans, 4, queue="fcfs", n_submit=10, overheads=CAL)
    legacy.run()
    assert all(type(s.policy) is FCFSPolicy for s in legacy.sed_of.values())
    assert all(type(d) is LegacyDispatcher for d in legacy.disps.values())


def test_hand_computed_timeline_of_one_user():
    """1 SeD, 1 user, the per-call client; every cost chosen so the times can be worked out by hand."""
    o = Overheads(client_msg=0.01, sed_msg=0.02, latency=0.001, client_start=0.005, ping_interval=0.0,
                  ack_delay=0.0)
    plan = ClientPlan(user="u0", t0=1.0, deadline=3.0, n_min=1, n_max=2, task_time=0.5)
    sim = ScenarioSim([plan], 1, overheads=o, mandatory_first=False, batches=False, shared_discovery=False)
    events, m = sim.run()
    at = lambda typ, **kw: [e["t"] for e in events if e["type"] == typ  # noqa: E731
                            and all(e.get(k) == v for k, v in kw.items())]
    # client: start 5 ms + DISCOVER 10 ms; hop; MA free; hop; SeD process 2 messages (40 ms); hop; hop;
    # client reads SERVERS (10 ms): the dispatcher starts at 1.0 + .015 + .001 + .001 + .04 + .001 + .001 + .01
    t_start = 1.0 + 0.015 + 0.001 + 0.001 + 0.04 + 0.001 + 0.001 + 0.01
    assert at("user_arrive") == [pytest.approx(t_start)]
    # m0's CALL leaves after 10 ms, one hop, the SeD reads it (20 ms) and starts it at once
    m0 = t_start + 0.01 + 0.001 + 0.02
    assert at("call_start", call="u0/m0") == [pytest.approx(m0)]
    # it ends T later; the SeD reads the worker's result (20 ms) and starts o0, queued meanwhile
    assert at("call_start", call="u0/o0") == [pytest.approx(m0 + 0.5 + 0.02)]
    assert m.completed == 2 and m.unhappy_users == 0


# -- zero overheads: the zero-latency simulation, exactly ---------------------------------------
@pytest.mark.parametrize("scenario,kw", [
    ("night-consecutive", {"queue": "ethic"}),
    ("day-regular", {"queue": "ethic", "queue_options": {"accounting": "virtual"}}),
    ("night-simultaneous", {"queue": "ethic", "queue_options": {"kill_grace": 1.0}}),
    ("day-diurnal-random", {"queue": "ethic"}),
    ("day-regular", {"queue": "fcfs", "n_submit": 190}),
])
def test_zero_overheads_reproduce_the_zero_latency_simulation(scenario, kw):
    """With the client sending each user's first calls as one burst, one message per call."""
    plans = generate(scenario, random.Random(1))
    ev_old, m_old = simulate(plans, 10, seed=3, **kw)
    ev_new, m_new = ScenarioSim(plans, 10, seed=3, overheads=Overheads.zero(), mandatory_first=False,
                                batches=False, shared_discovery=False, **kw).run()
    assert ev_new == ev_old
    assert (m_new.completed, m_new.unfairness, m_new.killed) == (m_old.completed, m_old.unfairness, m_old.killed)


# -- overheads cost requests -------------------------------------------------------------------------
def test_larger_overheads_complete_fewer_requests():
    plans = generate("day-regular", random.Random(0), time_scale=0.05)
    completed, client_cpu = [], []
    for f in (0.0, 1.0, 10.0, 40.0):
        sim = ScenarioSim(plans, 10, queue="ethic", overheads=CAL.scaled(f), seed=0)
        _, m = sim.run()
        completed.append(m.completed)
        client_cpu.append(sim.cpu()["clients"]["cpu_s"])
    assert completed == sorted(completed, reverse=True), completed
    assert completed[-1] < completed[0] * 0.9, completed
    assert client_cpu[0] == 0.0 and client_cpu[1] < client_cpu[2] < client_cpu[3]


def test_the_client_process_is_a_shared_serial_resource():
    """20 users starting together on one client process start one after the
    other; on 4 processes they start about 4 times sooner."""
    plans = generate("night-simultaneous", random.Random(0), n_users=20, n_max=200, time_scale=0.1)

    def spread(k):
        # each user's whole first burst between two users' starts: the per-call client
        ev, _ = ScenarioSim(plans, 20, overheads=CAL, client_processes=k, mandatory_first=False,
                            batches=False, shared_discovery=False).run()
        t0 = [e["t"] for e in ev if e["type"] == "user_arrive"]
        return max(t0) - min(t0)

    one, four = spread(1), spread(4)
    assert one > 19 * CAL.client_start             # every start waits for the ones before it
    assert four < one / 2.5


def test_overheads_validation():
    with pytest.raises(ValueError, match="client_msg"):
        Overheads(client_msg=-1.0)
    with pytest.raises(ValueError, match="latency"):
        Overheads(latency=math.nan)
    with pytest.raises(ValueError):
        CAL.scaled(-2)
    assert Overheads.zero().is_zero() and not CAL.is_zero()
    assert CAL.client_msg == DEFAULT_COSTS["msgs"]["client"]
    assert CAL.sed_msg == DEFAULT_COSTS["msgs"]["sed"]
    with pytest.raises(ValueError, match="sed_processes"):
        ScenarioSim([], 2, sed_processes=0)


# -- runner, CLI ----------------------------------------------------------------------------------------
def test_cli_simulate_writes_the_real_runners_json_shape(tmp_path, capsys):
    path = tmp_path / "out.json"
    rc = main(["experiment", "ethic", "--simulate", "--scenario", "day-regular", "--seds", "4", "--clients", "3",
               "--n-max", "40", "--time-scale", "0.05", "--runs", "2", "--accounting", "virtual",
               "--json", str(path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "unfairness" in out and "completed" in out
    res = json.loads(path.read_text())
    for key in ("config", "unhappy_users", "unfairness", "completed", "killed", "killed_seconds",
                "completed_optional", "cpu_percent", "runs", "events_log"):
        assert key in res
    assert res["simulated"] is True and res["config"]["accounting"] == "virtual"
    assert len(res["runs"]) == 2 and [r["seed"] for r in res["runs"]] == [0, 1]
    run = res["runs"][0]
    for key in ("user_details", "sed_duration_over_T", "idle_gap", "cpu_percent", "wall", "duration"):
        assert key in run
    assert {u["user"] for u in run["user_details"]} == {"r0-u0", "r0-u1", "r0-u2"}
    assert run["sed_duration_over_T"]["median"] > 1.0          # the worker's overhead
    events = [json.loads(line) for line in (tmp_path / "out.events.jsonl").read_text().splitlines()]
    assert {e["type"] for e in events} >= {"user_arrive", "call_start", "call_end", "user_leave"}


@pytest.mark.parametrize("argv,message", [
    (["--client-processes", "2"], "--simulate"),
    (["--no-overheads"], "--simulate"),
    (["--per-call-client"], "--simulate"),
    (["--simulate", "--client-processes", "0"], ">= 1"),
    (["--simulate", "--overhead-factor", "-1"], ">= 0"),
    (["--simulate", "--no-overheads", "--overhead-factor", "2"], "excludes"),
    (["--simulate", "--costs", "/nonexistent/costs.json"], "no such file"),
])
def test_cli_bad_options(tmp_path, capsys, argv, message):
    assert main(["experiment", "ethic", *argv, "--json", str(tmp_path / "x.json")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_cli_rejects_a_file_that_is_not_a_cost_file(tmp_path, capsys):
    bad = tmp_path / "costs.json"
    bad.write_text(json.dumps({"exec_cpu": 1.0}))
    assert main(["experiment", "ethic", "--simulate", "--costs", str(bad), "--json", str(tmp_path / "x.json")]) == 2
    assert "not a cost file" in capsys.readouterr().err


def test_cli_costs_file_is_used(tmp_path):
    costs = json.loads(json.dumps(DEFAULT_COSTS))
    costs["msgs"]["client"] = 0.002
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(costs))
    out = tmp_path / "o.json"
    assert main(["experiment", "ethic", "--simulate", "--costs", str(path), "--seds", "2", "--clients", "2",
                 "--n-max", "10", "--time-scale", "0.05", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["overheads"]["client_msg"] == 0.002


# -- validation harness -------------------------------------------------------------------------------
def test_validation_says_within_only_when_inside_the_real_spread():
    cfg = EthicConfig(scenario="night-consecutive", seds=3, clients=3, n_max=30, time_scale=0.05, runs=2)
    stored = run_simulated(cfg, overheads=CAL, progress=lambda s: None)
    stored = {"config": stored["config"], "runs": stored["runs"]}
    row = validate_point(stored, overheads={"same": CAL})
    assert all(row["same"]["within"].values())           # the same model: inside its own spread
    for r in stored["runs"]:
        r["completed"] += 1000                            # a "real" tree that completed far more
    row = validate_point(stored, overheads={"same": CAL})
    assert not row["same"]["within"]["completed"] and row["same"]["within"]["unhappy_users"]
    assert dataclasses.asdict(cfg)["scenario"] == row["config"]["scenario"]


def test_horizon_stops_the_clock_and_counts_users_not_started_as_unhappy(tmp_path):
    plans = generate("day-regular", random.Random(0), time_scale=0.1)    # arrivals every 1 s
    sim = ScenarioSim(plans, 4, overheads=CAL, horizon=4.5)
    events, m = sim.run()
    assert max(e["t"] for e in events) <= 4.5
    assert sim.not_started == [p.user for p in plans if p.t0 > 4.5]        # u5 .. u9
    cfg = EthicConfig(scenario="day-regular", seds=4, time_scale=0.1)
    run = run_simulated(cfg, overheads=CAL, horizon=4.5, progress=lambda s: None)["runs"][0]
    assert run["not_started"] == 5 and run["unhappy_users"] >= 5
    full = run_simulated(cfg, overheads=CAL, progress=lambda s: None)["runs"][0]
    assert full["not_started"] == 0 and full["unhappy_users"] == 0
    assert main(["experiment", "ethic", "--horizon", "3", "--json", str(tmp_path / "x.json")]) == 2


def test_unhappy_by_client_counts_results_the_client_had_not_read():
    """A client process far too slow to read the results in time: the SeDs ran the mandatory calls
    (the metric, from the SeD-side log, says happy) but the client never saw them by the deadline."""
    cfg = EthicConfig(scenario="night-simultaneous", seds=2, clients=2, n_max=4, deadline=5.0, time_scale=0.1)
    slow = dataclasses.replace(CAL, client_msg=0.05)
    run = run_simulated(cfg, overheads=slow, horizon=0.5, progress=lambda s: None)["runs"][0]
    assert run["not_started"] == 0 and run["unhappy_by_client"] == 2
    ok = run_simulated(cfg, overheads=CAL, progress=lambda s: None)["runs"][0]
    assert ok["unhappy_by_client"] == 0 == ok["unhappy_users"]


def test_the_ethic_scheduler_pays_per_queued_request_fcfs_does_not():
    plans = generate("night-simultaneous", random.Random(0), n_users=30, n_max=60, time_scale=0.05)
    no_sched = dataclasses.replace(CAL, sched_item=0.0, sched_item_virtual=0.0)

    def sed_cpu(o, **kw):
        sim = ScenarioSim(plans, 3, overheads=o, **kw)
        sim.run()
        return sim.cpu()["sed_processes"]["cpu_s"]

    base = sed_cpu(no_sched)
    assert sed_cpu(CAL) > base                                     # 30 users queued per SeD
    assert sed_cpu(CAL, queue_options={"accounting": "virtual"}) > sed_cpu(
        no_sched, queue_options={"accounting": "virtual"})
    assert sed_cpu(CAL, queue="fcfs", n_submit=10) == sed_cpu(no_sched, queue="fcfs", n_submit=10)


def test_the_scenario_table_puts_predicted_beside_measured(tmp_path):
    """A validated point (a stored run of night-consecutive, ethic
    cumulative, whose real runs completed 1000 more than the model): its
    row in the per-scenario table, rendered again from the --json file."""
    from gridrpc.experiments.sim_validate import main as validate_main, scenario_markdown
    cfg = EthicConfig(scenario="night-consecutive", seds=3, clients=3, n_max=30, time_scale=0.05, runs=2)
    stored = run_simulated(cfg, overheads=CAL, progress=lambda s: None)
    stored = {"config": stored["config"], "runs": stored["runs"]}
    sim_completed = sorted(r["completed"] for r in stored["runs"])
    for r in stored["runs"]:
        r["completed"] += 1000
    row = validate_point(stored, overheads={"calibrated": CAL, "zero": Overheads.zero()})
    row["point"] = "night-consecutive.ethic-cumulative"
    table = scenario_markdown([row]).splitlines()
    assert len(table) == 3 and table[2].startswith("| night-consecutive | ethic-cumulative | 0 / 0 | ")
    measured, predicted = table[2].split(" | ")[-1].rstrip(" |").split(" / ")
    assert predicted.endswith(" ✗") and float(predicted.split()[0]) in [float(c) for c in sim_completed] + [
        (sim_completed[0] + sim_completed[-1]) / 2]
    assert measured.startswith(f"{row['real']['completed']['median']:g} (")
    path = tmp_path / "v.json"
    path.write_text(json.dumps([row]))
    out = tmp_path / "s.md"
    assert validate_main([str(tmp_path), "--from-json", str(path), "--scenarios", str(out)]) == 0
    assert out.read_text().splitlines() == table
