"""The floor: raw pyzmq asyncio DEALER -> ROUTER echo, server in another process.

``python -m benchmarks.floor serve`` runs the echo server (a zmq.asyncio
ROUTER echoing every message, zero-copy) and prints ``READY <address>``. The
client side (here, in the benchmark process) measures:

- round trip of a 1-byte message, 1 in flight (median, p99);
- round trips per second with 64 in flight (plain zmq.asyncio, no batching);
- round trip of an 8 MB float64 array, sent and received with copy=False
  (GB/s counts both directions: 2 x 8 MiB per round trip).
"""
from __future__ import annotations

import asyncio
import sys
import time

import numpy as np
import zmq
import zmq.asyncio

from .procs import Procs
from .stats import latency, rates

MB8 = 8 * 1024 * 1024


async def _serve() -> None:
    ctx = zmq.asyncio.Context()
    s = ctx.socket(zmq.ROUTER)
    s.setsockopt(zmq.LINGER, 0)
    port = s.bind_to_random_port("tcp://127.0.0.1")
    print(f"READY tcp://127.0.0.1:{port}", flush=True)
    while True:
        frames = await s.recv_multipart(copy=False)
        await s.send_multipart(frames, copy=False)


def start_server(procs: Procs):
    p = procs.spawn("floor-echo", [sys.executable, "-m", "benchmarks.floor", "serve"])
    deadline = time.monotonic() + 20
    while True:
        text = p.log_tail(4000)
        for line in text.splitlines():
            if line.startswith("READY "):
                return line.split()[1]
        if p.popen.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("floor echo server did not start:\n" + text)
        time.sleep(0.02)


async def _latency(addr: str, warmup: int, n: int) -> dict:
    ctx = zmq.asyncio.Context()
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(addr)
    try:
        out = []
        for i in range(warmup + n):
            t0 = time.perf_counter()
            await d.send(b"x")
            await d.recv()
            if i >= warmup:
                out.append(time.perf_counter() - t0)
        return latency(out)
    finally:
        d.close()
        ctx.term()


async def _throughput(addr: str, n: int, window: int, repeat: int) -> dict:
    ctx = zmq.asyncio.Context()
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(addr)
    try:
        async def one_run(count):
            sent = got = 0
            t0 = time.perf_counter()
            while sent < min(window, count):
                await d.send(b"x")
                sent += 1
            while got < count:
                await d.recv()
                got += 1
                if sent < count:
                    await d.send(b"x")
                    sent += 1
            return count / (time.perf_counter() - t0)
        await one_run(min(n, 500))      # warm-up
        return {"calls_per_s": rates([await one_run(n) for _ in range(repeat)]), "n": n, "window": window}
    finally:
        d.close()
        ctx.term()


async def _bandwidth(addr: str, warmup: int, n: int) -> dict:
    ctx = zmq.asyncio.Context()
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(addr)
    arr = np.random.default_rng(0).random(MB8 // 8)
    try:
        out = []
        for i in range(warmup + n):
            t0 = time.perf_counter()
            await d.send(memoryview(arr).cast("B"), copy=False)
            frame = await d.recv(copy=False)
            back = np.frombuffer(frame.buffer, dtype=arr.dtype)
            if i >= warmup:
                out.append(time.perf_counter() - t0)
        assert back.shape == arr.shape and back[-1] == arr[-1]
        lat = latency(out)
        lat["gb_per_s"] = 2 * MB8 / (lat["median_ms"] / 1e3) / 1e9
        return lat
    finally:
        d.close()
        ctx.term()


def run(procs: Procs, items: set[str], quick: bool) -> dict:
    addr = start_server(procs)
    res = {}
    if "floor_latency" in items:
        res["floor_latency"] = asyncio.run(_latency(addr, 200, 500 if quick else 5000))
    if "floor_throughput" in items:
        res["floor_throughput"] = asyncio.run(_throughput(addr, 1000 if quick else 20000, 64, 1 if quick else 3))
    if "floor_8mb" in items:
        res["floor_8mb"] = asyncio.run(_bandwidth(addr, 3, 5 if quick else 30))
    return res


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        try:
            asyncio.run(_serve())
        except KeyboardInterrupt:
            pass
