"""The pilot back-end of a batch SeD: calls run on SeDs that live inside batch
allocations (pilot jobs), so the scheduler's start cost is paid per pilot,
not per call. See ``docs/batch.md`` ("Pilots").

1. the pure :class:`~.pilot_policy.PilotPool` decides when pilot jobs are
   submitted and cancelled, which pilot runs a call (only one that can end
   it before its walltime), when a pilot drains, and when the manager pauses;
2. a pilot job runs ``gridrpc sed`` (the services of this SeD, ``cores``
   calls at once) whose parent is an agent this back-end binds for its
   pilots; the pilot is ready when that SeD registers, and gone when its
   job ends or its SeD misses its heartbeats;
3. each call is relayed to a pilot's SeD unchanged
   (:class:`~gridrpc.sed.backends.relay.RelayBackend`, as the cloud back-end
   relays to its VMs) and the answer relayed back; calls wait here, never on
   a pilot, so a draining pilot hands nothing back.

Scheduler commands run in a thread pool; one ``states()`` query per
``poll_interval`` follows every pilot job, one ``estimate_start()`` per
``estimate_interval`` gives the wait of a new pilot (``est_wait`` of the
estimation vector when no pilot slot is free).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import logging
import os
import time
from typing import Any, ClassVar

from ...core.events import EventKind, make_event
from ...errors import InvalidArgument
from ...runtime.worker_agent import WorkerAgent
from ...transport.channel import host_of
from ..backends.relay import CallGivenUp, PolicyTimer, RelayBackend, RelayFailed, wake
from . import jobfiles
from .base import BatchBackend, BatchError, JobSpec, JobState
from .config import CALL_OPTION, BatchConfig
from .jobs import ImportableServices
from .pilot_model import COMING, CancelPilot, Dispatch, FailCall, Note, SubmitPilot
from .pilot_policy import PilotPool

log = logging.getLogger(__name__)

__all__ = ["PilotJobs", "pilot_job_spec"]

_NOTE_KINDS = {"pilot_started": EventKind.PILOT_STARTED, "draining": EventKind.PILOT_DRAINING,
               "pilot_stopped": EventKind.PILOT_STOPPED, "paused": EventKind.PILOTS_PAUSED,
               "resumed": EventKind.PILOTS_RESUMED}


def pilot_job_spec(config: BatchConfig, scheduler: BatchBackend, *, pilot: str, manager: str, parent: str,
                   services: dict[str, str], workdir: str, hb_interval: float = 1.0,
                   hb_timeout: float = 3.0) -> JobSpec:
    """The job of pilot *pilot*: ``gridrpc sed`` registering at *parent* with
    *services* (name -> module:function), ``cores`` calls at once, for the
    pilot walltime; the script is the scheduler's (``render_script``)."""
    p = config.pilot
    command = [config.remote_python, "-m", "gridrpc", "sed", "--name", pilot, "--parent", parent,
               "--host", p.host, "--port", "0", "--hb-interval", f"{hb_interval:g}",
               "--hb-timeout", f"{hb_timeout:g}", "--orphan-timeout", f"{max(10.0, 3 * hb_timeout):g}",
               "--max-concurrent", str(p.cores), *p.sed_args]
    for name, target in sorted(services.items()):
        command += ["--service", f"{name}={target}"]
    spec = JobSpec(script="#!/bin/sh\n", name=f"gridrpc-pilot-{manager}"[:64], workdir=workdir,
                   partition=config.partition, account=config.account, time_limit=p.walltime,
                   cpus_per_task=p.cores, output=os.path.join(workdir, "pilot.out"),
                   extra_options=config.submit_options, env=dict(config.job_env))
    return dataclasses.replace(spec, script=scheduler.render_script(spec, command))


class PilotJobs(ImportableServices, RelayBackend):
    """Calls on pilot SeDs inside batch allocations (see the module doc).
    Trade-offs: one scheduler start per pilot, then calls at SeD speed (one
    relay hop); idle pilots hold allocations for ``idle_timeout``; the pilots
    must reach this SeD's pilot agent (``pilot.listen``)."""
    name: ClassVar[str] = "pilot"
    server_type = "batch"
    remote = True
    push_estimation = False     # the wait changes with every pilot and call: fan-out, not a pushed snapshot
    where = "on pilot SeDs in batch allocations"
    relay_noun = "pilot"
    detail_key = "pilot"
    sed_what = "pilot SeD"
    failure_type = unavailable_type = "PilotFailure"

    def __init__(self, sed_name: str, config: BatchConfig, scheduler: BatchBackend) -> None:
        if config.pilot is None:
            raise ValueError("PilotJobs needs config.pilot")
        super().__init__()
        self.sed_name = sed_name
        self.config = config
        self.settings = config.pilot
        self.scheduler = scheduler
        self.run_token = os.urandom(4).hex()
        self.state_dir = os.path.join(config.state_root, jobfiles.safe_name(sed_name))
        self.pilots_dir = os.path.join(self.state_dir, "pilots")
        self.policy = PilotPool(self.settings, name_prefix=f"{sed_name}.p{self.run_token}-")
        self.targets: dict[str, str] = {}
        self.agent: WorkerAgent | None = None
        self.agent_address: str | None = None
        self.events: list[tuple[float, str, str | None, str]] = []   # (time, what, pilot, detail)
        self.jobs_submitted = 0
        self._bg: set[asyncio.Task] = set()
        self._tasks: list[asyncio.Task] = []
        self.timer = PolicyTimer(self.policy, self._apply, time.time)   # pilot times: wall clock (walltimes)
        self._unknown_since: dict[str, float] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix=f"{sed_name}-pilot-cmd")

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        sed = self.sed
        await asyncio.to_thread(os.makedirs, self.pilots_dir, exist_ok=True)
        listen = self.settings.listen or f"tcp://{host_of(sed.bind_address)}:0"
        self.agent = WorkerAgent(
            name=f"{self.sed_name}.pilots", address=listen, hb_interval=sed.hb_interval,
            hb_timeout=sed.hb_timeout, on_changed=self._pilots_changed,
            on_lost=lambda name, why: self._pilot_gone(name, f"its SeD left or missed its heartbeats ({why})"))
        await self.agent.start()
        self.agent_address = self.agent.address
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._poll_loop()))
        self._apply(self.policy.start(time.time()))
        log.info("pilot SeD %s: %s pilots of %d core(s) on %s (walltime %gs), pilots register at %s",
                 self.sed_name, f"{self.settings.min_pilots}..{self.settings.max_pilots}", self.settings.cores,
                 self.config.scheduler, self.settings.walltime, self.agent_address)

    async def close(self) -> None:
        self.closing = True
        self.timer.close()
        for t in self._tasks:
            t.cancel()
        await self.stop_relays()
        for a in self.policy.shutdown():          # pilots are this SeD's: none outlives it
            self._spawn(self._cancel(a))
        waiting = [t for t in self._bg if not t.done()]
        if waiting:
            await asyncio.wait(waiting, timeout=self.config.cancel_timeout + self.config.command_timeout + 5)
        if self.agent is not None:
            await self.agent.aclose()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _spawn(self, coro) -> asyncio.Task:
        t = asyncio.get_running_loop().create_task(coro)
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)
        return t

    def _in_thread(self, fn, *args) -> asyncio.Future:
        return asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # ------------------------------------------------------------------ the policy's actions
    def _apply(self, actions: list) -> None:
        for a in actions:
            if isinstance(a, Dispatch):
                wake(self.waiters, a.call_id, a.pilot)
            elif isinstance(a, FailCall):
                wake(self.waiters, a.call_id, error=CallGivenUp(a.message))
            elif isinstance(a, SubmitPilot):
                if not self.closing:
                    self._spawn(self._submit(a.name))
            elif isinstance(a, CancelPilot):
                self.drop_link(a.name, f"left ({a.reason})")
                if self.agent is not None:
                    self.agent.registry.remove(a.name)
                self._spawn(self._cancel(a))
            elif isinstance(a, Note):
                self._note(a.what, a.pilot, a.detail)
        self.timer.arm()

    def _note(self, what: str, pilot: str | None, detail: str) -> None:
        now = time.time()
        self.events.append((now, what, pilot, detail))
        del self.events[:-1000]
        (log.error if what == "paused" else log.info)("pilot SeD %s: %s%s: %s", self.sed_name, what,
                                                       f" {pilot}" if pilot else "", detail)
        sed = getattr(self, "sed", None)
        if sed is not None:
            sed.outbox.emit(make_event(_NOTE_KINDS[what], now, self.sed_name, server=pilot or self.sed_name,
                                       detail=detail))

    async def _submit(self, name: str) -> None:
        workdir = os.path.join(self.pilots_dir, jobfiles.safe_name(name))
        try:
            await asyncio.to_thread(os.makedirs, workdir, exist_ok=True)
            spec = pilot_job_spec(self.config, self.scheduler, pilot=name, manager=self.sed_name,
                                  parent=self.agent_address, services=self.targets, workdir=workdir,
                                  hb_interval=self.sed.hb_interval, hb_timeout=self.sed.hb_timeout)
            job_id = await self._in_thread(self.scheduler.submit, spec)
        except (BatchError, OSError, ValueError) as exc:
            log.warning("pilot SeD %s: cannot submit pilot %s: %s", self.sed_name, name, exc)
            # the scheduler's own words first: events and errors keep a few hundred characters
            stderr = getattr(exc, "stderr", "") or ""
            reason = " | ".join(line.strip() for line in stderr.strip().splitlines()) or str(exc)
            if not self.closing:
                self._apply(self.policy.submit_failed(name, reason, time.time()))
            return
        self.jobs_submitted += 1
        log.info("pilot SeD %s: pilot %s is job %s", self.sed_name, name, job_id)
        if self.closing:
            await self._cancel(CancelPilot(name, job_id, "shutdown"))
            return
        self._apply(self.policy.submitted(name, job_id, time.time()))

    async def _cancel(self, a: CancelPilot) -> None:
        if a.job_id is None:
            return
        log.info("pilot SeD %s: cancelling pilot %s (job %s): %s", self.sed_name, a.name, a.job_id, a.reason)
        try:
            await self._in_thread(functools.partial(self.scheduler.cancel, a.job_id,
                                                    timeout=self.config.cancel_timeout))
        except BatchError as exc:
            log.error("pilot SeD %s: cannot cancel pilot %s (job %s): %s", self.sed_name, a.name, a.job_id, exc)
        if not self.closing:
            self._apply(self.policy.job_ended(a.name, f"cancelled: {a.reason}", time.time()))

    async def _poll_loop(self) -> None:
        last_estimate = 0.0
        while True:
            await asyncio.sleep(self.config.poll_interval)
            ids = {p.job_id: name for name, p in self.policy.pilots.items() if p.job_id}
            if ids:
                try:
                    infos = await self._in_thread(self.scheduler.states, list(ids))
                except BatchError as exc:
                    log.warning("pilot SeD %s: cannot poll the pilot jobs: %s", self.sed_name, exc)
                    infos = {}
                now = time.time()
                for job_id, info in infos.items():
                    name = ids.get(job_id)
                    if name is None:
                        continue
                    if info.state is JobState.UNKNOWN:
                        since = self._unknown_since.setdefault(name, now)
                        if now - since >= self.config.lost_after:
                            self._pilot_gone(name, f"job {job_id} unknown to the scheduler")
                        continue
                    self._unknown_since.pop(name, None)
                    if info.state.is_final:
                        reason = info.raw_state or info.state.value
                        if info.reason:
                            reason += f" ({info.reason})"
                        p = self.policy.pilots.get(name)
                        if p is not None and p.state in COMING:
                            tail = await asyncio.to_thread(self._output_tail, name)
                            reason += f"; its output ends: {tail}" if tail else ""
                        self._pilot_gone(name, f"job {job_id} ended {reason}")
                    elif info.state is JobState.RUNNING and info.start_time:
                        self._apply(self.policy.job_started(name, info.start_time, now))
            if time.time() - last_estimate >= self.config.estimate_interval and not self.policy.paused:
                last_estimate = time.time()
                self.policy.set_scheduler_wait(await self._start_estimate())
            self._apply(self.policy.tick(time.time()))

    def _output_tail(self, name: str, limit: int = 300) -> str:
        """(thread) The last lines of a pilot job's output, on one line."""
        path = os.path.join(self.pilots_dir, jobfiles.safe_name(name), "pilot.out")
        try:
            with open(path, "rb") as f:
                f.seek(max(0, os.path.getsize(path) - 4 * limit))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text.strip().splitlines()[-3:])[-limit:]

    async def _start_estimate(self) -> float | None:
        """The scheduler's wait for a new pilot job (None if it cannot tell)."""
        try:
            spec = pilot_job_spec(self.config, self.scheduler, pilot="estimate", manager=self.sed_name,
                                  parent=self.agent_address, services=self.targets, workdir=self.pilots_dir)
            return await self._in_thread(self.scheduler.estimate_start, spec)
        except (BatchError, ValueError) as exc:
            log.debug("pilot SeD %s: no start estimate: %s", self.sed_name, exc)
            return None

    # ------------------------------------------------------------------ pilots' SeDs
    def _pilots_changed(self) -> None:
        if self.closing or self.agent is None:
            return
        now = time.time()

        def starting(name: str) -> bool:        # one of our pilots, on its way (not a stranger)
            p = self.policy.pilots.get(name)
            return p is not None and p.state in COMING

        for name, address in self.link_registered(self.agent.registry.children, starting):
            self._apply(self.policy.registered(name, address, now))

    def _pilot_gone(self, name: str, why: str) -> None:
        if self.closing:
            return
        self._unknown_since.pop(name, None)
        self.drop_link(name, why)       # its relays raise RelayFailed -> relay_failed
        p = self.policy.pilots.get(name)
        if p is None:
            return
        actions = []
        if p.state in ("ready", "draining") and p.job_id:
            actions.append(CancelPilot(name, p.job_id, why))   # its SeD is gone: the job need not run on
        self._apply(self.policy.job_ended(name, why, time.time()) + actions)

    # ------------------------------------------------------------------ calls
    def prepare(self, service, kwargs, header, buffers) -> tuple[dict, dict]:
        if CALL_OPTION in kwargs:
            raise InvalidArgument(f"a pilot SeD takes no per-call {CALL_OPTION} request: the pilots' shape is "
                                  "the SeD's (pilot cores, walltime, max_call_time)")
        return super().prepare(service, kwargs, header, buffers)

    def _need(self, replica, service: str) -> float:
        return self.settings.need(replica.predictor.predict(service))

    def relay_admit(self, call) -> None:
        self._apply(self.policy.call_arrived(call.id, time.time(), need=self._need(call.replica, call.service)))

    def relay_failed(self, call_id: str, place: str, exc: RelayFailed) -> None:
        # the pool fails the call (never runs it elsewhere): a client with other candidates fails over,
        # a non-idempotent call that had started ends in ServerLost there
        self._apply(self.policy.call_failed(call_id, f"pilot {place} failed while running the call: {exc}",
                                            time.time()))

    def relay_done(self, call_id: str) -> None:
        self._apply(self.policy.call_done(call_id, time.time()))

    def relay_cancelled(self, call_id: str) -> None:
        self._apply(self.policy.cancel(call_id, time.time()))

    # ------------------------------------------------------------------ estimation
    def estimate(self, replica, service, user, now: float) -> dict[str, Any]:
        sch = replica.scheduler
        tcomp = replica.predictor.predict(service.name)
        ahead = len(sch.waiting())
        pilots = self.policy.estimate(time.time(), self._need(replica, service.name))
        return {"server_type": self.server_type, "batch_scheduler": self.config.scheduler, "pilot": True,
                "tcomp": tcomp, "num_running": pilots["calls_on_pilots"],
                "num_waiting": ahead + pilots["calls_waiting_for_pilot"],
                "max_concurrent": self.settings.max_pilots * self.settings.cores,
                "time_since_last_solve": (now - replica.last_solve) if replica.last_solve is not None else 1e9,
                **pilots, "eft": now + pilots["est_wait"] + tcomp}

    def load(self, replica) -> dict:
        return {**self.policy.counts(), "server_type": self.server_type}

    def statistics(self) -> dict:
        return {"server_type": "batch", "pilots": self.policy.statistics(), "jobs_submitted": self.jobs_submitted,
                "pilot_agent": self.agent_address}
