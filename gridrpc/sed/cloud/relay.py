"""Forwarding calls from the cloud SeD to the SeD running on a VM.

The cloud SeD relays each call *as it received it*: the client's CALL header
(service, encoded arguments) and its binary frames go to the VM unchanged,
under a new request id; the VM's RESULT or ERROR frames come back unchanged
too. Nothing is decoded and re-encoded on the way, so numpy arrays stay
zero-copy and ``gridrpc.File`` arguments reach the VM as file contents (not
as paths on the cloud SeD's disk).

:class:`VMLink` is one DEALER per VM, driving the clients' call machine
(:mod:`gridrpc.core.call`, one candidate, no failover: the cloud policy picks
another VM): ACCEPTED within ``ack_timeout``, pings every ``ping_interval``
while calls run there; silence for ``ping_timeout``, a PONG saying the VM
does not know the call (restarted) or a reply that does not parse raises
:class:`VMFailed` in the waiting :meth:`VMLink.run`, and the VM gets a CANCEL
whenever the relay gives a call up.
"""
from __future__ import annotations

import asyncio
import functools
import logging

from ...client.driver import AsyncCallDriver, Flight
from ...client.ids import new_id
from ...core.call import CallMachine, CallPolicy, Done
from ...core.messages import MsgType
from ...transport.channel import Channel, connect_dealer

log = logging.getLogger(__name__)


class VMFailed(Exception):
    """The VM could not run the call: unreachable, silent, died, lost it.
    ``sent``: the call had left for the VM (it may have run there); False
    when the VM was known gone before anything was sent."""

    def __init__(self, message: str, *, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


class _VM:
    __slots__ = ("name", "address")

    def __init__(self, name: str, address: str) -> None:
        self.name, self.address = name, address


class VMLink:
    def __init__(self, name: str, address: str, *, ack_timeout: float = 10.0,
                 ping_interval: float = 1.0, ping_timeout: float = 4.0) -> None:
        self.name, self.address = name, address
        self.ack_timeout, self.ping_interval, self.ping_timeout = ack_timeout, ping_interval, ping_timeout
        self.policy = CallPolicy(ack_timeout=ack_timeout, ping_interval=ping_interval, ping_timeout=ping_timeout,
                                 failover=False)
        self.loop = asyncio.get_running_loop()
        self.driver = AsyncCallDriver(self.loop, self._send, new_id=new_id, decode=_raw, name=f"cloud->{name}")
        self.channel = Channel(connect_dealer(address), functools.partial(self.driver.on_message, address),
                               name=f"cloud->{name}")
        self.relays: dict[str, Flight] = {}
        self.closed = False

    async def run(self, relay_id: str, header: dict, buffers: list) -> tuple[MsgType, dict, list]:
        """Send the call (``header`` gets ``relay_id`` and this VM's SeD name)
        and wait for its RESULT or ERROR: ``(type, header, frames)``."""
        if self.closed:
            raise VMFailed(f"VM {self.name} is gone", sent=False)
        machine = CallMachine(str(header.get("service", "call")), [_VM(self.name, self.address)],
                              policy=self.policy, new_id=lambda: relay_id, noun="VM")
        flight = self.relays[relay_id] = self.driver.launch(machine, dict(header), buffers)
        try:
            outcome = await self.driver.wait(flight)       # cancelled: CANCEL to the VM
        finally:
            self.relays.pop(relay_id, None)
        if type(outcome) is Done:
            return outcome.value
        if outcome.error.from_server:           # the VM's SeD answered ERROR: relay it as is
            return outcome.error.reply
        raise VMFailed(outcome.error.message)

    def cancel(self, relay_id: str) -> None:
        """Ask the VM's SeD to cancel (fire and forget). A relay given up
        (:meth:`run` cancelled or failed) has already sent its CANCEL."""
        flight = self.relays.get(relay_id)
        if flight is not None:
            self.driver.cancel(flight)

    def fail_all(self, reason: str) -> None:
        self.driver.abort_all(reason)

    def close(self, reason: str = "closed") -> None:
        if self.closed:
            return
        self.closed = True
        self.fail_all(f"VM {self.name} {reason}")
        self.driver.flush()             # their CANCELs leave before the socket closes
        self.channel.close()

    def _send(self, address: str, frames: list) -> None:
        self.channel.send(frames)


def wake(waiters: dict, call_id: str, result=None, error: BaseException | None = None) -> None:
    """Wake the call waiting for a place to run (``waiters[call_id]``, a
    future), if it still waits: with the worker chosen (a VM, a pilot), or
    with ``error``. The cloud pool and the pilot manager answer their
    policies' ``Dispatch`` and ``FailCall`` this way."""
    fut = waiters.get(call_id)
    if fut is not None and not fut.done():
        if error is None:
            fut.set_result(result)
        else:
            fut.set_exception(error)


def _raw(header: dict, frames: list) -> tuple[MsgType, dict, list]:
    return MsgType.RESULT, header, list(frames[1:])
