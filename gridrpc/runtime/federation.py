"""The master agent's links to its peers (federation, the rules in
:mod:`gridrpc.core.agent.federation`).

One DEALER per peer MA, connected with ``IMMEDIATE`` so that a send to a
peer whose connection is down fails at once (a partition between sites is
reported in milliseconds, not after the discovery budget); under security
it speaks CURVE with this MA's element key and the peer's public key. The
answers (SERVERS or ERROR, validated like every message) go to the state
machine as :class:`~gridrpc.core.agent.machine.FromPeer`; anything else, or anything
malformed, is dropped and counted. Frames are bounded like the endpoint's.
"""
from __future__ import annotations

import logging
from typing import Callable, Mapping

import zmq

from ..core import messages as m
from ..core.agent.machine import FromPeer, PeerUnreachable
from ..core.messages import MsgType
from ..errors import ConfigError, GridRPCError, ProtocolError
from ..transport.channel import Channel, connect_dealer
from ..transport.endpoint import DEFAULT_MAX_MESSAGE
from ..transport.security import Security

log = logging.getLogger(__name__)

_ANSWERS = (MsgType.SERVERS, MsgType.ERROR)


class PeerLinks:
    """``feed(event)``: hands an event to the agent's state machine (and
    carries out its actions). ``peer_keys``: peer address -> its CURVE public
    key (required under security)."""

    def __init__(self, name: str, peers: list[str], feed: Callable[[object], None], *,
                 security: Security | None = None, peer_keys: Mapping[str, bytes] | None = None,
                 max_message_size: int = DEFAULT_MAX_MESSAGE) -> None:
        self.name = name
        self.peers = list(peers)
        self.feed = feed
        self.security = security
        self.peer_keys = dict(peer_keys or {})
        self.max_message_size = max_message_size
        self.channels: dict[str, Channel] = {}
        self.dropped = 0
        if security is not None and security.enabled:
            missing = [p for p in self.peers if not self.peer_keys.get(p)]
            if missing:
                raise ConfigError(f"{name}: security is on but the public key of peer(s) {', '.join(missing)} "
                                  "is unknown: give --peer-key KEYFILE for each --peer (in the same order)")

    def start(self) -> None:
        for addr in self.peers:
            opts: dict = {zmq.MAXMSGSIZE: int(self.max_message_size)}
            if self.security is not None and self.security.enabled:
                opts.update(self.security.client_options(self.peer_keys[addr]))
            sock = connect_dealer(addr, immediate=True, options=opts)
            self.channels[addr] = Channel(sock, lambda frames, a=addr: self._on_frames(a, frames),
                                          name=f"{self.name}->peer {addr}")
        if self.peers:
            log.info("%s: federated with %s", self.name, ", ".join(self.peers))

    def send(self, peer: str, header: dict) -> None:
        ch = self.channels.get(peer)
        try:
            if ch is None:
                raise GridRPCError(f"no link to peer {peer}")
            ch.send([m.dumps(header)])
        except GridRPCError as exc:
            log.info("%s: discovery %s not sent to peer %s: %s", self.name, header.get("id"), peer, exc)
            self.feed(PeerUnreachable(peer, header.get("id", "")))

    def _on_frames(self, peer: str, frames: list) -> None:
        try:
            mt, h = m.parse_header(frames[0].bytes)
        except ProtocolError as exc:
            self._drop(peer, str(exc))
            return
        if mt not in _ANSWERS or len(frames) != 1:
            self._drop(peer, f"unexpected {mt.value!r} from a peer")
            return
        self.feed(FromPeer(peer, mt, h))

    def _drop(self, peer: str, why: str) -> None:
        self.dropped += 1
        if self.dropped in (1, 10, 100, 1000) or self.dropped % 10_000 == 0:
            log.warning("%s: dropped a message from peer %s (%d so far): %s", self.name, peer, self.dropped, why)

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()
        self.channels.clear()


