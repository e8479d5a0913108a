"""``ClientOptions``: the settings shared by :class:`gridrpc.Client`,
:class:`gridrpc.AsyncClient` and the load-test ``GreenClient``.

Parsed once, before any thread or socket starts: an unknown option (a typo)
or a value of the wrong type is a :class:`TypeError` naming it, a value out of
range a :class:`ValueError`::

    >>> ClientOptions.build("Client", timout=3)
    Traceback (most recent call last):
    TypeError: Client() got an unexpected keyword argument 'timout' (did you mean 'timeout'?) ...
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, fields, replace
from typing import Any

from ..core.client_call.machine import CallPolicy

__all__ = ["ClientOptions", "option_view"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientOptions:
    """Every option is keyword-only and has a default.

    ``user``: name sent with calls (default: the login name).
    ``timeout``: default bound of a whole call, discovery included, s (None: none).
    ``discovery_timeout``: how long the MA has to answer, s.
    ``discovery_budget``: time the agents may spend collecting estimations, s
    (default: 0.6 ``discovery_timeout``).
    ``ack_timeout``: how long a SeD has to acknowledge a call before the next
    candidate is tried, s. ``ping_interval`` / ``ping_timeout``: liveness of
    the SeD during a call, s. ``failover``: retry on the next server when one
    fails. ``max_candidates``: servers asked for per discovery.
    ``max_message_size``: largest call message, bytes. ``aggregator``: default
    aggregator of discoveries (a name or ``{name, params}``).
    ``download_dir``: where files returned by services are written.
    ``retry_timeout``: how long transient failures (no master agent answers,
    an MA rebuilding its tree, every server lost before the call started)
    are retried with backoff when the call has no ``timeout``, s (within a
    timeout, until the timeout); ``discover()`` retries an MA rebuilding its
    tree for as long.
    ``share_discovery``: identical discoveries (same MAs, keys, service,
    number, aggregator, arguments) that clients of this process ask on the
    same event loop while one of them is in flight get that one's answer:
    one DISCOVER for many users arriving together (a burst of 100 users is
    one discovery, not 100). The j-th client to join gets the ranking
    rotated by j places (as the MA's memory of its recent choices spreads
    separate discoveries), so their first calls do not all land on the same
    servers. The estimates are those computed for the first asker's user, so
    leave it off when servers estimate per user (batch history) and that
    matters.
    ``reuse_discovery``: seconds a discovery answered from the master
    agent's pushed view serves the next calls of the same service (same
    kind, ``max_candidates`` and aggregator) without asking the MA again,
    re-ranked by this client's own calls in flight on each server
    (:mod:`gridrpc.client.reuse`; docs/performance.md). An answer that
    showed every server full (a saturated tree) serves longer, up to 1 s
    (``gridrpc.client.reuse.SATURATED_REUSE``), while this client calls back
    to back and those servers stay full by its count. 0 turns it off: every
    call asks the MA. A call on data references, an answer from a fan-out
    (estimations that depend on the request) and ``discover()`` itself always
    ask; a failed call forgets the kept answers. Default 0.01 (10 ms).
    """
    user: str | None = None
    timeout: float | None = None
    discovery_timeout: float = 5.0
    discovery_budget: float | None = None
    ack_timeout: float = 5.0
    ping_interval: float = 1.0
    ping_timeout: float = 4.0
    failover: bool = True
    max_candidates: int = 3
    max_message_size: int = 512 * 1024 * 1024
    aggregator: Any = None
    download_dir: str | None = None
    #: CURVE: the key directory (``gridrpc keys``); security is on when given
    keys: str | None = None
    #: the name of this user's key pair in ``keys`` (default: ``user``)
    key: str | None = None
    #: the MA's public key: 40 z85 characters, a ``.key`` file, or an element
    #: name in ``keys`` (default: the element ``MA``); several MAs: one key
    #: each, comma-separated in the order of their addresses (``"MA1,MA2"``)
    ma_key: str | None = None
    retry_timeout: float = 10.0
    share_discovery: bool = False
    reuse_discovery: float = 0.01

    def __post_init__(self) -> None:
        if self.user is not None and not isinstance(self.user, str):
            _bad_type("user", self.user, "a str or None")
        for name in ("discovery_timeout", "ack_timeout", "ping_interval", "ping_timeout", "retry_timeout"):
            _positive(name, getattr(self, name))
        for name in ("timeout", "discovery_budget"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name), "a number of seconds or None")
        r = self.reuse_discovery
        if isinstance(r, bool) or not isinstance(r, (int, float)):
            _bad_type("reuse_discovery", r, "a number of seconds")
        if not 0 <= r <= 60:
            raise ValueError(f"client option reuse_discovery must be between 0 and 60 s, not {r!r}")
        if not isinstance(self.failover, bool):
            _bad_type("failover", self.failover, "True or False")
        for name in ("max_candidates", "max_message_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                _bad_type(name, value, "an int")
            if value < 1:
                raise ValueError(f"client option {name} must be >= 1, not {value!r}")
        if self.download_dir is not None and not isinstance(self.download_dir, (str, os.PathLike)):
            _bad_type("download_dir", self.download_dir, "a path or None")
        for name in ("keys", "key", "ma_key"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, (str, os.PathLike)):
                _bad_type(name, v, "a str or None")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def build(cls, owner: str, options: "ClientOptions | None" = None, defaults: dict | None = None,
              **kwargs: Any) -> "ClientOptions":
        """``options`` (or the defaults) with ``kwargs`` applied; ``owner``
        names the class in error messages. ``defaults``: the owner's own
        defaults, under the user's keywords."""
        if options is not None and not isinstance(options, ClientOptions):
            raise TypeError(f"{owner}(): options must be a gridrpc.ClientOptions, not {type(options).__name__}")
        known = cls.names()
        for key in kwargs:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise TypeError(f"{owner}() got an unexpected keyword argument {key!r}{hint}; "
                                f"client options: {', '.join(known)}")
        if options is None:
            return cls(**{**(defaults or {}), **kwargs})
        return replace(options, **kwargs) if kwargs else options

    @property
    def budget(self) -> float:
        """The discovery budget (s) sent to the agents."""
        if self.discovery_budget is not None:
            return self.discovery_budget
        return max(0.05, self.discovery_timeout * 0.6)

    def policy(self) -> CallPolicy:
        """The call machine's settings."""
        return CallPolicy(ack_timeout=float(self.ack_timeout), ping_interval=float(self.ping_interval),
                          ping_timeout=float(self.ping_timeout), failover=self.failover,
                          retry_timeout=float(self.retry_timeout))


def option_view(name: str) -> property:
    """A read-only attribute of a client showing ``client.options.<name>``."""
    return property(lambda self: getattr(self.options, name), doc=f"``ClientOptions.{name}`` (read-only)")


class OptionViews:
    """Read-only attributes ``client.timeout``... over ``client.options``,
    shared by the asyncio and the gevent clients."""
    timeout = option_view("timeout")
    discovery_timeout = option_view("discovery_timeout")
    ack_timeout = option_view("ack_timeout")
    ping_interval = option_view("ping_interval")
    ping_timeout = option_view("ping_timeout")
    failover = option_view("failover")
    max_candidates = option_view("max_candidates")
    max_message_size = option_view("max_message_size")
    aggregator = option_view("aggregator")


def _bad_type(name: str, value: Any, what: str) -> None:
    raise TypeError(f"client option {name} must be {what}, not {type(value).__name__} ({value!r})")


def _positive(name: str, value: Any, what: str = "a number of seconds") -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _bad_type(name, value, what)
    if not value > 0:
        raise ValueError(f"client option {name} must be > 0, not {value!r}")
