"""The locust user class for gridrpc.

Importing this module imports locust (which monkey-patches the process for
gevent); import it only in a locust process. A locustfile needs two lines::

    from gridrpc.loadtest import GridRPCUser

    class GridUser(GridRPCUser):          # configured from the environment ...
        mix = "add:3,sleep/bound:1"       # ... or from class attributes

Each simulated user owns a :class:`~gridrpc.loadtest.green.GreenClient`
(``zmq.green``: waiting never blocks the gevent hub) and, on every task, runs
one entry of the mix drawn by weight. Every request is reported to locust's
``request`` event: ``request_type`` ``call`` (discovery + call), ``discover``
or ``bound`` (call on a server found once), ``name`` the service,
``response_time`` in ms measured by the client, ``response_length`` the
bytes of the answer, ``exception`` the gridrpc error when it failed.

Bounds: ``max_requests`` (or ``GRIDRPC_MAX_REQUESTS``) caps the requests this
process starts; when reached the users stop and the runner quits (a worker
quits its master, which stops when its last worker quits). On a master,
``GRIDRPC_MAX_REQUESTS`` caps the aggregated total. ``GRIDRPC_FAIL_RATIO``
sets the process exit code: 1 when failures / requests exceed it, else 0.
``GRIDRPC_SUMMARY`` names a JSON file written when the run ends, holding
locust's statistics and the client's own measurements side by side.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import random
import time

import gevent
from locust import User, events, task
from locust.exception import StopUser
from locust.runners import STATE_CLEANUP, STATE_STOPPED, STATE_STOPPING, MasterRunner, WorkerRunner

from ..address import parse_addresses
from ..errors import ConfigError, GridRPCError
from .config import LoadConfig, MixEntry, parse_args, parse_mix
from .green import GreenClient

log = logging.getLogger(__name__)
_UNSET = object()


class _Budget:
    """Requests this process may still start (cooperative: no lock needed)."""

    def __init__(self) -> None:
        self.limit = 0
        self.used = 0
        self.quitting = False

    def reset(self, limit: int) -> None:
        self.limit, self.used, self.quitting = int(limit or 0), 0, False

    def take(self) -> bool:
        if self.limit and self.used >= self.limit:
            return False
        self.used += 1
        return True


BUDGET = _Budget()
_USERS = itertools.count()      # several master agents: users take them in turn


class OwnStats:
    """The client's own measurements, per (request type, service): every
    latency (ms) and the failures. Workers send their new samples to the
    master with each report."""

    MAX_SAMPLES = 1_000_000

    def __init__(self) -> None:
        self.samples: dict[tuple[str, str], list[float]] = {}
        self.failures: dict[tuple[str, str], int] = {}
        self._sent: dict[tuple[str, str], int] = {}
        self._sent_fail: dict[tuple[str, str], int] = {}

    def add(self, kind: str, name: str, ms: float, failed: bool) -> None:
        key = (kind, name)
        lst = self.samples.setdefault(key, [])
        if len(lst) < self.MAX_SAMPLES:
            lst.append(ms)
        if failed:
            self.failures[key] = self.failures.get(key, 0) + 1

    def delta(self) -> dict:
        out = {}
        for key, lst in self.samples.items():
            n0 = self._sent.get(key, 0)
            f = self.failures.get(key, 0) - self._sent_fail.get(key, 0)
            if len(lst) > n0 or f:
                out["\t".join(key)] = {"ms": lst[n0:], "failures": f}
                self._sent[key] = len(lst)
                self._sent_fail[key] = self.failures.get(key, 0)
        return out

    def merge(self, data: dict) -> None:
        for k, v in data.items():
            key = tuple(k.split("\t", 1))
            self.samples.setdefault(key, []).extend(v.get("ms", []))
            self.failures[key] = self.failures.get(key, 0) + int(v.get("failures", 0))

    def summary(self) -> dict:
        out = {}
        for (kind, name), lst in sorted(self.samples.items()):
            s = sorted(lst)
            n = len(s)
            out[f"{kind} {name}"] = {
                "type": kind, "name": name, "requests": n, "failures": self.failures.get((kind, name), 0),
                "avg_ms": sum(s) / n if n else None, "median_ms": _pct(s, 0.5), "p95_ms": _pct(s, 0.95),
                "p99_ms": _pct(s, 0.99), "min_ms": s[0] if s else None, "max_ms": s[-1] if s else None}
        return out

    def reset(self) -> None:
        self.__init__()


OWN = OwnStats()


def _pct(s: list[float], q: float):
    if not s:
        return None
    return s[min(len(s) - 1, int(q * len(s)))]


class GridRPCUser(User):
    """A simulated gridrpc client. Class attributes override the environment
    (see :mod:`gridrpc.loadtest.config` for the variables):

    ``master_agent`` (``GRIDRPC_MA``), ``mix`` (string or MixEntry list,
    ``GRIDRPC_MIX``), ``args`` (dict or string, ``GRIDRPC_ARGS``), ``k``
    (``GRIDRPC_K``), ``timeout`` (``GRIDRPC_TIMEOUT``), ``wait`` (seconds
    between tasks, ``GRIDRPC_WAIT``), ``max_requests``
    (``GRIDRPC_MAX_REQUESTS``). ``bind_k``: servers a ``bound`` entry chooses
    among (each user binds to one at random, so users spread). Locust's
    ``--host``, when given, is taken as the MA address too.
    """

    abstract = True
    master_agent: str | None = None
    mix = None
    args = None
    k: int | None = None
    timeout: float | None = None
    wait: float | None = None
    max_requests: int | None = None
    bind_k: int = 16

    def __init__(self, environment) -> None:
        super().__init__(environment)
        ma = self.master_agent or (self.host if self.host and "://" in str(self.host) else None)
        mix = parse_mix(self.mix) if isinstance(self.mix, str) else (tuple(self.mix) if self.mix else None)
        args = parse_args(self.args) if isinstance(self.args, str) else self.args
        self.config = LoadConfig.from_env(master_agent=ma, mix=mix, args=args, k=self.k,
                                          timeout=self.timeout, wait=self.wait, max_requests=None)
        if self.max_requests and not BUDGET.limit:
            BUDGET.limit = int(self.max_requests)
        self._entries: list[MixEntry] = list(self.config.mix)
        self._weights = [e.weight for e in self._entries]
        mas = parse_addresses(self.config.master_agent, what="master agent")
        # GRIDRPC_MA=a,b (a deployment with several MAs): each user talks to one MA, in turn
        # (the gevent client keeps one MA; the load is spread, there is no failover between MAs)
        self.ma = mas[next(_USERS) % len(mas)] if len(mas) > 1 else self.config.master_agent
        self.client = GreenClient(self.ma, timeout=self.config.timeout,
                                  discovery_timeout=min(5.0, self.config.timeout),
                                  reuse_discovery=self.config.reuse_discovery)
        self._bound: dict[str, object] = {}
        self._rng = random.Random()

    def wait_time(self) -> float:
        return self.config.wait

    def on_stop(self) -> None:
        self.client.close()

    @task
    def run_mix(self) -> None:
        entry = self._rng.choices(self._entries, self._weights)[0] if len(self._entries) > 1 else self._entries[0]
        self.run_entry(entry)

    def run_entry(self, entry: MixEntry) -> None:
        """Run one request of the mix and report it (also usable from your own @task)."""
        args = self.config.args_for(entry.service)
        if entry.mode == "discover":
            self._do(lambda: self.client.discover(entry.service, self.config.k))
        elif entry.mode == "call":
            self._do(lambda: self.client.call(entry.service, *args))
        else:
            h = self._bound.get(entry.service)
            if h is None:
                h = self._do(lambda: self.client.bind(entry.service, self.bind_k,
                                                      pick=self._rng.randrange(self.bind_k)))
                if h is None:
                    return
                self._bound[entry.service] = h
            self._do(lambda: h(*args))

    def _do(self, fn):
        """Run ``fn`` (one client request) within the budget; report it."""
        if not BUDGET.take():
            _budget_exhausted(self.environment)
            raise StopUser()
        start = time.time()
        exc = None
        value = None
        try:
            value = fn()
        except GridRPCError as e:
            exc = e
        rec = self.client.last
        if rec is None:          # failed before the client recorded anything (should not happen)
            return None
        OWN.add(rec.kind, rec.service, rec.ms, exc is not None)
        self.environment.events.request.fire(
            request_type=rec.kind, name=rec.service, response_time=rec.ms, response_length=rec.size,
            response=None, context={"server": rec.server}, exception=exc, start_time=start, url=None)
        return value


def _budget_exhausted(environment) -> None:
    if BUDGET.quitting:
        return
    BUDGET.quitting = True
    runner = environment.runner
    log.info("gridrpc: %d requests started in this process: stopping its users", BUDGET.used)
    # A worker only stops its users: its last statistics reach the master when
    # the master ends the test (its total reached, or the run time is over); a
    # worker quitting by itself would drop them.
    if runner is not None and not isinstance(runner, WorkerRunner):
        gevent.spawn_later(0.05, runner.quit)


# -- events ---------------------------------------------------------------
def _env_limit() -> int:
    try:
        return int(os.environ.get("GRIDRPC_MAX_REQUESTS") or 0)
    except ValueError:
        raise ConfigError("GRIDRPC_MAX_REQUESTS must be an integer") from None


@events.test_start.add_listener
def _on_test_start(environment, **_kw) -> None:
    limit = _env_limit()
    BUDGET.reset(limit)
    OWN.reset()
    _WORKERS_SEEN.clear()
    if isinstance(environment.runner, MasterRunner) and limit:
        gevent.spawn(_master_watch, environment, limit)


def _master_watch(environment, limit: int) -> None:
    runner = environment.runner
    while runner.state not in (STATE_STOPPING, STATE_STOPPED, STATE_CLEANUP):
        if runner.stats.total.num_requests >= limit:
            log.info("gridrpc: %d requests reached: stopping the test", limit)
            runner.quit()
            return
        gevent.sleep(0.2)


@events.report_to_master.add_listener
def _on_report(client_id, data, **_kw) -> None:
    data["gridrpc_own"] = OWN.delta()


_WORKERS_SEEN: set[str] = set()


@events.worker_report.add_listener
def _on_worker_report(client_id, data, **_kw) -> None:
    _WORKERS_SEEN.add(client_id)
    OWN.merge(data.get("gridrpc_own") or {})


@events.quitting.add_listener
def _on_quitting(environment, **_kw) -> None:
    if isinstance(environment.runner, WorkerRunner):
        return
    s = summary(environment)
    ratio = os.environ.get("GRIDRPC_FAIL_RATIO")
    if ratio not in (None, ""):
        environment.process_exit_code = 1 if s["total"]["fail_ratio"] > float(ratio) else 0
    path = os.environ.get("GRIDRPC_SUMMARY")
    if path:
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(s, fh, indent=1)
        os.replace(tmp, path)


def summary(environment) -> dict:
    """Locust's statistics and the client's own, as one JSON-able dict."""
    stats = environment.runner.stats if environment.runner else environment.stats
    entries = {}
    for (name, method), e in sorted(stats.entries.items()):
        entries[f"{method} {name}"] = _entry(e, method, name)
    tot = stats.total
    total = _entry(tot, "", "Aggregated")
    total["fail_ratio"] = tot.num_failures / tot.num_requests if tot.num_requests else 0.0
    errors = [{"type": e.method, "name": e.name, "error": str(e.error), "occurrences": e.occurrences}
              for e in stats.errors.values()]
    return {"locust": entries, "total": total, "errors": errors, "client": OWN.summary(),
            "workers": len(_WORKERS_SEEN),     # workers that reported (they are gone at the end)
            "user_count": getattr(environment.runner, "user_count", None)}


def _entry(e, method: str, name: str) -> dict:
    n = e.num_requests
    return {"type": method, "name": name, "requests": n, "failures": e.num_failures,
            "avg_ms": e.avg_response_time if n else None,
            "median_ms": e.median_response_time if n else None,
            "p95_ms": e.get_response_time_percentile(0.95) if n else None,
            "p99_ms": e.get_response_time_percentile(0.99) if n else None,
            "min_ms": e.min_response_time if n else None, "max_ms": e.max_response_time if n else None,
            "rps": e.total_rps if n else 0.0, "avg_bytes": e.avg_content_length if n else None}
