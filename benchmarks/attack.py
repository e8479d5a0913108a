"""A well-behaved user's calls, quiet and under a mixed attack from two hostile users.

Tree: MA -> LA1 -> sed-1, sed-2 (real processes; ``--secure``: CURVE on every
link and a user key each for alice, mallory and trudy). Alice makes
sequential calls of ``add`` with discovery, first on a quiet tree, then while
mallory and trudy, from raw sockets, send at once:

- ``data_put``s whose ``source`` is a new address each time (descriptors);
- 1 MB strings to store (the data budget counts them);
- tiny ``data_put``s as fast as they can (the store's cost per put);
- CALLs nested 900 deep (handler errors and the log);
- DISCOVERs with 1 MB of ``args`` (refused at the MA, not copied down);
- a flood of short calls (``sleep 0.05``) to every SeD, bounded by the SeDs'
  ``--max-calls-per-user`` below their slots.

Printed: alice's median and p99 latency quiet and under attack (and their
ratio), her failures, the attackers' answers by kind, and for every daemon
its peak resident memory and descriptors and whether it stayed in the tree.
JSON with ``--json PATH``.

Run: ``python -m benchmarks.attack [--seconds 8] [--secure] [--json out.json]``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

import orjson
import psutil
import zmq

import gridrpc
from gridrpc.core import messages as m
from gridrpc.core.messages import MsgType

from .procs import Procs, wait_registered

#: the floods, by name (``--only``)
KINDS = ("sources", "big", "tiny", "deep", "discover", "calls")
SLOTS = 6           # calls running at once per SeD
PER_USER = 2        # --max-calls-per-user: below the slots, so one user cannot take them all


def _sock(address: str, options: dict | None) -> zmq.Socket:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, 2000)
    for k, v in (options or {}).items():
        s.setsockopt(k, v)
    s.connect(address)
    return s


class Attacker(threading.Thread):
    """One hostile user's floods, round-robin, until ``stop`` is set; counts the answers by kind."""

    def __init__(self, user: str, ma: str, seds: list[str], opts, stop: threading.Event,
                 kinds: frozenset = frozenset(KINDS)) -> None:
        super().__init__(daemon=True, name=f"attack-{user}")
        self.kinds = kinds
        self.user, self.stop = user, stop
        self.ma = _sock(ma, opts(user, "MA"))
        self.seds = [_sock(a, opts(user, n)) for n, a in seds]
        self.names = [n for n, _ in seds]
        self.sent = 0
        self.answers: dict[str, int] = {}

    def _send(self, sock: zmq.Socket, header: dict) -> None:
        try:
            sock.send(orjson.dumps(header), zmq.NOBLOCK)
            self.sent += 1
        except zmq.Again:
            pass

    def _drain(self) -> None:
        for s in (self.ma, *self.seds):
            while s.poll(0):
                h = orjson.loads(s.recv_multipart()[0])
                kind = h.get("type") if h.get("type") != "error" else f"error:{h['error'].get('kind')}"
                self.answers[kind] = self.answers.get(kind, 0) + 1

    def run(self) -> None:
        i = 0
        deep = "[" * 900 + "]" * 900
        big = "x" * 1_000_000
        while not self.stop.is_set():
            i += 1
            j = i % len(self.seds)
            sock, name = self.seds[j], self.names[j]
            u, k = self.user, self.kinds
            if "sources" in k:
                self._send(sock, m.make(MsgType.DATA_PUT, f"{u}-src-{i}", ref=f"r{u}s{i}", user=u, sed=name,
                                        source={"name": "sed-9",
                                                "address": f"tcp://127.0.0.1:{20000 + i % 30000}"}))
            if "big" in k and i % 20 == 0:
                self._send(sock, m.make(MsgType.DATA_PUT, f"{u}-big-{i}", ref=f"r{u}b{i}", user=u, sed=name,
                                        value=big))
            if "tiny" in k:
                self._send(sock, m.make(MsgType.DATA_PUT, f"{u}-tiny-{i}", ref=f"r{u}t{i}", user=u, sed=name,
                                        value=i))
            if "deep" in k:
                try:
                    sock.send((f'{{"v":1,"type":"call","id":"{u}-deep-{i}","service":"echo","args":[{deep}],'
                               f'"kwargs":{{}},"sed":"{name}","user":"{u}"}}').encode(), zmq.NOBLOCK)
                except zmq.Again:
                    pass
            if "discover" in k and i % 10 == 0:
                self._send(self.ma, m.make(MsgType.DISCOVER, f"{u}-disc-{i}", service="add", k=5, max_age_ms=0,
                                           user=u, args=[big]))
            if "calls" in k:
                self._send(sock, {"v": 1, "type": "call", "id": f"{u}-call-{i}", "service": "sleep",
                                  "args": [0.05], "kwargs": {}, "sed": name, "user": u})
            self._drain()
            time.sleep(0.002)
        self._drain()
        for s in (self.ma, *self.seds):
            s.close()


class Watch(threading.Thread):
    """Peak RSS (MB) and descriptors of each daemon, sampled every 0.2 s."""

    def __init__(self, procs: dict[str, int], stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.ps = {n: psutil.Process(pid) for n, pid in procs.items()}
        self.peak = {n: {"rss_mb": 0.0, "fds": 0} for n in procs}
        self.stop = stop

    def run(self) -> None:
        while not self.stop.wait(0.2):
            for n, p in self.ps.items():
                try:
                    self.peak[n]["rss_mb"] = max(self.peak[n]["rss_mb"], p.memory_info().rss / 1e6)
                    self.peak[n]["fds"] = max(self.peak[n]["fds"], p.num_fds())
                except psutil.Error:
                    pass


def _alice(client: gridrpc.Client, seconds: float) -> dict:
    lat, failed = [], {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        try:
            client.call("add", 1, 2)
            lat.append(time.perf_counter() - t)
        except gridrpc.GridRPCError as exc:
            failed[type(exc).__name__] = failed.get(type(exc).__name__, 0) + 1
    lat.sort()
    return {"calls": len(lat), "median_ms": statistics.median(lat) * 1e3 if lat else None,
            "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3 if lat else None, "failed": failed}


def run(seconds: float, secure: bool, kinds: frozenset = frozenset(KINDS)) -> dict:
    with Procs(hb=(0.5, 2.0)) as procs:
        users = ("alice", "mallory", "trudy")
        keys = procs.keys(["MA", "LA1", "sed-1", "sed-2"], users=users) if secure else None
        ma = procs.daemon("ma", "MA", keys=keys).wait_ready()
        la = procs.daemon("la", "LA1", parent=ma.address, keys=keys, parent_key="MA").wait_ready()
        sed_args = ("--examples", "--max-concurrent", str(SLOTS), "--max-calls-per-user", str(PER_USER),
                    "--data-memory-bytes", "50000000")
        seds = [procs.daemon("sed", n, *sed_args, parent=la.address, keys=keys, parent_key="LA1").wait_ready()
                for n in ("sed-1", "sed-2")]
        kw = {"keys": str(keys), "key": "alice", "user": "alice"} if secure else {"user": "alice"}
        wait_registered(ma.address, 2, 30, **kw)

        def opts(user: str, element: str) -> dict | None:
            if not secure:
                return None
            from gridrpc.transport.security import KeyStore, Security
            store = KeyStore(keys)
            return Security(keys=store, name=user, role="user").client_options(store.public(element, "element"))

        out: dict = {"floods": sorted(kinds), "secure": secure, "seconds": seconds, "sed_slots": SLOTS, "max_calls_per_user": PER_USER}
        with gridrpc.Client(ma.address, **kw) as alice:
            for _ in range(50):
                alice.call("add", 1, 2)                          # warm-up
            out["quiet"] = _alice(alice, seconds)
            stop = threading.Event()
            watch = Watch({"MA": ma.pid, "LA1": la.pid, "sed-1": seds[0].pid, "sed-2": seds[1].pid}, stop)
            attackers = [Attacker(u, ma.address, [("sed-1", seds[0].address), ("sed-2", seds[1].address)], opts,
                                  stop, kinds) for u in ("mallory", "trudy")]
            watch.start()
            for a in attackers:
                a.start()
            time.sleep(0.5)
            out["attack"] = _alice(alice, seconds)
            stop.set()
            for a in attackers:
                a.join(10)
            watch.join(5)
            out["attackers"] = {a.user: {"sent": a.sent, "answers": a.answers} for a in attackers}
            out["daemons"] = watch.peak
            alive = {e["name"]: e.get("state", "alive") for e in alice.tree()}
            out["tree_after"] = alive
            out["dropped"] = sorted(n for n in ("LA1", "sed-1", "sed-2") if alive.get(n) != "alive")
        q, a = out["quiet"], out["attack"]
        out["p99_ratio"] = (a["p99_ms"] / q["p99_ms"]) if a["p99_ms"] and q["p99_ms"] else None
        out["median_ratio"] = (a["median_ms"] / q["median_ms"]) if a["median_ms"] and q["median_ms"] else None
        return out


def table(r: dict) -> str:
    q, a = r["quiet"], r["attack"]
    lines = [f"mixed attack ({'CURVE' if r['secure'] else 'plain'}), {r['seconds']:g} s per phase",
             "| alice's add with discovery | calls | median | p99 | failed |", "|---|---|---|---|---|",
             f"| quiet | {q['calls']} | {q['median_ms']:.2f} ms | {q['p99_ms']:.2f} ms | {q['failed'] or 0} |",
             f"| under attack | {a['calls']} | {a['median_ms']:.2f} ms | {a['p99_ms']:.2f} ms | {a['failed'] or 0} |",
             f"p99 under attack / quiet: {r['p99_ratio']:.2f}x (median {r['median_ratio']:.2f}x)", "",
             "| daemon | peak RSS | peak descriptors | in the tree after |", "|---|---|---|---|"]
    for n, p in r["daemons"].items():
        lines.append(f"| {n} | {p['rss_mb']:.0f} MB | {p['fds']} | {r['tree_after'].get(n, 'root')} |")
    for u, s in r["attackers"].items():
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(s["answers"].items(), key=lambda kv: -kv[1]))
        lines.append(f"{u}: {s['sent']} messages sent; answers: {kinds}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.attack", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=8.0, help="length of each phase (default 8)")
    p.add_argument("--secure", action="store_true", help="CURVE on every link, a key per user")
    p.add_argument("--only", metavar="KIND,...", help=f"only these floods ({', '.join(KINDS)}; default all)")
    p.add_argument("--json", metavar="PATH")
    a = p.parse_args(argv)
    kinds = frozenset(x.strip() for x in a.only.split(",")) if a.only else frozenset(KINDS)
    if not kinds <= set(KINDS):
        p.error(f"--only: unknown flood(s) {', '.join(sorted(kinds - set(KINDS)))}; known: {', '.join(KINDS)}")
    r = run(a.seconds, a.secure, kinds)
    print(table(r))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(r, fh, indent=1)
        print(f"JSON: {a.json}")
    return 0 if not r["dropped"] and not r["attack"]["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
