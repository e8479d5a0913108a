"""The daemons' shared lifecycle (gridrpc.runtime.lifecycle): the cleanup
stack runs in reverse on any exit, a failed start is closed again, aclose is
idempotent, the orphan exit waits for may_leave, and each daemon describes
itself without the runner guessing its kind."""
from __future__ import annotations

import asyncio
import logging
import re

import pytest

from gridrpc.local_agent import LocalAgent
from gridrpc.master_agent import MasterAgent
from gridrpc.runtime.lifecycle import Daemon
from gridrpc.sed import SeD


class Probe(Daemon):
    label = "Probe"

    def __init__(self, fail_at: str | None = None, busy: bool = False) -> None:
        super().__init__(name="p1", address="tcp://127.0.0.1:0", orphan_timeout=2.0)
        self.fail_at, self.busy, self.log = fail_at, busy, []
        self.on_cleanup(self.log.append, "init")

    async def setup(self) -> None:
        for step in ("a", "b", "c"):
            if step == self.fail_at:
                raise RuntimeError(f"cannot {step}")
            self.on_cleanup(self._undo, step)

    async def _undo(self, step: str) -> None:
        await asyncio.sleep(0)
        self.log.append(step)

    async def drain(self) -> None:
        self.log.append("drain")

    def may_leave(self) -> bool:
        return not self.busy


def test_cleanup_runs_in_reverse_after_drain_and_only_once():
    async def main():
        d = Probe()
        async with d:
            assert not d.closing and not d.closed.is_set()
        await d.aclose()                        # a second close does nothing more
        return d
    d = asyncio.run(main())
    assert d.log == ["drain", "c", "b", "a", "init"] and d.closing and d.closed.is_set()


def test_a_failed_start_undoes_what_it_did_and_raises():
    d = Probe(fail_at="c")
    with pytest.raises(RuntimeError, match="cannot c"):
        asyncio.run(d.start())
    assert d.log == ["drain", "b", "a", "init"] and d.closed.is_set()


def test_a_failing_undo_does_not_stop_the_others():
    async def main():
        d = Probe()
        await d.start()

        def boom():
            raise OSError("undo failed")
        d.on_cleanup(boom)
        with pytest.raises(OSError):
            await d.aclose()
        return d
    d = asyncio.run(main())
    assert d.log == ["drain", "c", "b", "a", "init"] and d.closed.is_set()


def test_concurrent_closes_all_wait_for_the_end():
    async def main():
        d = Probe()
        await d.start()
        await asyncio.gather(d.aclose(), d.aclose(), d.aclose())
        return d
    d = asyncio.run(main())
    assert d.log.count("a") == 1 and d.closed.is_set()


def test_orphaned_waits_for_may_leave_then_closes_once(caplog):
    async def main():
        d = Probe(busy=True)
        await d.start()
        d.orphaned()                  # something runs: stay
        await asyncio.sleep(0.01)
        stayed = not d.closing
        d.busy = False
        d.orphaned()
        d.orphaned()                  # called at every heartbeat: acts once
        await asyncio.wait_for(d.closed.wait(), 5)
        return d, stayed
    with caplog.at_level(logging.WARNING, logger="gridrpc.runtime.lifecycle"):
        d, stayed = asyncio.run(main())
    assert stayed and d.orphan_exit and d.log.count("drain") == 1
    assert [r.getMessage() for r in caplog.records] == ["Probe p1: parent gone for more than 2s: exiting"]


def test_each_daemon_describes_itself():
    sed = SeD("solver-1", "tcp://127.0.0.1:5555", isolation="inline", replicas=3)
    sed.add_service("solve", "gridrpc.examples.services:add")
    assert sed.describe() == ("SeD solver-1 (3 replicas solver-1-1..solver-1-3) serving solve at "
                              "tcp://127.0.0.1:0 under parent tcp://127.0.0.1:5555")
    alone = SeD("s2", None, isolation="inline")
    assert alone.describe() == ("SeD s2 serving no service at tcp://127.0.0.1:0 with no parent "
                                "(clients reach it only by its address)")
    assert LocalAgent(name="LA1", parent="tcp://127.0.0.1:5555").describe() == \
        "Local Agent LA1 serving at tcp://127.0.0.1:0 under parent tcp://127.0.0.1:5555"
    ma = MasterAgent(name="MA", address="tcp://127.0.0.1:5999")
    assert ma.describe() == "Master Agent MA serving at tcp://127.0.0.1:5999"
    assert ma.ready_info() == {"name": "MA", "address": None}
    for d in (sed, alone):
        asyncio.run(d.aclose())         # their temporary directories go


def test_a_started_ma_describes_its_http_status_and_cleans_up_in_order():
    async def main():
        ma = MasterAgent(name="MA", address="tcp://127.0.0.1:0", http_port=0)
        async with ma:
            line, info = ma.describe(), ma.ready_info()
            assert not ma.endpoint.closed
        return ma, line, info
    ma, line, info = asyncio.run(main())
    assert line.startswith("Master Agent MA serving at tcp://127.0.0.1:") and "; HTTP status at http://" in line
    assert info["http"] == ma.http.url and info["address"] == ma.address
    assert ma.endpoint.closed and ma.closed.is_set() and ma.http.runner.server is None


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("kind", ["la", "sed"])
def test_an_orphaned_daemon_process_exits_by_itself(kind):
    """``gridrpc la|sed --orphan-timeout``: the parent never answers, the
    daemon closes itself and its process ends (exit 0, the reason logged)."""
    import subprocess
    import sys
    extra = ["--examples", "--isolation", "inline"] if kind == "sed" else []
    p = subprocess.run([sys.executable, "-m", "gridrpc", kind, "--name", "X", "--port", "0",
                        "--parent", f"127.0.0.1:{_free_port()}", "--orphan-timeout", "0.3",
                        "--hb-interval", "0.1", "--log-level", "warning", *extra],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert re.search(r"X: parent gone for more than 0\.3s.*: exiting", p.stderr), p.stderr
    assert " X serving" in p.stderr and "Traceback" not in p.stderr
