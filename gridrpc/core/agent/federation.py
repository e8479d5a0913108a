"""Federation of master agents (DIET's Multi-MA), in the pure agent state
machine (:mod:`gridrpc.core.agent.machine`).

MAs of different trees (sites) are linked as *peers*: an MA's
``AgentConfig.peers`` lists them (the runtime keeps one connection per peer;
here a peer is its address, an opaque string). A discovery for a service
that no server of the local tree offers is forwarded to every peer, with a
hop limit and the list of MAs it went through (``hops``, ``via``):

- the forwarded DISCOVER carries ``hops`` = what is left after this MA (the
  client's request gets ``config.peer_hops``; a request's own ``hops`` can only
  lower it) and ``via`` = the names of the MAs it went through, this one
  last. An MA that finds its own name in ``via`` answers "not here" at once
  (no loops, even in a ring of peers); ``hops`` = 0 is answered from the
  local tree only;
- the peers' answers are ranked with the request's aggregator, as children's
  answers are, and the best ``k`` go to the client, which then calls the
  remote SeD directly (the answer holds its address, and its key under CURVE);
- the peers get the same share of the budget as children do; a peer that
  cannot be reached (the send fails at once: its connection is down) or
  does not answer in time is named in the error: ``peer_unreachable``, not
  retried by clients, so a partition between sites fails fast with a clear
  message instead of the call's whole timeout.

A service the local tree offers, but whose servers are all busy beyond
``config.peer_busy_wait`` seconds (their ``est_wait`` in the MA's view; off
by default), is asked of the peers too: the local servers and the peers'
are ranked together, so a saturated site sends work to an idle one (only
from a view answer, the MA's usual path; a fan-out answer is not re-asked).

Under security, only an *element* key (another site's MA, whose public key
the operator put in this MA's key directory) may send a DISCOVER with
``via``: a client cannot pose as a peer.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import messages as m
from .vocabulary import FromPeer, SendPeer
from .roles import child_budget_ms
from ..discovery import Done
from ..messages import MsgType

__all__ = ["Federating", "PEER_PREFIX", "MAX_PEER_HOPS"]

PEER_PREFIX = "peer:"          # how a peer is named among a pending discovery's "children"
LOCAL = "local:"               # the local servers' answer, when a busy tree asks its peers too
MAX_PEER_HOPS = 4              # the largest ``hops`` a message may carry (fields.py)


@dataclass(slots=True)
class _Forwarded:
    """What a federated discovery needs to answer: the peers that could not
    be asked or did not answer, and the error kinds peers answered with."""
    peers: tuple[str, ...]
    unreachable: list[str]
    errors: dict[str, str]


class Federating:
    """The federation transitions of :class:`~gridrpc.core.agent.machine.AgentState`
    (state: ``config.peers``, ``config.peer_hops``, ``_forwarded``)."""

    def _hops_left(self, h: dict, user: str | None) -> int:
        """How many more hops this discovery may travel (0: not forwarded)."""
        if not self.config.peers or not self.role.root:
            return 0
        via = h.get("via") or ()
        if via and user is not None and not user.startswith("element:"):
            return 0                            # under security only an MA (an element key) forwards
        hops = self.config.peer_hops if h.get("hops") is None else min(h["hops"], self.config.peer_hops)
        if self.name in via or len(via) >= MAX_PEER_HOPS:
            return 0
        return max(0, hops)

    def _federate_busy(self, h: dict, reply_to: tuple, service: str, k: int, agg, local: list, budget: float,
                       now: float, user: str | None) -> list | None:
        """The local servers of a view answer are all busy beyond
        ``config.peer_busy_wait`` (their ``est_wait``): ask the peers too, and
        rank their servers with the local ones. None: answer locally."""
        bound = self.config.peer_busy_wait
        if bound is None or not local or min(_wait(s) for s in local) <= bound:
            return None
        return self._federate(h, reply_to, service, k, agg, budget, now, user, local=local)

    def _federate(self, h: dict, reply_to: tuple, service: str, k: int, agg, budget: float, now: float,
                  user: str | None, local: list | None = None) -> list | None:
        """Forward a discovery to the peers: the local tree cannot answer it
        (``local`` None), or its servers (``local``) are all too busy. None
        when there is nothing to forward (no peers, no hops left)."""
        hops = self._hops_left(h, user)
        if hops <= 0:
            return None
        peers = self.config.peers
        via = list(h.get("via") or ())
        self._seq += 1
        fid = f"{self.name}:f{self._seq}"
        fwd = dict(h, id=fid, hops=hops - 1, via=via + [self.name], budget_ms=child_budget_ms(budget), k=k)
        fwd.pop("names", None)
        self._forwarded[fid] = _Forwarded(tuple(peers), [], {})
        self.counters.forwarded += 1
        self._in_flight_from(reply_to)
        out: list = [SendPeer(p, fwd) for p in peers]
        waiting = [PEER_PREFIX + p for p in peers] + ([LOCAL] if local is not None else [])
        done = self.discoveries.start(fid, (reply_to, h["id"], service, k), waiting, k, agg, now + budget, now)
        if local is not None:
            self.counters.forwarded_busy += 1
            done = self.discoveries.answer(fid, LOCAL, local, now)
        if done is not None:
            out.extend(self._finish(done, now))
        return out

    def _from_peer(self, ev: FromPeer, now: float) -> list:
        """A peer MA answered one of our forwarded discoveries."""
        h = ev.header
        fid = h.get("id")
        f = self._forwarded.get(fid) if isinstance(fid, str) else None
        if f is None or ev.peer not in f.peers:
            self.counters.answers_ignored += 1
            return []
        if ev.type is MsgType.SERVERS:
            servers = [s for s in h.get("servers") or () if isinstance(s, dict)]
        else:
            err = h.get("error") if isinstance(h.get("error"), dict) else {}
            f.errors[ev.peer] = str(err.get("kind") or "error")
            servers = []
        done = self.discoveries.answer(fid, PEER_PREFIX + ev.peer, servers, now)
        return self._finish(done, now) if done is not None else []

    def _peer_unreachable(self, peer: str, fid: str, now: float) -> list:
        """A forward to ``peer`` could not be sent (its connection is down)."""
        f = self._forwarded.get(fid)
        if f is None:
            return []
        f.unreachable.append(peer)
        done = self.discoveries.drop(fid, [PEER_PREFIX + peer], now)
        return self._finish(done, now) if done is not None else []

    def _federated_answer(self, done: Done, rid: str, service: str) -> dict | None:
        """The error of a federated discovery that found nothing (None: the
        ranked SERVERS). Forgets the discovery."""
        f = self._forwarded.pop(done.id, None)
        if f is None or done.servers:
            return None
        lost = f.unreachable + [t[len(PEER_PREFIX):] for t in done.timed_out if t.startswith(PEER_PREFIX)]
        if lost:
            return m.error_header(rid, "peer_unreachable",
                                  f"no server of {self.name}'s tree offers {service!r}, and peer master "
                                  f"agent(s) {', '.join(sorted(set(lost)))} could not be asked (unreachable, "
                                  "or no answer in time: a partition between sites?)")
        others = ", ".join(f.peers)
        return m.error_header(rid, "service_not_found",
                              f"no server offers {service!r} in {self.name}'s tree nor in its peers' ({others})")


def _wait(server: dict) -> float:
    """A server's announced wait before a free slot (``est_wait``; 0 if none)."""
    est = server.get("estimation")
    w = est.get("est_wait") if isinstance(est, dict) else None
    return float(w) if type(w) in (int, float) and w == w else 0.0
