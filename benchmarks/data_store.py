"""The pure data store's cost of one put at its budget (no sockets: a SeD's
CPU per ``client.put`` once its data budget is full).

    python -m benchmarks.data_store                     # 20,000 entries, each policy, evict and spill
    python -m benchmarks.data_store --entries 5000 --puts 500 --policy lru --disk 0

The store holds ``--entries`` references at its memory budget: one user
(``alice``) holds 8 values of 1 MB, another (``mallory``) the rest, 100 bytes
each. ``mallory`` then puts ``--puts`` more values of 100 bytes: each put
makes room from her own oldest data (``--disk 0``: evicted; ``--disk N``: the
spill directory holds N bytes, at most half of her values, and is already
full, so each put spills one value and evicts one from disk). Also timed: ``touch`` (a use, which
moves an entry in the LRU/LFU order). CPU time (``time.process_time``, gc on)
per operation, in µs; a run stops early past ``--seconds`` per row.
"""
from __future__ import annotations

import argparse
import time

from gridrpc.core.datastore import DataStore, Mode

BIG, SMALL, N_BIG = 1_000_000, 100, 8


def filled(entries: int, policy: str, disk: int) -> DataStore:
    """A store of ``entries`` references at its memory budget (and, with
    ``disk``, its spill space full of ``mallory``'s oldest values)."""
    small = entries - N_BIG
    on_disk = min(small // 2, disk // SMALL)
    memory = N_BIG * BIG + (small - on_disk) * SMALL
    s = DataStore(memory_bytes=0, disk_bytes=on_disk * SMALL, policy=policy)
    for i in range(small):
        if i == on_disk:
            s.memory_bytes = memory      # the oldest went to disk (no memory: each put spilled itself)
        s.add(f"m{i}", "mallory", Mode.PERSISTENT, SMALL, now=float(i))
    for i in range(N_BIG):
        s.add(f"big{i}", "alice", Mode.PERSISTENT, BIG, now=float(small + i))
    assert len(s.entries) == entries and s.statistics()["memory_bytes"] == memory
    assert s.statistics()["disk_bytes"] == on_disk * SMALL
    return s


def row(entries: int, policy: str, disk: int, puts: int, seconds: float) -> dict:
    s = filled(entries, policy, disk)
    t0 = time.process_time()
    stop = t0 + seconds
    done = made = 0
    base = float(entries)
    while done < puts and time.process_time() < stop:
        _, actions = s.add(f"p{done}", "mallory", Mode.PERSISTENT, SMALL, now=base + done)
        made += len(actions)
        done += 1
    put_us = (time.process_time() - t0) / done * 1e6
    refs = list(s.entries)
    t0 = time.process_time()
    for i in range(puts):
        s.touch(refs[i * 7919 % len(refs)], now=base + puts + i)
    touch_us = (time.process_time() - t0) / puts * 1e6
    assert len(s.entries) == entries and made >= done      # each put made room, the store stayed full
    return {"entries": entries, "policy": policy, "disk": s.disk_bytes, "puts": done, "actions": made,
            "put_us": put_us, "touch_us": touch_us}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", type=int, default=20_000)
    p.add_argument("--puts", type=int, default=2_000)
    p.add_argument("--policy", choices=("lru", "lfu", "fifo", "all"), default="all")
    p.add_argument("--disk", type=int, action="append", help="spill bytes (repeatable; default 0 and 1,000,000)")
    p.add_argument("--seconds", type=float, default=10.0, help="stop a row's puts past this CPU time")
    a = p.parse_args(argv)
    if a.entries <= N_BIG * 2 or a.puts < 1:
        p.error(f"--entries must be > {N_BIG * 2} and --puts >= 1")
    policies = ("lru", "lfu", "fifo") if a.policy == "all" else (a.policy,)
    print(f"{'entries':>8} {'policy':>6} {'disk':>9} {'puts':>6} {'actions':>7} {'µs/put':>9} {'µs/touch':>9}")
    for disk in a.disk or (0, 1_000_000):
        for policy in policies:
            r = row(a.entries, policy, disk, a.puts, a.seconds)
            print(f"{r['entries']:>8} {r['policy']:>6} {r['disk']:>9} {r['puts']:>6} {r['actions']:>7} "
                  f"{r['put_us']:>9.1f} {r['touch_us']:>9.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
