"""A fake hypervisor: turns instances of a (moto) EC2 API into local processes.

moto's instances never boot anything. ``FakeHypervisor`` watches the API from a
background thread and, for every instance that becomes ``running``, calls
``on_start(vm)`` (a test starts a real SeD there, configured from the VM's user
data: ``hv.user_data(vm.id)``); when the instance is terminated or disappears
it calls ``on_stop(vm, handle)`` with what ``on_start`` returned.

Faults, to test the cloud SeD's policies:

- ``boot_delay``: seconds between "running" in the API and ``on_start``
  (a VM takes a while to boot before its SeD registers);
- ``never_boot(vm_id)`` / ``never_boot(nth=N)``: that instance runs in the API
  but ``on_start`` is never called (a VM whose image is broken);
- ``die(vm_id)``: call ``on_stop`` now although the API still says running
  (the VM crashed); it is not restarted.

Every callback runs on the hypervisor thread, one at a time. ``stop()`` joins
the thread and calls ``on_stop`` for every instance still started.
"""
from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gridrpc.sed.cloud.provider import VM, CloudProvider, LibcloudProvider

log = logging.getLogger(__name__)


def _launch_order(vm: VM) -> tuple:
    return (vm.launched_at is None, vm.launched_at.timestamp() if vm.launched_at else 0.0,
            vm.id)


class FakeHypervisor:
    """Watches ``provider_or_endpoint`` (a :class:`CloudProvider`, or an EC2
    endpoint URL) every ``poll_interval`` s, for the instances carrying all of
    ``tag_filter``'s tags.

    ``events`` records ``(kind, vm_id)`` in order; kinds: ``seen`` (first
    seen running), ``start``, ``stop``,
    ``never_boot``, ``die``, ``start_failed``, ``cancel`` (an instance that went
    away before its boot delay elapsed), ``poll_error`` (listing failed; vm_id
    is ``""``; nothing is stopped because of it).

    "The Nth instance" counts instances in the order the hypervisor first sees
    them running (1-based); instances seen in the same poll are ordered by
    launch time, then id.
    """

    def __init__(self, provider_or_endpoint: CloudProvider | str,
                 on_start: Callable[[VM], Any], on_stop: Callable[[VM, Any], None],
                 poll_interval: float = 0.2, *, boot_delay: float = 0.0,
                 tag_filter: Mapping[str, str] | None = None,
                 never_boot_ids: Iterable[str] = (), never_boot_nth: Iterable[int] = (),
                 region: str = "us-east-1"):
        if isinstance(provider_or_endpoint, str):
            provider_or_endpoint = LibcloudProvider(endpoint=provider_or_endpoint,
                                                    region=region, timeout=5.0)
        self.provider = provider_or_endpoint
        self.on_start, self.on_stop = on_start, on_stop
        self.poll_interval = poll_interval
        self.boot_delay = boot_delay
        self.tag_filter = dict(tag_filter or {})
        self.events: list[tuple[str, str]] = []
        self.poll_errors = 0
        self._never_ids = set(never_boot_ids)
        self._never_nth = set(never_boot_nth)
        self._seen = 0                               # instances seen running so far
        self._known: set[str] = set()                # ids ever seen running
        self._booting: dict[str, float] = {}         # id -> when on_start is due
        self._started: dict[str, tuple[VM, Any]] = {}     # id -> (vm, handle)
        self._user_data: dict[str, str | None] = {}
        self._commands: queue.Queue = queue.Queue()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> "FakeHypervisor":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fake-hypervisor",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop watching; ``on_stop`` every instance still started."""
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise RuntimeError("fake hypervisor thread did not stop")
        for vm_id in list(self._started):
            self._do_stop(vm_id, "stop")

    def __enter__(self) -> "FakeHypervisor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---------------------------------------------------------------- faults
    def never_boot(self, vm_id: str | None = None, *, nth: int | None = None) -> None:
        """Make an instance (by id, or the ``nth`` seen) never call on_start.
        Must be set before the instance is seen running."""
        with self._cond:
            if vm_id is not None:
                self._never_ids.add(vm_id)
            if nth is not None:
                self._never_nth.add(nth)

    def die(self, vm_id: str, timeout: float = 10.0) -> None:
        """The VM dies: ``on_stop`` now (or cancel its pending boot); it will
        not be started again. Returns once done."""
        if self._thread is None or self._stopped:
            raise RuntimeError("the hypervisor is not running")
        done = threading.Event()
        self._commands.put((vm_id, done))
        self._wake.set()
        if not done.wait(timeout):
            raise TimeoutError(f"die({vm_id}) not handled within {timeout} s")

    # ---------------------------------------------------------------- inspection
    @property
    def started(self) -> dict[str, Any]:
        """Instances currently started: id -> handle."""
        with self._cond:
            return {vm_id: h for vm_id, (_vm, h) in self._started.items()}

    def ids(self, kind: str) -> list[str]:
        with self._cond:
            return [vm_id for k, vm_id in self.events if k == kind]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait until ``predicate()`` (evaluated after each event) holds."""
        with self._cond:
            if not self._cond.wait_for(predicate, timeout):
                raise TimeoutError(f"hypervisor: condition not met within {timeout} s; "
                                   f"events={self.events}")

    def wait_event(self, kind: str, count: int = 1, timeout: float = 10.0) -> list[str]:
        """Wait until ``count`` events of ``kind`` happened; their vm ids."""
        self.wait_for(lambda: sum(k == kind for k, _ in self.events) >= count, timeout)
        return self.ids(kind)

    def user_data(self, vm_id: str) -> str | None:
        """The instance's user data (needs a provider with ``user_data()``,
        such as LibcloudProvider); cached."""
        if vm_id not in self._user_data:
            self._user_data[vm_id] = self.provider.user_data(vm_id)  # type: ignore[attr-defined]
        return self._user_data[vm_id]

    # ---------------------------------------------------------------- the thread
    def _record(self, kind: str, vm_id: str) -> None:
        with self._cond:
            self.events.append((kind, vm_id))
            self._cond.notify_all()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                next_due = self._tick(time.monotonic())
            except Exception:  # never let the watcher die silently
                log.exception("fake hypervisor: tick failed")
                next_due = None
            wait = self.poll_interval
            if next_due is not None:
                wait = max(0.0, min(wait, next_due - time.monotonic()))
            self._wake.wait(wait)

    def _tick(self, now: float) -> float | None:
        self._handle_commands()
        try:
            vms = self.provider.list(self.tag_filter)
        except Exception as exc:  # a failed poll must not stop any VM
            self.poll_errors += 1
            self._record("poll_error", "")
            log.warning("fake hypervisor: listing instances failed: %s", exc)
            return None
        running = {vm.id: vm for vm in vms if vm.state == "running"}
        for vm_id in [i for i in self._started if i not in running]:
            # listed but not running (shutting-down, stopped...), or not listed
            # at all: terminated (lists leave terminated instances out) or gone
            now_vm = next((vm for vm in vms if vm.id == vm_id), None)
            if now_vm is None:
                now_vm = dataclasses.replace(self._started[vm_id][0], state="terminated")
            self._do_stop(vm_id, "stop", now_vm)
        for vm_id in [i for i in self._booting if i not in running]:
            del self._booting[vm_id]
            self._record("cancel", vm_id)
        for vm in sorted(running.values(), key=_launch_order):
            if vm.id in self._known:
                continue
            self._known.add(vm.id)
            self._seen += 1
            self._record("seen", vm.id)
            with self._cond:
                never = vm.id in self._never_ids or self._seen in self._never_nth
            if never:
                self._record("never_boot", vm.id)
            else:
                self._booting[vm.id] = now + self.boot_delay
        for vm_id, due in list(self._booting.items()):
            if due <= time.monotonic() and not self._stop.is_set():
                del self._booting[vm_id]
                self._do_start(running[vm_id])
        return min(self._booting.values(), default=None)

    def _handle_commands(self) -> None:
        while True:
            try:
                vm_id, done = self._commands.get_nowait()
            except queue.Empty:
                return
            self._known.add(vm_id)  # known ids are never started (again)
            if vm_id in self._booting:
                del self._booting[vm_id]
                self._record("die", vm_id)
            elif vm_id in self._started:
                self._do_stop(vm_id, "die")
            else:
                self._record("die", vm_id)
            done.set()

    def _do_start(self, vm: VM) -> None:
        try:
            handle = self.on_start(vm)
        except Exception:
            log.exception("fake hypervisor: on_start(%s) failed", vm.id)
            self._record("start_failed", vm.id)
            return
        with self._cond:
            self._started[vm.id] = (vm, handle)
        self._record("start", vm.id)

    def _do_stop(self, vm_id: str, kind: str, vm: VM | None = None) -> None:
        with self._cond:
            old_vm, handle = self._started.pop(vm_id)
        try:
            self.on_stop(vm or old_vm, handle)
        except Exception:
            log.exception("fake hypervisor: on_stop(%s) failed", vm_id)
        self._record(kind, vm_id)
