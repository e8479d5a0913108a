"""``gridrpc demo``: a small tree on this machine (1 MA, 2 LAs, 4 SeDs as
separate processes on free loopback ports), a sample workload through it,
a report of what happened, then everything stopped.

Whatever happens to the demo, the tree is stopped before it exits:

- its output going away (``gridrpc demo | head``): the rest of the report is
  dropped, the tree stopped, exit status 141 (128 + SIGPIPE, as ``yes | head``);
- Ctrl-C (SIGINT), SIGTERM or SIGHUP: the workload is cancelled (calls
  cancelled on their servers), the tree stopped, exit status 130; further
  Ctrl-C while stopping only say so.

The workload runs on an :class:`~gridrpc.AsyncClient` inside
:func:`asyncio.run`, so an interruption cancels its tasks properly (no
"Task was destroyed but it is pending!").
"""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

INTERRUPTED = 130
OUTPUT_GONE = 141


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _OutputGone(Exception):
    """Our stdout's reader went away: stop the workload."""


class Out:
    """Prints lines to stdout from any thread; never raises for a vanished
    reader: the first BrokenPipeError points stdout at /dev/null (so the
    interpreter's last flush is quiet too) and sets :attr:`gone`."""

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stdout
        self.gone = False
        self._raised = False
        self._lock = threading.Lock()

    def __call__(self, line: str = "") -> None:
        with self._lock:
            if self.gone:
                return
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (BrokenPipeError, ValueError):
                self.gone = True
                self._silence()
            except OSError:
                self.gone = True

    def _silence(self) -> None:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass

    def check(self) -> None:
        """Raise :class:`_OutputGone` once nobody reads (between workload steps)."""
        if self.gone:
            raise _OutputGone

    def progress(self, line: str) -> None:
        """For the deployment: print, and the first time the reader is found
        gone, raise :class:`_OutputGone` once (the runner then stops what it
        started; its own messages while stopping must not raise again)."""
        self(line)
        if self.gone and not self._raised:
            self._raised = True
            raise _OutputGone

    def disarm(self) -> None:
        """From now on :meth:`progress` never raises (stopping the tree)."""
        self._raised = True


class _Signals:
    """Signal handling of the demo's three phases.

    ``start()`` (starting the tree, sync): the first SIGINT/SIGTERM/SIGHUP
    raises KeyboardInterrupt (the runner then stops what it started).
    ``workload()``: SIGINT back to Python's default so :func:`asyncio.run`
    cancels the workload cleanly; SIGTERM/SIGHUP are turned into SIGINT.
    ``stopping()``: nothing interrupts stopping the tree any more."""

    SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s)

    def __init__(self, say) -> None:
        self.say = say
        self.hits = 0
        self.saved = {}
        self.active = threading.current_thread() is threading.main_thread()
        if self.active:
            self.saved = {s: signal.getsignal(s) for s in self.SIGNALS}

    def _install(self, handler) -> None:
        if self.active:
            for s in self.SIGNALS:
                signal.signal(s, handler(s))

    def _first_interrupts(self, signum, frame) -> None:
        self.hits += 1
        if self.hits == 1:
            raise KeyboardInterrupt
        self.say("(still stopping the tree, please wait)")

    def start(self) -> None:
        self._install(lambda s: self._first_interrupts)

    def workload(self) -> None:
        def as_sigint(signum, frame):
            self.hits += 1
            signal.raise_signal(signal.SIGINT)
        self._install(lambda s: signal.default_int_handler if s == signal.SIGINT else as_sigint)

    def stopping(self) -> None:
        def note(signum, frame):
            self.hits += 1
            self.say("(still stopping the tree, please wait)")
        self._install(lambda s: note)

    def restore(self) -> None:
        if self.active:
            for s, h in self.saved.items():
                signal.signal(s, h)


def run_demo(calls: int = 40) -> int:
    import gridrpc
    from .deploy.runner import Deployment
    from .deploy.spec import parse

    say = Out()
    signals = _Signals(say)
    spec = parse({
        "master_agent": {"name": "MA", "host": "localhost", "port": _free_port(), "http_port": _free_port()},
        "local_agents": [{"name": "LA1", "parent": "MA"}, {"name": "LA2", "parent": "MA"}],
        "seds": [{"name": f"sed-{i}", "parent": f"LA{1 + (i - 1) // 2}", "examples": True,
                  "max_concurrent": 1} for i in range(1, 5)],
        "heartbeat": {"interval": 0.5, "timeout": 2.0},
    }, name="demo")
    status = 0
    with tempfile.TemporaryDirectory(prefix="gridrpc-demo-") as state:
        dep = Deployment(spec, state_dir=state, progress=say.progress)
        try:
            signals.start()
            say("== starting a tree: 1 MA, 2 LAs, 4 SeDs (separate processes) ==")
            try:
                dep.up()
            except gridrpc.GridRPCError as exc:
                if isinstance(exc.__cause__, KeyboardInterrupt):
                    raise KeyboardInterrupt from None
                if isinstance(exc.__cause__, _OutputGone):
                    raise _OutputGone from None
                say(f"demo failed to start the tree: {exc}")
                return 1
            say.disarm()
            say.check()
            signals.workload()
            ok = asyncio.run(_workload(dep.addresses["MA"], f"http://127.0.0.1:{spec.ma.http_port}",
                                       calls, say))
            status = 0 if ok else 1
        except KeyboardInterrupt:
            status = INTERRUPTED
            say("\n== interrupted ==")
        except _OutputGone:
            status = OUTPUT_GONE
        finally:
            say.disarm()
            signals.stopping()
            try:
                if dep.started:
                    say("\n== stopping the tree ==")
                    dep.down()
                dep.close()
            finally:
                signals.restore()
        if status in (0, 1):
            say("demo finished" + ("" if status == 0 else " with errors"))
    if say.gone and status in (0, 1):
        status = OUTPUT_GONE
    return status


async def _workload(ma: str, http: str, calls: int, say: Out) -> bool:
    """The sample workload; False when a step failed unexpectedly."""
    import gridrpc
    mine: list = []               # submitted calls: cancelled (on their servers too) if we are
    try:
        async with gridrpc.AsyncClient(ma, user="demo") as c:
            try:
                await _steps(c, http, calls, say, mine)
            finally:
                await _cancel_all(mine)
        return True
    except (_OutputGone, asyncio.CancelledError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - report, then the caller stops the tree
        say(f"demo workload failed: {type(exc).__name__}: {exc}")
        return False


async def _steps(c, http: str, calls: int, say: Out, mine: list) -> None:
    import gridrpc
    say("\n== services ==")
    for name, meta in sorted((await c.services()).items()):
        doc = meta["doc"].splitlines()[0] if meta["doc"] else ""
        say(f"  {name:10s} on {len(meta['servers'])} server(s): {doc}")
    say.check()
    say("\n== sequential calls with discovery ==")
    lat = []
    for i in range(calls):
        t = time.perf_counter()
        assert await c.call("add", i, i) == 2 * i
        lat.append((time.perf_counter() - t) * 1000)
    say(f"  {calls} x add: median {statistics.median(lat):.2f} ms, max {max(lat):.2f} ms")
    say.check()
    say("\n== 8 concurrent sleep(0.5) calls over 4 single-slot SeDs ==")
    t = time.perf_counter()
    batch = [await c.submit("sleep", 0.5) for _ in range(8)]
    mine += batch
    for b in batch:
        try:
            await b.aresult(max(0.0, 30 - (time.perf_counter() - t)))
        except gridrpc.GridRPCError:
            pass
    per_server: dict[str, int] = {}
    for b in batch:
        per_server[b.server] = per_server.get(b.server, 0) + 1
    done = sum(1 for b in batch if b.done())
    say(f"  {done}/8 done in {time.perf_counter() - t:.2f} s; spread: {per_server}")
    say.check()
    say("\n== a numpy dgemm ==")
    a = np.random.default_rng(0).random((200, 200))
    r = await c.call("dgemm", a, a, alpha=2.0)
    say(f"  dgemm(200x200): max error {float(np.abs(r - 2 * a @ a).max()):.2e}")
    say.check()
    say("\n== a failing service and a crashing worker: the SeD keeps serving ==")
    try:
        await c.call("fail", "this service always fails")
    except gridrpc.RemoteError as exc:
        say(f"  RemoteError from {exc.server}: {exc.remote_type}: {exc.remote_message}")
    try:
        await c.call("exit", 7)
    except gridrpc.RemoteError as exc:
        say(f"  {type(exc).__name__} from {exc.server}: {exc.remote_message}")
    say(f"  next call: add(20, 22) = {await c.call('add', 20, 22)}")
    say.check()
    say("\n== cancel a running call ==")
    slow = await c.submit("sleep", 30)
    mine.append(slow)
    t = time.perf_counter()
    while not slow.server and time.perf_counter() - t < 5:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    await slow.acancel()
    try:
        await slow.aresult(5)
    except gridrpc.CallCancelled:
        say(f"  sleep(30) on {slow.server} cancelled after {time.perf_counter() - t:.2f} s "
            "(its worker was killed)")
    say.check()
    say("\n== the tree, as the MA sees it (also at " + http + "/api/tree) ==")
    for e in await c.tree():
        say(f"  {e['name']:6s} {e['kind']:3s} parent={e.get('parent') or '-':4s} "
            f"pid={e.get('pid')} services={len(e.get('services') or [])}")


async def _cancel_all(calls) -> None:
    """Cancel what is still running (its worker killed on the server) and
    collect every outcome, so nothing is left pending or unretrieved."""
    for call in calls:
        if not call.done():
            try:
                await asyncio.wait_for(call.acancel(), 5)
            except (Exception, asyncio.CancelledError):  # noqa: BLE001 - best effort on the way out
                pass
