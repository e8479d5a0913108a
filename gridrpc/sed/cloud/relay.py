"""Forwarding calls from the cloud SeD to the SeD running on a VM.

The cloud SeD relays each call *as it received it*: the client's CALL header
(service, encoded arguments) and its binary frames go to the VM unchanged,
under a new request id; the VM's RESULT or ERROR frames come back unchanged
too. Nothing is decoded and re-encoded on the way, so numpy arrays stay
zero-copy and ``gridrpc.File`` arguments reach the VM as file contents (not
as paths on the cloud SeD's disk).

:class:`VMLink` is one DEALER per VM. Like the client, it waits for ACCEPTED
within ``ack_timeout`` and pings the VM's SeD every ``ping_interval`` while
calls run there; silence for ``ping_timeout``, or a PONG saying the VM does
not know the call (restarted), raises :class:`VMFailed` in the waiting
:meth:`VMLink.run`.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from ...core import messages as m
from ...core.messages import MsgType
from ...errors import GridRPCError, ProtocolError
from ...transport.channel import Channel, connect_dealer

log = logging.getLogger(__name__)


class VMFailed(Exception):
    """The VM could not run the call: unreachable, silent, died, lost it."""


@dataclass
class _Relay:
    id: str
    accepted: asyncio.Future
    done: asyncio.Future
    last_pong: float = field(default_factory=time.monotonic)


class VMLink:
    def __init__(self, name: str, address: str, *, ack_timeout: float = 10.0,
                 ping_interval: float = 1.0, ping_timeout: float = 4.0) -> None:
        self.name, self.address = name, address
        self.ack_timeout, self.ping_interval, self.ping_timeout = ack_timeout, ping_interval, ping_timeout
        self.loop = asyncio.get_running_loop()
        self.channel = Channel(connect_dealer(address), self._on_message, name=f"cloud->{name}")
        self.relays: dict[str, _Relay] = {}
        self.closed = False
        self._pinger = self.loop.create_task(self._ping_loop(), name=f"ping-{name}")

    async def run(self, relay_id: str, header: dict, buffers: list) -> tuple[MsgType, dict, list]:
        """Send the call (``header`` gets ``relay_id`` and this VM's SeD name)
        and wait for its RESULT or ERROR: ``(type, header, frames)``."""
        if self.closed:
            raise VMFailed(f"VM {self.name} is gone")
        r = _Relay(id=relay_id, accepted=self.loop.create_future(), done=self.loop.create_future())
        self.relays[relay_id] = r
        try:
            try:
                self.channel.send([m.dumps(dict(header, id=relay_id, sed=self.name)), *buffers])
            except GridRPCError as exc:
                raise VMFailed(f"cannot send the call to VM {self.name}: {exc}") from exc
            try:
                await asyncio.wait_for(asyncio.shield(r.accepted), self.ack_timeout)
            except asyncio.TimeoutError:
                raise VMFailed(f"VM {self.name} ({self.address}) did not accept the call within "
                               f"{self.ack_timeout:g} s") from None
            return await r.done
        finally:
            self.relays.pop(relay_id, None)

    def cancel(self, relay_id: str) -> None:
        """Ask the VM's SeD to cancel (fire and forget)."""
        try:
            self.channel.send([m.dumps(m.make(MsgType.CANCEL, relay_id, sed=self.name))])
        except GridRPCError:
            pass

    def fail_all(self, reason: str) -> None:
        for r in list(self.relays.values()):
            _fail(r, VMFailed(reason))

    def close(self, reason: str = "closed") -> None:
        if self.closed:
            return
        self.closed = True
        self.fail_all(f"VM {self.name} {reason}")
        self._pinger.cancel()
        self.channel.close()

    # ------------------------------------------------------------------ internals
    def _on_message(self, frames: list) -> None:
        try:
            mt, h = m.parse_header(frames[0].bytes)
        except ProtocolError as exc:
            log.warning("bad message from VM %s: %s", self.name, exc)
            return
        now = time.monotonic()
        if mt is MsgType.PONG:
            for rid, state in (h.get("calls") or {}).items():
                r = self.relays.get(rid)
                if r is None:
                    continue
                if state == "unknown" and r.accepted.done():
                    _fail(r, VMFailed(f"VM {self.name} lost call {rid} (its SeD restarted?)"))
                else:
                    r.last_pong = now
            return
        r = self.relays.get(h["id"])
        if r is None:
            return                      # CANCELLED acks, answers to given-up relays
        r.last_pong = now
        if mt is MsgType.ACCEPTED:
            if not r.accepted.done():
                r.accepted.set_result(True)
        elif mt in (MsgType.RESULT, MsgType.ERROR):
            if not r.accepted.done():
                r.accepted.set_result(True)
            if not r.done.done():
                r.done.set_result((mt, h, list(frames[1:])))

    async def _ping_loop(self) -> None:
        while True:
            await asyncio.sleep(self.ping_interval)
            now = time.monotonic()
            ask = []
            for r in list(self.relays.values()):
                if r.done.done() or not r.accepted.done():
                    continue
                if now - r.last_pong > self.ping_timeout:
                    _fail(r, VMFailed(f"VM {self.name} ({self.address}) stopped answering for "
                                      f"{now - r.last_pong:.1f} s"))
                else:
                    ask.append(r.id)
            if ask:
                try:
                    self.channel.send([m.dumps(m.make(MsgType.PING, f"ping-{ask[0]}", ids=ask))])
                except GridRPCError:
                    pass


def _fail(r: _Relay, exc: BaseException) -> None:
    for f in (r.accepted, r.done):
        if not f.done():
            f.set_exception(exc)
            f.exception()
