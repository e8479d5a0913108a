"""The pure core's cost of one discovery answered from the view, over N SeDs
(no sockets: the MA's CPU per view answer, the part that grows with the tree).

    python -m benchmarks.view_core [N ...]           # default: 500 2000
    python -m benchmarks.view_core 2000 --profile    # and where the time goes
    python -m benchmarks.view_core 100000 --full     # rank the whole view (no kept ranking)
    python -m benchmarks.view_core 100000 --changes 20   # 20 snapshots pushed anew between answers

CPU time (``time.process_time``, gc on) per answer: the median and the
minimum of ``--answers`` answers, per SeD, and what an answer did (medians
of the agent's counters): ``ranked`` (the whole view ranked), or with the
kept ranking (core/view_rank.py) ``moved`` (changed snapshots moved),
``sorted`` (sorted anew), ``walked`` (first places looked at). The first
answer (which creates the kept ranking) is timed apart.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
import sys
import time

from gridrpc.core import messages as m
from gridrpc.core.agent.machine import AgentConfig, AgentState, MasterRole, Received
from gridrpc.core.messages import MsgType
from gridrpc.core.view import split_common

SERVICES = ("add", "echo", "sleep")


def _vec(i: int, tsls: float | None = None) -> dict:
    return {"tcomp": 0.01, "eft": 100.0, "est_wait": 0.0, "num_waiting": 0, "num_running": 0, "max_concurrent": 1,
            "time_since_last_solve": 5.0 + i * 1e-6 if tsls is None else tsls, "free_cpu": 0.5, "free_mem": 1e9,
            "nb_cpu": 2, "total_mem": 2e9, "server_type": "serial"}


def _entry(name: str, i: int, tsls: float | None = None) -> dict:
    common, own = split_common({s: _vec(i, tsls) for s in SERVICES})
    return {"name": name, "common": common, "services": own, "age_ms": 0}


def tree(n: int, las: int = 4, *, full: bool = False) -> AgentState:
    """An MA whose view holds ``n`` idle SeDs under ``las`` LAs (``full``: no kept ranking)."""
    cfg = dict(view_index_min=10 ** 9) if full else {}
    st = AgentState(AgentConfig(name="MA", rebuild_time=0.0, **cfg), MasterRole(), random.Random(1))
    per = n // las
    for la in range(las):
        name = f"LA{la}"
        els = [{"name": f"s{la}-{i}", "parent": name, "kind": "sed", "services": list(SERVICES),
                "address": f"tcp://h{la}:{1000 + i}"} for i in range(per)]
        st.handle(Received(name.encode(), MsgType.REGISTER, m.make(
            MsgType.REGISTER, f"r{la}", name=name, kind="la", address=f"tcp://la{la}:1", pid=la,
            services=list(SERVICES), elements=els)), 0.0)
        entries = [_entry(e["name"], la * per + i) for i, e in enumerate(els)]
        st.handle(Received(name.encode(), MsgType.VIEW, m.make(MsgType.VIEW, f"v{la}", name=name,
                                                                entries=entries)), 0.0)
    return st


def answers(st: AgentState, n: int = 50, changes: int = 0, seed: int = 2) -> dict:
    """``n`` view answers; ``changes`` snapshots pushed anew (a solve: the
    time since the last one restarts) between two answers."""
    rng = random.Random(seed)
    las = [c for c in st.registry.children.values()]

    def disc(i: int, now: float):
        return st.handle(Received(b"client", MsgType.DISCOVER, m.make(MsgType.DISCOVER, f"d{i}", service="add",
                                                                      k=3)), now)
    kinds = ("view_ranked", "view_moved", "view_sorted", "view_walked")
    t = time.process_time()
    assert disc(0, 0.1)[0].header.get("view"), "not answered from the view"
    first = time.process_time() - t
    cpu, work = [], {k: [] for k in kinds}
    for i in range(n):
        now = 0.1 + (i + 1) * 0.001
        for j in range(changes):
            la = las[rng.randrange(len(las))]
            e = la.elements[rng.randrange(len(la.elements))]
            st.handle(Received(la.name.encode(), MsgType.VIEW, m.make(
                MsgType.VIEW, f"c{i}.{j}", name=la.name, entries=[_entry(e["name"], 0, tsls=rng.random())])), now)
        before = {k: getattr(st.counters, k) for k in kinds}
        t = time.process_time()
        out = disc(i + 1, now)
        cpu.append(time.process_time() - t)
        for k in kinds:
            work[k].append(getattr(st.counters, k) - before[k])
        assert out[0].header.get("view"), "not answered from the view"
    return {"median_ms": statistics.median(cpu) * 1e3, "min_ms": min(cpu) * 1e3, "first_ms": first * 1e3,
            **{k[5:]: statistics.median(v) for k, v in work.items()}}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sizes", nargs="*", type=int, default=[500, 2000])
    p.add_argument("--full", action="store_true", help="rank the whole view at every answer")
    p.add_argument("--answers", type=int, default=50)
    p.add_argument("--changes", type=int, default=0, help="snapshots pushed anew between two answers")
    p.add_argument("--profile", action="store_true")
    a = p.parse_args(argv)
    for n in a.sizes:
        st = tree(n, full=a.full)
        r = answers(st, a.answers, a.changes)
        print(f"{n:7d} SeDs ({'whole view' if a.full else 'kept ranking'}, {a.changes} changes/answer): "
              f"{r['median_ms']:.3f} ms (min {r['min_ms']:.3f}) of MA CPU per view discovery, "
              f"{r['median_ms'] * 1e3 / n:.2f} us per SeD; first answer {r['first_ms']:.1f} ms; per answer "
              + ", ".join(f"{k} {r[k]:.0f}" for k in ("ranked", "moved", "sorted", "walked")), flush=True)
        if a.profile:
            prof = cProfile.Profile()
            prof.runcall(answers, st, 30, a.changes)
            pstats.Stats(prof).sort_stats("cumtime").print_stats(12)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
