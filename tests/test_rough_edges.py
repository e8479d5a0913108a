"""The rough edges a new user hits first: the demo's output and Ctrl-C, the
tutorial SeD's start-up line, addresses as users type them, daemons that
cannot start or are interrupted, ``deploy down``/``logs --follow``, the
load test's hints and progress, readable ``call``/``discover`` output, and
the README's optional-computation example."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from gridrpc.address import parse_address, parse_addresses
from gridrpc.errors import ConfigError
from tests.proc_tree import free_port

REPO = Path(__file__).resolve().parents[1]
PY = [sys.executable, "-m", "gridrpc"]


def run(*args, timeout=60, env=None, **kw):
    return subprocess.run([*PY, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, **kw)


def marked(mark: str) -> list[psutil.Process]:
    """Processes carrying GRIDRPC_TEST_MARK=mark in their environment: the
    test's process and everything it started (elements, workers)."""
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("GRIDRPC_TEST_MARK") == mark and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, OSError):
            pass
    return out


def kill_all(procs) -> None:
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


def no_survivors(mark: str, within: float = 5.0) -> list:
    deadline = time.monotonic() + within
    while True:
        left = marked(mark)
        if not left or time.monotonic() > deadline:
            kill_all(left)           # never leave them behind, even when the test fails
            return [(p.pid, " ".join(p.cmdline()[2:6]) if p.is_running() else "?") for p in left]
        time.sleep(0.2)


@pytest.fixture(autouse=True)
def _ctrl_c_reaches_children():
    """Children of these tests must start with Ctrl-C enabled, even when the test run itself was
    started in the background: a non-interactive shell starts `cmd &` with SIGINT ignored, children
    inherit that, and a gridrpc command then rightly ignores the test's Ctrl-C (seen: three tests
    timing out in a run launched with `&`)."""
    old = signal.getsignal(signal.SIGINT)
    if old is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def signal_and_wait(p: subprocess.Popen, sig: int, timeout: float = 60.0) -> None:
    """Send ``sig`` and wait for the process; kill it if it outlives ``timeout``."""
    try:
        p.send_signal(sig)
        p.wait(timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


class Reader:
    """Collect a process's output lines in a thread; wait for a pattern."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self._cv = threading.Condition()
        self._t = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._t.start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._cv:
                self.lines.append(line)
                self._cv.notify_all()

    def wait_for(self, pattern: str, timeout: float = 30) -> bool:
        deadline = time.monotonic() + timeout
        with self._cv:
            while not any(re.search(pattern, x) for x in self.lines):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
            return True

    @property
    def text(self) -> str:
        self._t.join(10)
        return "".join(self.lines)


# -- addresses: one parser for every command ------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("127.0.0.1:5555", "tcp://127.0.0.1:5555"),
    ("node1.example.org:80", "tcp://node1.example.org:80"),
    ("localhost:1", "tcp://localhost:1"),
    ("[::1]:5555", "tcp://[::1]:5555"),
    ("tcp://127.0.0.1:5555", "tcp://127.0.0.1:5555"),
    ("  tcp://10.0.0.2:7000 ", "tcp://10.0.0.2:7000"),
    ("TCP://h:9", "tcp://h:9"),
    ("ipc:///tmp/gridrpc.sock", "ipc:///tmp/gridrpc.sock"),
    ("inproc://ma", "inproc://ma"),
])
def test_addresses_in_every_accepted_form(text, expected):
    assert parse_address(text) == expected


@pytest.mark.parametrize("text, message", [
    ("127.0.0.1", "the port is missing"),
    ("tcp://127.0.0.1", "the port is missing"),
    ("127.0.0.1:99999", "out of range"),
    ("127.0.0.1:0", "out of range"),
    ("http://127.0.0.1:8080", "unknown scheme 'http'"),
    ("127.0.0.1:55x55", "is not an address"),
    ("", "empty address"),
    ("ipc://", "has no path"),
])
def test_bad_addresses_say_what_is_expected(text, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        parse_address(text, what="--ma")
    assert "expected host:port, tcp://host:port or ipc:///path" in str(info.value)
    assert str(info.value).startswith("--ma: ")


def test_address_lists():
    assert parse_addresses("a:1,tcp://b:2") == ["tcp://a:1", "tcp://b:2"]
    assert parse_addresses(["a:1"]) == ["tcp://a:1"]
    with pytest.raises(ConfigError):
        parse_addresses(",")


def test_every_command_takes_host_port(proc_tree):
    ma = proc_tree.start("ma", "MA")
    proc_tree.sed("s1", ma.address)
    hostport = ma.address.removeprefix("tcp://")
    from gridrpc.testing import wait_for
    import gridrpc
    with gridrpc.Client(ma.address) as c:
        wait_for(lambda: "add" in c.services(), 10, "services")
    r = run("call", "add", "1", "2", "--ma", hostport)
    assert r.returncode == 0 and r.stdout.strip() == "3", r.stderr
    r = run("services", "--ma", hostport)
    assert r.returncode == 0 and "add(" in r.stdout, r.stderr
    r = run("discover", "add", "--ma", hostport)
    assert r.returncode == 0 and "s1" in r.stdout, r.stderr
    r = run("call", "add", "1", "2", env={"GRIDRPC_MA": hostport})       # the environment too
    assert r.returncode == 0 and r.stdout.strip() == "3", r.stderr
    r = run("la", "--name", "LAx", "--parent", hostport, "--port", "0", "--orphan-timeout", "0.5",
            "--help")
    assert r.returncode == 0


@pytest.mark.parametrize("args, env", [
    (["call", "add", "1", "2", "--ma", "nonsense"], {}),
    (["services", "--ma", "127.0.0.1"], {}),
    (["discover", "add", "--ma", "tcp://h"], {}),
    (["call", "add", "1", "2"], {"GRIDRPC_MA": "127.0.0.1:notaport"}),
    (["la", "--name", "x", "--parent", "127.0.0.1"], {}),
    (["loadtest", "127.0.0.1:55x55"], {}),
])
def test_bad_addresses_are_one_clear_line(args, env):
    r = run(*args, env=env, timeout=30)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert "expected host:port, tcp://host:port or ipc:///path" in r.stderr


# -- the gridrpc command itself ------------------------------------------------
def test_no_arguments_prints_help_and_exits_2():
    r = run()
    assert r.returncode == 2
    assert "usage: gridrpc" in r.stderr + r.stdout and "demo" in r.stderr + r.stdout


def test_log_level_is_checked():
    from gridrpc.cli import build_parser
    for given, want in (("debug", "DEBUG"), ("Info", "INFO"), ("WARNING", "WARNING"), ("error", "ERROR")):
        assert build_parser().parse_args(["ma", "--log-level", given]).log_level == want
    r = run("ma", "--log-level", "verbose")
    assert r.returncode == 2 and "DEBUG, INFO, WARNING, ERROR" in r.stderr and "Traceback" not in r.stderr


# -- daemons: start-up failures and Ctrl-C ----------------------------------------
def test_ma_http_port_in_use_is_one_line(tmp_path):
    import socket
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = run("ma", "--port", "0", "--http-port", str(port), "--log-level", "warning")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert f"127.0.0.1:{port}" in lines[0] and "already in use" in lines[0] and "HTTP" in lines[0]


def _wait_file(path: Path, p: subprocess.Popen, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, "not ready"
        time.sleep(0.05)


@pytest.mark.parametrize("kind", ["ma", "sed"])
def test_ctrl_c_of_a_daemon_exits_130(tmp_path, kind):
    ready = tmp_path / "ready.json"
    extra = ["--examples", "--parent", f"tcp://127.0.0.1:{free_port()}"] if kind == "sed" else []
    p = subprocess.Popen([*PY, kind, "--name", "X", "--port", "0", "--ready-file", str(ready), *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_file(ready, p)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, err
    assert "Traceback" not in err and "Task was destroyed" not in err


def test_ctrl_c_of_a_call_exits_130_and_cancels_it(proc_tree):
    ma = proc_tree.start("ma", "MA")
    proc_tree.sed("s1", ma.address)
    import gridrpc
    from gridrpc.testing import wait_for
    with gridrpc.Client(ma.address) as c:
        wait_for(lambda: "sleep" in c.services(), 10, "services")
    p = subprocess.Popen([*PY, "call", "sleep", "30", "--ma", ma.address], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        with gridrpc.Client(ma.address) as c:       # wait until the SeD runs it
            wait_for(lambda: c.discover("sleep", 1)[0].estimation.get("num_running") == 1, 15, "running")
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, err
    assert "Traceback" not in err and "Task was destroyed" not in err
    with gridrpc.Client(ma.address) as c:           # cancelled on the server too
        wait_for(lambda: c.discover("sleep", 1)[0].estimation.get("num_running") == 0, 10, "cancelled")


def _readme_block(start: str) -> str:
    """The README's fenced python block whose first line starts with ``start``."""
    text = (REPO / "README.md").read_text()
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        if block.lstrip().startswith(start):
            return block
    raise AssertionError(f"no python block starting with {start!r} in README.md")


def test_tutorial_sed_says_what_it_serves_and_where(proc_tree, tmp_path):
    """``python solvers.py`` (the README's tutorial, as written, with the MA's
    port): one line naming the services, the address and the parent."""
    port = free_port()
    ma = proc_tree.start("ma", "MA", port=port)
    code = _readme_block("# solvers.py").replace("tcp://127.0.0.1:5555", ma.address)
    script = tmp_path / "solvers.py"
    script.write_text(code)
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=tmp_path)
    err = Reader(p.stderr)
    try:
        assert err.wait_for(r"solver-1", 20), err.lines
        line = next(x for x in err.lines if "solver-1" in x)
        assert re.search(r"solver-1 .*serv\w* solve\b.* at tcp://127\.0\.0\.1:\d+ .*under (parent )?"
                         + re.escape(ma.address), line), line
        p.send_signal(signal.SIGINT)
        p.wait(20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130
    assert "Traceback" not in err.text


# -- call / discover output ----------------------------------------------------------
def test_values_print_readably_and_as_json():
    import numpy as np
    from gridrpc.cli import format_value, to_json
    assert format_value(np.array([0.5, 0.5])) == "[0.5 0.5]"
    assert "array(" not in format_value({"a": np.arange(3)})
    assert format_value(3) == "3" and format_value("text") == "text" and format_value(None) == "None"
    assert format_value([1, 2]) == "[1, 2]" and format_value({"a": [1, 2]}) == '{"a": [1, 2]}'
    assert format_value(0.1 + 0.2) == "0.30000000000000004"          # exact, as Python prints it
    assert format_value(b"\x00ab") == "b'\\x00ab'"
    doc = json.loads(to_json({"arr": np.array([[1, 2], [3, 4]], dtype=np.int32), "b": b"hi",
                              "f": float("inf"), "n": float("nan"), "c": 1 + 2j, "t": (1, 2),
                              "s": np.float32(0.5), "none": None}))
    assert doc["arr"] == [[1, 2], [3, 4]] and doc["t"] == [1, 2] and doc["s"] == 0.5
    assert doc["b"] == {"base64": "aGk="}                                # bytes: base64, tagged
    assert doc["f"] == "Infinity" and doc["n"] == "NaN"                 # strict JSON: no bare NaN
    assert doc["c"] == {"real": 1.0, "imag": 2.0} and doc["none"] is None


def test_call_and_discover_output(proc_tree):
    ma = proc_tree.start("ma", "MA")
    proc_tree.sed("s1", ma.address)
    from gridrpc.testing import wait_for
    import gridrpc
    with gridrpc.Client(ma.address) as c:
        wait_for(lambda: "dgemm" in c.services(), 10, "services")
    r = run("call", "dgemm", "[[1, 0], [0, 1]]", "[0.5, 0.5]", "--ma", ma.address)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[0.5 0.5]"
    r = run("call", "dgemm", "[[1, 0], [0, 1]]", "[0.5, 0.5]", "--ma", ma.address, "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == [0.5, 0.5]
    r = run("call", "add", "1", "2", "--ma", ma.address, "--json")
    assert json.loads(r.stdout) == 3
    r = run("discover", "add", "--ma", ma.address)
    assert r.returncode == 0 and "s1" in r.stdout
    for value in re.findall(r"=(\S+)", r.stdout):                      # no 0.42700000000000005
        mantissa = value.split("e")[0]
        assert len(re.sub(r"\D", "", mantissa).lstrip("0")) <= 4, r.stdout
    r = run("discover", "add", "--ma", ma.address, "--json")
    servers = json.loads(r.stdout)
    assert servers[0]["name"] == "s1" and servers[0]["address"].startswith("tcp://")
    assert "tcomp" in servers[0]["estimation"]


# -- deploy ----------------------------------------------------------------------------
def test_second_deploy_down_says_nothing_running(tmp_path):
    r = run("deploy", "down", "never-deployed", "--state-dir", str(tmp_path / "st"))
    assert r.returncode == 0, r.stderr
    assert "nothing running" in r.stdout + r.stderr


def test_deploy_logs_follow(tmp_path):
    from gridrpc.deploy.runner import Deployment
    from gridrpc.deploy.spec import parse
    st = tmp_path / "st"
    spec = parse({"name": "follow", "master_agent": {"name": "MA", "port": 0}}, name="follow")
    d = Deployment(spec, state_dir=st, progress=lambda s: None)
    d.up()
    p = subprocess.Popen([*PY, "deploy", "logs", "follow", "MA", "--follow", "--state-dir", str(st)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = Reader(p.stdout)
    try:
        assert out.wait_for(r'READY \{"name": "MA"', 20), out.lines
        d.down()                                 # the element stops: --follow ends by itself
        p.wait(20)
        assert p.returncode == 0
        assert "not running" in p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        d.down()
        d.close()


def test_deploy_logs_follow_ctrl_c(tmp_path):
    from gridrpc.deploy.runner import Deployment
    from gridrpc.deploy.spec import parse
    st = tmp_path / "st"
    spec = parse({"name": "follow2", "master_agent": {"name": "MA", "port": 0}}, name="follow2")
    d = Deployment(spec, state_dir=st, progress=lambda s: None)
    d.up()
    p = subprocess.Popen([*PY, "deploy", "logs", "follow2", "MA", "-f", "--state-dir", str(st)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = Reader(p.stdout)
    try:
        assert out.wait_for(r"READY", 20)
        p.send_signal(signal.SIGINT)
        p.wait(20)
        err = p.stderr.read()
        assert p.returncode == 130, err
        assert "Traceback" not in err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        d.down()
        d.close()


def test_ctrl_c_of_deploy_up_exits_130_and_stops_everything(tmp_path):
    mark = uuid.uuid4().hex
    f = tmp_path / "d.yaml"
    f.write_text("master_agent: {name: MA, port: 0}\n"
                 "local_agents: [{name: LA1, parent: MA}]\n"
                 "seds: [{name: s1, parent: LA1, examples: true, isolation: inline}]\n")
    p = subprocess.Popen([*PY, "deploy", "up", str(f), "--state-dir", str(tmp_path / "st")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "GRIDRPC_TEST_MARK": mark})
    err = Reader(p.stderr)
    up = err.wait_for(r"MA on localhost: serving at", 30)
    signal_and_wait(p, signal.SIGINT)
    assert up, err.lines
    assert p.returncode == 130, err.text
    assert "Traceback" not in err.text
    assert no_survivors(mark) == []


class _MemoryLauncher:
    """Stands for the local launcher of ``deploy up``: "starts" elements in memory, READY at once."""
    launcher_name = "local"
    host = "localhost"

    def __init__(self) -> None:
        self.running: dict[int, str] = {}
        self._lock = threading.Lock()
        self._next = 900000

    def start_many(self, items, pattern, timeout, on_started=None):
        from gridrpc.deploy.launchers import BatchResult, Started
        out = {}
        for name, command in items:
            with self._lock:
                self._next += 1
                st = Started(launcher="local", host="localhost", pid=self._next, log_path="",
                             command=tuple(command), name=name)
                self.running[st.pid] = name
            if on_started:
                on_started(name, st)
            out[name] = BatchResult(name, st, 'READY {"address": "tcp://127.0.0.1:9"}')
        return out

    def stop_many(self, started, timeout=10.0):
        with self._lock:
            return {st.pid: "terminated" if self.running.pop(st.pid, None) else "not-running" for st in started}

    def close(self) -> None:
        pass


def test_ctrl_c_as_a_level_starts_its_threads_leaves_nothing_started(tmp_path, monkeypatch):
    """The flaky Ctrl-C above, made deterministic: the interrupt lands while the thread pool of
    LA1's level is starting a thread (after the thread began, before the pool knew it), and that
    thread gets going only once ``up`` has rolled back. It used to start LA1 then, after the
    roll-back: LA1 ran on, recorded in the state, while ``up`` said everything had been stopped."""
    from gridrpc.deploy.cli import once_interruptible
    from gridrpc.deploy.runner import Deployment
    from gridrpc.deploy.spec import parse
    from gridrpc.deploy.state import DeployError
    spec = parse({"name": "intr", "master_agent": {"name": "MA", "port": 0},
                  "local_agents": [{"name": "LA1", "parent": "MA"}]}, name="intr")
    lines: list[str] = []
    d = Deployment(spec, state_dir=tmp_path / "st", progress=lines.append)
    fake = _MemoryLauncher()
    d._make_launcher = lambda host_spec: fake         # never a real process, even after close()
    rolled_back = threading.Event()
    roll_back = d._roll_back

    def roll_back_then_tell() -> None:
        roll_back()
        rolled_back.set()
    d._roll_back = roll_back_then_tell

    late: list[threading.Thread] = []
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        if late or threading.current_thread() is not threading.main_thread() or "MA" not in d.started:
            return real_start(thread)
        run = thread.run

        def run_late() -> None:            # a loaded machine: this thread gets the CPU only now
            rolled_back.wait(10)
            run()
        thread.run = run_late
        late.append(thread)
        real_start(thread)
        signal.raise_signal(signal.SIGINT)  # Ctrl-C, as the pool of LA1's level starts a thread

    monkeypatch.setattr(threading.Thread, "start", start)
    try:
        with pytest.raises(DeployError, match="interrupted"):
            with once_interruptible():
                d.up()
    finally:
        monkeypatch.undo()
        for t in late:
            t.join(15)
        d.close()
    assert late, "the interrupt was never raised"
    assert not late[0].is_alive()
    assert any("serving at" in x and "MA" in x for x in lines), lines
    assert fake.running == {}, lines
    assert d.started == {} and not (tmp_path / "st" / "state.json").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stopping_an_experiment_stops_its_tree(tmp_path, sig):
    """The experiment's MA, SeD processes and workers live in their own sessions: SIGTERM or
    Ctrl-C of `gridrpc experiment ethic` must stop them (SIGTERM left 141 processes behind)."""
    mark = uuid.uuid4().hex
    p = subprocess.Popen([*PY, "experiment", "ethic", "--scenario", "night-simultaneous", "--seds", "4",
                          "--clients", "3", "--time-scale", "0.5", "--runs", "2", "--json", str(tmp_path / "e.json")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "GRIDRPC_TEST_MARK": mark})
    err = Reader(p.stderr)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(
            "experiments.tree" in " ".join(q.cmdline()) for q in marked(mark) if q.pid != p.pid):
        time.sleep(0.2)
    time.sleep(3.0)                                       # the run is under way
    running = p.poll() is None
    signal_and_wait(p, sig)
    survivors = no_survivors(mark, within=15.0)      # first: they are killed even when an assert fails
    assert running, err.text
    assert p.returncode == 130, err.text
    assert "interrupted" in err.text and "Traceback" not in err.text
    assert survivors == []
    assert not (tmp_path / "e.json").exists()


# -- loadtest ----------------------------------------------------------------------------
def test_loadtest_without_locust_says_how_to_install(monkeypatch, capsys):
    from gridrpc.cli import main
    monkeypatch.setitem(sys.modules, "locust", None)          # `import locust` fails as if absent
    rc = main(["loadtest", "tcp://127.0.0.1:1", "-t", "1s"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "pip install 'gridrpc[load]'" in err and "Traceback" not in err


@pytest.mark.slow
def test_loadtest_prints_progress(proc_tree):
    ma = proc_tree.start("ma", "MA")
    proc_tree.sed("s1", ma.address, "--isolation", "inline")
    from gridrpc.testing import wait_for
    import gridrpc
    with gridrpc.Client(ma.address) as c:
        wait_for(lambda: "add" in c.services(), 10, "services")
    r = run("loadtest", ma.address.removeprefix("tcp://"), "-u", "2", "-t", "7s", "-n", "100000",
            "--mix", "noop", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    progress = [x for x in r.stderr.splitlines() if re.search(r"\d+ requests, \d+ failures, [\d.]+ req/s", x)]
    assert progress, r.stderr
    assert "failure ratio" in r.stdout                       # then the summary, as before


# -- the README's optional computations ------------------------------------------------------
@pytest.mark.slow
def test_readme_run_optional_example_runs_as_written(proc_tree):
    """The README's ``run_optional("montecarlo", ...)`` block, executed as
    written against a tree whose SeDs use the ethic queue."""
    ma = proc_tree.start("ma", "MA")
    for i in (1, 2):
        proc_tree.start("sed", f"mc-{i}", "--service", "gridrpc.examples.services:montecarlo",
                        "--queue", "ethic", parent=ma.address)
    import gridrpc
    from gridrpc.testing import discoverable, wait_for
    block = _readme_block("out = client.run_optional(")
    with gridrpc.Client(ma.address, user="alice") as client:
        wait_for(lambda: discoverable(client, "montecarlo", 2), 10, "both SeDs discoverable")
        scope = {"client": client, "gridrpc": gridrpc}
        t0 = time.monotonic()
        exec(compile(block, "README.md", "exec"), scope)
        elapsed = time.monotonic() - t0
    out = scope["out"]
    assert len(out.mandatory) == 3 and all(abs(v - 3.14159) < 0.2 for v in out.mandatory)
    assert len(out.optional) > 0
    assert elapsed < 60


def test_montecarlo_service():
    from gridrpc.examples import services
    assert "montecarlo" in services.ALL
    a, b = services.montecarlo(1), services.montecarlo(1)
    assert a == b and abs(a - 3.14159) < 0.05                        # seeded: reproducible
    assert services.montecarlo(2, samples=1000) != services.montecarlo(3, samples=1000)
    with pytest.raises(ValueError):
        services.montecarlo(1, samples=0)


# -- the demo: nothing the user does to its output may leak a process ------------------------
@pytest.mark.slow
@pytest.mark.parametrize("lines", [2, 8, 30])
def test_demo_piped_into_head_leaves_nothing(lines, tmp_path):
    mark = uuid.uuid4().hex
    env = {**os.environ, "GRIDRPC_TEST_MARK": mark}
    r = subprocess.run(["bash", "-c", f"{sys.executable} -m gridrpc demo --calls 5 | head -{lines}"],
                       capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0
    assert len(r.stdout.splitlines()) == lines
    assert "Traceback" not in r.stderr and "Broken pipe" not in r.stderr, r.stderr
    assert no_survivors(mark) == []


@pytest.mark.slow
@pytest.mark.parametrize("after", [r"ma MA on localhost: serving", r"== sequential calls",
                                   r"== 8 concurrent sleep"])
def test_demo_ctrl_c_exits_130_cleanly(after, tmp_path):
    mark = uuid.uuid4().hex
    p = subprocess.Popen([*PY, "demo", "--calls", "200"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "GRIDRPC_TEST_MARK": mark}, cwd=tmp_path)
    out, err = Reader(p.stdout), Reader(p.stderr)
    try:
        assert out.wait_for(after, 60), out.lines
        p.send_signal(signal.SIGINT)
        p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    text = out.text + err.text
    assert p.returncode == 130, text
    assert "Traceback" not in text and "Task was destroyed" not in text, text
    assert re.search(r"stopping the (tree|\d+ element)", out.text), out.text
    assert no_survivors(mark) == []
