"""The pilot manager's policy, pure: when to submit and cancel pilot jobs,
which pilot runs which call, when a pilot drains, when the manager pauses,
and the pilot part of the estimation vector.

No I/O, no clock: every method takes ``now`` (POSIX seconds, the scale of
the scheduler's job start times) and returns a list of actions for the
runtime (:mod:`.pilots`) to carry out:

=================  ==========================================================
``SubmitPilot``    submit pilot job ``name`` (report back with
                   :meth:`PilotPool.submitted` or :meth:`PilotPool.submit_failed`)
``CancelPilot``    cancel its job (it has no call left)
``Dispatch``       relay call ``call_id`` to pilot ``pilot`` (report back with
                   :meth:`PilotPool.call_done` or :meth:`PilotPool.call_failed`)
``FailCall``       answer the call with this error (paused, impossible, pilot lost)
``Note``           something an operator should see: an event and a log line
                   (``what``: pilot_started, pilot_stopped, draining, paused, resumed)
=================  ==========================================================

The action and record types live in :mod:`.pilot_model`, the
estimation's slot simulation in :mod:`.pilot_estimate`.

A pilot goes ``submitting`` -> ``pending`` (job id known) -> ``starting``
(the job runs) -> ``ready`` (its SeD registered) -> ``draining`` ->
gone; ``leaving`` once its job is being cancelled.

Rules (settings in :class:`~.pilot_config.PilotConfig`):

- **Fit.** A call needs ``need`` seconds (the SeD's declared
  ``max_call_time``, else the service's predicted run time). It goes to a ready
  pilot with a free slot only if ``now + need + drain_margin`` is before the
  pilot's end (job start + walltime); otherwise it waits for another pilot.
  A call longer than any pilot can hold fails at once.
- **Drain.** A pilot drains once the shortest call could no longer fit
  (``end - drain_margin - max_call_time``, or ``end - drain_margin``): no
  new call goes there; when its last call ends its job is cancelled. Queued
  calls are never handed to a pilot, they stay with the manager.
- **Grow.** ``demand`` = calls waiting + calls running; ``supply`` = slots of
  the pilots running or on their way that will not end within the time a new
  pilot needs to start (the scheduler's wait + the learnt start time, with a
  margin of half that plus 2 s) and drain. When
  ``demand - supply >= backlog`` enough pilots for the difference are
  submitted (never beyond ``max_pilots`` jobs); ``min_pilots`` are kept. A
  waiting call that none of those pilots could end in time counts as missing
  a slot whatever their free slots.
  A pilot that will end soon thus gets its replacement in time.
- **Shrink.** A ready pilot idle for ``idle_timeout`` leaves while more than
  ``min_pilots`` remain.
- **Failures.** A refused submission, a job that ended before its SeD
  registered, or a SeD that did not register ``start_timeout`` after its job
  started counts as a failure; ``max_submit_failures`` in a row pause the
  manager for ``pause`` seconds (a ``paused`` note); while paused nothing is
  submitted and calls that no pilot can take fail with the reason. A pilot
  that registers resets the count. Between failures submissions back off
  (1, 2, 4... s).
"""
from __future__ import annotations

import collections
import math

from .pilot_config import PilotConfig
from .pilot_estimate import pilot_slots, simulate_slots
from .pilot_model import COMING, CancelPilot, Dispatch, FailCall, Note, Pilot, PilotCall, SubmitPilot

__all__ = ["PilotPool"]


class PilotPool:
    """The state machine; see the module docstring."""

    def __init__(self, config: PilotConfig, *, name_prefix: str = "pilot-") -> None:
        self.config = config
        self.name_prefix = name_prefix
        self.pilots: dict[str, Pilot] = {}
        self.calls: dict[str, PilotCall] = {}
        self.waiting: collections.deque[str] = collections.deque()
        # learnt: submission -> SeD registered, beyond the pending time the scheduler predicted
        # (its own start latency, the node's Python and imports)
        self.start_time = float(config.start_guess)
        self.start_samples = 0
        self.scheduler_wait: float | None = None        # the scheduler's estimate for a new pilot job
        self.failures = 0
        self.last_failure = ""
        self.paused_until: float | None = None
        self._no_submit_before = 0.0
        self._seq = 0
        self.stats = {"submitted": 0, "submit_failures": 0, "start_failures": 0, "started": 0,
                      "stopped": 0, "dispatched": 0, "calls_failed": 0, "pauses": 0}

    # ------------------------------------------------------------------ pilots
    def start(self, now: float) -> list:
        """Start-up: ``min_pilots`` are submitted."""
        return self._schedule(now)

    def submitted(self, name: str, job_id: str, now: float) -> list:
        p = self.pilots.get(name)
        if p is None:
            return [CancelPilot(name, job_id, "no longer needed")]
        p.job_id = job_id
        self.stats["submitted"] += 1
        if p.doomed:
            return self._leave(p, "no longer needed", now)
        if p.state == "submitting":
            p.state = "pending"
        return self._schedule(now)

    def submit_failed(self, name: str, message: str, now: float) -> list:
        self.pilots.pop(name, None)
        self.stats["submit_failures"] += 1
        return self._failure(f"the scheduler refused pilot {name}: {message}", now)

    def set_scheduler_wait(self, seconds: float | None) -> None:
        """The scheduler's estimate of how long a new pilot job would pend."""
        self.scheduler_wait = None if seconds is None else max(0.0, float(seconds))

    def job_started(self, name: str, started: float, now: float) -> list:
        """The scheduler says the job runs since ``started``."""
        p = self.pilots.get(name)
        if p is None or p.start_exact:
            return []
        p.started, p.start_exact = min(float(started), now), True
        if p.state in ("submitting", "pending"):
            p.state = "starting"
        return self._schedule(now)

    def registered(self, name: str, address: str, now: float) -> list:
        """The pilot's SeD registered: it takes calls. Unknown names: []."""
        p = self.pilots.get(name)
        if p is None or p.state not in COMING:
            return []
        if p.started is None:           # not polled yet: its submission bounds the start from below
            p.started = p.submitted     # (the next poll gives the scheduler's start time)
        sample = max(0.0, now - p.submitted - p.expected_wait)
        self.start_time = sample if self.start_samples == 0 else 0.7 * self.start_time + 0.3 * sample
        self.start_samples += 1
        p.state, p.address, p.registered, p.idle_since = "ready", address, now, now
        self.failures = 0
        self.stats["started"] += 1
        notes = [Note("pilot_started", name, f"job {p.job_id}, {self.config.cores} slot(s), "
                                             f"ends {p.end(self.config.walltime) - now:.0f} s from now")]
        return notes + self._schedule(now)

    def job_ended(self, name: str, reason: str, now: float) -> list:
        """The job is over (or its SeD left): calls on it are reported by
        the runtime with :meth:`call_failed`."""
        p = self.pilots.get(name)
        if p is None:
            return []
        actions: list = []
        if p.doomed:
            del self.pilots[name]
            return self._schedule(now)
        if p.state in COMING:
            self.stats["start_failures"] += 1
            del self.pilots[name]
            actions += self._failure(f"pilot {name} (job {p.job_id}) ended before its SeD registered: {reason}",
                                     now)
            return actions
        del self.pilots[name]
        if p.state != "leaving":
            self.stats["stopped"] += 1
            actions.append(Note("pilot_stopped", name, f"job {p.job_id}: {reason}"))
        return actions + self._schedule(now)

    def resume(self, now: float) -> list:
        """Lift a pause now (an operator's decision, or the pause ended)."""
        if self.paused_until is None:
            return []
        self.paused_until = None
        self.failures = max(0, self.config.max_submit_failures - 1)   # one more failure pauses again
        self._no_submit_before = now
        return [Note("resumed", None, "pilot submissions resumed")] + self._schedule(now)

    # ------------------------------------------------------------------ calls
    def call_arrived(self, call_id: str, now: float, *, need: float) -> list:
        """A call to run; ``need``: the seconds it may take (see the module doc)."""
        if call_id in self.calls:
            return []
        room = self.config.walltime - self.config.drain_margin
        if need > room:
            self.stats["calls_failed"] += 1
            return [FailCall(call_id, f"the call may take {need:g} s; a pilot's walltime "
                                      f"({self.config.walltime:g} s, {self.config.drain_margin:g} s kept "
                                      "for draining) cannot hold it")]
        self.calls[call_id] = PilotCall(call_id, max(0.0, need), now)
        self.waiting.append(call_id)
        return self._schedule(now)

    def call_done(self, call_id: str, now: float) -> list:
        c = self.calls.pop(call_id, None)
        if c is None:
            return []
        p = self.pilots.get(c.pilot) if c.pilot else None
        if p is not None:
            p.calls.discard(call_id)
            p.served += 1
            if not p.calls:
                p.idle_since = now
        return self._schedule(now)

    def call_failed(self, call_id: str, message: str, now: float) -> list:
        """The pilot running the call failed (died, lost the call)."""
        c = self.calls.pop(call_id, None)
        if c is None:
            return []
        actions: list = [FailCall(call_id, message)]
        self.stats["calls_failed"] += 1
        p = self.pilots.get(c.pilot) if c.pilot else None
        if p is not None:
            p.calls.discard(call_id)
            if p.state not in ("leaving",):
                actions += self._leave(p, f"failed while running call {call_id}", now)
        return actions + self._schedule(now)

    def cancel(self, call_id: str, now: float) -> list:
        """The call was cancelled (the runtime cancels it on its pilot)."""
        c = self.calls.pop(call_id, None)
        if c is None:
            return []
        if call_id in self.waiting:
            self.waiting.remove(call_id)
        p = self.pilots.get(c.pilot) if c.pilot else None
        if p is not None:
            p.calls.discard(call_id)
            if not p.calls:
                p.idle_since = now
        return self._schedule(now)

    def tick(self, now: float) -> list:
        """Timers: pause over, start timeouts, draining, idle pilots."""
        actions: list = []
        if self.paused_until is not None and now >= self.paused_until:
            actions += self.resume(now)
        for p in list(self.pilots.values()):
            if (p.state == "starting" and p.started is not None
                    and now - p.started >= self.config.start_timeout):
                self.stats["start_failures"] += 1
                actions += self._leave(p, f"its SeD did not register within {self.config.start_timeout:g} s "
                                          "of the job's start", now, quiet=True)
                actions += self._failure(f"pilot {p.name} (job {p.job_id}) started but its SeD did not register "
                                         f"within {self.config.start_timeout:g} s", now)
        return actions + self._schedule(now)

    def shutdown(self) -> list:
        """Cancel every pilot (the runtime answers the calls itself)."""
        actions = [CancelPilot(p.name, p.job_id, "shutdown") for p in self.pilots.values()
                   if p.state != "leaving"]
        self.pilots.clear()
        self.calls.clear()
        self.waiting.clear()
        return actions

    def next_wakeup(self, now: float) -> float | None:
        """When :meth:`tick` has something to do (None: nothing planned)."""
        c = self.config
        times: list[float] = []
        if self.paused_until is not None:
            times.append(self.paused_until)
        if self.waiting and self._no_submit_before > now:
            times.append(self._no_submit_before)
        for p in self.pilots.values():
            end = p.end(c.walltime)
            if p.state == "starting" and p.started is not None:
                times.append(p.started + c.start_timeout)
            if p.state == "ready":
                times.append(self._drain_at(end))
                if not p.calls:
                    times.append(p.idle_since + c.idle_timeout)
                times.append(end - self._lead())       # when its replacement is due
        # a moment already past (a replacement not allowed by max_pilots, an idle pilot kept by
        # min_pilots) is not a wake-up: the next call or poll looks again
        times = [t for t in times if t > now]
        return min(times) if times else None

    # ------------------------------------------------------------------ queries
    @property
    def paused(self) -> bool:
        return self.paused_until is not None

    def pilot_of(self, call_id: str) -> str | None:
        c = self.calls.get(call_id)
        return c.pilot if c else None

    def calls_on(self, name: str) -> list[str]:
        p = self.pilots.get(name)
        return sorted(p.calls) if p else []

    def counts(self) -> dict:
        ps = self.pilots.values()
        ready = [p for p in ps if p.state == "ready"]
        return {"pilots_ready": len(ready), "pilots_draining": sum(1 for p in ps if p.state == "draining"),
                "pilots_starting": sum(1 for p in ps if p.state in COMING),
                "pilot_free_slots": sum(self.config.cores - len(p.calls) for p in ready),
                "calls_waiting_for_pilot": len(self.waiting),
                "calls_on_pilots": sum(len(p.calls) for p in ps)}

    def new_pilot_wait(self) -> float:
        """Seconds until a pilot submitted now would take calls."""
        return (self.scheduler_wait or 0.0) + self.start_time

    def estimate(self, now: float, need: float) -> dict:
        """Pilot tags for one more call needing ``need`` s after the calls
        waiting: ``est_wait`` (0: a free pilot now), ``pilot_start_estimate``
        (a new pilot in about that many seconds), ``pilots_paused``, counts."""
        c = self.config
        may_submit = not self.paused and self._count_live() < c.max_pilots
        slots = pilot_slots(self.pilots.values(), self.calls, c, now, start_time=self.start_time,
                            new_at=now + self.new_pilot_wait() if may_submit else None)
        queue = [self.calls[cid].need for cid in self.waiting if cid in self.calls] + [max(0.0, need)]
        starts = simulate_slots(slots, queue, c.drain_margin)
        wait = min(max(0.0, starts[-1] - now), 1e9) if starts[-1] is not None else 1e9
        return {"est_wait": wait, "pilot_start_estimate": self.new_pilot_wait(), "pilot_walltime": c.walltime,
                "pilots_paused": self.paused, "max_pilots": c.max_pilots, **self.counts()}

    def statistics(self) -> dict:
        return {**self.stats, **self.counts(), "start_time": self.start_time, "start_samples": self.start_samples,
                "scheduler_wait": self.scheduler_wait, "paused": self.paused, "paused_until": self.paused_until,
                "failures_in_a_row": self.failures, "last_failure": self.last_failure,
                "pilots": [{"name": p.name, "job_id": p.job_id, "state": p.state, "calls": sorted(p.calls),
                            "served": p.served, "address": p.address, "started": p.started,
                            "end": p.end(self.config.walltime)} for p in self.pilots.values()]}

    # ------------------------------------------------------------------ internals
    def _lead(self) -> float:
        """How long before a pilot's end its replacement must be submitted:
        the time a new pilot takes (half again, plus 2 s, as a margin), then
        the drain time."""
        return 1.5 * self.new_pilot_wait() + 2.0 + self.config.drain_margin + self.config.need(0.0)

    def _drain_at(self, end: float) -> float:
        return end - self.config.drain_margin - self.config.need(0.0)

    def _count_live(self) -> int:
        return sum(1 for p in self.pilots.values() if p.state != "leaving")

    def _fits(self, p: Pilot, c: PilotCall, now: float) -> bool:
        end = p.end(self.config.walltime)
        return (p.state == "ready" and len(p.calls) < self.config.cores
                and end is not None and now + c.need + self.config.drain_margin <= end)

    def _new_name(self) -> str:
        while True:
            self._seq += 1
            name = f"{self.name_prefix}{self._seq}"
            if name not in self.pilots:
                return name

    def _leave(self, p: Pilot, reason: str, now: float, *, quiet: bool = False) -> list:
        """Cancel ``p``'s job (once its id is known)."""
        if p.job_id is None:
            p.doomed = True
            return []
        was = p.state
        p.state = "leaving"
        actions: list = [CancelPilot(p.name, p.job_id, reason)]
        if was in ("ready", "draining") and not quiet:
            self.stats["stopped"] += 1
            actions.append(Note("pilot_stopped", p.name, f"job {p.job_id}: {reason} (served {p.served} calls)"))
        return actions

    def _failure(self, message: str, now: float) -> list:
        self.failures += 1
        self.last_failure = message
        actions: list = []
        if self.failures >= self.config.max_submit_failures and self.paused_until is None:
            self.paused_until = now + self.config.pause
            self.stats["pauses"] += 1
            actions.append(Note("paused", None, f"pilot manager paused for {self.config.pause:g} s after "
                                                f"{self.failures} failed pilot submissions or starts in a row; "
                                                f"last: {message}"))
        else:
            self._no_submit_before = now + min(2.0 ** (self.failures - 1), 30.0)
        return actions + self._schedule(now)

    def _schedule(self, now: float) -> list:
        c = self.config
        actions: list = []
        # drain: pilots where no call fits any more
        for p in self.pilots.values():
            if p.state == "ready" and now >= self._drain_at(p.end(c.walltime)):
                p.state = "draining"
                actions.append(Note("draining", p.name, f"job {p.job_id}: walltime ends in "
                                                        f"{p.end(c.walltime) - now:.0f} s"))
        # dispatch waiting calls, first come first served, packed on the busiest pilot that fits
        if self.waiting:
            kept: collections.deque[str] = collections.deque()
            ready = [p for p in self.pilots.values() if p.state == "ready"]
            for cid in self.waiting:
                call = self.calls.get(cid)
                if call is None:
                    continue
                fits = [p for p in ready if self._fits(p, call, now)]
                if not fits:
                    kept.append(cid)
                    continue
                p = max(fits, key=lambda q: (len(q.calls), q.end(c.walltime)))
                p.calls.add(cid)
                call.pilot, call.dispatched = p.name, now
                self.stats["dispatched"] += 1
                actions.append(Dispatch(cid, p.name))
            self.waiting = kept
        # leave: drained pilots, idle pilots beyond min_pilots
        for p in list(self.pilots.values()):
            if p.state == "draining" and not p.calls:
                actions += self._leave(p, "drained before its walltime", now)
        lead = self._lead()
        staying = [p for p in self.pilots.values() if p.state in COMING and not p.doomed
                   or p.state == "ready" and p.end(c.walltime) - now > lead]
        idle = sorted((p for p in staying if p.state == "ready" and not p.calls
                       and now - p.idle_since >= c.idle_timeout), key=lambda q: q.idle_since)
        for p in idle:
            if len(staying) <= c.min_pilots:
                break
            staying.remove(p)
            actions += self._leave(p, f"idle for {now - p.idle_since:.0f} s", now)
        # grow
        if self.paused:
            actions += self._fail_stranded()
            return actions
        # a waiting call that no staying pilot could ever end in time needs a pilot of its own
        unfit = sum(1 for cid in self.waiting if cid in self.calls
                    and not any(p.state in COMING or now + self.calls[cid].need + c.drain_margin
                                <= p.end(c.walltime) for p in staying))
        demand = len(self.waiting) - unfit + sum(len(p.calls) for p in self.pilots.values())
        short = max(0, demand - len(staying) * c.cores) + unfit
        want = math.ceil(short / c.cores) if short >= c.backlog else 0
        want = max(want, c.min_pilots - len(staying))
        want = min(want, c.max_pilots - self._count_live())
        if want > 0 and now >= self._no_submit_before:
            for _ in range(want):
                name = self._new_name()
                self.pilots[name] = Pilot(name=name, submitted=now, expected_wait=self.scheduler_wait or 0.0)
                actions.append(SubmitPilot(name))
        return actions

    def _fail_stranded(self) -> list:
        """While paused: waiting calls that no live pilot can ever take fail."""
        live = [p for p in self.pilots.values() if p.state in COMING + ("ready",) and not p.doomed]
        if live or not self.waiting:
            return []
        actions = [FailCall(cid, f"no pilot can run the call: {self.last_failure} (the pilot manager is paused "
                                 f"after {self.failures} failures in a row)") for cid in self.waiting]
        for cid in self.waiting:
            self.calls.pop(cid, None)
        self.stats["calls_failed"] += len(self.waiting)
        self.waiting.clear()
        return actions
