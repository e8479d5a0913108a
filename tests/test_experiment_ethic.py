"""``gridrpc experiment ethic``: CLI smoke, a tiny run writing JSON, and the
integration test (a compressed scenario on a real tree: 0 unhappy users and
lower unfairness than the legacy baseline), plus the pure simulator."""
from __future__ import annotations

import json
import random

import pytest

from gridrpc.cli import main
from gridrpc.core.scenarios import generate
from gridrpc.experiments.ethic import EthicConfig, run_experiment
from gridrpc.experiments.sim import simulate

pytestmark = pytest.mark.timeout(90)


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as info:
        main(["experiment", "ethic", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--scenario", "--seds", "--clients", "--deadline", "--task-time", "--n-min", "--n-max",
                 "--arrival-interval", "--runs", "--seed", "--legacy", "--n-submit", "--json",
                 "--time-scale", "--kill-grace"):
        assert flag in out


def test_cli_rejects_legacy_without_n_submit(tmp_path, capsys):
    assert main(["experiment", "ethic", "--legacy", "--json", str(tmp_path / "x.json")]) == 2
    assert "--n-submit" in capsys.readouterr().err


def test_cli_tiny_run_writes_json_and_events(tmp_path, capsys):
    path = tmp_path / "out.json"
    rc = main(["experiment", "ethic", "--scenario", "night-consecutive", "--seds", "2", "--clients", "2",
               "--deadline", "20", "--n-max", "30", "--time-scale", "0.05", "--json", str(path)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "unhappy_users 0" in printed and "unfairness" in printed and "completed" in printed
    d = json.loads(path.read_text())
    for key in ("unhappy_users", "unfairness", "completed", "runs", "config"):
        assert key in d
    assert d["unhappy_users"] == 0 and d["completed"] >= 6
    users = d["runs"][0]["user_details"]
    assert len(users) == 2 and all(u["satisfaction"] is not None for u in users)
    events = [json.loads(line) for line in open(d["events_log"])]
    kinds = {e["type"] for e in events}
    assert {"user_arrive", "mandatory_done", "user_leave", "call_start", "call_end"} <= kinds


def test_integration_ethic_fairer_than_legacy():
    """4 SeDs, 4 simultaneous users, T = 50 ms, d = 2 s, n_max = 100: each
    legacy user submits 100 requests (25 per SeD, 1.25 s of work), so FCFS
    serves the users one after the other — the first gets ~5 server-seconds
    for a deserved 2, the last ones only their mandatory requests, late
    (unfairness ~2.4). Ethic shares the servers: unfairness well below 0.5
    even with the runtime's jitter on busy cores."""
    common = dict(scenario="night-simultaneous", seds=4, clients=4, deadline=40.0, task_time=1.0,
                  n_min=3, n_max=100, time_scale=0.05)
    ethic = run_experiment(EthicConfig(**common), progress=lambda s: None)
    legacy = run_experiment(EthicConfig(**common, legacy=True, n_submit=100), progress=lambda s: None)
    summary = {k: (ethic[k], legacy[k]) for k in ("unhappy_users", "unfairness", "completed")}
    assert ethic["unhappy_users"] == 0, summary
    assert ethic["unfairness"] < 0.5, summary
    # legacy is ~2.4 on a quiet machine; under the whole suite's load the users'
    # submissions interleave in the FCFS queues and it was measured at 0.5-0.7
    # (ethic 0.05 in the same runs), once 0.41 against ethic 0.083: compare the two (3x), not an
    # absolute figure
    assert legacy["unfairness"] > max(0.3, 3 * ethic["unfairness"]), summary
    run = ethic["runs"][0]
    assert all(not u["unhappy"] for u in run["user_details"])
    assert run["completed_optional"] > 0


def _sim(scenario, **kw):
    plans = generate(scenario, random.Random(1), time_scale=1.0)
    return simulate(plans, 10, seed=1, **kw)[1]


def test_sim_virtual_accounting_is_fairer_on_day_regular():
    cumulative = _sim("day-regular", queue="ethic")
    virtual = _sim("day-regular", queue="ethic", queue_options={"accounting": "virtual"})
    legacy = _sim("day-regular", queue="fifo", n_submit=190)
    assert cumulative.unhappy_users == virtual.unhappy_users == 0
    # newcomers monopolise freed slots with cumulative accounting
    assert cumulative.unfairness > 0.6
    assert virtual.unfairness < 0.2 < legacy.unfairness
    # completed within 3 % of the best legacy guess
    assert virtual.completed >= 0.97 * legacy.completed


def test_sim_night_simultaneous_matches_the_ideal():
    m = _sim("night-simultaneous", queue="ethic")
    assert m.unhappy_users == 0 and m.unfairness < 0.05
    legacy = _sim("night-simultaneous", queue="fifo", n_submit=190)
    assert legacy.unhappy_users >= 3 and legacy.unfairness > 1
