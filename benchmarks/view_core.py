"""The pure core's cost of one discovery answered from the view, over N SeDs
(no sockets: the MA's CPU per view answer, the part that grows with the tree).

    python -m benchmarks.view_core [N ...]        # default: 500 2000
    python -m benchmarks.view_core 2000 --profile # and where the time goes
"""
from __future__ import annotations

import cProfile
import pstats
import random
import sys
import time

from gridrpc.core import messages as m
from gridrpc.core.agent import AgentConfig, AgentState, MasterRole, Received
from gridrpc.core.messages import MsgType
from gridrpc.core.view import split_common

SERVICES = ("add", "echo", "sleep")


def _vec(i: int) -> dict:
    return {"tcomp": 0.01, "eft": 100.0, "est_wait": 0.0, "num_waiting": 0, "num_running": 0, "max_concurrent": 1,
            "time_since_last_solve": 5.0 + i * 1e-6, "free_cpu": 0.5, "free_mem": 1e9, "nb_cpu": 2,
            "total_mem": 2e9, "server_type": "serial"}


def tree(n: int, las: int = 4) -> AgentState:
    """An MA whose view holds ``n`` idle SeDs under ``las`` LAs."""
    st = AgentState(AgentConfig(name="MA", rebuild_time=0.0), MasterRole(), random.Random(1))
    per = n // las
    for la in range(las):
        name = f"LA{la}"
        els = [{"name": f"s{la}-{i}", "parent": name, "kind": "sed", "services": list(SERVICES),
                "address": f"tcp://h{la}:{1000 + i}"} for i in range(per)]
        st.handle(Received(name.encode(), MsgType.REGISTER, m.make(
            MsgType.REGISTER, f"r{la}", name=name, kind="la", address=f"tcp://la{la}:1", pid=la,
            services=list(SERVICES), elements=els)), 0.0)
        entries = []
        for i, e in enumerate(els):
            common, own = split_common({s: _vec(la * per + i) for s in SERVICES})
            entries.append({"name": e["name"], "common": common, "services": own, "age_ms": 0})
        st.handle(Received(name.encode(), MsgType.VIEW, m.make(MsgType.VIEW, f"v{la}", name=name,
                                                                entries=entries)), 0.0)
    return st


def per_discovery_ms(st: AgentState, n: int = 50) -> float:
    def disc(i: int, now: float):
        return st.handle(Received(b"client", MsgType.DISCOVER, m.make(MsgType.DISCOVER, f"d{i}", service="add",
                                                                      k=3)), now)
    assert disc(0, 0.1)[0].header.get("view"), "not answered from the view"
    t = time.perf_counter()
    for i in range(n):
        disc(i + 1, 0.1 + i * 0.001)
    return (time.perf_counter() - t) / n * 1000


def main(argv: list[str]) -> int:
    sizes = [int(a) for a in argv if a.isdigit()] or [500, 2000]
    for n in sizes:
        st = tree(n)
        print(f"{n:6d} SeDs: {per_discovery_ms(st):.2f} ms of MA CPU per view discovery", flush=True)
        if "--profile" in argv:
            prof = cProfile.Profile()
            prof.runcall(per_discovery_ms, st, 30)
            pstats.Stats(prof).sort_stats("cumtime").print_stats(12)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
