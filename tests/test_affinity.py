"""CPU binding of daemons (gridrpc.affinity, ``--cpus``): parsing, a clear
error for CPUs the process may not use, and a real SeD whose process, zmq
thread and worker processes all run on the given CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

import gridrpc
from gridrpc.affinity import bind_cpus, format_cpus, parse_cpus, usable_cores
from gridrpc.errors import ConfigError

pytestmark = pytest.mark.timeout(90)


def test_parse_cpus():
    assert parse_cpus("1") == [1]
    assert parse_cpus("0,2-3, 5") == [0, 2, 3, 5]
    assert parse_cpus("3,1,1") == [1, 3]
    assert parse_cpus([2, 0]) == [0, 2] and format_cpus([2, 0]) == "0,2"
    for bad in ("", " ", "a", "1-", "-1", "3-1", "1,,2", [], [-1], ["1"], [True], None, 1.5):
        with pytest.raises(ConfigError):
            parse_cpus(bad)


def test_usable_cores_is_the_affinity_else_the_machine(monkeypatch):
    """What ``gridrpc loadtest --workers auto`` and a simulated host profile count:
    the CPUs this process may run on, so a process bound to one CPU counts 1."""
    cpu = min(os.sched_getaffinity(0))
    code = ("import os; from gridrpc.affinity import usable_cores; "
            f"os.sched_setaffinity(0, {{{cpu}}}); print(usable_cores())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["1"], out.stderr
    assert usable_cores() == len(os.sched_getaffinity(0))
    monkeypatch.delattr(os, "sched_getaffinity")                     # a platform without affinity
    monkeypatch.setattr(os, "cpu_count", lambda: 7)
    assert usable_cores() == 7
    monkeypatch.setattr(os, "cpu_count", lambda: None)               # the machine cannot tell
    assert usable_cores() == 1


def test_bind_refuses_cpus_this_process_may_not_use():
    allowed = sorted(os.sched_getaffinity(0))
    with pytest.raises(ConfigError, match="not usable here"):
        bind_cpus([max(allowed) + 1])
    assert sorted(os.sched_getaffinity(0)) == allowed          # nothing changed


def _affinity_of_tree(pid: int) -> dict[int, list[int]]:
    out = {}
    for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        for t in p.threads():
            out[t.id] = sorted(os.sched_getaffinity(t.id))
    return out


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable CPUs")
def test_a_sed_with_cpus_runs_its_threads_and_workers_there(tmp_path):
    cpu = sorted(os.sched_getaffinity(0))[-1]
    ready = tmp_path / "ready"
    p = subprocess.Popen([sys.executable, "-m", "gridrpc", "sed", "--name", "pinned", "--examples", "--port", "0",
                          "--cpus", str(cpu), "--prestart-workers", "2", "--ready-file", str(ready)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(300):
            if ready.exists() and ready.read_text().strip():
                break
            assert p.poll() is None, p.stderr.read()
            time.sleep(0.05)
        address = json.loads(ready.read_text())["address"]
        with gridrpc.Client(None) as c:
            assert c.call("add", 2, 3, server=f"{address}#pinned") == 5
        seen = _affinity_of_tree(p.pid)
        workers = psutil.Process(p.pid).children(recursive=True)
        assert len(workers) >= 2 and len(seen) >= 3            # the SeD's threads and two workers
        assert set(map(tuple, seen.values())) == {(cpu,)}, seen
    finally:
        p.terminate()
        p.wait(20)


def test_a_daemon_given_a_cpu_it_may_not_use_exits_2_with_a_clear_error():
    bad = max(os.sched_getaffinity(0)) + 1
    r = subprocess.run([sys.executable, "-m", "gridrpc", "la", "--name", "x", "--parent", "tcp://127.0.0.1:9",
                        "--cpus", str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and f"cpus {bad} not usable here" in r.stderr
