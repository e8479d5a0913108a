"""Batches in the ethic simulation (:mod:`.sim_runtime`), as the runtime
sends and reads them.

* **The client's outbox**: the asyncio client keeps the CALLs and CANCELs a
  user makes in one loop iteration per server and sends them at the end of
  the iteration, one message (a ``batch``) per user and SeD process
  (docs/architecture.md, "Batches"). Here a loop iteration of a client
  process is the jobs that were ready when it began (the job running and the
  ones queued behind it then); what arrives meanwhile is the next iteration.
  The client pays ``client_msg`` per message and ``client_batch_item`` per
  call or cancel in a batch.
* **The SeD's read**: a SeD process reads a batch with its queues paused
  (nothing starts, nothing is preempted until the end), resumes them after
  every ``PAUSE_CALLS`` calls admitted and at the end, or ``CANCEL_GRACE``
  later when a cancel freed a running slot (other users' cancels of the same
  moment are on their way): the constants are the SeD runtime's
  (:mod:`gridrpc.sed.calls.receive`, :mod:`gridrpc.sed.calls.run`). It pays
  ``sed_msg`` per message and ``sed_batch_item`` per call or cancel, and
  answers the batch (ACCEPTED, CANCELLED) with one message.
"""
from __future__ import annotations

from ..core.queue import Request
from ..core.sed_calls import CANCEL_GRACE, PAUSE_CALLS
from .sim_procs import Proc

__all__ = ["BatchesMixin"]


class BatchesMixin:
    """The outbox of the client processes and the batch reads of the SeD
    processes, for :class:`~.sim_runtime.ScenarioSim` (``batches=True``)."""

    def _init_batches(self) -> None:
        self.outbox: dict[Proc, dict[tuple[str, Proc], list[tuple]]] = {}
        self.iteration_left: dict[Proc, int] = {}          # client process -> jobs left in this iteration
        self.grace_at: dict[Proc, float] = {}              # SeD process -> when its paused queues resume

    # -- the client's outbox --------------------------------------------------------
    def _c_out(self, c: Proc, user: str, sp: Proc, item: tuple) -> None:
        self.outbox.setdefault(c, {}).setdefault((user, sp), []).append(item)

    def _job_begins(self, proc: Proc) -> None:
        if self.batches and proc.kind == "client" and proc not in self.iteration_left:
            self.iteration_left[proc] = len(proc.queue)    # the jobs ready now: this iteration

    def _job_ended(self, proc: Proc) -> None:
        left = self.iteration_left.get(proc)
        if left is None:
            return
        if left > 0:
            self.iteration_left[proc] = left - 1
            return
        del self.iteration_left[proc]
        self._flush(proc)

    def _flush(self, c: Proc) -> None:
        """The end of a loop iteration: each user's messages to each SeD
        process leave as one (alone when it is one)."""
        out = self.outbox.pop(c, None)
        if not out:
            return
        o = self.o
        for items in out.values():
            self._charge(c, o.client_msg + (len(items) * o.client_batch_item if len(items) > 1 else 0.0), 1)
        for (_user, sp), items in out.items():
            if len(items) == 1:
                self._c_send(c, sp, items[0])
            else:
                self._send(c, sp, self._sp_batch, sp, items)

    def _c_send(self, c: Proc, sp: Proc, item: tuple) -> None:
        if item[0] == "call":
            self._send(c, sp, self._sp_call, *item[1:])
        else:
            self._send(c, sp, self._sp_cancel, *item[1:])

    def _c_read_batch(self, user: str, n: int, cancelled: int, sp: Proc) -> None:
        """The SeD's answers to one batch (ACCEPTED, CANCELLED), one message."""
        self._charge(self.client_of[user], self.o.client_msg + n * self.o.client_batch_item, 1)
        self.out_at[user][sp] -= cancelled

    # -- the SeD's read -------------------------------------------------------------
    def _sp_batch(self, sp: Proc, items: list[tuple]) -> None:
        """A batch of one user's CALLs and CANCELs, taken as one read of the SeD's socket."""
        o = self.o
        self._charge(sp, o.sed_msg)                              # the batch in
        self._sp_pause(sp)
        calls = answers = cancelled = 0
        freed = False
        user = ""
        for item in items:
            sname = item[1]
            sch = self.sed_of[sname]
            if item[0] == "call":
                _, sname, rid, user, optional = item
                self._charge(sp, o.sed_batch_item + self.sched * (len(sch.requests) + 1), 0)
                t = sp.busy_until
                self._sed(sname, sch.submit(Request(id=rid, user=user, service="sleep", optional=optional,
                                                    submitted=t), t))
                calls += 1
                if calls % PAUSE_CALLS == 0 and not freed and sp not in self.grace_at:
                    self._sp_resume(sp)                          # the queues start work, then pause again
                    self._sp_pause(sp)
            else:
                rid = item[2]
                user = rid.split("/", 1)[0]
                known = rid in sch.requests
                freed = freed or rid in sch.running
                self._charge(sp, o.sed_batch_item + (self.sched * len(sch.requests) if known else 0.0), 0)
                self._sed(sname, sch.cancel(rid, sp.busy_until))
                cancelled += known
            answers += 1
        if freed:
            if sp not in self.grace_at:
                self.grace_at[sp] = t = sp.busy_until + CANCEL_GRACE
                self._push(t, "job", sp, self._sp_grace_end, (sp, t))
        elif sp not in self.grace_at:
            self._sp_resume(sp)
        if self.zero:
            return
        self._charge(sp, o.sed_msg + answers * o.sed_batch_item, 1)   # the answers, one batch out
        self._send(sp, self.client_of[user], self._c_read_batch, user, answers, cancelled, sp)

    def _sp_pause(self, sp: Proc) -> None:
        for sname in self.names_of[sp]:
            self.sed_of[sname].pause()

    def _sp_resume(self, sp: Proc) -> None:
        t = sp.busy_until
        for sname in self.names_of[sp]:
            self._sed(sname, self.sed_of[sname].resume(t))

    def _sp_grace_end(self, sp: Proc, when: float) -> None:
        if self.grace_at.get(sp) == when:
            del self.grace_at[sp]
            self._sp_resume(sp)
