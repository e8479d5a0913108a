"""Execution back-ends of the SeD: where and how a call runs.

The SeD runtime (:mod:`gridrpc.sed.server`) receives calls, keeps their
records (:class:`~gridrpc.core.sed_calls.SedCalls`), answers and talks to its
parent; everything about *running* a call is its back-end's, behind
:class:`ExecutionBackend`:

==============  ====================================================  ======================
back-end        runs a call                                           trade-offs
==============  ====================================================  ======================
``process``     in a forked worker process (:mod:`.local`)            killable, crash-proof;
                                                                      a pipe hop per call
``inline``      in the SeD (a thread; coroutines on its loop)         fastest, no isolation:
                                                                      a crash or a hang is
                                                                      the SeD's; cancel
                                                                      cannot stop a thread
``batch``       as a job of a batch scheduler (Slurm, SGE, OAR:       whole clusters; a job
                :mod:`gridrpc.sed.batch.jobs`)                        per call (seconds)
``pilot``       on SeDs inside pilot jobs of a batch scheduler        many short calls per
                (:mod:`gridrpc.sed.batch.pilots`)                     job; idle pilots hold
                                                                      allocations a while
``cloud``       on VMs the SeD starts and stops                       elastic, priced; boot
                (:mod:`gridrpc.sed.cloud.vms`)                        times
==============  ====================================================  ======================

``process`` and ``inline`` are registered by name (``SeD(isolation=...)``);
the batch (and pilot) and cloud back-ends need their configuration and are built by
:class:`~gridrpc.sed.batch.sed.BatchSeD` and
:class:`~gridrpc.sed.cloud.sed.CloudSeD`, which are SeDs with that back-end.
Each family is a *kind* of SeD (``sed``, ``batch``, ``cloud``) in
:mod:`.registry`, which brings its ``gridrpc sed`` flags, its deployment-file
kind and settings, and its ``server_type``: a new back-end registers one there.

A back-end is given the SeD (``bind``) and may use: ``name``, ``services``,
``functions``, ``replicas``, ``calls`` (live records), ``lifecycle``,
``host`` (host metrics), ``tmpdir``, ``hb_interval``/``hb_timeout``,
``bind_address``, ``admit(call)`` (queue a call, e.g. recovered after a
restart), ``answer(call, header, buffers, ok=)`` (answer a call and close its
record) and ``timing(call)``.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol, runtime_checkable

from ...errors import ConfigError
from ...files import FileSink

if TYPE_CHECKING:  # pragma: no cover
    from ..calls.receive import LiveCall
    from ..server import Replica, SeD
    from ..services import Service

__all__ = ["ExecutionBackend", "BaseBackend", "Outcome", "BACKENDS", "register_backend", "make_backend",
           "with_backend"]


@dataclass(slots=True, kw_only=True)
class Outcome:
    """How a call ended, as its back-end tells the runtime, which adds the
    call id, the server and the timing and answers the client.

    Either ``value`` (ok: the service's return value, encoded by the
    runtime), ``error`` (``(type, message, traceback)`` with ``kind``), or a
    ready ``header`` (RESULT or ERROR fields) with its ``buffers`` (a job's
    result file, a VM's answer relayed as is)."""
    ok: bool
    value: Any = None
    error: tuple[str, str, str] | None = None
    kind: str = "remote"
    header: dict | None = None
    buffers: list = field(default_factory=list)
    timing: dict = field(default_factory=dict)      # more timing fields (e.g. the VM's)
    run_time: float | None = None                   # seconds the service ran (learnt for tcomp)


def with_backend(header: dict, name: str, detail: dict) -> dict:
    """A copy of the RESULT or ERROR *header* whose ``backend`` field also
    holds what back-end *name* says about the call (*detail*: its job, its VM,
    its pilot), next to what the back-ends it relays already said. The wire
    bounds the field (:data:`gridrpc.core.fields.BACKEND`); the names are the
    back-ends'."""
    said = header.get("backend")
    return dict(header, backend={**(said if isinstance(said, dict) else {}), name: detail})


@runtime_checkable
class ExecutionBackend(Protocol):
    """Runs a SeD's calls. Members in the order of a call's life."""
    name: ClassVar[str]              # registry name: process | inline | batch | pilot | cloud
    server_type: str                 # estimation tag: serial | batch | cloud
    ack_delay: float                 # s; 0: ACCEPTED at once (else a quick RESULT stands for it)
    linger_answers: bool             # answers may wait up to 1 ms to go as a batch (messages.linger):
                                     # only where "sent" may stand for "delivered" (not batch: it keeps
                                     # an answer that did not reach its client)
    copy_args: bool                  # decoded arrays must be writable copies (they stay in the SeD)
    remote: bool                     # services run elsewhere: non-importable targets are offered
    where: str                       # where calls run, for docs and messages

    def bind(self, sed: "SeD") -> None:
        """Attach to the SeD (called once, in the SeD's constructor)."""

    async def start(self) -> None:
        """Start (before the SeD binds its socket: no call arrives before it returns)."""

    def check_service(self, name: str, fn: Callable | str) -> None:
        """Raise ConfigError if ``fn`` cannot run here (batch: not importable on the nodes)."""

    def services_changed(self, name: str, fn: Callable | str | None) -> None:
        """Service ``name`` was added (``fn``) or removed (None)."""

    def file_sink(self, workdir: str) -> Callable:
        """Where files sent with a call go (the codec's file writer; gives paths)."""

    def new_workdir(self) -> str:
        """A fresh directory name for one call's files (never from the message)."""

    def prepare(self, service: "Service", kwargs: dict, header: dict, buffers: list) -> tuple[dict, dict]:
        """Per-call options: ``(service kwargs, options)`` (batch: ``_batch``;
        cloud: the frames to relay). InvalidArgument on bad options."""

    def ack_fields(self, call: "LiveCall") -> dict:
        """More fields of ACCEPTED (batch: ``patience``)."""

    async def run(self, call: "LiveCall") -> Outcome | None:
        """Run the call; None if it was stopped (its answer is the runtime's)."""

    def start_now(self, call: "LiveCall", done: Callable[["Outcome | None"], None]) -> bool:
        """Start the call at once without a task, if the back-end can: then
        ``done(outcome)`` is called when it ends (as :meth:`run` would
        return). False: the runtime runs :meth:`run` in a task."""

    def send_ahead(self, call: "LiveCall", after: "LiveCall") -> bool:
        """Hand over ``call``, still queued, to run right after ``after`` (the
        only running call) where ``after`` runs, before the server has seen
        ``after`` end (a worker kept hot). The server then starts it with
        :meth:`start_now` or withdraws it with :meth:`kill`. False: nothing
        was handed over."""

    def kill(self, call: "LiveCall") -> bool:
        """Stop a running call (cancel, preemption), or withdraw one sent
        ahead. True if the back-end ends the run itself; False: the runtime
        cancels the task running it."""

    def timing(self, call: "LiveCall") -> dict:
        """More timing fields of the answer (batch: the job's)."""

    def finished(self, call: "LiveCall", header: dict, frames: list, delivered: bool) -> None:
        """The call was answered (``delivered``: the client got it)."""

    def remove_workdir(self, workdir: str) -> None:
        """Remove a call's files (a refused call, or one that never became a job)."""

    async def fetch_kept(self, call_id: str) -> list | None:
        """Frames of an answer the back-end holds (:meth:`SedCalls.hold`)."""

    def kept_delivered(self, call_id: str) -> None:
        """A held answer reached its client."""

    def estimate(self, replica: "Replica", service: "Service", user: str | None, now: float) -> dict:
        """The estimation tags of ``replica`` for ``service`` (the service's own
        estimation function is applied by the runtime on top)."""

    def load(self, replica: "Replica") -> dict:
        """More fields of the load the parent sees."""

    def statistics(self) -> dict:
        """More fields of the SeD's statistics."""

    async def close(self) -> None:
        """Stop (the SeD's socket is still open: calls may still be answered)."""


class BaseBackend:
    """Defaults of :class:`ExecutionBackend`; back-ends override what they need."""
    name: ClassVar[str] = "base"
    server_type = "serial"
    ack_delay = 0.0
    linger_answers = False
    copy_args = True
    remote = False
    where = "in the SeD"
    push_estimation = True      # the estimation does not depend on the user: pushed (discovery from the view)
    sed: "SeD"

    def bind(self, sed: "SeD") -> None:
        self.sed = sed
        self._workdirs = 0
        self._made_workdirs: set[str] = set()

    async def start(self) -> None:
        pass

    def check_service(self, name, fn) -> None:
        pass

    def services_changed(self, name, fn) -> None:
        pass

    def file_sink(self, workdir: str) -> Callable:
        sink = FileSink(workdir, as_path=True)
        made = self._made_workdirs

        def write(ref):                       # remember the directories that really exist
            made.add(workdir)
            return sink(ref)
        return write

    def new_workdir(self) -> str:
        # created only when files arrive (then recorded); removed when the call ends
        self._workdirs += 1
        return os.path.join(self.sed.tmpdir, f"call-{self._workdirs}")

    def prepare(self, service, kwargs, header, buffers) -> tuple[dict, dict]:
        return kwargs, {}

    def ack_fields(self, call) -> dict:
        return {}

    def start_now(self, call, done) -> bool:
        return False

    async def run(self, call) -> Outcome | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def send_ahead(self, call, after) -> bool:
        return False

    def kill(self, call) -> bool:
        return False

    def timing(self, call) -> dict:
        return {}

    def finished(self, call, header, frames, delivered) -> None:
        if call.workdir:
            self.remove_workdir(call.workdir)

    def remove_workdir(self, workdir: str) -> None:
        # only directories files were written to: no file-system call per call otherwise
        # (an rmtree of a missing directory cost ~90 us per call here)
        if workdir in self._made_workdirs:
            self._made_workdirs.discard(workdir)
            shutil.rmtree(workdir, ignore_errors=True)

    async def fetch_kept(self, call_id: str) -> list | None:
        return None

    def kept_delivered(self, call_id: str) -> None:
        pass

    def estimate(self, replica, service, user, now) -> dict:
        from .local import queue_estimate
        return queue_estimate(self.sed, replica, service, now, self.server_type)

    def load(self, replica) -> dict:
        return {}

    def statistics(self) -> dict:
        return {}

    async def close(self) -> None:
        pass


BACKENDS: dict[str, Callable[..., ExecutionBackend]] = {}


def register_backend(name: str, factory: Callable[..., ExecutionBackend]) -> None:
    """Make ``factory(workers=N)`` available as ``SeD(isolation=name)``."""
    BACKENDS[name] = factory


def make_backend(name: str, **options) -> ExecutionBackend:
    from . import local  # noqa: F401 - registers process and inline
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise ConfigError(f"unknown SeD isolation {name!r}; known: {', '.join(sorted(BACKENDS))}") from None
    return factory(**options)
