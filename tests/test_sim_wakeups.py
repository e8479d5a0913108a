"""The simulator's process model (gridrpc/sim/engine.py): a wake-up is paid
when an idle process gets a job, not for the jobs it drains while busy; the
share of it after the messages left; the time slice; and the calibration
separating the wake-up from the per-message cost (gridrpc/sim/calibrate.py)."""
from __future__ import annotations

import json

import pytest

from gridrpc.sim import Costs, World, elements_for
from gridrpc.sim.client_node import User
from gridrpc.sim.engine import Host, Proc, Sim

W, C = 200e-6, 30e-6          # a wake-up, a job


class _Job:
    def __init__(self, log: list, tag: str, sim: Sim, cost: float = C) -> None:
        self.log, self.tag, self.sim, self.cost = log, tag, sim, cost

    def complete(self) -> None:
        self.log.append((self.tag, self.sim.now))


def _proc(cores: int = 1, wakeup: float = W, tail: float = 0.0, time_slice: float = 0.0):
    sim = Sim()
    host = Host(sim, "h", cores, time_slice=time_slice)
    return sim, host, Proc(host, "p", "sed", wakeup, tail)


def test_draining_queued_messages_pays_one_wakeup():
    sim, _, p = _proc()
    log: list = []
    n = 5
    for i in range(n):                          # n messages arrive together at an idle process
        sim.at(0.0, p.submit, lambda i=i: _Job(log, f"m{i}", sim))
    sim.run()
    assert p.wakeups == 1 and p.jobs_done == n
    assert p.busy_time == pytest.approx(W + n * C)
    assert log[-1][1] == pytest.approx(W + n * C)      # done when the wake-up and n jobs are spent
    assert log[0][1] == pytest.approx(W + C)            # the first job carries the wake-up


def test_a_message_arriving_while_busy_is_drained_without_waking():
    sim, _, p = _proc()
    log: list = []
    sim.at(0.0, p.submit, lambda: _Job(log, "a", sim))
    sim.at(W + C / 2, p.submit, lambda: _Job(log, "b", sim))    # during a's job
    sim.run()
    assert p.wakeups == 1 and p.busy_time == pytest.approx(W + 2 * C)


def test_idle_to_busy_pays_the_wakeup_again():
    sim, _, p = _proc()
    log: list = []
    sim.at(0.0, p.submit, lambda: _Job(log, "a", sim))
    sim.at(1.0, p.submit, lambda: _Job(log, "b", sim))          # long after a: the process slept
    sim.run()
    assert p.wakeups == 2 and p.busy_time == pytest.approx(2 * (W + C))
    assert log == [("a", pytest.approx(W + C)), ("b", pytest.approx(1.0 + W + C))]


def test_waiting_for_a_core_counts_as_busy():
    """A process that has work but no core (another one holds it) drains
    what arrives meanwhile in the same wake-up."""
    sim = Sim()
    host = Host(sim, "h", 1)
    hog = Proc(host, "hog", "ma", 0.0)
    p = Proc(host, "p", "sed", W)
    log: list = []
    sim.at(0.0, hog.submit, lambda: _Job(log, "hog", sim, cost=0.01))
    sim.at(0.001, p.submit, lambda: _Job(log, "a", sim))
    sim.at(0.005, p.submit, lambda: _Job(log, "b", sim))        # p still waits for the core
    sim.run()
    assert p.wakeups == 1 and p.busy_time == pytest.approx(W + 2 * C)
    assert [t for t, _ in log] == ["hog", "a", "b"]


def test_wake_tail_lets_messages_leave_before_the_core_is_free():
    sim, host, p = _proc(tail=0.5)
    log: list = []
    other = Proc(host, "o", "la", 0.0)
    sim.at(0.0, p.submit, lambda: _Job(log, "a", sim))
    sim.at(0.0, other.submit, lambda: _Job(log, "o", sim))      # waits for the one core
    sim.run()
    done = dict(log)
    assert done["a"] == pytest.approx(W / 2 + C)                # sent before the last half of the wake-up
    assert done["o"] == pytest.approx(W + C + C)                # the core was busy until W + C


def test_time_slice_keeps_the_core_for_queued_jobs():
    for time_slice, want in ((0.0, ["a0", "b0", "a1", "b1", "a2", "b2"]),
                             (1.0, ["a0", "a1", "a2", "b0", "b1", "b2"])):
        sim = Sim()
        host = Host(sim, "h", 1, time_slice=time_slice)
        a, b = Proc(host, "a", "la", 0.0), Proc(host, "b", "la", 0.0)
        log: list = []
        for i in range(3):
            sim.at(0.0, a.submit, lambda i=i: _Job(log, f"a{i}", sim))
            sim.at(0.0, b.submit, lambda i=i: _Job(log, f"b{i}", sim))
        sim.run()
        assert [t for t, _ in log] == want, time_slice


def test_events_run_in_time_then_scheduling_order():
    """Near events and far ones (timers, past Sim.HORIZON) are in two heaps:
    they run in the order of one heap of (time, sequence), ties in the
    order they were scheduled, and a run stops at ``until`` whichever heap
    holds the next event."""
    import heapq
    import random
    rng = random.Random(5)
    sim, log, ref, seq = Sim(), [], [], [0]

    def ev(tag):
        log.append((tag, sim.now))
        if rng.random() < 0.5:                  # events schedule more, near and far, some at equal times
            for _ in range(rng.randrange(3)):
                dt = rng.choice([0.0, 1e-5, 1e-5, 5e-4, 2e-3, 0.05, rng.random() * 0.1])
                seq[0] += 1
                heapq.heappush(ref, (sim.now + dt, seq[0]))
                sim.after(dt, ev, seq[0])
    for _ in range(200):
        t = rng.choice([0.0, 0.001, 0.5, rng.random()])
        seq[0] += 1
        heapq.heappush(ref, (t, seq[0]))
        sim.at(t, ev, seq[0])
    for until in (0.0, 0.0011, 0.3, 0.5, 10.0):
        sim.run(until=until)
        assert all(t <= until for _, t in log)
        if sim._heap or sim._far:               # stopped by until: the clock is there
            assert sim.now == until
    want = []
    while ref:
        t, tag = heapq.heappop(ref)
        want.append((tag, t))
    assert [tag for tag, _ in log] == [tag for tag, _ in want]
    assert [t for _, t in log] == [t for _, t in want]
    assert sim.events == len(log)


def test_a_job_end_and_a_timer_at_the_same_time_run_in_scheduling_order():
    """A job's end goes to the near heap however long the job; a timer
    scheduled later for the same time, to the far one: the job ends first."""
    sim, host, p = _proc(wakeup=0.0)
    log: list = []
    sim.at(0.0, p.submit, lambda: _Job(log, "job", sim, cost=0.01))
    sim.at(0.001, lambda: sim.at(0.01, lambda: log.append(("timer", sim.now))))
    sim.run()
    assert log == [("job", 0.01), ("timer", 0.01)]


def test_io_thread_jobs_are_fixed_cost_jobs():
    """IoProc.add is Proc.submit of a fixed-cost job: the same end times,
    busy times, jobs and wake-ups, on a contended and an uncontended host."""
    from gridrpc.sim.engine import FixedJob, IoProc

    class OldIo(Proc):
        def add(self, cost):
            self.submit(FixedJob, cost)

    def run(io_class, cores, time_slice):
        sim = Sim()
        host = Host(sim, "h", cores, time_slice=time_slice)
        p = Proc(host, "p", "la", W, 0.5)
        p.io = io_class(host, "p-io") if io_class is IoProc else io_class(host, "p-io", "io")
        p.io_share = 0.3
        other = Proc(host, "o", "sed", W)
        log: list = []
        for i in range(40):
            t = 0.0002 * (i % 7) + 0.001 * (i // 7)
            sim.at(t, p.submit, lambda i=i: _Job(log, f"p{i}", sim, cost=C * (1 + i % 3)))
            if i % 3 == 0:
                sim.at(t, other.submit, lambda i=i: _Job(log, f"o{i}", sim))
        sim.run()
        procs = (p, p.io, other)
        return log, [(q.busy_time, q.jobs_done, q.wakeups) for q in procs], host.busy_time, sim.events
    for cores in (1, 2, 4):
        for time_slice in (0.0, 3e-3):
            assert run(IoProc, cores, time_slice) == run(OldIo, cores, time_slice), (cores, time_slice)


def test_bad_parameters_are_refused():
    sim = Sim()
    with pytest.raises(ValueError, match="time_slice"):
        Host(sim, "h", 1, time_slice=-1.0)
    host = Host(sim, "h", 1)
    with pytest.raises(ValueError, match="wake-up"):
        Proc(host, "p", "sed", -1e-6)
    with pytest.raises(ValueError, match="wake_tail"):
        Proc(host, "p", "sed", W, 1.5)


@pytest.mark.parametrize("crowding", [0.0, 0.3])
def test_elements_pay_their_kinds_wakeup(crowding):
    """In a simulated tree every element's CPU is wake-ups x wake-up +
    messages x message + items x item of its kind, times the crowding
    factor of its host (element processes per core: 4 on 2 cores here)."""
    costs = Costs(msgs={"ma": 40e-6, "sed": 30e-6, "client": 100e-6}, items={"ma": 2e-6, "sed": 1e-6},
                  wakeups={"ma": 250e-6, "sed": 150e-6}, exec_cpu=0.0, local_latency=10e-6, crowding=crowding)
    w = World(costs=costs, seed=1, hb_interval=1000.0).build(elements_for("flat", 4))
    c = w.client()                  # before any job: the host's crowding is the same for every job
    w.wait_registered()
    User(c, "u", service="noop", k=3, call=False, calls=30, think=None, user="u").begin()
    w.sim.run(until=w.sim.now + 10.0)
    assert len(w.discoveries) == 30
    host = w.agents["MA"].proc.host
    assert host.elements == 4 and host.factor == pytest.approx(2.0 ** crowding)    # MA, 2 SeD procs, client
    for node in [w.agents["MA"], *w.seds.values()]:
        k = node.kind
        want = (node.proc.wakeups * costs.wake(k) + node.n_msgs * costs.msg(k) + node.n_items * costs.item(k))
        assert node.proc.busy_time == pytest.approx(want * 2.0 ** crowding), node.name
        assert node.proc.wakeups > 0
    # sequential discoveries: the MA wakes for each DISCOVER and each answer
    # (2 SeD processes answer; the second may find it still busy)
    assert 60 <= w.agents["MA"].proc.wakeups <= 3 * 30 + 5


def test_costs_without_wakeups_load_as_zero(tmp_path):
    old = {"msgs": {"ma": 1e-4}, "items": {}, "local_latency": 1e-5}       # a file written before wake-ups
    p = tmp_path / "old.json"
    p.write_text(json.dumps(old))
    c = Costs.load(str(p))
    assert c.wake("ma") == 0.0 and c.msg("ma") == 1e-4 and c.time_slice == 0.0
    d = Costs.load(None)
    assert all(d.wake(k) > 0 for k in ("ma", "la", "sed"))     # the built-in fit has them for the daemons
    p.write_text(d.to_json())
    assert Costs.load(str(p)) == d


def _synthetic_study(costs: Costs, background: float) -> dict:
    """A study whose "measured" CPU is what ``costs`` give on the simulator's
    own counts: a fit must find ``costs`` back."""
    from gridrpc.sim.counts import count_discovery, count_load
    runs = []
    for shape, n, users in (("flat", 4, (1, 8)), ("L2-2", 6, (1, 4, 16))):
        mean_s = 2e-3
        cnt = count_discovery(shape, n, costs)
        cpu = {el: _model(costs, c) / mean_s * 100 for el, c in cnt.items() if c["kind"] != "client"}
        steps = []
        for u in users:
            lc, rps = count_load(shape, n, u, costs)       # as fit_rows counts: the same numbers
            step_cpu = {el: (_model(costs, c) + c["execs"] * costs.exec_cpu) * rps * 100
                        for el, c in lc.items()}
            step_cpu["locust"] += background * 100
            steps.append({"users": u, "rps": rps, "cpu": step_cpu})
        runs.append({"n": n, "shape": shape, "loadavg_before": 1.0, "idle_cpu": {},
                     "discovery": {"mean_ms": mean_s * 1e3, "median_ms": 1.0}, "discovery_cpu": cpu,
                     "load": steps, "saturation": {"users": users[-1], "max_rps": 1.0}})
    return {"meta": {}, "runs": runs}


def _model(costs: Costs, c: dict) -> float:
    k = c["kind"]
    f = max(1.0, c["crowd"]) ** costs.crowding
    return f * (c["wakeups"] * costs.wake(k) + c["msgs"] * costs.msg(k) + c["items"] * costs.item(k))


def test_calibration_separates_wakeup_from_message_cost():
    """Synthetic measurements made by known costs (crowding included) on
    the simulator's counts: the calibration's fit finds them back."""
    from gridrpc.sim import calibrate as cal
    true = Costs(msgs={"ma": 35e-6, "la": 40e-6, "sed": 50e-6, "locust": 160e-6, "client": 180e-6},
                 items={"ma": 1.4e-6, "la": 1.6e-6, "sed": 1.8e-6},
                 wakeups={"ma": 250e-6, "la": 300e-6, "sed": 240e-6, "locust": 140e-6},
                 exec_cpu=50e-6, local_latency=15e-6, time_slice=3e-3, crowding=0.1)
    study = _synthetic_study(true, background=0.03)
    rows = cal.fit_rows(study, true)
    assert {r[2] for rs in rows.values() for r in rs} == {"discovery", "load"}
    assert len({r[3] for rs in rows.values() for r in rs}) >= 2       # two trees: two crowds
    crowding, cols, quality = cal.solve_crowding(rows)
    assert crowding == pytest.approx(0.1)
    assert cal.solve(rows, 0.0)[1]["sse"] > 10 * quality["sse"]       # without it the fit is worse
    for kind in ("ma", "la", "sed", "locust"):
        assert cols["wakeups"][kind] == pytest.approx(true.wake(kind), rel=1e-3), kind
        assert cols["msgs"][kind] == pytest.approx(true.msg(kind), rel=1e-3), kind
        assert quality[kind]["median_rel_error"] < 1e-3
    for kind in ("ma", "la", "sed"):
        assert cols["items"][kind] == pytest.approx(true.item(kind), rel=1e-3), kind
    assert cols["background"]["locust"] == pytest.approx(0.03, rel=1e-3)


def test_calibrate_refuses_bad_options():
    from gridrpc.sim import calibrate as cal
    with pytest.raises(ValueError, match="iterations"):
        cal.fit({"meta": {}, "runs": []}, None, iterations=0)
    with pytest.raises(ValueError, match="time slice"):
        cal.fit({"meta": {}, "runs": []}, None, time_slice=-1.0)


def test_validate_predicts_the_median_of_several_seeds():
    from gridrpc.sim.validate import predict
    p = predict("L2-2", 6, Costs.load(None), users=4, rounds=20, seconds=0.3, load_seeds=3)
    assert len(p["throughputs"]) == 3 and p["throughput"] == sorted(p["throughputs"])[1]
    assert len(set(p["throughputs"])) > 1          # the seeds give different runs
    with pytest.raises(ValueError, match="load_seeds"):
        predict("flat", 2, Costs.load(None), load_seeds=0)


def test_the_load_generators_background_share_is_spent_and_not_counted_as_wakeups():
    """Costs.background: a client of that kind spends the share of a core
    whatever it handles (a job every BACKGROUND_PERIOD); its wake-ups are
    kept apart, so the calibration's wake-up column does not see them."""
    from gridrpc.sim.counts import _snapshot
    from gridrpc.sim.model import BACKGROUND_PERIOD
    costs = Costs.load(None)
    costs.background = {"locust": 0.05}
    w = World(costs=costs, seed=1)
    c = w.client("locust", "locust")
    idle = w.client("client", "client")                 # another kind: no background
    w.sim.run(until=1.0)
    busy = c.proc.busy_time + c.proc.io.busy_time        # with the I/O thread's share (io_share)
    assert busy == pytest.approx(0.05 * (1.0 // BACKGROUND_PERIOD) * BACKGROUND_PERIOD, rel=0.02)
    assert idle.proc.busy_time == 0.0
    assert c.bg_wakeups == c.proc.wakeups > 50            # an idle process: every background job woke it
    assert _snapshot(w)["locust"][1] == 0                 # ... none of them counted as its wake-ups
    costs.background = {}
    w = World(costs=costs, seed=1)
    c = w.client("locust", "locust")
    w.sim.run(until=1.0)
    assert c.proc.busy_time == 0.0 and c.bg_wakeups == 0


def test_calibration_simulates_the_background_it_fits():
    from gridrpc.sim import calibrate as cal
    true = Costs.load(None)
    true.background = {}
    study = _synthetic_study(true, background=0.03)
    fitted = cal.fit(study, None, iterations=2, max_load=15.0)
    assert fitted.bg("locust") == pytest.approx(0.03, rel=0.05)
    assert fitted.fit["background"]["locust"] == fitted.bg("locust")
    assert Costs.load(None).bg("locust") > 0.0           # the built-in costs simulate theirs
