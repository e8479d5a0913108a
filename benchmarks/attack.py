"""A well-behaved user's calls, quiet and under a mixed attack from two hostile users.

Tree: MA -> LA1 -> sed-1, sed-2 (real processes; ``--secure``: CURVE on every
link and a user key each for alice, mallory and trudy). Alice makes
sequential calls of ``add`` with discovery, on the quiet tree and while
mallory and trudy, from raw sockets, send at once:

- ``data_put``s whose ``source`` is a new address each time (descriptors);
- 1 MB strings to store (the data budget counts them);
- tiny ``data_put``s as fast as they can (the store's cost per put);
- CALLs nested 900 deep (handler errors and the log);
- DISCOVERs with 1 MB of ``args`` (refused at the MA, not copied down);
- a flood of short calls (``sleep 0.05``) to every SeD, bounded by the SeDs'
  ``--max-calls-per-user`` below their slots.

Each hostile user is a process of its own (as it would be on another
host): it shares no interpreter lock with alice's client. Each round has
three windows, so a change in the machine's other load falls on all alike:
quiet, attacked, and a control in which the hostile processes send nothing
but spin on the CPU for as many cores as the attack just took (their own
CPU plus what the daemons used beyond their quiet rate). The control tells
what the attack costs alice through the CPU alone on a machine where she
shares the cores with the attackers.

Printed: alice's median and p99 latency in each kind of window (and the
ratios to quiet), her failures, the attackers' answers by kind, for every
daemon its peak resident memory and descriptors and whether it stayed in
the tree, and the CPU time each party used in each kind of window
(attackers, daemons with their workers, alice's client, the whole machine)
against the cores' capacity.
JSON with ``--json PATH``.

Run: ``python -m benchmarks.attack [--seconds 8] [--rounds 4] [--secure] [--json out.json]``.
"""
from __future__ import annotations

import argparse
import json
import os
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

from .procs import Procs, cpu_seconds, wait_registered

#: the floods, by name (``--only``)
KINDS = ("sources", "big", "tiny", "deep", "discover", "calls")
SLOTS = 6           # calls running at once per SeD
PER_USER = 2        # --max-calls-per-user: below the slots, so one user cannot take them all
PAUSED, FLOOD, BURN = 0, 1, 2   # what the hostile processes do (the control: BURN)
PHASES = ("quiet", "attack", "control")


def _sock(address: str, options: dict | None) -> zmq.Socket:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, 2000)
    for k, v in (options or {}).items():
        s.setsockopt(k, v)
    s.connect(address)
    return s


class Attacker:
    """One hostile user's floods, round-robin, while its mode is FLOOD, until
    ``stop`` is set; counts the answers by kind. Runs in a process of its own
    (:func:`_attacker_main`)."""

    def __init__(self, user: str, ma: str, seds: list[tuple[str, str]], keys: str | None,
                 kinds: frozenset = frozenset(KINDS)) -> None:
        self.kinds = kinds
        self.user = user
        self.ma = _sock(ma, _options(keys, user, "MA"))
        self.seds = [_sock(a, _options(keys, user, n)) for n, a in seds]
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

    def run(self, mode, duty, stop) -> None:
        """``mode``: PAUSED, FLOOD or BURN (no message: ``duty`` of a core spent spinning)."""
        i = 0
        deep = "[" * 900 + "]" * 900
        big = "x" * 1_000_000
        while not stop.is_set():
            if mode.value == BURN:
                _spin(duty.value)
                continue
            if mode.value != FLOOD:
                self._drain()
                time.sleep(0.01)
                continue
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
                    self.sent += 1
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


def _options(keys: str | None, user: str, element: str) -> dict | None:
    """CURVE client options of ``user`` towards ``element`` (None: plain)."""
    if keys is None:
        return None
    from gridrpc.transport.security import KeyStore, Security
    store = KeyStore(keys)
    return Security(keys=store, name=user, role="user").client_options(store.public(element, "element"))


def _spin(duty: float, period: float = 0.01) -> None:
    """One period of the control: ``duty`` of it spinning on the CPU, the rest asleep."""
    t = time.perf_counter()
    while time.perf_counter() - t < duty * period:
        pass
    time.sleep(max(0.0, (1.0 - duty) * period))


def _attacker_main(user: str, ma: str, seds: list, keys: str | None, kinds: frozenset, mode, duty, stop,
                   out) -> None:
    """A hostile user's process (:meth:`Attacker.run`); at the end, what it sent and got into ``out``."""
    a = Attacker(user, ma, seds, keys, kinds)
    try:
        a.run(mode, duty, stop)
    finally:
        out.put({"user": user, "sent": a.sent, "answers": a.answers})


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


def _alice(client: gridrpc.Client, seconds: float, lat: list, failed: dict) -> None:
    """Alice's sequential calls for ``seconds``: latencies (s) of right answers into ``lat``, failures by
    kind (an error's class, or ``wrong answer``) into ``failed``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        try:
            got = client.call("add", 1, 2)
        except gridrpc.GridRPCError as exc:
            failed[type(exc).__name__] = failed.get(type(exc).__name__, 0) + 1
            continue
        if got == 3:
            lat.append(time.perf_counter() - t)
        else:
            failed["wrong answer"] = failed.get("wrong answer", 0) + 1


def _summary(lat: list, failed: dict) -> dict:
    lat = sorted(lat)
    return {"calls": len(lat), "median_ms": statistics.median(lat) * 1e3 if lat else None,
            "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3 if lat else None, "failed": failed}


class Cpu:
    """CPU seconds used by each party (daemons with their workers, the
    attackers' processes, alice's client) and by the whole machine, summed
    over the measured windows of each phase."""

    def __init__(self, daemons: dict[str, int], attackers: list[int]) -> None:
        self.daemons, self.attackers = daemons, attackers
        self.used = {ph: {"wall_s": 0.0, "machine_s": 0.0, "attackers_s": 0.0, "alice_s": 0.0,
                          **{n: 0.0 for n in daemons}} for ph in PHASES}
        self._at: dict | None = None

    def _snap(self) -> dict:
        t = psutil.cpu_times()
        return {"wall_s": time.monotonic(), "machine_s": sum(t) - t.idle - getattr(t, "iowait", 0.0),
                "attackers_s": sum(cpu_seconds(p, False) for p in self.attackers),
                "alice_s": cpu_seconds(os.getpid(), False),
                **{n: cpu_seconds(pid) for n, pid in self.daemons.items()}}

    def begin(self) -> None:
        self._at = self._snap()

    def end(self, phase: str) -> dict:
        """Adds the window to ``phase``; returns the window's own CPU seconds."""
        now, was = self._snap(), self._at
        window = {k: v - was[k] for k, v in now.items()}
        for k, v in window.items():
            self.used[phase][k] += v
        return window

    def added_cores(self, quiet: dict, attack: dict) -> float:
        """Cores the attack took, from one quiet and one attacked window: the attackers' CPU and
        what the daemons used beyond their quiet rate."""
        def rate(w: dict, keys) -> float:
            return sum(w[k] for k in keys) / w["wall_s"] if w["wall_s"] > 0 else 0.0
        return max(0.0, rate(attack, ["attackers_s", *self.daemons]) - rate(quiet, self.daemons))

    def shares(self) -> dict:
        """Per phase: CPU seconds of each party and their share of the machine's capacity
        (wall time x cores)."""
        cores = psutil.cpu_count() or 1
        out = {}
        for ph, u in self.used.items():
            cap = u["wall_s"] * cores
            out[ph] = {"cores": cores, **{k: round(v, 2) for k, v in u.items()},
                       "share": {k: round(v / cap, 3) for k, v in u.items() if k != "wall_s" and cap}}
        return out


def run(seconds: float, secure: bool, kinds: frozenset = frozenset(KINDS), rounds: int = 4) -> dict:
    """``seconds`` of each phase, in ``rounds`` alternating windows (quiet, then attacked)."""
    import multiprocessing
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

        out: dict = {"floods": sorted(kinds), "secure": secure, "seconds": seconds, "rounds": rounds,
                     "sed_slots": SLOTS, "max_calls_per_user": PER_USER}
        mp = multiprocessing.get_context("spawn")
        mode, duty, stop, results = mp.Value("i", PAUSED), mp.Value("d", 0.0), mp.Event(), mp.Queue()
        attackers = [mp.Process(target=_attacker_main, daemon=True, name=f"attack-{u}",
                                args=(u, ma.address, [("sed-1", seds[0].address), ("sed-2", seds[1].address)],
                                      str(keys) if keys else None, kinds, mode, duty, stop, results))
                     for u in ("mallory", "trudy")]
        for a in attackers:
            a.start()
        daemons = {"MA": ma.pid, "LA1": la.pid, "sed-1": seds[0].pid, "sed-2": seds[1].pid}
        lat: dict = {ph: ([], {}) for ph in PHASES}
        duties = []
        try:
            with gridrpc.Client(ma.address, **kw) as alice:
                for _ in range(50):
                    alice.call("add", 1, 2)                          # warm-up
                watch_stop = threading.Event()
                watch = Watch(daemons, watch_stop)
                watch.start()
                cpu = Cpu(daemons, [a.pid for a in attackers])

                def window(phase: str, settle: float) -> dict:
                    time.sleep(settle)
                    cpu.begin()
                    _alice(alice, seconds / rounds, *lat[phase])
                    return cpu.end(phase)

                for _ in range(rounds):
                    quiet = window("quiet", 0.0)
                    mode.value = FLOOD
                    attack = window("attack", 0.3)                 # the floods reach their steady state
                    mode.value = PAUSED
                    time.sleep(0.5)                                  # what they queued drains
                    # the control: the same CPU as the attack took, spent spinning, no message sent
                    duty.value = min(1.0, cpu.added_cores(quiet, attack) / len(attackers))
                    duties.append(round(duty.value, 3))
                    mode.value = BURN
                    window("control", 0.1)
                    mode.value = PAUSED
                stop.set()
                got = [results.get(timeout=20) for _ in attackers]
                watch_stop.set()
                watch.join(5)
                out["attackers"] = {g["user"]: {"sent": g["sent"], "answers": g["answers"]} for g in got}
                out["cpu"] = cpu.shares()
                out["daemons"] = watch.peak
                alive = {e["name"]: e.get("state", "alive") for e in alice.tree()}
                out["tree_after"] = alive
                out["dropped"] = sorted(n for n in ("LA1", "sed-1", "sed-2") if alive.get(n) != "alive")
        finally:
            stop.set()
            for a in attackers:
                a.join(10)
                if a.is_alive():
                    a.kill()
                    a.join(5)
        for ph in PHASES:
            out[ph] = _summary(*lat[ph])
        out["control_duty"] = duties
        q, a, c = out["quiet"], out["attack"], out["control"]
        out["p99_ratio"] = (a["p99_ms"] / q["p99_ms"]) if a["p99_ms"] and q["p99_ms"] else None
        out["median_ratio"] = (a["median_ms"] / q["median_ms"]) if a["median_ms"] and q["median_ms"] else None
        out["control_p99_ratio"] = (c["p99_ms"] / q["p99_ms"]) if c["p99_ms"] and q["p99_ms"] else None
        return out


def table(r: dict) -> str:
    q, a, c = r["quiet"], r["attack"], r["control"]
    lines = [f"mixed attack ({'CURVE' if r['secure'] else 'plain'}), {r['seconds']:g} s per phase "
             f"in {r['rounds']} alternating windows",
             "| alice's add with discovery | calls | median | p99 | failed |", "|---|---|---|---|---|",
             f"| quiet | {q['calls']} | {q['median_ms']:.2f} ms | {q['p99_ms']:.2f} ms | {q['failed'] or 0} |",
             f"| under attack | {a['calls']} | {a['median_ms']:.2f} ms | {a['p99_ms']:.2f} ms | {a['failed'] or 0} |",
             f"| control: the attack's CPU, no message | {c['calls']} | {c['median_ms']:.2f} ms | "
             f"{c['p99_ms']:.2f} ms | {c['failed'] or 0} |",
             f"p99 under attack / quiet: {r['p99_ratio']:.2f}x (median {r['median_ratio']:.2f}x); "
             f"control / quiet: {r['control_p99_ratio']:.2f}x (the hostile processes spinning "
             f"{', '.join(f'{d:.0%}' for d in r['control_duty'])} of a core each)", "",
             "| daemon | peak RSS | peak descriptors | in the tree after |", "|---|---|---|---|"]
    for n, p in r["daemons"].items():
        lines.append(f"| {n} | {p['rss_mb']:.0f} MB | {p['fds']} | {r['tree_after'].get(n, 'root')} |")
    for u, s in r["attackers"].items():
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(s["answers"].items(), key=lambda kv: -kv[1]))
        lines.append(f"{u}: {s['sent']} messages sent; answers: {kinds}")
    cpu = r.get("cpu")
    if cpu:
        names = [k for k in cpu["quiet"] if k not in ("cores", "share", "wall_s", "machine_s")]
        lines += ["", f"CPU seconds used while alice measured ({cpu['quiet']['cores']} cores; share of "
                      "wall time x cores):",
                  "| phase | wall | machine | " + " | ".join(names) + " |", "|---" * (len(names) + 3) + "|"]
        for ph in PHASES:
            c = cpu[ph]
            lines.append(f"| {ph} | {c['wall_s']:.1f} s | {c['machine_s']:.1f} ({c['share']['machine_s']:.0%}) | "
                         + " | ".join(f"{c[n]:.1f} ({c['share'][n]:.0%})" for n in names) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.attack", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=8.0, help="length of each phase (default 8)")
    p.add_argument("--rounds", type=int, default=4,
                   help="alternating quiet and attacked windows each phase is split into (default 4)")
    p.add_argument("--secure", action="store_true", help="CURVE on every link, a key per user")
    p.add_argument("--only", metavar="KIND,...", help=f"only these floods ({', '.join(KINDS)}; default all)")
    p.add_argument("--json", metavar="PATH")
    a = p.parse_args(argv)
    kinds = frozenset(x.strip() for x in a.only.split(",")) if a.only else frozenset(KINDS)
    if not kinds <= set(KINDS):
        p.error(f"--only: unknown flood(s) {', '.join(sorted(kinds - set(KINDS)))}; known: {', '.join(KINDS)}")
    if a.rounds < 1 or a.seconds <= 0:
        p.error("--rounds must be >= 1 and --seconds > 0")
    r = run(a.seconds, a.secure, kinds, a.rounds)
    print(table(r))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(r, fh, indent=1)
        print(f"JSON: {a.json}")
    return 0 if not r["dropped"] and not r["attack"]["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
