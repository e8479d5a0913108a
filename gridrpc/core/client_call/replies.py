"""A server's reply to a call, as the event the call machine takes (pure).

Every driver of :class:`~gridrpc.core.client_call.machine.CallMachine` (the
asyncio and gevent clients through :class:`gridrpc.client.driver.CallDriver`,
the relay to VMs and pilots in :mod:`gridrpc.sed.backends.relay`, the
simulator's clients in :mod:`gridrpc.sim.client_node`) turns the replies of a
SeD into machine events with these two functions, so the mapping of a header
field to an event field is written once.
"""
from __future__ import annotations

from typing import Any

from .vocabulary import Accepted, CancelAck, Error, Malformed, Pong, Result
from ..messages import MsgType

__all__ = ["pong_events", "reply_event"]


def pong_events(h: dict) -> list[Pong]:
    """The :class:`Pong` of every call a PONG header names (none if it names none)."""
    calls = h.get("calls")
    if not isinstance(calls, dict):
        return []
    return [Pong(cid, str(state)) for cid, state in calls.items()]


def reply_event(mt: MsgType, h: dict, value: Any = None, reply: tuple | None = None) -> Any:
    """The event of a reply of type ``mt`` (not PONG: :func:`pong_events`)
    to the call ``h["id"]``. ``value``: the decoded value of a RESULT (its
    decoding is the driver's: it needs the frames); ``reply``: what an
    ERROR's event keeps of the message (``(mt, header, buffers)``, for a
    client that hands the raw error on)."""
    cid = h["id"]
    if mt is MsgType.RESULT:
        return Result(cid, value, _dict(h.get("timing")), _str(h.get("server")))
    if mt is MsgType.ACCEPTED:
        return Accepted(cid, h.get("patience"), h.get("idempotent"), h.get("state"))
    if mt is MsgType.ERROR:
        return Error(cid, h["error"], _dict(h.get("timing")), _str(h.get("server")), reply=reply)
    if mt is MsgType.CANCELLED:
        return CancelAck(cid, _str(h.get("state")), _dict(h.get("timing")))
    return Malformed(f"unexpected {mt.value!r} message", cid)


def _dict(v: Any) -> dict | None:
    return v if isinstance(v, dict) else None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None
