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
   (:class:`~gridrpc.sed.cloud.relay.VMLink`) and the answer relayed back;
   calls wait here, never on a pilot, so a draining pilot hands nothing back.

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

from ...client.ids import new_id
from ...core import messages as m
from ...core.events import EventKind, make_event
from ...core.messages import MsgType
from ...core.sed_calls import CallState
from ...errors import InvalidArgument
from ...runtime.worker_agent import WorkerAgent
from ...transport.channel import host_of
from ..backends import BaseBackend, Outcome, with_backend
from ..cloud.relay import VMFailed, VMLink, wake
from . import jobfiles
from .base import BatchBackend, BatchError, JobSpec, JobState
from .config import CALL_OPTION, BatchConfig
from .jobs import ImportableServices
from .pilot_policy import CancelPilot, Dispatch, FailCall, Note, PilotPool, SubmitPilot

log = logging.getLogger(__name__)

__all__ = ["PilotJobs", "pilot_job_spec"]

_NOTE_KINDS = {"pilot_started": EventKind.PILOT_STARTED, "draining": EventKind.PILOT_DRAINING,
               "pilot_stopped": EventKind.PILOT_STOPPED, "paused": EventKind.PILOTS_PAUSED,
               "resumed": EventKind.PILOTS_RESUMED}


class _Failed(Exception):
    """The pool gave up on a call (FailCall)."""


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


class PilotJobs(ImportableServices, BaseBackend):
    """Calls on pilot SeDs inside batch allocations (see the module doc).
    Trade-offs: one scheduler start per pilot, then calls at SeD speed (one
    relay hop); idle pilots hold allocations for ``idle_timeout``; the pilots
    must reach this SeD's pilot agent (``pilot.listen``)."""
    name: ClassVar[str] = "pilot"
    server_type = "batch"
    remote = True
    push_estimation = False     # the wait changes with every pilot and call: fan-out, not a pushed snapshot
    where = "on pilot SeDs in batch allocations"

    def __init__(self, sed_name: str, config: BatchConfig, scheduler: BatchBackend) -> None:
        if config.pilot is None:
            raise ValueError("PilotJobs needs config.pilot")
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
        self._links: dict[str, VMLink] = {}
        self._waiters: dict[str, asyncio.Future] = {}
        self._bg: set[asyncio.Task] = set()
        self._tasks: list[asyncio.Task] = []
        self._timer: asyncio.TimerHandle | None = None
        self._unknown_since: dict[str, float] = {}
        self._closing = False
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
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
        for t in self._tasks:
            t.cancel()
        for fut in list(self._waiters.values()):
            if not fut.done():
                fut.set_exception(_Failed(f"pilot SeD {self.sed_name} is shutting down"))
        for call in [c for c in self.sed.calls.values() if c.state is CallState.QUEUED]:
            self.sed.answer(call, m.error_header(call.id, "communication", f"pilot SeD {self.sed_name} is "
                                                 "shutting down", type_="PilotFailure", **self.sed.timing(call)),
                            ok=False)
        for link in list(self._links.values()):
            link.close("shut down with the pilot SeD")
        self._links.clear()
        await asyncio.sleep(0)
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
                wake(self._waiters, a.call_id, a.pilot)
            elif isinstance(a, FailCall):
                wake(self._waiters, a.call_id, error=_Failed(a.message))
            elif isinstance(a, SubmitPilot):
                if not self._closing:
                    self._spawn(self._submit(a.name))
            elif isinstance(a, CancelPilot):
                link = self._links.pop(a.name, None)
                if link is not None:
                    link.close(f"left ({a.reason})")
                if self.agent is not None:
                    self.agent.registry.remove(a.name)
                self._spawn(self._cancel(a))
            elif isinstance(a, Note):
                self._note(a.what, a.pilot, a.detail)
        self._arm_timer()

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

    def _arm_timer(self) -> None:
        if self._closing:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = time.time()
        wake = self.policy.next_wakeup(now)
        if wake is not None:
            self._timer = asyncio.get_running_loop().call_later(max(0.0, wake - now) + 0.01, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if not self._closing:
            self._apply(self.policy.tick(time.time()))

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
            if not self._closing:
                self._apply(self.policy.submit_failed(name, reason, time.time()))
            return
        self.jobs_submitted += 1
        log.info("pilot SeD %s: pilot %s is job %s", self.sed_name, name, job_id)
        if self._closing:
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
        if not self._closing:
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
                        if p is not None and p.state in ("submitting", "pending", "starting"):
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
        if self._closing or self.agent is None:
            return
        now = time.time()
        for name, child in list(self.agent.registry.children.items()):
            address = child.info.get("address")
            p = self.policy.pilots.get(name)
            if name in self._links or p is None or not isinstance(address, str) \
                    or not address.startswith(("tcp://", "ipc://")):
                continue        # known already, or a stranger (not one of our pilot names)
            if p.state not in ("submitting", "pending", "starting"):
                continue
            self._links[name] = VMLink(name, address, ack_timeout=10.0, ping_interval=self.sed.hb_interval,
                                       ping_timeout=self.sed.hb_timeout + 1.0)
            self._apply(self.policy.registered(name, address, now))

    def _pilot_gone(self, name: str, why: str) -> None:
        if self._closing:
            return
        self._unknown_since.pop(name, None)
        link = self._links.pop(name, None)
        if link is not None:
            link.close(why)             # its relays raise VMFailed -> call_failed
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
        # the call goes to the pilot as the client sent it (arrays zero-copy, files as contents)
        return kwargs, {"forward": {k: v for k, v in header.items() if k not in ("id", "sed")},
                        "buffers": list(buffers)}

    def _need(self, replica, service: str) -> float:
        return self.settings.need(replica.predictor.predict(service))

    async def run(self, call) -> Outcome | None:
        cid = call.id
        forward, buffers = call.options.get("forward", {}), call.options.get("buffers", [])
        loop = asyncio.get_running_loop()
        self._waiters[cid] = loop.create_future()
        current: tuple[VMLink, str] | None = None
        try:
            if self._closing:
                raise _Failed(f"pilot SeD {self.sed_name} is shutting down")
            self._apply(self.policy.call_arrived(cid, time.time(), need=self._need(call.replica, call.service)))
            while True:
                pilot = await self._waiters[cid]
                self._waiters[cid] = loop.create_future()
                link = self._links.get(pilot)
                rid = new_id()
                try:
                    if link is None:
                        raise VMFailed(f"pilot {pilot} is gone")
                    current = (link, rid)
                    mt, vh, frames = await link.run(rid, forward, buffers)
                    current = None
                except VMFailed as exc:
                    current = None
                    log.warning("pilot SeD %s: call %s: %s", self.sed_name, cid, exc)
                    self._apply(self.policy.call_failed(cid, f"pilot {pilot} failed while running the call: "
                                                             f"{exc}", time.time()))
                    continue            # the FailCall raises from the waiter
                return self._answered(call, pilot, mt, vh, frames)
        except _Failed as exc:
            return Outcome(ok=False, kind="communication", error=(
                "PilotFailure", f"pilot SeD {self.sed_name} could not run the call: {exc}", ""))
        except asyncio.CancelledError:
            if current is not None:
                current[0].cancel(current[1])
            if not self._closing:
                self._apply(self.policy.cancel(cid, time.time()))
            raise
        finally:
            self._waiters.pop(cid, None)
            call.options = {}

    def _answered(self, call, pilot: str, mt: MsgType, vh: dict, frames: list) -> Outcome:
        timing = vh.get("timing") if isinstance(vh.get("timing"), dict) else {}
        run_time = None
        if mt is MsgType.RESULT:
            started, ended = timing.get("started"), timing.get("ended")
            if isinstance(started, (int, float)) and isinstance(ended, (int, float)) and ended >= started:
                run_time = min(ended - started, 1e7)
        self._apply(self.policy.call_done(call.id, time.time()))
        return Outcome(ok=mt is MsgType.RESULT, header=with_backend(vh, self.name, {"pilot": pilot}), buffers=frames,
                       timing={"pilot": timing}, run_time=run_time)

    def finished(self, call, header, frames, delivered) -> None:
        call.options = {}
        super().finished(call, header, frames, delivered)

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
