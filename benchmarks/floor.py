"""The floor: raw pyzmq asyncio DEALER -> ROUTER echo, server in another process.

``python -m benchmarks.floor serve`` runs the echo server (a zmq.asyncio
ROUTER echoing every message, zero-copy) and prints ``READY <address>``. The
client side (here, in the benchmark process) measures:

- round trip of a 1-byte message, 1 in flight (median, p99);
- round trips per second with 64 in flight (plain zmq.asyncio, no batching);
- round trip of an 8 MB float64 array, sent and received with copy=False
  (GB/s counts both directions: 2 x 8 MiB per round trip).

Two more echo servers bound what a call through a worker process can reach
in Python (issue #12's "bound call <= 1.5x the floor"; diagnostics, no target):

- ``floor_hop_latency`` (``serve hop``): the same echo, each message passed
  through a worker process over a ``multiprocessing`` pipe and back (the
  SeD's hop, with nothing else);
- ``floor_rpc_latency`` (``serve rpc``): the least a remote call does in
  Python: the client sends an orjson header (id, service, args) and reads the
  value from the answer's; the server parses it, checks the id, service and
  args, pickles ``(service, args)`` to the worker, which runs ``add`` and
  pickles the result back; the answer is an orjson header. No queue, no
  accounting, no acknowledgement, no timers.
"""
from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
import pickle
import sys
import time

import numpy as np
import orjson
import zmq
import zmq.asyncio

from .procs import Procs
from .stats import latency, rates

MB8 = 8 * 1024 * 1024


def _add(a, b):
    return a + b


_SERVICES = {"add": _add}


def _worker(conn, rpc: bool, other) -> None:
    other.close()           # the server's end: its exit then ends this loop (EOFError)
    while True:
        try:
            data = conn.recv_bytes()
        except EOFError:
            return
        if rpc:
            service, args = pickle.loads(data)
            data = pickle.dumps((True, _SERVICES[service](*args)))
        conn.send_bytes(data)


async def _serve(mode: str = "") -> None:
    ctx = zmq.asyncio.Context()
    s = ctx.socket(zmq.ROUTER)
    s.setsockopt(zmq.LINGER, 0)
    port = s.bind_to_random_port("tcp://127.0.0.1")
    loop = asyncio.get_running_loop()
    waiting: list = []
    if mode:
        mine, theirs = mp.Pipe()
        mp.get_context("fork").Process(target=_worker, args=(theirs, mode == "rpc", mine), daemon=True).start()
        theirs.close()
        loop.add_reader(mine.fileno(), lambda: waiting.pop().set_result(mine.recv_bytes()))

    async def through_worker(data: bytes) -> bytes:
        fut = loop.create_future()
        waiting.append(fut)
        mine.send_bytes(data)
        return await fut

    print(f"READY tcp://127.0.0.1:{port}", flush=True)
    while True:
        frames = await s.recv_multipart(copy=False)
        if mode == "hop":
            await through_worker(frames[-1].bytes)
        elif mode == "rpc":
            h = orjson.loads(frames[-1].bytes)
            if type(h.get("id")) is not str or h.get("service") not in _SERVICES or type(h.get("args")) is not list:
                continue
            ok, value = pickle.loads(await through_worker(pickle.dumps((h["service"], h["args"]))))
            frames = [frames[0], orjson.dumps({"type": "result", "id": h["id"], "value": value})]
        await s.send_multipart(frames, copy=False)


def start_server(procs: Procs, mode: str = ""):
    p = procs.spawn(f"floor-echo{'-' + mode if mode else ''}",
                    [sys.executable, "-m", "benchmarks.floor", "serve", *([mode] if mode else [])])
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


async def _rpc_latency(addr: str, warmup: int, n: int) -> dict:
    """Round trips of the least remote call (``serve rpc``): an orjson header each way."""
    ctx = zmq.asyncio.Context()
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(addr)
    ids = itertools.count()
    try:
        out = []
        for i in range(warmup + n):
            t0 = time.perf_counter()
            await d.send(orjson.dumps({"type": "call", "id": str(next(ids)), "service": "add", "args": [i, 2]}))
            value = orjson.loads(await d.recv())["value"]
            if i >= warmup:
                out.append(time.perf_counter() - t0)
        assert value == i + 2
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
    if "floor_hop_latency" in items:
        res["floor_hop_latency"] = asyncio.run(_latency(start_server(procs, "hop"), 200, 500 if quick else 5000))
    if "floor_rpc_latency" in items:
        res["floor_rpc_latency"] = asyncio.run(_rpc_latency(start_server(procs, "rpc"), 200,
                                                            500 if quick else 5000))
    return res


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"] and sys.argv[2:] in ([], ["hop"], ["rpc"]):
        try:
            asyncio.run(_serve(sys.argv[2] if sys.argv[2:] else ""))
        except KeyboardInterrupt:
            pass
