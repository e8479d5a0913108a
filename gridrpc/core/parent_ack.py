"""What a child (LA, SeD replica) does with its parent's acknowledgements (pure).

A parent answers a REGISTER with REGISTERED and a HEARTBEAT with
HEARTBEAT_ACK. The acknowledgement may say that the parent does not know the
child (``known: false``: a restarted parent; the child registers again and
is detached until the parent registers it), or that the parent's view lacks
some snapshots of the child's subtree (``view_missing``; heeded only by a
child already attached: a new attachment pushes everything anyway). The
first acknowledgement after a (re)registration attaches the child.

:class:`gridrpc.transport.parent_link.ParentLink` (the daemons) and the
simulator's elements (:mod:`gridrpc.sim.agent_node`,
:mod:`gridrpc.sim.sed_node`) both decide with :func:`parent_ack`.
"""
from __future__ import annotations

from dataclasses import dataclass

from .messages import MsgType

__all__ = ["ParentAck", "parent_ack"]


@dataclass(frozen=True, slots=True)
class ParentAck:
    """``register``: register again (the child is detached until the parent
    acknowledges); ``view_missing``: the snapshots to push again;
    ``attached_now``: this acknowledgement attaches the child (its
    ``on_attached``: an agent pushes its whole view)."""
    register: bool = False
    view_missing: tuple = ()
    attached_now: bool = False


_REGISTER = ParentAck(register=True)


def parent_ack(mt: MsgType, h: dict, attached: bool) -> ParentAck:
    """What to do with an acknowledgement (REGISTERED or HEARTBEAT_ACK ``h``)
    from the parent, for a child that is ``attached`` or not."""
    if mt is MsgType.HEARTBEAT_ACK and not h.get("known", True):
        return _REGISTER
    missing = h.get("view_missing") if attached else None      # validated at parse: a list of names
    return ParentAck(view_missing=tuple(missing) if missing else (), attached_now=not attached)
