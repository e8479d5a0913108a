"""Events and actions of the agent state machine (:mod:`gridrpc.core.agent.machine`).

Events go in (``state.handle(event, now)``); actions come out. All are frozen
value objects; the headers inside are plain dicts (validated wire headers).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..messages import MsgType


# -- events -----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Received:
    """A validated message on the agent's endpoint (from a child or a client)."""
    peer: bytes                     # the sender's routing id: answers go back there
    type: MsgType
    header: dict
    user: str | None = None         # authenticated identity ("element:LA1", "user:alice"); None: no security


@dataclass(frozen=True, slots=True)
class FromParent:
    """A validated message from the parent (DISCOVER, PING)."""
    type: MsgType
    header: dict


@dataclass(frozen=True, slots=True)
class FromPeer:
    """A validated answer (SERVERS or ERROR) from a peer master agent to a
    discovery this agent forwarded (federation, :mod:`gridrpc.core.agent.federation`)."""
    peer: str                       # the peer as configured (its address)
    type: MsgType
    header: dict


@dataclass(frozen=True, slots=True)
class PeerUnreachable:
    """A :class:`SendPeer` could not be delivered (no connection to the peer)."""
    peer: str
    id: str


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: expire discoveries past their deadline and children silent
    past the heartbeat timeout. ``wall``: the wall-clock time at ``now`` (unix
    seconds), to show heartbeat times in the tree; None keeps the last one."""
    wall: float | None = None


@dataclass(frozen=True, slots=True)
class SendFailed:
    """A :class:`Send` could not be delivered (the peer is gone)."""
    send: "Send"


@dataclass(frozen=True, slots=True)
class Rejected:
    """A message was refused at the boundary (answered there); counted here."""


# -- actions ----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Send:
    """Send ``header`` to a peer of the endpoint. ``children``: for a
    discovery fan-out, the children this message asks (report a failed
    delivery with :class:`SendFailed`)."""
    to: bytes
    header: dict
    children: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SendParent:
    header: dict


@dataclass(frozen=True, slots=True)
class SendPeer:
    """Send ``header`` (a forwarded DISCOVER) to a peer master agent; report a
    failed delivery with :class:`PeerUnreachable`."""
    peer: str
    header: dict


@dataclass(frozen=True, slots=True)
class ChildrenUpdated:
    """A child registered, heartbeated or left. ``reregister``: the subtree's
    shape or services changed since the parent last heard them: register
    again with the parent."""
    reregister: bool


@dataclass(frozen=True, slots=True)
class ChildLost:
    name: str
    reason: str                     # "left" (unregistered) | "silent" (missed its heartbeats)
