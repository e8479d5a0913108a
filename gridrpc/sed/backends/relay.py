"""Relaying a call to a remote SeD: the back-ends whose calls run on SeDs
they start elsewhere (the cloud back-end's VMs, the pilot back-end's pilot
jobs) share this protocol; only *where* a call goes is theirs.

The SeD relays each call *as it received it*: the client's CALL header
(service, encoded arguments) and its binary frames go to the remote SeD
unchanged, under a new request id; its RESULT or ERROR frames come back
unchanged too. Nothing is decoded and re-encoded on the way, so numpy arrays
stay zero-copy and ``gridrpc.File`` arguments reach the remote SeD as file
contents (not as paths on the relaying SeD's disk).

:class:`SeDLink` is one DEALER per remote SeD, driving the clients' call
machine (:mod:`gridrpc.core.client_call.machine`, one candidate, no failover: the back-end's
policy picks another place): ACCEPTED within ``ack_timeout``, pings every
``ping_interval`` while calls run there; silence for ``ping_timeout``, a PONG
saying the remote SeD does not know the call (restarted) or a reply that does
not parse raises :class:`RelayFailed` in the waiting :meth:`SeDLink.run`, and
the remote SeD gets a CANCEL whenever the relay gives a call up.

:class:`RelayBackend` is the execution back-end's side: it keeps the frames
when a call is accepted, waits until the back-end's policy names a place
(:func:`wake`), relays, reports a failed relay to the policy (which decides
whether the call runs elsewhere: a non-idempotent call that was sent never
does) and answers with the remote SeD's reply, its ``backend`` field naming
the place (:func:`~gridrpc.sed.backends.with_backend`) and its run time
learnt from the remote SeD's timing.
"""
from __future__ import annotations

import asyncio
import functools
import logging
from typing import Callable, ClassVar

from ...client.driver import AsyncCallDriver, Flight
from ...client.ids import new_id
from ...core import messages as m
from ...core.client_call.machine import CallMachine, CallPolicy, Done
from ...core.messages import MsgType
from ...core.sed_calls import CallState
from ...transport.channel import Channel, connect_dealer
from . import BaseBackend, Outcome, with_backend

log = logging.getLogger(__name__)

__all__ = ["RelayFailed", "CallGivenUp", "SeDLink", "RelayBackend", "PolicyTimer", "wake"]


class RelayFailed(Exception):
    """The remote SeD could not run the call: unreachable, silent, died, lost
    it. ``sent``: the call had left for it (it may have run there); False
    when it was known gone before anything was sent."""

    def __init__(self, message: str, *, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


class CallGivenUp(Exception):
    """The back-end's policy gave up on a call (its ``FailCall``), or the
    back-end shuts down; ``kind`` is the wire error kind of the answer."""

    def __init__(self, message: str, kind: str = "communication") -> None:
        super().__init__(message)
        self.kind = kind


class _Target:
    __slots__ = ("name", "address")

    def __init__(self, name: str, address: str) -> None:
        self.name, self.address = name, address


class SeDLink:
    """The relay to one remote SeD (*name* at *address*); *noun* names it in
    messages ("VM", "pilot")."""

    def __init__(self, name: str, address: str, *, noun: str = "SeD", ack_timeout: float = 10.0,
                 ping_interval: float = 1.0, ping_timeout: float = 4.0) -> None:
        self.name, self.address, self.noun = name, address, noun
        self.policy = CallPolicy(ack_timeout=ack_timeout, ping_interval=ping_interval, ping_timeout=ping_timeout,
                                 failover=False)
        self.loop = asyncio.get_running_loop()
        self.driver = AsyncCallDriver(self.loop, self._send, new_id=new_id, decode=_raw, name=f"relay->{name}")
        self.channel = Channel(connect_dealer(address), functools.partial(self.driver.on_message, address),
                               name=f"relay->{name}")
        self.relays: dict[str, Flight] = {}
        self.closed = False

    async def run(self, relay_id: str, header: dict, buffers: list) -> tuple[MsgType, dict, list]:
        """Send the call (``header`` gets ``relay_id`` and the remote SeD's
        name) and wait for its RESULT or ERROR: ``(type, header, frames)``."""
        if self.closed:
            raise RelayFailed(f"{self.noun} {self.name} is gone", sent=False)
        machine = CallMachine(str(header.get("service", "call")), [_Target(self.name, self.address)],
                              policy=self.policy, new_id=lambda: relay_id, noun=self.noun)
        flight = self.relays[relay_id] = self.driver.launch(machine, dict(header), buffers)
        try:
            outcome = await self.driver.wait(flight)       # cancelled: CANCEL to the remote SeD
        finally:
            self.relays.pop(relay_id, None)
        if type(outcome) is Done:
            return outcome.value
        if outcome.error.from_server:           # the remote SeD answered ERROR: relay it as is
            return outcome.error.reply
        raise RelayFailed(outcome.error.message)

    def cancel(self, relay_id: str) -> None:
        """Ask the remote SeD to cancel (fire and forget). A relay given up
        (:meth:`run` cancelled or failed) has already sent its CANCEL."""
        flight = self.relays.get(relay_id)
        if flight is not None:
            self.driver.cancel(flight)

    def close(self, reason: str = "closed") -> None:
        if self.closed:
            return
        self.closed = True
        self.driver.abort_all(f"{self.noun} {self.name} {reason}")
        self.driver.flush()             # their CANCELs leave before the socket closes
        self.channel.close()

    def _send(self, address: str, frames: list) -> None:
        self.channel.send(frames)


def wake(waiters: dict, call_id: str, result=None, error: BaseException | None = None) -> None:
    """Wake the call waiting for a place to run (``waiters[call_id]``, a
    future), if it still waits: with the place chosen (a VM, a pilot), or
    with ``error``. The back-ends answer their policies' ``Dispatch`` and
    ``FailCall`` this way."""
    fut = waiters.get(call_id)
    if fut is not None and not fut.done():
        if error is None:
            fut.set_result(result)
        else:
            fut.set_exception(error)


class PolicyTimer:
    """The one timer of a relay back-end's policy (the pilot pool, the VM
    pool): :meth:`arm` after each batch of the policy's actions sets it for
    the policy's ``next_wakeup(now)`` (a time, or None: nothing to wake for),
    and when it fires the actions of ``policy.tick(now)`` go to ``apply``
    (which arms it again). ``clock`` is the policy's clock: its times are
    read on it. It fires ``slack`` seconds past the wake-up, so the policy
    finds that time passed. After :meth:`close` it never fires again."""

    def __init__(self, policy, apply: Callable[[list], None], clock: Callable[[], float],
                 slack: float = 0.01) -> None:
        self.policy, self.apply, self.clock, self.slack = policy, apply, clock, slack
        self.handle: asyncio.TimerHandle | None = None
        self.closed = False

    def arm(self) -> None:
        """(Re)set the timer for the policy's next wake-up (on the running loop)."""
        if self.closed:
            return
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        now = self.clock()
        at = self.policy.next_wakeup(now)
        if at is not None:
            self.handle = asyncio.get_running_loop().call_later(max(0.0, at - now) + self.slack, self._fire)

    def close(self) -> None:
        self.closed = True
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def _fire(self) -> None:
        self.handle = None
        if not self.closed:
            self.apply(self.policy.tick(self.clock()))


def _raw(header: dict, frames: list) -> tuple[MsgType, dict, list]:
    return MsgType.RESULT, header, list(frames[1:])


class RelayBackend(BaseBackend):
    """An execution back-end whose calls are relayed to remote SeDs that a
    policy of its own chooses. A subclass sets ``sed_name``, the class
    attributes below, and answers four hooks from its policy:
    :meth:`relay_admit` (a call wants a place: the policy's ``Dispatch``
    reaches :func:`wake` with the place's name), :meth:`relay_failed`,
    :meth:`relay_done` and :meth:`relay_cancelled`. It opens a link when a
    remote SeD registers (:meth:`link_registered`) and drops it when that SeD is
    lost or leaves (:meth:`drop_link`: its relays raise, so the policy hears
    :meth:`relay_failed`)."""
    relay_noun: ClassVar[str] = "SeD"          # what a place is called in messages: "VM", "pilot"
    detail_key: ClassVar[str] = "sed"          # its name's key in the reply's backend field and timing
    sed_what: ClassVar[str] = "relay SeD"      # what this SeD is called in messages: "cloud SeD", ...
    failure_type: ClassVar[str] = "RelayFailure"          # the error type of a call given up
    unavailable_type: ClassVar[str] = "RelayFailure"      # ... of kind "unavailable"
    sed_name: str

    def __init__(self) -> None:
        self.links: dict[str, SeDLink] = {}            # the remote SeDs ready, by place name
        self.waiters: dict[str, asyncio.Future] = {}   # call id -> the place it will run on
        self.closing = False
        self.ack_timeout = 10.0                        # s for a remote SeD's ACCEPTED

    # ------------------------------------------------------------------ the back-end's policy
    def relay_admit(self, call) -> None:
        """Ask the policy for a place for *call* (it wakes the call's waiter)."""
        raise NotImplementedError

    def relay_failed(self, call_id: str, place: str, exc: RelayFailed) -> None:
        """The relay of *call_id* to *place* failed: the policy retries it
        elsewhere (another wake) or gives it up (wake with an error)."""
        raise NotImplementedError

    def relay_done(self, call_id: str) -> None:
        """The remote SeD answered the call."""
        raise NotImplementedError

    def relay_cancelled(self, call_id: str) -> None:
        """The call was cancelled while waiting or running."""
        raise NotImplementedError

    # ------------------------------------------------------------------ links
    def link_registered(self, children: dict, wanted: Callable[[str], bool]) -> list[tuple[str, str]]:
        """Relay to each remote SeD among *children* (the registry of the
        agent they register with: name -> child with ``info["address"]``)
        that is *wanted* (one of this back-end's places, expected now) and
        not linked at that address yet; one that re-registered at a new
        address (restarted) gets a new link. Returns the ``(name, address)``
        newly linked, for the policy."""
        linked = []
        for name, child in list(children.items()):
            address = child.info.get("address")
            link = self.links.get(name)
            if (link is not None and link.address == address) or not isinstance(address, str) \
                    or not address.startswith(("tcp://", "ipc://")) or not wanted(name):
                continue        # linked already, a stranger, or a place given up (its SeD still talking)
            if link is not None:
                self.drop_link(name, "re-registered at a new address")
            self.links[name] = SeDLink(name, address, noun=self.relay_noun, ack_timeout=self.ack_timeout,
                                       ping_interval=self.sed.hb_interval, ping_timeout=self.sed.hb_timeout + 1.0)
            linked.append((name, address))
        return linked

    def drop_link(self, name: str, why: str) -> None:
        """Stop relaying to place *name*: its relays raise RelayFailed(*why*)."""
        link = self.links.pop(name, None)
        if link is not None:
            link.close(why)

    # ------------------------------------------------------------------ calls
    def prepare(self, service, kwargs, header, buffers) -> tuple[dict, dict]:
        # the call goes to the remote SeD as the client sent it (arrays zero-copy, files as contents)
        return kwargs, {"forward": {k: v for k, v in header.items() if k not in ("id", "sed")},
                        "buffers": list(buffers)}

    async def run(self, call) -> Outcome | None:
        cid = call.id
        forward, buffers = call.options.get("forward", {}), call.options.get("buffers", [])
        loop = asyncio.get_running_loop()
        self.waiters[cid] = loop.create_future()
        current: tuple[SeDLink, str] | None = None      # the relay in progress, to cancel it
        try:
            if self.closing:
                raise CallGivenUp(self.shutting_down())
            self.relay_admit(call)
            while True:
                place = await self.waiters[cid]
                self.waiters[cid] = loop.create_future()
                link = self.links.get(place)
                rid = new_id()            # the client's id may be long: ids stay within the wire limit
                try:
                    if link is None:
                        raise RelayFailed(f"{self.relay_noun} {place} is gone", sent=False)
                    current = (link, rid)
                    log.debug("%s %s: call %s -> %s %s as %s", self.sed_what, self.sed_name, cid,
                              self.relay_noun, place, rid)
                    mt, vh, frames = await link.run(rid, forward, buffers)
                    current = None
                except RelayFailed as exc:
                    current = None
                    log.warning("%s %s: call %s: %s", self.sed_what, self.sed_name, cid, exc)
                    if self.closing:
                        raise CallGivenUp(str(exc)) from None
                    self.relay_failed(cid, place, exc)
                    continue            # the policy's choice wakes the waiter (a place or an error)
                return self.relay_answered(call, place, mt, vh, frames)
        except CallGivenUp as exc:
            return self.given_up(call, exc)
        except asyncio.CancelledError:
            if current is not None:
                current[0].cancel(current[1])
            if not self.closing:
                self.relay_cancelled(cid)
            raise
        finally:
            self.waiters.pop(cid, None)
            call.options = {}           # the frames to relay: no longer needed

    def relay_answered(self, call, place: str, mt: MsgType, vh: dict, frames: list) -> Outcome:
        """The remote SeD's RESULT or ERROR as this SeD's answer: relayed as
        is, its ``backend`` field naming *place*; the service's run time
        (learnt for ``tcomp``) is the remote SeD's."""
        timing = vh.get("timing") if isinstance(vh.get("timing"), dict) else {}
        run_time = None
        if mt is MsgType.RESULT:
            started, ended = timing.get("started"), timing.get("ended")
            if isinstance(started, (int, float)) and isinstance(ended, (int, float)) and ended >= started:
                run_time = min(ended - started, 1e7)
        self.relay_done(call.id)
        return Outcome(ok=mt is MsgType.RESULT, header=with_backend(vh, self.name, {self.detail_key: place}),
                       buffers=frames, timing={self.detail_key: timing}, run_time=run_time)

    def given_up(self, call, exc: CallGivenUp) -> Outcome:
        """The answer of a call the policy gave up on (kind ``server_lost``:
        the client's ServerLost, naming the call)."""
        message = f"{self.sed_what} {call.replica.name} could not run the call: {exc}"
        if exc.kind == "server_lost":
            return Outcome(ok=False, header=m.make(MsgType.ERROR, call.id, error={
                "kind": "server_lost", "type": "ServerLost", "message": message, "traceback": "",
                "call_id": call.id}))
        return Outcome(ok=False, kind=exc.kind, error=(
            self.unavailable_type if exc.kind == "unavailable" else self.failure_type, message, ""))

    def finished(self, call, header, frames, delivered) -> None:
        call.options = {}               # calls answered before they ran (cancel, shutdown)
        super().finished(call, header, frames, delivered)

    # ------------------------------------------------------------------ shutdown
    def shutting_down(self) -> str:
        return f"{self.sed_what} {self.sed_name} is shutting down"

    async def stop_relays(self) -> None:
        """At shutdown (``closing`` set): the calls waiting for a place, or
        queued here, fail now (not after their clients' ping timeout), those
        being relayed fail as their links close; then their answers leave."""
        message = self.shutting_down()
        for fut in list(self.waiters.values()):
            if not fut.done():
                fut.set_exception(CallGivenUp(message))
        for call in [c for c in self.sed.calls.values() if c.state is CallState.QUEUED]:
            self.sed.answer(call, m.error_header(call.id, "communication", message, type_=self.failure_type,
                                                 **self.sed.timing(call)), ok=False)
        for name in list(self.links):
            self.drop_link(name, f"shut down with the {self.sed_what}")
        await asyncio.sleep(0)                  # let the calls answer their clients
