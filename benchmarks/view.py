"""Discovery from pushed state (issue #12): the view against the forced
fan-out, on real processes, in one run.

Rows (items):

``view_discovery_4``
    MA -> 2 LAs -> 4 SeDs (separate processes); sequential
    ``discover("add", 3)`` answered from the MA's view (the default) and
    with ``max_age=0`` (always a fan-out to the tree): median, p99.
``view_herd``
    MA -> 2 LAs -> 2 SeD processes x ``--replicas 4`` = 8 single-slot SeDs;
    16 clients (16 ``AsyncClient``, one connection each) submit
    ``sleep(HERD_SLEEP)`` at once; per round: the most calls one server
    ran, the servers used, the time until all 16 are done, the extra
    attempts (a call answered ``busy`` moved on). Rounds apart by more than
    the MA's 1 s choice memory. View vs fan-out (a client whose every
    discovery says ``max_age=0``).
``view_staleness``
    Tree of ``view_discovery_4``: a bound ``sleep`` is started on one SeD
    (X); discovery (``k`` = all 4) is polled sequentially from the moment
    it is sent. ``busy_seen_ms``: when the answers start to show X busy (its
    estimation vector has a running call) for good; ``last_first_ms``: the
    last answer that ranked X first. See the caveat in the module notes.
``view_silent``
    Same tree, started with a 30 s heartbeat timeout so a frozen child stays
    registered: one SeD process, then one LA, frozen with SIGSTOP (by PID;
    SIGCONT before anything else). Sequential discoveries over a window
    while it is frozen, view then fan-out; the added median / p99 against
    the same requests with every child alive just before.
``view_scale_500``, ``view_scale_2000``
    MA -> 4 LAs -> 4 ``gridrpc sed --replicas N/4 --isolation inline``
    processes; ``discover("add", 10)``, view and fan-out. ``--quick``: 500
    only (``view_scale_2000`` is reported skipped).

Caveat (staleness): the MA remembers its own first choices for 1 s and
shows them to the ranking as queued calls (a discovery is normally followed
by a call). Polling discovery without calling makes the free servers look
loaded after a few polls, so X can be ranked first again while busy: that is
why the target is checked on ``busy_seen_ms`` (the view knows), and the rank
is reported for information.
"""
from __future__ import annotations

import asyncio
import os
import signal
import statistics
import time

import gridrpc
from gridrpc.core.messages import MsgType

from .procs import Procs
from .stats import latency

ITEMS = ("view_discovery_4", "view_herd", "view_staleness", "view_silent", "view_scale_500", "view_scale_2000")
HERD_CLIENTS = 16
HERD_SEDS = 8
HERD_SLEEP = 0.2
STALE_CALL = 0.4        # s: the bound call that makes X busy
STALE_POLL = 0.3        # s: how long discovery is polled after it is sent
SILENT_HB_TIMEOUT = 30.0
VIEW_MAX_AGE = 1.5      # s: the MA's default (gridrpc.core.view.DEFAULT_MAX_AGE)


class FanoutClient(gridrpc.AsyncClient):
    """Every discovery of this client (its calls' too) says ``max_age=0``:
    the MA always fans out to the tree."""

    async def _discover_ranked(self, service, max_servers, aggregator, args, optional, max_age):
        return await super()._discover_ranked(service, max_servers, aggregator, args, optional, 0)


def spy(client: gridrpc.AsyncClient) -> dict:
    """Count the MA's answers to ``client`` by source (``view`` / ``fanout``)."""
    counts = {"view": 0, "fanout": 0}
    orig = client._ma_request

    async def request(header, timeout):
        mt, r = await orig(header, timeout)
        if mt is MsgType.SERVERS:
            counts["view" if r.get("view") else "fanout"] += 1
        return mt, r
    client._ma_request = request
    return counts


def _running(est: dict) -> bool:
    """The estimation vector shows a call running or waiting (pushed state, not the MA's memory)."""
    n = est.get("num_running")
    return isinstance(n, (int, float)) and n > 0


async def _tried(fn, errors: list):
    """``fn()``, or None with the error kept: a discovery that finds no server
    in time on a loaded machine is a result to count, not a crash."""
    try:
        return await fn()
    except gridrpc.GridRPCError as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
        return None


async def _seq(fn, warmup: int, n: int) -> dict:
    """Sequential latencies; failed requests count with the time they took,
    and are listed (``errors``, ``error_samples``)."""
    out: list[float] = []
    errors: list[str] = []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        await _tried(fn, errors if i >= warmup else [])
        if i >= warmup:
            out.append(time.perf_counter() - t0)
    return {**latency(out), "errors": len(errors), "error_samples": errors[:3]}


async def _window(fn, seconds: float, errors: list, starts: list | None = None) -> list[float]:
    """Sequential requests for ``seconds``; ``starts``: filled with each one's start (s from the first)."""
    out = []
    begin = time.perf_counter()
    end = begin + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        await _tried(fn, errors)
        out.append(time.perf_counter() - t0)
        if starts is not None:
            starts.append(t0 - begin)
    return out


def _summary(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "all": xs}


# -- rows 1, 3, 4: tree A ---------------------------------------------------------------
async def _discovery_4(ma: str, quick: bool) -> dict:
    n = 200 if quick else 3000
    async with gridrpc.AsyncClient(ma) as c:
        src = spy(c)
        view = await _seq(lambda: c.discover("add", 3), 50, n)
        view["answers"] = dict(src)
        src.update(view=0, fanout=0)
        fan = await _seq(lambda: c.discover("add", 3, max_age=0), 50, n)
        fan["answers"] = dict(src)
    return {"view": view, "fanout": fan, "k": 3}


async def _staleness(ma: str, sed_names: list[str], quick: bool) -> dict:
    trials = 2 if quick else 12
    out = {}
    async with gridrpc.AsyncClient(ma) as c:
        for mode, max_age in (("view", None), ("fanout", 0)):
            rows = []
            errors: list[str] = []
            for t in range(trials):
                x = sed_names[t % len(sed_names)]
                await asyncio.sleep(1.1)        # the MA's memory of its choices (1 s) is gone, X idle
                polls = []
                t0 = time.perf_counter()
                call = await c.submit("sleep", STALE_CALL, server=x)
                while time.perf_counter() - t0 < STALE_POLL:
                    kw = {} if max_age is None else {"max_age": max_age}
                    found = await _tried(lambda: c.discover("sleep", len(sed_names), **kw), errors) or []
                    t1 = time.perf_counter() - t0
                    if not found:
                        continue
                    est = next((s.estimation for s in found if s.name == x), None)
                    polls.append((t1, bool(found) and found[0].name == x, est is not None and _running(est)))
                await call
                # busy for good from the first poll after the last one not showing it busy
                not_busy = [i for i, p in enumerate(polls) if not p[2]]
                busy_seen = None if not_busy and not_busy[-1] == len(polls) - 1 else \
                    polls[not_busy[-1] + 1][0] if not_busy else polls[0][0]
                firsts = [p[0] for p in polls if p[1]]
                busy = [p[0] for p in polls if p[2]]
                rows.append({"sed": x, "polls": len(polls), "busy_seen_ms": None if busy_seen is None
                             else busy_seen * 1e3, "first_busy_ms": busy[0] * 1e3 if busy else None,
                             "last_not_busy_ms": polls[not_busy[-1]][0] * 1e3 if not_busy else None, "last_first_ms": firsts[-1] * 1e3 if firsts else 0.0,
                             "first_after_busy_seen": sum(1 for p in polls if p[1] and busy_seen is not None
                                                          and p[0] >= busy_seen)})
            seen = [r["busy_seen_ms"] for r in rows if r["busy_seen_ms"] is not None]
            out[mode] = {"busy_seen_ms": _summary(seen) if seen else None,
                         "never_seen_busy": sum(1 for r in rows if r["busy_seen_ms"] is None),
                         "last_first_ms": _summary([r["last_first_ms"] for r in rows]),
                         "trials": rows, "errors": len(errors), "error_samples": errors[:3]}
    out["how"] = (f"bound sleep({STALE_CALL}) submitted on SeD X at t=0, then discover('sleep', "
                  f"{len(sed_names)}) polled for {STALE_POLL}s; busy_seen_ms: from the first answer after "
                  "which X's vector always shows a running call; last_first_ms: last answer ranking X first")
    return out


async def _silent(procs_by_kind: dict, ma: str, quick: bool) -> dict:
    n_alive = 100 if quick else 1000
    # the view's regime changes 1.5 s in (the frozen SeD's snapshot is stale: a fan-out, then left
    # out for 1 s); --quick stays in the first regime
    window = 1.2 if quick else 5.0
    out = {}
    async with gridrpc.AsyncClient(ma) as c:
        src = spy(c)
        for kind, proc in procs_by_kind.items():
            res = {"frozen": proc.name, "pid": proc.pid}
            alive = {"view": await _seq(lambda: c.discover("add", 3), 20, n_alive),
                     "fanout": await _seq(lambda: c.discover("add", 3, max_age=0), 20, n_alive // 2)}
            src.update(view=0, fanout=0)
            errs: dict[str, list] = {"view": [], "fanout": []}
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                starts: list[float] = []
                frozen = {"view": await _window(lambda: c.discover("add", 3), window, errs["view"], starts)}
                res["view_answers_while_frozen"] = dict(src)
                frozen["fanout"] = await _window(lambda: c.discover("add", 3, max_age=0), window / 2, errs["fanout"])
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            for mode in ("view", "fanout"):
                f = {**latency(frozen[mode]), "errors": len(errs[mode]), "error_samples": errs[mode][:3]}
                res[mode] = {"alive": alive[mode], "frozen": f,
                             "added_median_ms": f["median_ms"] - alive[mode]["median_ms"],
                             "added_p99_ms": f["p99_ms"] - alive[mode]["p99_ms"]}
            # the view's two regimes: the frozen child's snapshot still fresh (< view_max_age, 1.5 s),
            # then stale (a fan-out, and the child left out if its parent saw it miss a deadline)
            for phase, keep in (("fresh", lambda t: t < VIEW_MAX_AGE), ("stale", lambda t: t >= VIEW_MAX_AGE)):
                xs = [x for x, t in zip(frozen["view"], starts) if keep(t)]
                if xs:
                    f = latency(xs)
                    res["view"][f"frozen_{phase}"] = f
                    res["view"][f"added_median_{phase}_ms"] = f["median_ms"] - alive["view"]["median_ms"]
            out[kind] = res
            await asyncio.sleep(1.0 if quick else 2.5)   # pushes and heartbeats back
    out["how"] = (f"SIGSTOP one child (SeD process, then LA), sequential discover('add', 3) for {window}s "
                  f"from the view, then {window / 2}s with max_age=0; against the same requests just before")
    return out


def run_tree_rows(procs: Procs, items: set[str], quick: bool, silent: tuple[str, ...] = ("sed", "la")) -> dict:
    """Rows 1, 3, 4 on one tree A; ``silent``: which children to freeze in turn."""
    t0 = time.monotonic()
    tree = procs.tree(las=2, seds_per_la=2)
    setup = time.monotonic() - t0
    ma = tree["ma"].address
    res: dict = {}
    what = "MA -> 2 LAs -> 4 SeDs (separate processes), heartbeat timeout 30 s"
    if "view_discovery_4" in items:
        res["view_discovery_4"] = {**asyncio.run(_discovery_4(ma, quick)), "tree": what}
    if "view_staleness" in items:
        res["view_staleness"] = {**asyncio.run(_staleness(ma, tree["sed_names"], quick)), "tree": what}
    if "view_silent" in items:
        kinds = {k: v for k, v in (("sed", tree["seds"][-1]), ("la", tree["las"][0])) if k in silent}
        res["view_silent"] = {**asyncio.run(_silent(kinds, ma, quick)), "tree": what}
    res["_setup_s"] = {"view_tree_a": setup}
    return res


# -- row 2: herd --------------------------------------------------------------------------
async def _herd_round(clients: list, sleep: float) -> dict:
    t0 = time.perf_counter()
    calls = [await c.submit("sleep", sleep) for c in clients]
    await asyncio.gather(*calls)
    took = time.perf_counter() - t0
    per: dict[str, int] = {}
    for call in calls:
        per[call.server] = per.get(call.server, 0) + 1
    return {"completion_s": took, "max_on_one": max(per.values()), "servers_used": len(per),
            "extra_attempts": sum(len(call.attempts) - 1 for call in calls if call.attempts), "per_server": per}


async def _herd(ma: str, quick: bool) -> dict:
    rounds = 1 if quick else 8
    out = {}
    for mode, cls in (("view", gridrpc.AsyncClient), ("fanout", FanoutClient)):
        clients = [cls(ma) for _ in range(HERD_CLIENTS)]
        try:
            for c in clients:
                await c.start()
            counts = [spy(c) for c in clients]
            await _herd_round(clients, 0.02)     # warm-up: connections, worker processes
            for d in counts:
                d.update(view=0, fanout=0)
            rows = []
            for _ in range(rounds):
                await asyncio.sleep(1.2)        # SeDs idle, pushed; the MA's choice memory (1 s) gone
                rows.append(await _herd_round(clients, HERD_SLEEP))
        finally:
            for c in clients:
                await c.aclose()
        out[mode] = {"rounds": rows, "max_on_one": _summary([r["max_on_one"] for r in rows]),
                     "servers_used": _summary([r["servers_used"] for r in rows]),
                     "completion_s": _summary([r["completion_s"] for r in rows]),
                     "extra_attempts": _summary([r["extra_attempts"] for r in rows]),
                     "answers": {k: sum(d[k] for d in counts) for k in ("view", "fanout")}}
    out["ideal"] = {"max_on_one": -(-HERD_CLIENTS // HERD_SEDS), "servers_used": HERD_SEDS,
                    "completion_s": -(-HERD_CLIENTS // HERD_SEDS) * HERD_SLEEP}
    out["how"] = (f"{HERD_CLIENTS} AsyncClients each submit sleep({HERD_SLEEP}) at once, {rounds} rounds "
                  f"1.2 s apart, on {HERD_SEDS} single-slot SeDs")
    return out


def run_herd(procs: Procs, quick: bool) -> dict:
    t0 = time.monotonic()
    tree = procs.tree(las=2, seds_per_la=1, replicas=HERD_SEDS // 2)
    setup = time.monotonic() - t0
    res = asyncio.run(_herd(tree["ma"].address, quick))
    res["tree"] = f"MA -> 2 LAs -> 2 SeD processes x --replicas {HERD_SEDS // 2} (max_concurrent 1) = {HERD_SEDS} SeDs"
    return {"view_herd": res, "_setup_s": {"view_herd_tree": setup}}


# -- row 5: scale -------------------------------------------------------------------------
async def _scale(ma: str, quick: bool) -> dict:
    async with gridrpc.AsyncClient(ma, discovery_timeout=30) as c:
        src = spy(c)
        view = await _seq(lambda: c.discover("add", 10), 10, 50 if quick else 1000)
        view["answers"] = dict(src)
        src.update(view=0, fanout=0)
        fan = await _seq(lambda: c.discover("add", 10, max_age=0), 5, 30 if quick else 300)
        fan["answers"] = dict(src)
    return {"view": view, "fanout": fan, "k": 10}


def run_scale(procs: Procs, n: int, quick: bool, las: int = 4) -> dict:
    """MA -> ``las`` LAs -> one ``--replicas n/las --isolation inline`` process each."""
    t0 = time.monotonic()
    tree = procs.tree(las=las, seds_per_la=1, replicas=n // las, sed_args=("--examples", "--isolation", "inline"),
                      timeout=180)
    setup = time.monotonic() - t0
    time.sleep(1.5)         # every replica's snapshot pushed at least once
    res = asyncio.run(_scale(tree["ma"].address, quick))
    for p in tree["seds"]:      # a graceful stop of hundreds of replicas takes seconds (6.5 s for 4 x 125)
        p.stop(timeout=0.5)     # SIGTERM, then SIGKILL of the process group: nothing to keep here
    res["seds"] = len(tree["sed_names"])
    res["tree"] = f"MA -> {las} LAs -> {las} processes x --replicas {n // las} --isolation inline = {n} SeDs"
    res["setup_s"] = setup
    return res


def run(items: set[str], quick: bool) -> dict:
    """Every selected row, each group on its own processes (stopped before the next)."""
    res: dict = {"_setup_s": {}, "_skipped": {}}

    def merge(out):
        res["_setup_s"].update(out.pop("_setup_s", {}))
        res.update(out)
    if {"view_discovery_4", "view_staleness", "view_silent"} & items:
        with Procs(hb=(1.0, SILENT_HB_TIMEOUT)) as procs:
            merge(run_tree_rows(procs, items, quick))
    if "view_herd" in items:
        with Procs() as procs:
            merge(run_herd(procs, quick))
    for n in (500, 2000):
        item = f"view_scale_{n}"
        if item not in items:
            continue
        if quick and n > 500:
            res["_skipped"][item] = "not in --quick"
            continue
        with Procs() as procs:
            res[item] = run_scale(procs, n, quick)
        res["_setup_s"][item] = res[item]["setup_s"]
    return res
