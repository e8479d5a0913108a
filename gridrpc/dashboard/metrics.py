"""``/metrics`` of the MA: a prometheus_client custom collector over the
tree (``/api/tree``), the MA's statistics and the event log's aggregates.

Each metric is one family, with ``# HELP`` and ``# TYPE``; label values are
escaped by prometheus_client. A private ``CollectorRegistry`` per MA (not the
global one), so several MAs in one process (tests) do not collide.

Families (``docs/dashboard.md`` has the table): the ones exported before this
module (``gridrpc_elements``, ``gridrpc_services``,
``gridrpc_discoveries_total``, ``gridrpc_discoveries_timed_out_total``,
``gridrpc_bad_messages_total``, ``gridrpc_sed_running``,
``gridrpc_sed_waiting``) keep their names and labels.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily,
                                    SummaryMetricFamily)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from ..core.events import LATENCY_BOUNDS, EventKind, EventLog

__all__ = ["GridCollector", "make_registry", "render", "CONTENT_TYPE_LATEST"]


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


class GridCollector(Collector):
    """Reads its sources at every scrape (they are cheap snapshots).

    ``tree_source()`` -> the ``/api/tree`` element list; ``statistics()`` ->
    the MA's counters (``discoveries``, ``discoveries_timed_out``,
    ``bad_messages``); ``services()`` -> the catalogue (a dict); ``event_log``
    and ``hub`` (an :class:`~gridrpc.dashboard.stream.EventHub`) are optional.
    """

    def __init__(self, *, tree_source: Callable[[], list[dict]],
                 statistics: Callable[[], dict] | None = None,
                 services: Callable[[], dict] | None = None,
                 event_log: EventLog | None = None, hub: Any = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.tree_source = tree_source
        self.statistics = statistics
        self.services = services
        self.event_log = event_log
        self.hub = hub
        self.clock = clock

    def collect(self) -> Iterable:
        tree = list(self.tree_source() or [])
        yield from self._tree_families(tree)
        st = self.statistics() if self.statistics else {}
        for key, name, doc in (
                ("discoveries", "gridrpc_discoveries", "Discovery requests handled by the MA."),
                ("discoveries_timed_out", "gridrpc_discoveries_timed_out",
                 "Discoveries answered after some children stayed silent past the budget."),
                ("bad_messages", "gridrpc_bad_messages", "Malformed or refused messages received by the MA.")):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], _num(st.get(key)) or 0.0)
            yield c
        if self.event_log is not None:
            yield from self._event_families(self.event_log)
        if self.hub is not None:
            yield from self._hub_families(self.hub.statistics())

    def _tree_families(self, tree: list[dict]) -> Iterable:
        kinds: dict[str, int] = {}
        for e in tree:
            k = str(e.get("kind", "?"))
            kinds[k] = kinds.get(k, 0) + 1
        g = GaugeMetricFamily("gridrpc_elements", "Elements in the tree by kind.", labels=["kind"])
        for k, v in sorted(kinds.items()):
            g.add_metric([k], v)
        yield g
        if self.services is not None:
            n_services = len(self.services() or {})
        else:
            n_services = len({s for e in tree for s in (e.get("services") or [])})
        g = GaugeMetricFamily("gridrpc_services", "Services offered in the tree.")
        g.add_metric([], n_services)
        yield g
        up = GaugeMetricFamily("gridrpc_element_up", "1 while the element heartbeats, 0 once it is lost.",
                               labels=["element", "kind", "parent"])
        age = GaugeMetricFamily("gridrpc_element_heartbeat_age_seconds",
                                "Seconds since the element's last heartbeat reached its parent.",
                                labels=["element"])
        now = self.clock()
        for e in tree:
            name = str(e.get("name", "?"))
            up.add_metric([name, str(e.get("kind", "?")), str(e.get("parent") or "")],
                          1.0 if e.get("state", "alive") == "alive" else 0.0)
            hb = _num(e.get("last_heartbeat"))
            if hb is not None and e.get("kind") != "ma":
                age.add_metric([name], max(0.0, now - hb))
        yield up
        yield age
        seds = [e for e in tree if e.get("kind") == "sed"]
        for key, name, doc, fam in (
                ("num_running", "gridrpc_sed_running", "Calls running per SeD.", GaugeMetricFamily),
                ("num_waiting", "gridrpc_sed_waiting", "Calls waiting in each SeD's queue.", GaugeMetricFamily),
                ("free_cpu", "gridrpc_sed_free_cpu", "Free CPU fraction of each SeD's host.", GaugeMetricFamily),
                ("completed", "gridrpc_sed_completed", "Calls each SeD completed since it started.",
                 CounterMetricFamily)):
            f = fam(name, doc, labels=["sed"])
            for e in seds:
                v = _num((e.get("load") or {}).get(key))
                if v is not None or key in ("num_running", "num_waiting"):
                    f.add_metric([str(e["name"])], v or 0.0)
            yield f

    def _event_families(self, log: EventLog) -> Iterable:
        c = CounterMetricFamily("gridrpc_calls", "Calls ended on the SeDs, by service and outcome "
                                "(finished, failed, cancelled, killed, preempted).",
                                labels=["service", "outcome"])
        for (svc, outcome), n in sorted(log.calls_total.items()):
            c.add_metric([svc, outcome], n)
        yield c
        h = HistogramMetricFamily("gridrpc_call_duration_seconds", "Run time of finished calls on the SeDs.",
                                  labels=["service"])
        for svc, s in sorted(log.cumulative.items()):
            if s.timed:
                acc, buckets = 0, []
                for bound, cnt in zip(LATENCY_BOUNDS, s.hist):
                    acc += cnt
                    buckets.append((repr(float(bound)), acc))
                buckets.append(("+Inf", acc + s.hist[-1]))
                h.add_metric([svc], buckets=buckets, sum_value=s.run_sum)
        yield h
        for name, doc, n_attr, sum_attr in (
                ("gridrpc_call_wait_seconds", "Time calls waited in a SeD's queue before starting.",
                 "wait_n", "wait_sum"),
                ("gridrpc_discovery_duration_seconds", "Time the MA took to answer discoveries.",
                 "disc_n", "disc_sum")):
            sm = SummaryMetricFamily(name, doc, labels=["service"])
            for svc, s in sorted(log.cumulative.items()):
                if getattr(s, n_attr):
                    sm.add_metric([svc], count_value=getattr(s, n_attr), sum_value=getattr(s, sum_attr))
            yield sm
        u = CounterMetricFamily("gridrpc_user_calls", "Calls per user: queued, then by outcome.",
                                labels=["user", "outcome"])
        for (user, outcome), n in sorted(log.user_total.items()):
            u.add_metric([user, outcome], n)
        yield u
        o = CounterMetricFamily("gridrpc_user_optional_calls",
                                "Optional computations per user, by outcome.", labels=["user", "outcome"])
        for (user, outcome), n in sorted(log.optional_total.items()):
            o.add_metric([user, outcome], n)
        yield o
        ev = CounterMetricFamily("gridrpc_events", "Events recorded by the MA, by kind.", labels=["kind"])
        for k in EventKind:
            ev.add_metric([k.value], log.events_total.get(k.value, 0))
        yield ev

    def _hub_families(self, st: dict) -> Iterable:
        g = GaugeMetricFamily("gridrpc_event_subscribers", "Live event streams open (/api/events).")
        g.add_metric([], st.get("subscribers", 0))
        yield g
        c = CounterMetricFamily("gridrpc_events_dropped",
                                "Events lost: by slow stream readers (stream), the event file (file), "
                                "invalid ones from children (rejected), outboxes below the MA (upstream).",
                                labels=["where"])
        c.add_metric(["stream"], st.get("dropped", 0))
        c.add_metric(["file"], (st.get("file") or {}).get("dropped", 0))
        c.add_metric(["rejected"], st.get("rejected", 0))
        c.add_metric(["upstream"], sum((st.get("lost_upstream") or {}).values()))
        yield c


def make_registry(collector: GridCollector, *, process: bool = True) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    if process:
        from prometheus_client import ProcessCollector
        ProcessCollector(registry=reg)
    return reg


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
