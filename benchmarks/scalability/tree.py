"""Tree shapes and the real processes that make them.

A shape places ``n`` SeDs under agents:

- ``flat``: every SeD under the MA (in ``min(2, n)`` SeD processes, one per
  core of this machine, with ``--replicas``);
- ``L2-d``: the MA, ``d`` LAs, the SeDs spread over the LAs;
- ``L3-d``: the MA, ``d`` LAs, ``d`` LAs under each (``d*d`` leaf LAs), the
  SeDs spread over the leaf LAs — a complete d-ary tree of agents.

Every leaf agent other than the MA gets one SeD process holding its share of
the SeDs as replicas (``gridrpc sed --replicas K --workers 1``): hundreds of
SeDs fit on two cores, each still its own element of the tree (own name,
queue, link to its parent, estimation vector).
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Element:
    kind: str                 # ma | la | sed
    name: str
    parent: str | None
    replicas: int = 1         # SeDs in this process (sed only)


@dataclass(frozen=True)
class Shape:
    name: str                 # flat | L2-d | L3-d
    levels: int               # agent levels (1 = MA only)
    d: int                    # fan-out of the agents above the leaf agents (0 for flat)

    @staticmethod
    def parse(text: str) -> "Shape":
        if text == "flat":
            return Shape("flat", 1, 0)
        try:
            lv, d = text.split("-")
            levels, d = int(lv.lstrip("Ll")), int(d)
        except ValueError:
            raise ValueError(f"shape {text!r}: use flat, L2-D or L3-D") from None
        if levels not in (2, 3) or d < 1:
            raise ValueError(f"shape {text!r}: levels 2 or 3, fan-out >= 1")
        return Shape(f"L{levels}-{d}", levels, d)

    def leaves(self) -> int:
        return 1 if self.levels == 1 else self.d ** (self.levels - 1)

    def fits(self, n: int) -> bool:
        return self.leaves() <= n

    def elements(self, n: int) -> list[Element]:
        out = [Element("ma", "MA", None)]
        if self.levels == 1:
            procs = min(2, n)
            for i, k in enumerate(_split(n, procs)):
                out.append(Element("sed", f"s{i + 1}", "MA", k))
            return out
        leaves = []
        for i in range(self.d):
            out.append(Element("la", f"LA{i + 1}", "MA"))
            if self.levels == 2:
                leaves.append(f"LA{i + 1}")
            else:
                for j in range(self.d):
                    out.append(Element("la", f"LA{i + 1}.{j + 1}", f"LA{i + 1}"))
                    leaves.append(f"LA{i + 1}.{j + 1}")
        for leaf, k in zip(leaves, _split(n, len(leaves))):
            if k:
                out.append(Element("sed", f"s-{leaf}", leaf, k))
        return out


def _split(n: int, parts: int) -> list[int]:
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def default_shapes(n: int) -> list[Shape]:
    """flat, L2 with d=2 and d=sqrt(n), L3 with d=2 and d=cbrt(n) (the complete d-ary trees)."""
    cands = [Shape.parse("flat")]
    if n >= 2:
        cands.append(Shape.parse("L2-2"))
    d2 = max(2, round(math.sqrt(n)))
    if n >= 4 and d2 != 2:
        cands.append(Shape.parse(f"L2-{d2}"))
    if n >= 4:
        cands.append(Shape.parse("L3-2"))
    d3 = max(2, round(n ** (1 / 3)))
    if n >= 8 and d3 != 2:
        cands.append(Shape.parse(f"L3-{d3}"))
    return [s for s in cands if s.fits(n)]


class Proc:
    def __init__(self, el: Element, popen: subprocess.Popen, ready: Path, log: Path) -> None:
        self.el, self.popen, self.ready, self.log = el, popen, ready, log
        self.address: str | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid


class TreeProcs:
    """Start a shape as real ``gridrpc ma|la|sed`` processes; ``stop()`` ends
    them all by PID (children first)."""

    def __init__(self, shape: Shape, n: int, workdir: Path, hb: tuple[float, float] = (1.0, 5.0),
                 services: tuple[str, ...] = ("gridrpc.examples.services:noop", "gridrpc.examples.services:add"),
                 env: dict | None = None, fanout: bool = False):
        self.shape, self.n, self.workdir, self.hb, self.services = shape, n, Path(workdir), hb, services
        self.env = env            # e.g. PYTHONPATH of another checkout (benchmarks.scalability.ab)
        self.fanout = fanout      # MA and LAs with --no-view: every discovery a fan-out (DIET's way)
        self.procs: list[Proc] = []
        self.by_name: dict[str, Proc] = {}

    @property
    def ma_address(self) -> str:
        return self.by_name["MA"].address

    def start(self, timeout: float = 180.0) -> "TreeProcs":
        self.workdir.mkdir(parents=True, exist_ok=True)
        elements = self.shape.elements(self.n)
        deadline = time.monotonic() + timeout
        level = [e for e in elements if e.parent is None]
        while level:
            started = [self._spawn(e) for e in level]
            for p in started:
                self._wait_ready(p, deadline)
            names = {e.name for e in level}
            level = [e for e in elements if e.parent in names]
        self.wait_registered(deadline)
        return self

    def _spawn(self, e: Element) -> Proc:
        ready = self.workdir / f"{e.name}.ready"
        log = self.workdir / f"{e.name}.log"
        ready.unlink(missing_ok=True)          # a stale file would give a dead address
        cmd = [sys.executable, "-m", "gridrpc", e.kind, "--name", e.name, "--port", "0",
               "--hb-interval", str(self.hb[0]), "--hb-timeout", str(self.hb[1]),
               "--ready-file", str(ready), "--log-level", "WARNING"]
        if e.parent:
            cmd += ["--parent", self.by_name[e.parent].address]
        if self.fanout and e.kind in ("ma", "la"):
            cmd.append("--no-view")
        if e.kind == "sed":
            cmd += ["--replicas", str(e.replicas), "--workers", "1"]
            for s in self.services:
                cmd += ["--service", s]
        with open(log, "wb") as out:
            popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env={**os.environ, **self.env} if self.env else None)
        p = Proc(e, popen, ready, log)
        self.procs.append(p)
        self.by_name[e.name] = p
        return p

    def _wait_ready(self, p: Proc, deadline: float) -> None:
        while not p.ready.exists():
            if p.popen.poll() is not None:
                raise RuntimeError(f"{p.el.name} exited with {p.popen.returncode}:\n"
                                   + p.log.read_text(errors="replace")[-2000:])
            if time.monotonic() > deadline:
                raise TimeoutError(f"{p.el.name} not ready in time")
            time.sleep(0.05)
        p.address = json.loads(p.ready.read_text())["address"]

    def registered(self) -> int:
        import gridrpc
        with gridrpc.Client(self.ma_address, discovery_timeout=5) as c:
            return sum(1 for e in c.tree() if e.get("kind") == "sed" and e.get("state", "alive") == "alive")

    def wait_registered(self, deadline: float) -> None:
        import gridrpc
        with gridrpc.Client(self.ma_address, discovery_timeout=5) as c:
            while True:
                try:
                    seen = sum(1 for e in c.tree() if e.get("kind") == "sed" and e.get("state", "alive") == "alive")
                except gridrpc.GridRPCError:
                    seen = 0
                if seen >= self.n:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {seen}/{self.n} SeDs registered at the MA")
                time.sleep(0.2)

    def ma_counters(self) -> dict:
        """The MA's discovery counters: how many it answered, how many of
        them from its pushed view, and the pushed snapshots it took or
        dropped (``views_ignored``: --no-view)."""
        import gridrpc
        with gridrpc.Client(self.ma_address, discovery_timeout=5) as c:
            load = next(e for e in c.tree() if e.get("name") == "MA").get("load") or {}
        return {k: load.get(k) for k in ("discoveries", "view_answers", "view_snapshots", "view_updates",
                                         "views_ignored")}

    def pids(self) -> dict[str, int]:
        return {p.el.name: p.pid for p in self.procs}

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.popen.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for p in reversed(self.procs):
            try:
                p.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait(5)

    def __enter__(self) -> "TreeProcs":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
