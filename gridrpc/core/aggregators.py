"""Aggregators: how an agent ranks its children's answers and keeps the best k.

A server answer is a dict ``{"name", "address", "estimation": {tag: value}}``.
An aggregator turns a list of them into a ranked list, best first. The same
aggregator (name + params) travels with the discovery request, so every level
of the tree applies the same one (as in DIET).

Built-ins (the operator registers more at an element's start with
:func:`register_aggregator` or :func:`load_plugins`, from the deployment file's
``plugins.aggregators`` list or the ``gridrpc.aggregators`` entry-point group).
A request only *names* a registered aggregator: nothing named by a message is
ever imported (an import path in a request is an unknown name).

``default``          least recently used first (``time_since_last_solve``,
                     largest first), then random. Servers without the tag rank
                     last but are never dropped (DIET dropped them silently).
                     Its ``view_key`` lets the root keep a large view sorted
                     (core/view_rank.py); the others rank the whole view.
``priority``         ``params={"order": [["eft", "min"], ["free_cpu", "max"]]}``:
                     lexicographic on the listed tags; a missing value loses;
                     ties random.
``least_wait_time``  smallest expected wait (``est_wait``, else
                     ``num_waiting * tcomp``); tie-break ``eft``.
``least_slowdown``   smallest ``slowdown`` = (wait + run) / run.
``least_cost``       cheapest ``price`` (local servers: 0) among those with
                     ``price <= params["max_cost"]`` (if given); tie-break slowdown.
"""
from __future__ import annotations

import math
import operator
import re
import random
from typing import Any, ClassVar, Protocol

Server = dict


class Aggregator(Protocol):
    name: ClassVar[str]

    def rank(self, servers: list[Server], rng: random.Random) -> list[Server]: ...


def num(est: dict, tag: str) -> float | None:
    v = est.get(tag)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        return None
    return float(v)


def _est(server: dict) -> dict:
    """The estimation vector of an answer; a malformed one counts as empty."""
    est = server.get("estimation")
    return est if isinstance(est, dict) else {}


_KEY_RANDOM = operator.itemgetter(0, 1)      # (key, random): the same order as ``lambda t: (t[0], t[1])``


def _keyed(servers, rng, key):
    """Sort by key, random tie-break (random key drawn once per server)."""
    decorated = [(key(s), rng.random(), s) for s in servers]
    decorated.sort(key=_KEY_RANDOM)
    return [s for _, _, s in decorated]


class DefaultAggregator:
    name: ClassVar[str] = "default"
    #: a view answer may keep the SeDs sorted by :meth:`view_key` (core/view_rank.py)
    view_id: ClassVar[str] = "default"

    def __init__(self, **params: Any) -> None:
        pass

    def rank(self, servers, rng):
        # _keyed with the key inlined (an LA of a large tree ranks every SeD's answer):
        # key (0, -time_since_last_solve), or (1, 0.0) without a number; one draw per server, in order
        # flat (group, -v, random, position): the same order as ((group, -v), random) and a stable sort
        rnd = rng.random
        decorated = []
        append = decorated.append
        for i, s in enumerate(servers):
            est = s.get("estimation")
            v = est.get("time_since_last_solve") if isinstance(est, dict) else None
            if type(v) is float and v == v:             # a number, not NaN (the usual case)
                append((0, -v, rnd(), i, s))
            elif isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
                append((1, 0.0, rnd(), i, s))
            else:
                append((0, -float(v), rnd(), i, s))
        decorated.sort()                                # never compares s: the positions differ
        return [d[4] for d in decorated]

    @staticmethod
    def view_key(est: dict, at: float) -> tuple:
        """The order of :meth:`rank` for a vector taken at time ``at``, the
        same for vectors aged to any common time (the time since the last
        solve grows with age): the time of the last solve, earliest first."""
        v = num(est, "time_since_last_solve")
        return (0, at - v) if v is not None else (1, 0.0)


class PriorityAggregator:
    name: ClassVar[str] = "priority"

    def __init__(self, order: list | None = None, **params: Any) -> None:
        self.order = []
        if not isinstance(order, (list, tuple, type(None))):
            raise ValueError(f"priority aggregator: order must be a list of tags, not {order!r}")
        for item in order or []:
            if isinstance(item, str):
                tag, direction = item.lstrip("+-"), "min" if item.startswith("-") else "max"
            elif isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str):
                tag, direction = item[0], item[1]
            else:
                raise ValueError(f"priority aggregator: each order item must be 'tag', '-tag' "
                                 f"or [tag, 'min'|'max'], not {item!r}")
            if direction not in ("min", "max"):
                raise ValueError(f"priority aggregator: direction must be 'min' or 'max', not {direction!r}")
            self.order.append((str(tag), direction))

    def rank(self, servers, rng):
        def key(s):
            est = _est(s)
            out = []
            for tag, direction in self.order:
                v = num(est, tag)
                out.append((1, 0.0) if v is None else (0, v if direction == "min" else -v))
            return tuple(out)
        return _keyed(servers, rng, key)


def _wait(est: dict) -> float:
    w = num(est, "est_wait")
    if w is not None:
        return w
    tcomp = num(est, "tcomp") or 0.0
    return ((num(est, "num_waiting") or 0.0) + (num(est, "num_running") or 0.0)) * tcomp


def _slowdown(est: dict) -> float:
    s = num(est, "slowdown")
    if s is not None:
        return s
    run = num(est, "tcomp") or 0.0
    return (_wait(est) + run) / run if run > 0 else 1.0 + _wait(est)


class LeastWaitTimeAggregator:
    name: ClassVar[str] = "least_wait_time"

    def __init__(self, **params: Any) -> None:
        pass

    def rank(self, servers, rng):
        return _keyed(servers, rng, lambda s: (_wait(_est(s)),
                                               num(_est(s), "eft") or 0.0))


class LeastSlowdownAggregator:
    name: ClassVar[str] = "least_slowdown"

    def __init__(self, **params: Any) -> None:
        pass

    def rank(self, servers, rng):
        return _keyed(servers, rng, lambda s: _slowdown(_est(s)))


class LeastCostAggregator:
    name: ClassVar[str] = "least_cost"

    def __init__(self, max_cost: float | None = None, **params: Any) -> None:
        if max_cost is not None and (isinstance(max_cost, bool) or not isinstance(max_cost, (int, float))):
            raise ValueError(f"least_cost aggregator: max_cost must be a number, not {max_cost!r}")
        self.max_cost = max_cost

    def rank(self, servers, rng):
        kept = [s for s in servers
                if self.max_cost is None or (num(_est(s), "price") or 0.0) <= self.max_cost]
        return _keyed(kept, rng, lambda s: (num(_est(s), "price") or 0.0,
                                            _slowdown(_est(s))))


class LocalityAggregator:
    """Prefer servers that hold the request's data (``fetch_bytes`` 0) unless
    they are far busier: rank by the predicted completion, queue wait
    (``est_wait`` or waiting x ``tcomp``) plus run time (``tcomp``) plus the
    time to fetch the missing bytes at ``bandwidth`` bytes/s (default 1e9,
    about a 10 GbE link). Trade-off: a low ``bandwidth`` pins work to the
    holders (little traffic, possible hot spots); a high one spreads work
    and moves data. ``slack`` (s, default 0.05) treats completions that
    close as equal, so the holder wins ties."""
    name: ClassVar[str] = "locality"

    def __init__(self, bandwidth: float = 1e9, slack: float = 0.05, **params: Any) -> None:
        for what, v in (("bandwidth", bandwidth), ("slack", slack)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"locality aggregator: {what} must be a non-negative number, not {v!r}")
        if bandwidth == 0:
            raise ValueError("locality aggregator: bandwidth must be > 0")
        self.bandwidth, self.slack = float(bandwidth), float(slack)

    def rank(self, servers, rng):
        def key(s):
            est = _est(s)
            fetch = num(est, "fetch_bytes") or 0.0
            done = _wait(est) + (num(est, "tcomp") or 0.0) + fetch / self.bandwidth
            bucket = math.floor(done / self.slack) if self.slack > 0 else done
            return (bucket, fetch)
        return _keyed(servers, rng, key)


AGGREGATORS: dict[str, type] = {c.name: c for c in (
    DefaultAggregator, PriorityAggregator, LeastWaitTimeAggregator,
    LeastSlowdownAggregator, LeastCostAggregator, LocalityAggregator)}


NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")


def register_aggregator(cls: type) -> type:
    """Register an aggregator class under its ``name`` (operator code, at start)."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValueError(f"aggregator class {cls!r} needs a 'name' of letters, digits, '_', '.', '-'")
    AGGREGATORS[name] = cls
    return cls


def check_spec(spec: str | dict | None) -> tuple[str, dict]:
    """The shape of an aggregator spec (a name, or ``{"name", "params"}``),
    without resolving the name: ``(name, params)``. ValueError otherwise."""
    if spec is None:
        return "default", {}
    if isinstance(spec, str):
        name, params = spec, {}
    elif isinstance(spec, dict) and isinstance(spec.get("name"), str):
        name, params = spec["name"], spec.get("params") or {}
        if not isinstance(params, dict):
            raise ValueError("aggregator params must be an object")
    else:
        raise ValueError(f"bad aggregator spec {str(spec)[:100]!r}: a name or {{'name': ..., 'params': {{...}}}}")
    if not NAME_RE.match(name):
        raise ValueError(f"bad aggregator name {name[:100]!r}: letters, digits, '_', '.', '-' only "
                         "(a request names a registered aggregator, never code)")
    return name, params


def make_aggregator(spec: str | dict | None,
                    registry: dict[str, type] | None = None) -> Aggregator:
    """``spec``: a registered name, or ``{"name": ..., "params": {...}}``.
    Only names in ``registry`` (default: this process's registered
    aggregators) are accepted; nothing is ever imported here. Raises
    ValueError with a clear message."""
    name, params = check_spec(spec)
    reg = AGGREGATORS if registry is None else registry
    cls = reg.get(name)
    if cls is None:
        raise ValueError(f"unknown aggregator {name!r}; registered here: {', '.join(sorted(reg))} "
                         "(an operator adds plugins in the deployment file's plugins.aggregators)")
    try:
        return cls(**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for aggregator {name!r}: {exc}") from exc
