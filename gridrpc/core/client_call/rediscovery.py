"""Discovery and retries of the call machine (:mod:`gridrpc.core.client_call.machine`).

A machine built with ``discover=True`` and no candidates asks the agents for
them (a :class:`~gridrpc.core.client_call.vocabulary.Discover` action) and, on a
transient failure, discovers again after an exponential backoff until the
call's deadline (or ``policy.retry_timeout`` after the start), each backoff
shortened at random by up to ``policy.backoff_jitter`` (clients that failed
together, e.g. when an MA died, do not come back together); the servers
already given up on are left out of the next answer. The rules are drawn in
:mod:`gridrpc.core.client_call.machine`'s docstring.

:class:`Rediscovery` holds those transitions; :class:`~gridrpc.core.client_call.machine.
CallMachine` inherits them (its ``__slots__`` hold the state used here:
``discover``, ``discoveries``, ``retry_at``, ``retry_until``, ``excluded``,
``last_error``).
"""
from __future__ import annotations

import random

from .vocabulary import CallError, Discover, Discovered, DiscoveryFailed, Phase

__all__ = ["TRANSIENT_KINDS", "Rediscovery"]

#: the one source of randomness of the machine (backoff jitter; ``policy.backoff_jitter=0`` for none);
#: a module-level generator keeps the machine free of I/O and seedable by tests
_jitter = random.Random()

#: discovery failures worth retrying: nothing is known to be wrong with the request
TRANSIENT_KINDS = frozenset({"rebuilding", "communication", "no_server", "timeout"})


class Rediscovery:
    """The discovery and retry transitions of :class:`~gridrpc.core.client_call.machine.CallMachine`."""

    __slots__ = ()

    def _discovered(self, ev: Discovered, now: float) -> list:
        if self.phase is not Phase.DISCOVERING:
            return []
        servers = [s for s in ev.servers if s.name not in self.excluded] or list(ev.servers)
        if not servers:
            return self._retry_or_fail(now, CallError(kind="no_server",
                                                      message=f"no server available for {self.service!r}"))
        self.candidates = tuple(servers) if self.policy.failover else tuple(servers)[:1]
        self.first_free = ev.first_free if servers[0] is ev.servers[0] else None
        return self._send_to(0, now)

    def _discovery_failed(self, ev: DiscoveryFailed, now: float) -> list:
        if self.phase is not Phase.DISCOVERING:
            return []
        err = CallError(kind=ev.kind, message=ev.message)
        if ev.kind not in TRANSIENT_KINDS:
            return self._fail(err)
        return self._retry_or_fail(now, err)

    def _discover_now(self, now: float) -> list:
        self.phase = Phase.DISCOVERING
        self.discoveries += 1
        left = None if self.deadline is None else max(0.0, self.deadline - now)
        return [Discover(self.discoveries, left)]

    def _retry_or_fail(self, now: float, err: CallError) -> list:
        """A transient failure: discover again after the backoff if time is
        left, else fail with ``err``."""
        self.last_error = err
        pol = self.policy
        delay = min(pol.backoff_max, pol.backoff_initial * (2 ** max(0, self.discoveries - 1)))
        if pol.backoff_jitter > 0:       # "equal jitter": a restarted MA is not met by a synchronized herd
            delay *= 1.0 - min(1.0, pol.backoff_jitter) * _jitter.random()
        if not self.discover or now + delay >= self.retry_until:
            if self.deadline is not None and now + delay >= self.deadline:
                return self._fail(self._retry_timeout_error())
            return self._fail(err)
        self.phase = Phase.BACKOFF
        self.retry_at = now + delay
        return []

    def _retry_timeout_error(self) -> CallError:
        if self.last_error is not None:
            last = f": {self.last_error.message}"
        elif self.phase is Phase.DISCOVERING:
            last = ": the master agent did not answer the discovery in time"
        else:
            last = ""
        return CallError(kind="timeout", message=f"call to {self.service} timed out after "
                                                 f"{self.discoveries} discovery attempt(s){last}")
