"""The gridrpc command: help texts, clear errors, call/services against a
real process tree, deploy of the ready local file, and the demo."""
import os
import subprocess
import sys

import pytest

from tests.proc_tree import free_port

PY = [sys.executable, "-m", "gridrpc"]


def run(*args, timeout=60, env=None):
    return subprocess.run([*PY, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("cmd", [[], ["ma"], ["la"], ["sed"], ["call"], ["services"], ["demo"],
                                 ["deploy"], ["deploy", "up"], ["discover"]])
def test_help(cmd):
    r = run(*cmd, "--help")
    assert r.returncode == 0 and "usage" in r.stdout.lower()


def test_sed_without_services_is_a_clear_error():
    r = run("sed", "--name", "x", "--parent", "tcp://127.0.0.1:1")
    assert r.returncode != 0 and "--service" in r.stderr


def test_sed_bad_service_spec_is_a_clear_error():
    r = run("sed", "--name", "x", "--service", "no_such_module_zz:f")
    assert r.returncode == 2 and "cannot load service" in r.stderr


def test_sed_unknown_queue_is_a_clear_error():
    r = run("sed", "--name", "x", "--examples", "--queue", "lifo")
    assert r.returncode != 0 and "unknown queue policy" in r.stderr


def test_call_and_services_against_processes(proc_tree):
    ma = proc_tree.start("ma", "MA")
    proc_tree.sed("s1", ma.address)
    from gridrpc.testing import wait_for
    import gridrpc
    with gridrpc.Client(ma.address) as c:
        wait_for(lambda: "add" in c.services(), 10, "services")
    r = run("call", "add", "2", "40", "--ma", ma.address)
    assert r.returncode == 0 and r.stdout.strip() == "42" and "s1" in r.stderr
    r = run("call", "echo", '{"a": [1, 2]}', "--ma", ma.address)
    assert r.stdout.strip() == '{"a": [1, 2]}'
    r = run("call", "fail", "oops", "--ma", ma.address)
    assert r.returncode == 1 and "RuntimeError" in r.stderr and "oops" in r.stderr
    r = run("call", "nothing_here", "--ma", ma.address)
    assert r.returncode == 1 and "ServiceNotFound" in r.stderr
    r = run("services", "--ma", ma.address)
    assert r.returncode == 0 and "add(x:int, y:int)" in r.stdout
    r = run("discover", "add", "--ma", ma.address)
    assert r.returncode == 0 and "s1" in r.stdout
    # a whole `gridrpc call` loads none of the heavy packages (tests/test_imports.py: the import alone)
    code = (f"import sys\nfrom gridrpc.cli import main\nrc = main(['call', 'add', '2', '40', '--ma', {ma.address!r}])\n"
            "print(rc, sorted(m for m in ('numpy', 'scipy', 'aiohttp', 'pydantic', 'yaml', 'rich', "
            "'prometheus_client', 'psutil') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.splitlines() == ["42", "0 []"], r.stdout + r.stderr


def _only_the_message(r, start: str) -> None:
    """stderr is the command's one clear line: no traceback, no asyncio noise."""
    for noise in ("Traceback", "never retrieved", "Task was destroyed", "Exception ignored"):
        assert noise not in r.stderr, r.stderr
    assert r.stderr.startswith(start) and r.stderr.count("\n") == 1, r.stderr


def test_call_unreachable_ma():
    r = run("call", "add", "1", "2", "--ma", f"tcp://127.0.0.1:{free_port()}", "--timeout", "2")
    assert r.returncode == 1 and "did not answer" in r.stderr
    _only_the_message(r, "gridrpc call: Timeout: ")


def test_error_paths_print_only_their_message(tmp_path):
    r = run("call", "add", "1", "2", "--ma", "bogus::addr")
    assert r.returncode == 2
    _only_the_message(r, "gridrpc call: error: --ma: ")
    r = run("workflow", "run", str(tmp_path / "missing.yaml"), "--ma", f"127.0.0.1:{free_port()}")
    assert r.returncode == 2
    _only_the_message(r, "gridrpc workflow run: cannot read ")
    (tmp_path / "wf.yaml").write_text("steps: 3\n")
    r = run("workflow", "run", str(tmp_path / "wf.yaml"), "--ma", f"127.0.0.1:{free_port()}")
    assert r.returncode == 2 and "needs a 'nodes' mapping" in r.stderr
    _only_the_message(r, "gridrpc workflow run: ")
    r = run("deploy", "status", str(tmp_path / "missing.yaml"))
    assert r.returncode == 1
    _only_the_message(r, "gridrpc deploy status: ")


def test_deploy_bad_file(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("master_agent: [unclosed\n")
    r = run("deploy", "up", str(f), "--state-dir", str(tmp_path / "st"))
    assert r.returncode == 1 and "not valid YAML" in r.stderr
    r = run("deploy", "up", str(tmp_path / "missing.yaml"))
    assert r.returncode == 1 and "not found" in r.stderr


@pytest.mark.slow
def test_demo_runs_and_exits_zero():
    r = run("demo", "--calls", "10", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "demo finished" in r.stdout and "cancelled" in r.stdout
    assert "WorkerDied" in r.stdout and "add(20, 22) = 42" in r.stdout


def test_element_names_are_checked_at_startup():
    import subprocess
    import sys
    for bad in ("<script>", "a b", "_x", "é"):
        r = subprocess.run([sys.executable, "-m", "gridrpc", "sed", f"--name={bad}", "--examples"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "letters, digits" in r.stderr, (bad, r.stderr)


def test_result_cache_bytes_reaches_the_sed_command():
    from gridrpc.deploy.runner import Deployment
    from gridrpc.deploy.spec import parse
    spec = parse({"master_agent": {"name": "MA"},
                  "seds": [{"name": "s1", "parent": "MA", "examples": True, "result_cache_bytes": 1000,
                            "max_message_size": 2048, "allow": {"sleep": ["@staff", "bob"]},
                            "groups": {"staff": ["alice"]}, "max_calls_per_user": 3,
                            "data_memory_bytes": 5000, "data_policy": "lfu"}]})
    d = Deployment(spec)
    d.addresses["MA"] = "tcp://127.0.0.1:5555"
    cmd = d.command(next(e for e in spec.elements if e.name == "s1"))
    assert cmd[cmd.index("--result-cache-bytes") + 1] == "1000"
    assert cmd[cmd.index("--max-message-size") + 1] == "2048"
    assert cmd[cmd.index("--allow") + 1] == "sleep=@staff,bob" and cmd[cmd.index("--group") + 1] == "staff=alice"
    assert cmd[cmd.index("--max-calls-per-user") + 1] == "3"
    assert cmd[cmd.index("--data-memory-bytes") + 1] == "5000" and cmd[cmd.index("--data-policy") + 1] == "lfu"


def test_data_cache_options_reach_a_real_sed(proc_tree):
    """--data-memory-bytes bounds what a SeD holds (docs/data.md)."""
    import gridrpc
    ma = proc_tree.start("ma", "MA")
    proc_tree.sed("sed-d", ma.address, "--data-memory-bytes", "4000", "--data-policy", "fifo")
    with gridrpc.Client(ma.address, retry_timeout=10) as c:
        from gridrpc.testing import wait_for

        def ready():
            try:
                return bool(c.discover("add", 1))
            except gridrpc.GridRPCError:
                return False
        wait_for(ready, 20, "the SeD registered")
        small = c.put(b"x" * 1000, server="sed-d")
        assert c.get(small) == b"x" * 1000
        with pytest.raises(gridrpc.DataError, match="4000|budget|fit"):
            c.put(b"y" * 10_000, server="sed-d")


def test_ctrl_c_inside_code_compiled_from_a_string_still_exits_130():
    """A Ctrl-C that lands while ``exec(str)`` runs (a namedtuple or a
    dataclass being made by a module imported when first needed) left
    CPython's "unhandled KeyboardInterrupt" flag set although ``main``
    handled it: ``python -m gridrpc`` then died by SIGINT (-2), not 130
    (``deploy logs -f`` interrupted while it first imported psutil)."""
    code = ("import ctypes, sys, gridrpc.cli as cli\n"
            "try:\n"
            "    flag = ctypes.c_int.in_dll(ctypes.pythonapi, '_Py_UnhandledKeyboardInterrupt')\n"
            "except ValueError:\n"
            "    print('no flag'); sys.exit()\n"
            "cli._main = lambda argv: exec('raise KeyboardInterrupt')\n"
            "print(cli.main([]), flag.value)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    if r.stdout.strip() == "no flag":
        pytest.skip("this Python keeps the flag elsewhere")
    assert r.stdout.split() == ["130", "0"], r.stdout
    assert "interrupted" in r.stderr
