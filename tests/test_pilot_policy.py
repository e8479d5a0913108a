"""The pilot manager's pure policy (gridrpc/sed/batch/pilot_policy.py) and
the pilot settings (pilot_config.py, the CLI flags, the dry run): no
scheduler, no clock; ``now`` is given."""
from __future__ import annotations

import random
import subprocess
import sys

import pytest

from gridrpc.errors import ConfigError
from gridrpc.sed.batch.config import config_to_cli, parse_batch_config
from gridrpc.sed.batch.pilot_config import PilotConfig, parse_pilot_config
from gridrpc.sed.batch.pilot_model import CancelPilot, Dispatch, FailCall, Note, SubmitPilot
from gridrpc.sed.batch.pilot_policy import PilotPool

T0 = 1_700_000_000.0


def cfg(**kw) -> PilotConfig:
    kw.setdefault("host", "127.0.0.1")
    return PilotConfig(**kw)


def of(actions, kind):
    return [a for a in actions if isinstance(a, kind)]


def notes(actions, what):
    return [a for a in actions if isinstance(a, Note) and a.what == what]


def bring_up(pool: PilotPool, name: str, now: float, job: str = "1", started: float | None = None) -> list:
    """Submitted, running since ``started`` (default now), registered at ``now``."""
    out = pool.submitted(name, job, now)
    out += pool.job_started(name, now if started is None else started, now)
    return out + pool.registered(name, f"tcp://127.0.0.1:{1000 + int(job)}", now)


# ------------------------------------------------------------------ grow, dispatch, estimates

def test_a_call_submits_a_pilot_and_runs_there_once_it_registers():
    pool = PilotPool(cfg(cores=2, start_guess=4.0))
    assert pool.start(T0) == []                         # min_pilots 0: nothing up front
    est = pool.estimate(T0, 1.0)
    assert est["est_wait"] == pytest.approx(4.0) and est["pilot_start_estimate"] == 4.0
    pool.set_scheduler_wait(6.0)                        # the scheduler says a job would pend 6 s
    assert pool.estimate(T0, 1.0)["est_wait"] == pytest.approx(10.0)
    pool.set_scheduler_wait(0.0)                        # a free cluster now
    out = pool.call_arrived("c1", T0, need=1.0)
    assert [type(a) for a in out] == [SubmitPilot]
    name = out[0].name
    assert pool.call_arrived("c2", T0, need=1.0) == []  # the pilot on its way has 2 slots
    out = bring_up(pool, name, T0 + 3, started=T0 + 1)
    assert of(out, Dispatch) == [Dispatch("c1", name), Dispatch("c2", name)]
    assert notes(out, "pilot_started")
    assert pool.start_time == pytest.approx(3.0)        # learnt: submission -> SeD registered
    assert pool.estimate(T0 + 3, 1.0)["est_wait"] == pytest.approx(1.0)   # both slots busy for 1 s
    pool.call_done("c1", T0 + 3.5)
    assert pool.estimate(T0 + 3.5, 1.0)["est_wait"] == 0.0               # a free pilot now


def test_backlog_and_max_pilots_bound_the_submissions():
    pool = PilotPool(cfg(cores=1, backlog=3, max_pilots=2))
    assert pool.call_arrived("a", T0, need=0) == []
    assert pool.call_arrived("b", T0, need=0) == []
    out = pool.call_arrived("c", T0, need=0)            # 3 calls without a slot: 3 pilots wanted, 2 allowed
    assert len(of(out, SubmitPilot)) == 2
    assert of(pool.call_arrived("d", T0, need=0), SubmitPilot) == []


def test_min_pilots_are_kept_and_idle_ones_leave():
    pool = PilotPool(cfg(min_pilots=1, max_pilots=3, idle_timeout=10))
    first = of(pool.start(T0), SubmitPilot)
    assert len(first) == 1
    bring_up(pool, first[0].name, T0, job="1")
    out = pool.call_arrived("a", T0, need=1) + pool.call_arrived("b", T0, need=1)
    second = of(out, SubmitPilot)
    assert len(second) == 1
    bring_up(pool, second[0].name, T0 + 1, job="2")
    pool.call_done("a", T0 + 2)
    pool.call_done("b", T0 + 2)
    assert pool.next_wakeup(T0 + 2) == pytest.approx(T0 + 12)
    out = pool.tick(T0 + 12)
    left = of(out, CancelPilot)
    assert len(left) == 1 and "idle" in left[0].reason and notes(out, "pilot_stopped")
    assert of(pool.tick(T0 + 100), CancelPilot) == []   # the last one stays (min_pilots)


def test_a_pilot_registering_after_the_calls_ended_starts_idle_and_leaves_idle():
    """Two pilots submitted for a burst; the first serves every call before
    the second registers: the second still starts (a ``pilot_started`` note),
    takes nothing, and leaves after ``idle_timeout`` like any idle pilot."""
    pool = PilotPool(cfg(cores=2, max_pilots=2, idle_timeout=3))
    out = []
    for cid in "abcd":
        out += pool.call_arrived(cid, T0, need=0.05)
    first, second = (a.name for a in of(out, SubmitPilot))
    pool.submitted(second, "2", T0)
    out = bring_up(pool, first, T0 + 1, job="1")
    assert [d.call_id for d in of(out, Dispatch)] == ["a", "b"]
    for cid, done in (("a", "c"), ("b", "d")):
        assert of(pool.call_done(cid, T0 + 1.1), Dispatch) == [Dispatch(done, first)]
    pool.call_done("c", T0 + 1.2)
    pool.call_done("d", T0 + 1.2)
    out = pool.job_started(second, T0 + 2, T0 + 2) + pool.registered(second, "tcp://127.0.0.1:1002", T0 + 2.5)
    assert notes(out, "pilot_started") and of(out, Dispatch) == []
    out = pool.tick(T0 + 4.2)                           # the first, idle since T0 + 1.2, leaves
    assert [a.name for a in of(out, CancelPilot)] == [first]
    out = pool.tick(T0 + 5.5)                           # the second, idle since it registered, leaves
    assert [a.name for a in of(out, CancelPilot)] == [second]
    assert "idle" in notes(out, "pilot_stopped")[0].detail and "served 0 calls" in notes(out, "pilot_stopped")[0].detail


# ------------------------------------------------------------------ walltime: fit, drain, replace

def test_a_call_never_goes_to_a_pilot_that_cannot_finish_it():
    pool = PilotPool(cfg(cores=4, walltime=100, drain_margin=5, max_pilots=2))
    name = of(pool.call_arrived("short", T0, need=1), SubmitPilot)[0].name
    bring_up(pool, name, T0)
    pool.call_done("short", T0 + 1)
    assert pool.estimate(T0 + 50, 1)["est_wait"] == 0.0         # a free slot that holds a short call
    assert pool.estimate(T0 + 50, 60)["est_wait"] == pytest.approx(pool.new_pilot_wait())   # not a long one
    out = pool.call_arrived("long", T0 + 50, need=60)   # 50 + 60 + 5 > 100: not on this pilot
    assert of(out, Dispatch) == [] and len(of(out, SubmitPilot)) == 1
    fresh = of(out, SubmitPilot)[0].name
    assert of(bring_up(pool, fresh, T0 + 52, job="2"), Dispatch) == [Dispatch("long", fresh)]
    out = pool.call_arrived("huge", T0 + 53, need=96)   # more than any pilot holds: fails at once
    assert of(out, FailCall) and "cannot hold it" in of(out, FailCall)[0].message


def test_a_pilot_drains_before_its_walltime_and_a_replacement_comes_in_time():
    c = cfg(cores=1, walltime=60, max_call_time=2, drain_margin=10, max_pilots=2, start_guess=3)
    pool = PilotPool(c)
    name = of(pool.call_arrived("a", T0 - 3, need=2), SubmitPilot)[0].name
    bring_up(pool, name, T0, started=T0 - 2)            # learnt: 3 s from submission to SeD
    end0 = pool.pilots[name].end(c.walltime)
    assert end0 == T0 + 58
    # steady load: the pilot stays busy; its replacement is due 1.5 * 3 + 2 + 10 + 2 s before its end
    t, n, replacement = T0, 0, None
    while t < end0:
        t += 1
        out = pool.tick(t)
        for cid in list(pool.calls):
            if pool.calls[cid].pilot and t - pool.calls[cid].dispatched >= 1:
                out += pool.call_done(cid, t)
        n += 1
        out += pool.call_arrived(f"c{n}", t, need=2)
        for a in out:
            assert not isinstance(a, FailCall), a
            if isinstance(a, Dispatch):
                end = pool.pilots[a.pilot].end(c.walltime)
                assert t + 2 + c.drain_margin <= end         # never a call that cannot finish
            if isinstance(a, SubmitPilot) and replacement is None:
                replacement = (a.name, t)
                assert end0 - t >= 3 + 10 + 2 - 1            # submitted in time
                bring_up(pool, a.name, t + 3, job="2")
        if notes(out, "draining"):
            assert notes(out, "draining")[0].pilot == name and t >= end0 - 12
        if any(isinstance(a, CancelPilot) and a.name == name for a in out):
            assert "drained" in of(out, CancelPilot)[0].reason
            break
    else:
        pytest.fail("the first pilot never drained")
    assert replacement is not None and pool.pilots[replacement[0]].state == "ready"


# ------------------------------------------------------------------ failures

def test_repeated_submission_failures_pause_the_manager():
    pool = PilotPool(cfg(max_submit_failures=3, pause=100))
    name = of(pool.call_arrived("a", T0, need=1), SubmitPilot)[0].name
    out = pool.submit_failed(name, "sbatch: error: invalid partition", T0)
    assert of(out, SubmitPilot) == []                        # backs off 1 s
    assert pool.next_wakeup(T0) == pytest.approx(T0 + 1)
    name = of(pool.tick(T0 + 1), SubmitPilot)[0].name
    pool.submit_failed(name, "sbatch: error: invalid partition", T0 + 1)
    name = of(pool.tick(T0 + 3), SubmitPilot)[0].name
    out = pool.submit_failed(name, "sbatch: error: invalid partition", T0 + 3)
    paused = notes(out, "paused")
    assert len(paused) == 1 and "3 failed" in paused[0].detail and "invalid partition" in paused[0].detail
    fail = of(out, FailCall)
    assert [f.call_id for f in fail] == ["a"] and "paused" in fail[0].message
    assert "invalid partition" in fail[0].message
    out = pool.call_arrived("b", T0 + 4, need=1)
    assert of(out, SubmitPilot) == [] and of(out, FailCall)   # paused: fails at once, nothing submitted
    assert pool.estimate(T0 + 4, 1)["pilots_paused"] is True and pool.estimate(T0 + 4, 1)["est_wait"] == 1e9
    assert pool.next_wakeup(T0 + 4) == pytest.approx(T0 + 103)
    out = pool.tick(T0 + 103)                                # the pause is over: one more try
    assert notes(out, "resumed")
    out = pool.call_arrived("c", T0 + 104, need=1)
    assert len(of(out, SubmitPilot)) == 1
    out = pool.submit_failed(of(out, SubmitPilot)[0].name, "still refused", T0 + 104)
    assert notes(out, "paused")                              # one more failure pauses again


def test_a_pilot_that_never_registers_counts_as_a_failure_and_is_cancelled():
    pool = PilotPool(cfg(start_timeout=20, max_submit_failures=2))
    name = of(pool.call_arrived("a", T0, need=1), SubmitPilot)[0].name
    pool.submitted(name, "7", T0)
    pool.job_started(name, T0 + 1, T0 + 1)
    assert pool.next_wakeup(T0 + 1) == pytest.approx(T0 + 21)
    out = pool.tick(T0 + 21)
    assert CancelPilot(name, "7", "its SeD did not register within 20 s of the job's start") in out
    assert pool.failures == 1 and not pool.paused
    name2 = of(pool.tick(T0 + 22), SubmitPilot)[0].name
    pool.submitted(name2, "8", T0 + 22)
    out = pool.job_ended(name2, "FAILED (NonZeroExitCode)", T0 + 23)
    assert notes(out, "paused") and "ended before its SeD registered" in pool.last_failure
    assert of(out, FailCall)


def test_a_lost_pilot_fails_its_call_and_is_replaced():
    pool = PilotPool(cfg(cores=1, max_pilots=2))
    name = of(pool.call_arrived("a", T0, need=1), SubmitPilot)[0].name
    bring_up(pool, name, T0)
    pool.call_arrived("b", T0, need=1)
    out = pool.call_failed("a", "pilot x died", T0 + 1)
    assert FailCall("a", "pilot x died") in out and of(out, CancelPilot)
    assert of(out, SubmitPilot) or any(p.state == "submitting" for p in pool.pilots.values())


def test_random_runs_keep_the_invariants():
    """Random arrivals, ends, pilot starts and failures: never more live jobs
    than max_pilots, never a call on a pilot that cannot finish it, every
    call answered exactly once by Dispatch+done or FailCall."""
    for seed in range(30):
        rng = random.Random(seed)
        c = cfg(cores=rng.randint(1, 3), max_pilots=rng.randint(1, 4), min_pilots=rng.randint(0, 1),
                walltime=60, drain_margin=5, idle_timeout=rng.choice([3, 10]), max_submit_failures=3, pause=20)
        pool = PilotPool(c)
        t, jobs, failed, done = T0, 0, set(), set()
        out = pool.start(t)
        for step in range(400):
            for a in out:
                if isinstance(a, SubmitPilot):
                    if rng.random() < 0.2:
                        out2 = pool.submit_failed(a.name, "refused", t)
                    else:
                        jobs += 1
                        out2 = bring_up(pool, a.name, t + rng.random(), job=str(jobs))
                    out = out + out2
                elif isinstance(a, Dispatch):
                    p = pool.pilots[a.pilot]
                    assert t + pool.calls[a.call_id].need + c.drain_margin <= p.end(c.walltime) + 1
                elif isinstance(a, FailCall):
                    assert a.call_id not in failed and a.call_id not in done
                    failed.add(a.call_id)
            assert sum(1 for p in pool.pilots.values() if p.state != "leaving") <= c.max_pilots
            t += rng.random()
            out = []
            r = rng.random()
            if r < 0.4:
                out = pool.call_arrived(f"c{step}", t, need=rng.choice([0.1, 1, 5]))
            elif r < 0.8 and any(x.pilot for x in pool.calls.values()):
                cid = rng.choice([k for k, x in pool.calls.items() if x.pilot])
                done.add(cid)
                out = pool.call_done(cid, t)
            elif r < 0.85:
                for p in [p for p in pool.pilots.values() if p.state == "leaving"]:
                    out += pool.job_ended(p.name, "CANCELLED", t)
            out += pool.tick(t)
        assert not (failed & done)


# ------------------------------------------------------------------ settings, CLI, dry run

def test_pilot_settings_are_checked():
    assert parse_pilot_config(None) is None and parse_pilot_config(False) is None
    assert parse_pilot_config({"min": 1, "max": "3", "walltime": "1:00:00", "host": "127.0.0.1"}) == \
        PilotConfig(min_pilots=1, max_pilots=3, walltime=3600.0, host="127.0.0.1")
    for bad, words in [({"maxi": 2}, "unknown pilot setting 'maxi'"),
                       ({"min": 3, "max": 2, "host": "127.0.0.1"}, "exceeds max_pilots"),
                       ({"cores": 0}, "positive integer"),
                       ({"cores": 1.5}, "positive integer"),
                       ({"walltime": 60, "max_call_time": 58, "host": "127.0.0.1"}, "leaves no time for a call"),
                       ({"idle_timeout": -1}, "must be > 0"),
                       ({}, "--insecure"),               # default host 0.0.0.0 without a security choice
                       ({"host": "127.0.0.1", "listen": "127.0.0.1:5"}, "tcp://HOST:PORT"),
                       ("yes", "true or a mapping")]:
        with pytest.raises(ConfigError, match=".*"):
            parse_pilot_config(bad)
        try:
            parse_pilot_config(bad)
        except ConfigError as exc:
            assert words in str(exc), (bad, str(exc))
    assert parse_pilot_config({"sed_args": "--insecure"}).sed_args == ("--insecure",)


def test_batch_config_round_trips_pilots_through_the_cli():
    c = parse_batch_config({"scheduler": "slurm", "pilot": {"max": 6, "cores": 4, "idle_timeout": 30,
                                                             "sed_args": ["--insecure"]}})
    args = config_to_cli(c)
    assert args[:2] == ["--batch", "slurm"] and "--pilot" in args
    from gridrpc.cli import build_parser
    a = build_parser().parse_args(["sed", "--name", "s", "--parent", "tcp://127.0.0.1:1", *args])
    from gridrpc.sed.batch.cli import batch_settings_from_args
    assert parse_batch_config(batch_settings_from_args(a)) == c


def _gridrpc(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "gridrpc", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_dry_run_prints_the_pilot_job_script(tmp_path):
    r = _gridrpc("sed", "--batch", "slurm", "--pilot", "--pilot-dry-run", "--pilot-cores", "4",
                 "--pilot-walltime", "2:00:00", "--pilot-sed-arg=--insecure", "--name", "ps",
                 "--parent", "tcp://127.0.0.1:5555", "--service", "gridrpc.examples.services:sleep",
                 "--shared-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --time=0-02:00:00" in r.stdout and "#SBATCH --cpus-per-task=4" in r.stdout
    assert "-m gridrpc sed --name ps.pXXXX-1" in r.stdout and "--max-concurrent 4" in r.stdout
    assert "--service sleep=gridrpc.examples.services:sleep" in r.stdout and "--insecure" in r.stdout
    assert not (tmp_path / "ps" / "pilots").exists() or not any((tmp_path / "ps" / "pilots").iterdir())
    r = _gridrpc("sed", "--batch", "slurm", "--pilot-max", "3", "--name", "ps", "--parent", "tcp://127.0.0.1:1",
                 "--service", "gridrpc.examples.services:sleep")
    assert r.returncode == 2 and "need --pilot" in r.stderr
    r = _gridrpc("sed", "--batch", "slurm", "--pilot", "--name", "ps", "--parent", "tcp://127.0.0.1:1",
                 "--service", "gridrpc.examples.services:sleep", "--pilot-dry-run")
    assert r.returncode == 2 and "--insecure" in r.stderr      # 0.0.0.0 without a security choice


def test_a_deployment_file_declares_pilots_and_bad_ones_are_refused(tmp_path):
    from gridrpc.deploy import spec as deploy_spec
    from gridrpc.sed.batch.config import batch_settings
    text = """
master_agent: {name: MA, host: localhost, port: 0}
seds:
  - {name: hpc, parent: MA, host: localhost, kind: batch, scheduler: slurm,
     services: [gridrpc.examples.services:sleep],
     pilot: {min: 1, max: 3, cores: 2, walltime: "0:30:00", host: 127.0.0.1}}
"""
    path = tmp_path / "pilots.yaml"
    path.write_text(text)
    spec = deploy_spec.load(path)
    entry = next(e for e in spec.elements if e.name == "hpc")
    c = parse_batch_config(batch_settings(entry.options))
    assert c.pilot == PilotConfig(min_pilots=1, max_pilots=3, cores=2, walltime=1800.0, host="127.0.0.1")
    args = config_to_cli(c)
    assert args[args.index("--pilot-max") + 1] == "3" and "--pilot-walltime" in args
    path.write_text(text.replace("cores: 2", "cores: 2, maxi: 9"))
    with pytest.raises(ConfigError, match="maxi"):
        deploy_spec.load(path)


def test_no_wakeup_in_the_past():
    """A condition that stays true (an idle pilot kept by min_pilots, a
    replacement max_pilots does not allow) never asks for a wake-up now:
    the runtime would spin."""
    pool = PilotPool(cfg(min_pilots=1, max_pilots=1, idle_timeout=5, walltime=60, drain_margin=5))
    name = of(pool.start(T0), SubmitPilot)[0].name
    bring_up(pool, name, T0)
    for t in (T0 + 10, T0 + 40, T0 + 50):
        pool.tick(t)
        wake = pool.next_wakeup(t)
        assert wake is None or wake > t
