"""What differs between agents, as data: the role (Master or Local) and the
discovery budget rule (:mod:`gridrpc.core.agent.machine`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from .. import messages as m
from ..discovery import Done

MIN_BUDGET_S, MAX_BUDGET_S = 0.01, 60.0      # bounds of one discovery's budget
CHILD_SHARE, CHILD_MARGIN_MS, MIN_CHILD_BUDGET_MS = 0.8, 2.0, 5.0


def discovery_budget(budget_ms: object, default_s: float) -> float:
    """Seconds a discovery may take here: the request's ``budget_ms`` (or the
    agent's default when absent or 0), clamped to 10 ms .. 60 s."""
    if type(budget_ms) in (int, float) and budget_ms > 0 and math.isfinite(budget_ms):
        budget = budget_ms / 1000.0
    else:
        budget = default_s
    return min(max(budget, MIN_BUDGET_S), MAX_BUDGET_S)


def child_budget_ms(budget_s: float) -> float:
    """The budget a child gets: 80 % of ours minus 2 ms, at least 5 ms."""
    return max(MIN_CHILD_BUDGET_MS, budget_s * 1000.0 * CHILD_SHARE - CHILD_MARGIN_MS)


# -- roles ------------------------------------------------------------------
class Role(Protocol):
    kind: str                       # "ma" | "la", as the tree shows it
    root: bool                      # no parent, ever: never registers anywhere
    remember_choices: bool          # recent first choices shown to the aggregator as load

    def no_offer(self, request_id: str, service: str) -> dict | None:
        """The answer when no child offers ``service`` (None: an empty answer)."""

    def finished(self, request_id: str, service: str, k: int, done: Done, heard: dict | None = None) -> dict | None:
        """The answer to a finished discovery (None: the ranked SERVERS).
        ``heard``: for the children among ``done.timed_out``, seconds since
        this agent last heard from each, and whether that is recent (alive,
        within its heartbeat timeout, but late) or not (silent)."""


@dataclass(frozen=True, slots=True)
class LocalRole:
    """An inner agent: answers what its subtree has, even nothing."""
    kind: str = "la"
    root: bool = False
    remember_choices: bool = False

    def no_offer(self, request_id: str, service: str) -> dict | None:
        return None

    def finished(self, request_id: str, service: str, k: int, done: Done, heard: dict | None = None) -> dict | None:
        return None


@dataclass(frozen=True, slots=True)
class MasterRole:
    """The root: the clients' entry point, with no parent. It remembers its recent choices
    (concurrent discoveries spread over the servers), and turns "nobody" into
    the errors clients raise (ServiceNotFound, NoServerAvailable)."""
    kind: str = "ma"
    root: bool = True
    remember_choices: bool = True

    def no_offer(self, request_id: str, service: str) -> dict | None:
        return m.error_header(request_id, "service_not_found", f"no server in the tree offers {service!r}")

    def finished(self, request_id: str, service: str, k: int, done: Done, heard: dict | None = None) -> dict | None:
        if done.servers or k <= 0:
            return None
        if not done.timed_out and done.answered:
            # everyone answered, none was acceptable (an aggregator's filter, e.g. a price cap):
            # asking again would not help
            return m.error_header(request_id, "no_acceptable_server",
                                  f"none of the {done.answered} servers offering {service!r} is acceptable "
                                  "to the aggregator of this request")
        # a child heard from lately but late (busy, or just stopped) is not called silent: the user
        # is told which each was (the client retries either within the call's own timeout)
        heard = heard or {}
        late = [f"{n}, heard from {heard[n][0]:.1f} s ago" for n in done.timed_out if n in heard and heard[n][1]]
        silent = [n + (f", nothing heard for {heard[n][0]:.1f} s" if n in heard else "")
                  for n in done.timed_out if not (n in heard and heard[n][1])]
        why = []
        if late:
            why.append("late: " + "; ".join(late))
        if silent:
            why.append("silent: " + "; ".join(silent))
        detail = f" ({'; '.join(why)})" if why else ""
        return m.error_header(request_id, "no_server", f"no server answered for {service!r} in time{detail}")
