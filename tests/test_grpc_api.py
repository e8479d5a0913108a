"""Conformance suite for ``gridrpc.grpc`` (the OGF GridRPC API, GFD-R.052)
against a real in-process tree: the ground of the GridRPC interoperability
tests (initialize, finalize, function handles, call, probe, wait, cancel,
error reporting: each success path and each documented error path), plus
cancellation on the SeD, vanished servers, threads and the DIET-ethic
extensions.

No test sleeps and hopes: state on the SeDs is polled with ``wait_for`` and
a deadline; long services (``sleep(60)``) make a wrong answer show as a
timeout instead of passing by luck.
"""
from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

import gridrpc
from gridrpc import grpc as g
from gridrpc.grpc import (GRPC_ALREADY_INITIALIZED, GRPC_COMMUNICATION_FAILED, GRPC_CONFIGFILE_ERROR,
                          GRPC_CONFIGFILE_NOT_FOUND, GRPC_FUNCTION_NOT_FOUND, GRPC_INVALID_FUNCTION_HANDLE,
                          GRPC_INVALID_SESSION_ID, GRPC_NO_ERROR, GRPC_NONE_COMPLETED, GRPC_NOT_COMPLETED,
                          GRPC_NOT_INITIALIZED, GRPC_OTHER_ERROR_CODE, GRPC_RPC_REFUSED, GRPC_SERVER_NOT_FOUND,
                          GRPC_SESSION_FAILED, GRPC_SESSIONID_VOID)
from gridrpc.errors import Timeout
from gridrpc.testing import LocalTree, wait_for

pytestmark = pytest.mark.timeout(90)

LONG = 60.0          # a call that would make the test time out if not really stopped
FAST = 5.0           # bound for "at once" (a call on an idle server takes milliseconds)


# -- fixtures -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tree():
    t = LocalTree(las=1, seds_per_la=2, http=False)
    t.start()
    la = t.las[0].address
    # single slot, for bound-handle tests: it offers only sleep, so default handles on the
    # other services never queue behind a long call parked there
    t.add_sed("solo", la, services=["sleep"])
    t.add_sed("adder", la, services=["add"])                # offers only add
    t.wait_registered()
    yield t
    t.stop()


def write_config(path, master_agent, **extra) -> str:
    lines = [f'master_agent = "{master_agent}"']
    for k, v in extra.items():
        lines.append(f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v)}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def config(tree, tmp_path_factory):
    return write_config(tmp_path_factory.mktemp("grpc") / "client.toml", tree.ma_address,
                        user="grpc-tests", ping_interval=0.2, ping_timeout=1.5, ack_timeout=2.0,
                        discovery_timeout=3.0)


@pytest.fixture(autouse=True)
def clean_module():
    """Every test starts and ends uninitialized (finalize stops leftover work)."""
    g.grpc_finalize()
    yield
    g.grpc_finalize()


@pytest.fixture
def init(config, tree):
    assert g.grpc_initialize(config) == GRPC_NO_ERROR
    yield
    assert g.grpc_finalize() in (GRPC_NO_ERROR, GRPC_NOT_INITIALIZED)
    for name in tree.sed_names():
        wait_for(lambda: sed_load(tree, name) == (0, 0), 10, f"{name} idle after finalize")


def sed_of(tree, name):
    return next(s for s in tree.seds if name in s.replicas)


def sed_load(tree, name) -> tuple[int, int]:
    """(running, waiting) on a SeD replica."""
    sed = sed_of(tree, name)

    def load():
        sch = sed.replicas[name].scheduler
        return len(sch.running), len(sch.requests) - len(sch.running)
    return tree.lt.call(load)


def wait_load(tree, name, running, waiting=0, timeout=10):
    seen: list = []

    def reached() -> bool:
        sed = sed_of(tree, name)
        seen[:] = [sed_load(tree, name), dict(sed.stats),
                   tree.lt.call(lambda: {c.id: c.state.value for c in sed.calls.values()})]
        return seen[0] == (running, waiting)
    try:
        wait_for(reached, timeout, f"{name} with {running} running and {waiting} waiting call(s)")
    except Timeout as e:
        raise Timeout(f"{e}; last seen (running, waiting) = {seen[0]}, SeD counters {seen[1]}, "
                      f"calls {seen[2]}") from None


def handle(name, server=None):
    code, h = (g.grpc_function_handle_default(name) if server is None
               else g.grpc_function_handle_init(server, name))
    assert code == GRPC_NO_ERROR, g.grpc_error_string(code)
    assert isinstance(h, g.FunctionHandle)
    return h


def async_call(h, *args):
    code, sid = g.grpc_call_async(h, *args)
    assert code == GRPC_NO_ERROR, g.grpc_error_string(code)
    assert isinstance(sid, int) and sid != GRPC_SESSIONID_VOID
    return sid


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- constants and error strings ------------------------------------------------------------

EXPECTED_CODES = {
    "GRPC_NO_ERROR": 0, "GRPC_NOT_INITIALIZED": 1, "GRPC_CONFIGFILE_NOT_FOUND": 2,
    "GRPC_CONFIGFILE_ERROR": 3, "GRPC_SERVER_NOT_FOUND": 4, "GRPC_FUNCTION_NOT_FOUND": 5,
    "GRPC_INVALID_FUNCTION_HANDLE": 6, "GRPC_INVALID_SESSION_ID": 7, "GRPC_RPC_REFUSED": 8,
    "GRPC_COMMUNICATION_FAILED": 9, "GRPC_SESSION_FAILED": 10, "GRPC_NOT_COMPLETED": 11,
    "GRPC_NONE_COMPLETED": 12, "GRPC_OTHER_ERROR_CODE": 13, "GRPC_UNKNOWN_ERROR_CODE": 14,
    "GRPC_ALREADY_INITIALIZED": 15, "GRPC_LAST_ERROR_CODE": 16,
}


def test_constants_have_the_standard_values():
    for name, value in EXPECTED_CODES.items():
        assert getattr(g, name) == value, name
        assert g.GridRPCErrorCode[name] == value
        assert name in g.__all__
    assert g.GRPC_SESSIONID_VOID == -1
    assert len(g.GridRPCErrorCode) == len(EXPECTED_CODES)


def test_error_string_every_code_works_uninitialized():
    for name, value in EXPECTED_CODES.items():
        assert g.grpc_error_string(value) == name
        assert g.grpc_error_string(getattr(g, name)) == name
        assert g.DESCRIPTIONS[value]
    for bad in (-1, 17, 1000, None, "0", 1.5, True):
        assert g.grpc_error_string(bad) == "GRPC_UNKNOWN_ERROR_CODE"


# -- initialize / finalize --------------------------------------------------------------------

def test_initialize_and_finalize(config):
    assert g.grpc_initialize(config) == GRPC_NO_ERROR
    assert g.grpc_get_last_error() == GRPC_NO_ERROR
    assert g.grpc_finalize() == GRPC_NO_ERROR
    assert g.grpc_finalize() == GRPC_NOT_INITIALIZED
    assert g.grpc_initialize(config) == GRPC_NO_ERROR      # again after finalize


def test_initialize_missing_file(tmp_path):
    assert g.grpc_initialize(str(tmp_path / "nope.toml")) == GRPC_CONFIGFILE_NOT_FOUND
    assert g.grpc_initialize(tmp_path) == GRPC_CONFIGFILE_NOT_FOUND          # a directory
    assert g.grpc_function_handle_default("add") == (GRPC_NOT_INITIALIZED, None)


def test_initialize_from_environment(config, monkeypatch, tmp_path):
    monkeypatch.delenv("GRIDRPC_CONFIG", raising=False)
    assert g.grpc_initialize() == GRPC_CONFIGFILE_NOT_FOUND
    monkeypatch.setenv("GRIDRPC_CONFIG", config)
    assert g.grpc_initialize() == GRPC_NO_ERROR


@pytest.mark.parametrize("content", [
    'master_agent = "tcp://127.0.0.1:5555',                    # TOML syntax error
    'master_agent = ',
    'user = "alice"',                                           # master_agent missing
    'master_agent = 5555',
    'master_agent = "127.0.0.1:5555"',                          # no scheme
    'master_agent = "http://127.0.0.1:5555"',
    'master_agent = "tcp://127.0.0.1:5555"\ntimout = 3',        # unknown key (typo)
    'master_agent = "tcp://127.0.0.1:5555"\ntimeout = -1',
    'master_agent = "tcp://127.0.0.1:5555"\ntimeout = "long"',
    'master_agent = "tcp://127.0.0.1:5555"\nfailover = 1',
    'master_agent = "tcp://127.0.0.1:5555"\nmax_candidates = true',
    'master_agent = "tcp://127.0.0.1:5555"\naggregator = "os:system"',
    'master_agent = "tcp://127.0.0.1:5555"\nreuse_discovery = -0.5',
    'master_agent = "tcp://127.0.0.1:5555"\nreuse_discovery = "10ms"',
    b'master_agent = "tcp://\xff\xfe"',                          # not UTF-8
])
def test_initialize_malformed_file(tmp_path, content):
    p = tmp_path / "bad.toml"
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert g.grpc_initialize(str(p)) == GRPC_CONFIGFILE_ERROR
    assert g.grpc_get_last_error() == GRPC_NOT_INITIALIZED


def test_initialize_twice(config, tree):
    assert g.grpc_initialize(config) == GRPC_NO_ERROR
    assert g.grpc_initialize(config) == GRPC_ALREADY_INITIALIZED
    assert g.grpc_initialize("/does/not/exist") == GRPC_ALREADY_INITIALIZED
    assert g.grpc_get_last_error() == GRPC_ALREADY_INITIALIZED
    assert g.grpc_call(handle("add"), 1, 2) == (GRPC_NO_ERROR, 3)   # the first one still works


def test_initialize_concurrently_only_one_wins(config):
    barrier = threading.Barrier(6)
    codes = []

    def init():
        barrier.wait()
        codes.append(g.grpc_initialize(config))
    threads = [threading.Thread(target=init) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(codes) == [GRPC_NO_ERROR] + [GRPC_ALREADY_INITIALIZED] * 5


def test_config_options_are_applied(tree, tmp_path):
    cfg = write_config(tmp_path / "c.toml", tree.ma_address, timeout=0.5, user="alice",
                       aggregator="least_wait_time", ack_timeout=2.0)
    assert g.grpc_initialize(cfg) == GRPC_NO_ERROR
    h = handle("sleep", "solo")
    t0 = time.monotonic()
    assert g.grpc_call(h, LONG) == (GRPC_SESSION_FAILED, None)     # per-call timeout of 0.5 s
    assert time.monotonic() - t0 < FAST
    sid = async_call(h, LONG)
    assert g.grpc_wait(sid) == GRPC_SESSION_FAILED
    assert g.grpc_get_error(sid) == GRPC_SESSION_FAILED
    assert isinstance(g.grpc_get_exception(sid)[1], gridrpc.Timeout)
    wait_load(tree, "solo", 0, 0)                                  # the timed-out call was stopped
    assert g.grpc_call(handle("add"), 2, 2) == (GRPC_NO_ERROR, 4)


def test_unreachable_master_agent(tmp_path):
    cfg = write_config(tmp_path / "c.toml", f"tcp://127.0.0.1:{free_port()}", discovery_timeout=0.3)
    assert g.grpc_initialize(cfg) == GRPC_NO_ERROR                   # lazy: nothing contacted yet
    assert g.grpc_function_handle_default("add") == (GRPC_COMMUNICATION_FAILED, None)
    assert g.grpc_function_handle_init("sed-1-1", "add") == (GRPC_COMMUNICATION_FAILED, None)
    assert g.grpc_discover("add", 3) == (GRPC_COMMUNICATION_FAILED, None)
    assert g.grpc_get_last_error() == GRPC_COMMUNICATION_FAILED


def test_reinitialize_invalidates_handles_and_sessions(init, config):
    h = handle("add")
    sid = async_call(h, 1, 1)
    assert g.grpc_wait(sid) == GRPC_NO_ERROR
    assert g.grpc_finalize() == GRPC_NO_ERROR
    assert g.grpc_initialize(config) == GRPC_NO_ERROR
    assert g.grpc_call(h, 1, 1) == (GRPC_INVALID_FUNCTION_HANDLE, None)
    assert g.grpc_function_handle_destruct(h) == GRPC_INVALID_FUNCTION_HANDLE
    assert g.grpc_get_result(sid) == (GRPC_INVALID_SESSION_ID, None)
    assert g.grpc_probe(sid) == GRPC_INVALID_SESSION_ID
    sid2 = async_call(handle("add"), 1, 1)
    assert sid2 != sid                                               # ids are never reused


# -- every function before initialize / after finalize ----------------------------------------------

def _all_calls(h, sid):
    return [
        (g.grpc_finalize, (), False),
        (g.grpc_function_handle_default, ("add",), True),
        (g.grpc_function_handle_init, ("sed-1-1", "add"), True),
        (g.grpc_function_handle_destruct, (h,), False),
        (g.grpc_get_handle, (sid,), True),
        (g.grpc_call, (h, 1, 2), True),
        (g.grpc_call_async, (h, 1, 2), True),
        (g.grpc_get_result, (sid,), True),
        (g.grpc_probe, (sid,), False),
        (g.grpc_probe_or, ([sid],), True),
        (g.grpc_wait, (sid,), False),
        (g.grpc_wait_and, ([sid],), False),
        (g.grpc_wait_or, ([sid],), True),
        (g.grpc_wait_all, (), False),
        (g.grpc_wait_any, (), True),
        (g.grpc_cancel, (sid,), False),
        (g.grpc_cancel_all, (), False),
        (g.grpc_get_error, (sid,), False),
        (g.grpc_get_last_error, (), False),
        (g.grpc_get_failed_sessionid, (), True),
        (g.grpc_discover, ("add", 2), True),
        (g.grpc_function_handle_set_optional, (h,), False),
        (g.grpc_wait_any_until, (0.1,), True),
        (g.grpc_get_exception, (sid,), True),
    ]


def test_every_function_not_initialized_before_initialize():
    for fn, args, pair in _all_calls(None, 1):
        expected = (GRPC_NOT_INITIALIZED, None) if pair else GRPC_NOT_INITIALIZED
        assert fn(*args) == expected, fn.__name__


def test_every_function_not_initialized_after_finalize(init):
    h = handle("add")
    sid = async_call(h, 1, 2)
    assert g.grpc_wait(sid) == GRPC_NO_ERROR
    assert g.grpc_finalize() == GRPC_NO_ERROR
    for fn, args, pair in _all_calls(h, sid):
        expected = (GRPC_NOT_INITIALIZED, None) if pair else GRPC_NOT_INITIALIZED
        assert fn(*args) == expected, fn.__name__
    assert g.grpc_error_string(GRPC_NO_ERROR) == "GRPC_NO_ERROR"


def test_api_covers_the_contract():
    names = {"grpc_initialize", "grpc_finalize", "grpc_function_handle_default", "grpc_function_handle_init",
             "grpc_function_handle_destruct", "grpc_get_handle", "grpc_call", "grpc_call_async",
             "grpc_get_result", "grpc_probe", "grpc_probe_or", "grpc_wait", "grpc_wait_and", "grpc_wait_or",
             "grpc_wait_all", "grpc_wait_any", "grpc_cancel", "grpc_cancel_all", "grpc_error_string",
             "grpc_get_error", "grpc_get_last_error", "grpc_get_failed_sessionid", "grpc_discover",
             "grpc_function_handle_set_optional", "grpc_wait_any_until"}
    tested = {fn.__name__ for fn, _a, _p in _all_calls(None, 1)} | {"grpc_initialize", "grpc_error_string"}
    assert names <= tested
    assert names <= set(g.__all__)


# -- function handles --------------------------------------------------------------------------

def test_handle_default(init, tree):
    h = handle("add")
    assert h.function_name == "add" and h.server is None and h.server_name is None
    before = tree.ma.stats["discoveries"]
    assert g.grpc_call(h, 2, 3) == (GRPC_NO_ERROR, 5)
    assert tree.ma.stats["discoveries"] > before                      # discovers per call
    assert g.grpc_function_handle_destruct(h) == GRPC_NO_ERROR


def test_handle_default_unknown_function(init):
    assert g.grpc_function_handle_default("no_such_function") == (GRPC_FUNCTION_NOT_FOUND, None)
    assert g.grpc_get_last_error() == GRPC_FUNCTION_NOT_FOUND
    assert g.grpc_function_handle_default("") == (GRPC_FUNCTION_NOT_FOUND, None)
    assert g.grpc_function_handle_default(None) == (GRPC_FUNCTION_NOT_FOUND, None)


def test_handle_init_binds_to_the_server(init, tree):
    h = handle("add", "sed-1-2")
    assert h.server_name == "sed-1-2" and h.server.address == sed_of(tree, "sed-1-2").address
    replica = sed_of(tree, "sed-1-2").replicas["sed-1-2"]
    done_before = tree.lt.call(lambda: replica.completed)
    disc_before = tree.ma.stats["discoveries"]
    for i in range(3):
        assert g.grpc_call(h, i, 10) == (GRPC_NO_ERROR, i + 10)
    sid = async_call(h, 5, 5)
    assert g.grpc_get_result(sid) == (GRPC_NO_ERROR, 10)
    assert tree.lt.call(lambda: replica.completed) == done_before + 4   # all ran on sed-1-2
    assert tree.ma.stats["discoveries"] == disc_before                  # and skipped discovery


def test_handle_init_by_address_and_server_info(init, tree):
    addr = sed_of(tree, "sed-1-1").address
    assert handle("add", f"{addr}#sed-1-1").server_name == "sed-1-1"
    assert handle("add", addr).server_name == "sed-1-1"
    code, servers = g.grpc_discover("add", 10)
    assert code == GRPC_NO_ERROR
    h = handle("add", servers[0])
    assert h.server_name == servers[0].name
    assert g.grpc_call(h, 1, 1) == (GRPC_NO_ERROR, 2)
    assert g.grpc_function_handle_init(f"tcp://127.0.0.1:{free_port()}", "add") == (GRPC_SERVER_NOT_FOUND, None)


def test_handle_init_unknown_server(init):
    assert g.grpc_function_handle_init("no-such-sed", "add") == (GRPC_SERVER_NOT_FOUND, None)
    assert g.grpc_get_last_error() == GRPC_SERVER_NOT_FOUND
    assert g.grpc_function_handle_init("LA1", "add") == (GRPC_SERVER_NOT_FOUND, None)  # an agent
    assert g.grpc_function_handle_init("", "add") == (GRPC_SERVER_NOT_FOUND, None)
    assert g.grpc_function_handle_init(None, "add") == (GRPC_SERVER_NOT_FOUND, None)


def test_handle_init_unknown_function(init):
    assert g.grpc_function_handle_init("sed-1-1", "no_such_function") == (GRPC_FUNCTION_NOT_FOUND, None)
    # "sleep" exists in the tree but not on "adder"
    assert g.grpc_function_handle_init("adder", "sleep") == (GRPC_FUNCTION_NOT_FOUND, None)
    assert g.grpc_get_last_error() == GRPC_FUNCTION_NOT_FOUND
    assert g.grpc_call(handle("add", "adder"), 20, 22) == (GRPC_NO_ERROR, 42)


def test_handle_destruct(init):
    h = handle("add")
    assert g.grpc_function_handle_destruct(h) == GRPC_NO_ERROR
    assert h.destructed
    assert g.grpc_function_handle_destruct(h) == GRPC_INVALID_FUNCTION_HANDLE
    assert g.grpc_call(h, 1, 2) == (GRPC_INVALID_FUNCTION_HANDLE, None)
    assert g.grpc_call_async(h, 1, 2) == (GRPC_INVALID_FUNCTION_HANDLE, None)
    assert g.grpc_get_last_error() == GRPC_INVALID_FUNCTION_HANDLE
    for junk in (None, "add", 3, object()):
        assert g.grpc_function_handle_destruct(junk) == GRPC_INVALID_FUNCTION_HANDLE
        assert g.grpc_call(junk, 1, 2) == (GRPC_INVALID_FUNCTION_HANDLE, None)


def test_destruct_does_not_stop_running_sessions(init):
    h = handle("add")
    sid = async_call(h, 1, 2)
    assert g.grpc_function_handle_destruct(h) == GRPC_NO_ERROR
    assert g.grpc_get_result(sid) == (GRPC_NO_ERROR, 3)
    assert g.grpc_get_handle(sid) == (GRPC_NO_ERROR, h)


def test_get_handle(init):
    h = handle("add")
    sid = async_call(h, 3, 4)
    code, h2 = g.grpc_get_handle(sid)
    assert code == GRPC_NO_ERROR and h2 is h
    assert g.grpc_wait(sid) == GRPC_NO_ERROR
    sid2 = async_call(h2, 4, 4)                                         # interop test 7
    assert g.grpc_get_result(sid2) == (GRPC_NO_ERROR, 8)


@pytest.mark.parametrize("bad", [GRPC_SESSIONID_VOID, 10**9, "1", None, 1.0, True, [1]])
def test_invalid_session_ids(init, bad):
    assert g.grpc_get_handle(bad) == (GRPC_INVALID_SESSION_ID, None)
    assert g.grpc_get_result(bad) == (GRPC_INVALID_SESSION_ID, None)
    assert g.grpc_probe(bad) == GRPC_INVALID_SESSION_ID
    assert g.grpc_wait(bad) == GRPC_INVALID_SESSION_ID
    assert g.grpc_cancel(bad) == GRPC_INVALID_SESSION_ID
    assert g.grpc_get_error(bad) == GRPC_INVALID_SESSION_ID
    assert g.grpc_get_exception(bad) == (GRPC_INVALID_SESSION_ID, None)
    assert g.grpc_get_last_error() == GRPC_INVALID_SESSION_ID


# -- calls --------------------------------------------------------------------------------------

def test_call_values(init):
    assert g.grpc_call(handle("add"), 1, 2) == (GRPC_NO_ERROR, 3)
    value = {"a": [1, 2.5, None, "x", b"\x00"], "inf": float("inf")}
    assert g.grpc_call(handle("echo"), value) == (GRPC_NO_ERROR, value)
    assert g.grpc_call(handle("echo"), value=[1, 2]) == (GRPC_NO_ERROR, [1, 2])     # keyword argument
    a, b = np.arange(6.0).reshape(2, 3), np.arange(6.0).reshape(3, 2)
    code, c = g.grpc_call(handle("dgemm"), a, b, 2.0)
    assert code == GRPC_NO_ERROR
    np.testing.assert_array_equal(c, 2.0 * a @ b)
    assert g.grpc_get_last_error() == GRPC_NO_ERROR


def test_call_failures(init):
    assert g.grpc_call(handle("fail"), "boom") == (GRPC_SESSION_FAILED, None)
    assert g.grpc_get_last_error() == GRPC_SESSION_FAILED
    assert g.grpc_call(handle("exit"), 3) == (GRPC_SESSION_FAILED, None)       # worker died
    assert g.grpc_call(handle("add"), 1) == (GRPC_OTHER_ERROR_CODE, None)      # wrong arguments
    obj = np.array([object()], dtype=object)
    assert g.grpc_call(handle("echo"), obj) == (GRPC_OTHER_ERROR_CODE, None)   # cannot be sent
    assert g.grpc_call(handle("add"), 1, 1) == (GRPC_NO_ERROR, 2)              # still serving
    assert g.grpc_get_last_error() == GRPC_NO_ERROR


def test_call_arguments_reserved_by_the_handle(init):
    h = handle("echo")
    assert g.grpc_call(h, 1, server="sed-1-1") == (GRPC_OTHER_ERROR_CODE, None)
    assert g.grpc_call_async(h, 1, optional=True) == (GRPC_OTHER_ERROR_CODE, None)
    assert g.grpc_call(h, (1, "two")) == (GRPC_NO_ERROR, (1, "two"))     # several OUT values


def test_call_too_large_is_refused(tree, tmp_path):
    cfg = write_config(tmp_path / "c.toml", tree.ma_address, max_message_size=10_000)
    assert g.grpc_initialize(cfg) == GRPC_NO_ERROR
    h = handle("echo")
    assert g.grpc_call(h, b"x" * 100_000) == (GRPC_RPC_REFUSED, None)
    sid = async_call(h, b"x" * 100_000)
    assert g.grpc_wait(sid) == GRPC_SESSION_FAILED
    assert g.grpc_get_error(sid) == GRPC_RPC_REFUSED
    assert g.grpc_call(h, b"x" * 100) == (GRPC_NO_ERROR, b"x" * 100)


def test_call_async_and_get_result(init):
    h = handle("add")
    sids = [async_call(h, i, i) for i in range(5)]
    assert len(set(sids)) == 5
    for i, sid in enumerate(sids):
        assert g.grpc_get_result(sid) == (GRPC_NO_ERROR, 2 * i)
        assert g.grpc_get_result(sid) == (GRPC_NO_ERROR, 2 * i)             # valid until finalize
    fid = async_call(handle("fail"), "boom")
    assert g.grpc_get_result(fid) == (GRPC_SESSION_FAILED, None)
    assert g.grpc_get_error(fid) == GRPC_SESSION_FAILED


def test_get_result_waits_for_the_session(init):
    sid = async_call(handle("sleep"), 0.3)
    assert g.grpc_get_result(sid) == (GRPC_NO_ERROR, 0.3)
    assert g.grpc_probe(sid) == GRPC_NO_ERROR


# -- probe ---------------------------------------------------------------------------------------

def test_probe(init, tree):
    long_sid = async_call(handle("sleep", "solo"), LONG)
    assert g.grpc_probe(long_sid) == GRPC_NOT_COMPLETED
    assert g.grpc_get_last_error() == GRPC_NOT_COMPLETED
    sid = async_call(handle("add"), 1, 1)
    wait_for(lambda: g.grpc_probe(sid) == GRPC_NO_ERROR, 10, "probe to report completion")
    fid = async_call(handle("fail"), "x")
    wait_for(lambda: g.grpc_probe(fid) == GRPC_NO_ERROR, 10, "a failed session completes too")
    assert g.grpc_probe(long_sid) == GRPC_NOT_COMPLETED
    assert g.grpc_cancel(long_sid) == GRPC_NO_ERROR
    assert g.grpc_probe(long_sid) == GRPC_NO_ERROR


def test_probe_or(init):
    slow = handle("sleep", "solo")
    pending = [async_call(slow, LONG) for _ in range(2)]
    assert g.grpc_probe_or(pending) == (GRPC_NONE_COMPLETED, GRPC_SESSIONID_VOID)   # interop probe 6
    assert g.grpc_get_last_error() == GRPC_NONE_COMPLETED
    quick = async_call(handle("add"), 1, 1)
    wait_for(lambda: g.grpc_probe_or(pending + [quick]) == (GRPC_NO_ERROR, quick), 10, "probe_or")
    assert g.grpc_probe_or(pending + [quick, 10**9]) == (GRPC_INVALID_SESSION_ID, None)
    assert g.grpc_probe_or([GRPC_SESSIONID_VOID] * 3) == (GRPC_INVALID_SESSION_ID, None)
    assert g.grpc_probe_or(7) == (GRPC_INVALID_SESSION_ID, None)
    assert g.grpc_probe_or([]) == (GRPC_NONE_COMPLETED, GRPC_SESSIONID_VOID)
    assert g.grpc_cancel_all() == GRPC_NO_ERROR


# -- wait ----------------------------------------------------------------------------------------

def test_wait(init):
    h = handle("add")
    sids = [async_call(h, i, 1) for i in range(4)]
    for i, sid in enumerate(sids):
        assert g.grpc_wait(sid) == GRPC_NO_ERROR
        assert g.grpc_probe(sid) == GRPC_NO_ERROR
        assert g.grpc_get_result(sid) == (GRPC_NO_ERROR, i + 1)
    assert g.grpc_wait(sids[0]) == GRPC_NO_ERROR                              # waiting again is fine
    fid = async_call(handle("fail"), "x")
    assert g.grpc_wait(fid) == GRPC_SESSION_FAILED
    assert g.grpc_get_last_error() == GRPC_SESSION_FAILED
    assert g.grpc_wait(GRPC_SESSIONID_VOID) == GRPC_INVALID_SESSION_ID


def test_wait_and(init):
    h = handle("add")
    sids = [async_call(h, i, 2) for i in range(4)]
    assert g.grpc_wait_and(sids) == GRPC_NO_ERROR
    assert all(g.grpc_probe(s) == GRPC_NO_ERROR for s in sids)
    fid = async_call(handle("fail"), "x")
    ok = async_call(h, 1, 1)
    assert g.grpc_wait_and((fid, ok)) == GRPC_SESSION_FAILED
    assert g.grpc_get_failed_sessionid() == (GRPC_NO_ERROR, fid)
    assert g.grpc_get_failed_sessionid() == (GRPC_NO_ERROR, GRPC_SESSIONID_VOID)
    assert g.grpc_wait_and([]) == GRPC_NO_ERROR


def test_wait_and_invalid_id_returns_at_once(init):
    long_sid = async_call(handle("sleep", "solo"), LONG)
    t0 = time.monotonic()
    assert g.grpc_wait_and([long_sid, 10**9]) == GRPC_INVALID_SESSION_ID
    assert g.grpc_wait_and([GRPC_SESSIONID_VOID] * 3) == GRPC_INVALID_SESSION_ID   # interop wait 5
    assert g.grpc_wait_and(None) == GRPC_INVALID_SESSION_ID
    assert time.monotonic() - t0 < FAST
    assert g.grpc_probe(long_sid) == GRPC_NOT_COMPLETED


def test_wait_or(init):
    long_sid = async_call(handle("sleep", "solo"), LONG)
    fast = [async_call(handle("add"), i, i) for i in range(3)]
    ids = [long_sid] + fast
    seen = []
    for _ in fast:                                           # interop wait 7: shrink the list
        code, sid = g.grpc_wait_or(ids)
        assert code == GRPC_NO_ERROR and sid in fast
        seen.append(sid)
        ids.remove(sid)
    assert sorted(seen) == sorted(fast)
    assert ids == [long_sid]
    assert g.grpc_probe(long_sid) == GRPC_NOT_COMPLETED
    assert g.grpc_wait_or([long_sid, GRPC_SESSIONID_VOID]) == (GRPC_INVALID_SESSION_ID, None)
    assert g.grpc_wait_or([]) == (GRPC_NONE_COMPLETED, None)
    fid = async_call(handle("fail"), "x")
    assert g.grpc_wait_or([long_sid, fid]) == (GRPC_SESSION_FAILED, fid)   # the id of the failed one


def test_wait_all(init):
    h = handle("add")
    sids = [async_call(h, i, 3) for i in range(5)]
    assert g.grpc_wait_all() == GRPC_NO_ERROR
    assert all(g.grpc_probe(s) == GRPC_NO_ERROR for s in sids)
    assert [g.grpc_get_result(s)[1] for s in sids] == [i + 3 for i in range(5)]
    assert g.grpc_wait_all() == GRPC_NO_ERROR                                 # nothing left
    fid = async_call(handle("fail"), "x")
    async_call(h, 1, 1)
    assert g.grpc_wait_all() == GRPC_SESSION_FAILED
    assert g.grpc_get_failed_sessionid() == (GRPC_NO_ERROR, fid)


def test_wait_any_returns_each_session_once(init):
    h = handle("add")
    sids = [async_call(h, i, 0) for i in range(6)]
    got = []
    for _ in sids:                                                           # interop wait 12
        code, sid = g.grpc_wait_any()
        assert code == GRPC_NO_ERROR
        got.append(sid)
    assert sorted(got) == sorted(sids)
    assert g.grpc_wait_any() == (GRPC_NONE_COMPLETED, None)                  # none left
    fid = async_call(handle("fail"), "x")
    assert g.grpc_wait_any() == (GRPC_SESSION_FAILED, fid)


def test_wait_any_skips_sessions_already_waited(init):
    h = handle("add")
    a, b, c = (async_call(h, i, 0) for i in range(3))
    assert g.grpc_wait(a) == GRPC_NO_ERROR
    assert g.grpc_get_result(b) == (GRPC_NO_ERROR, 1)
    assert g.grpc_wait_any() == (GRPC_NO_ERROR, c)
    assert g.grpc_wait_any() == (GRPC_NONE_COMPLETED, None)


def test_wait_any_in_completion_order(init):
    slow = async_call(handle("sleep", "solo"), 1.0)
    fast = async_call(handle("add"), 1, 1)
    assert g.grpc_wait_any() == (GRPC_NO_ERROR, fast)
    assert g.grpc_wait_any() == (GRPC_NO_ERROR, slow)


def test_wait_any_until(init):
    long_sid = async_call(handle("sleep", "solo"), LONG)
    t0 = time.monotonic()
    assert g.grpc_wait_any_until(0.3) == (GRPC_NONE_COMPLETED, None)
    assert 0.25 <= time.monotonic() - t0 < FAST
    assert g.grpc_wait_any_until(0) == (GRPC_NONE_COMPLETED, None)
    sid = async_call(handle("add"), 1, 1)
    assert g.grpc_wait_any_until(30) == (GRPC_NO_ERROR, sid)
    assert g.grpc_wait_any_until("soon") == (GRPC_OTHER_ERROR_CODE, None)
    assert g.grpc_cancel(long_sid) == GRPC_NO_ERROR
    assert g.grpc_wait_any_until(5) == (GRPC_SESSION_FAILED, long_sid)      # cancelled
    assert g.grpc_wait_any_until(5) == (GRPC_NONE_COMPLETED, None)


def test_waits_wake_up_on_finalize(init):
    sid = async_call(handle("sleep", "solo"), LONG)
    out = {}

    def waiter():
        out["wait"] = g.grpc_wait(sid)
    t = threading.Thread(target=waiter)
    t.start()
    assert g.grpc_finalize() == GRPC_NO_ERROR
    t.join(20)
    assert not t.is_alive()
    assert out["wait"] == GRPC_NOT_INITIALIZED


# -- cancel ---------------------------------------------------------------------------------------

def test_cancel_running_call_frees_the_server(init, tree):
    h = handle("sleep", "solo")
    sid = async_call(h, LONG)
    wait_load(tree, "solo", 1, 0)
    cancelled_before = sed_of(tree, "solo").stats["cancelled"]
    t0 = time.monotonic()
    assert g.grpc_cancel(sid) == GRPC_NO_ERROR
    assert time.monotonic() - t0 < FAST
    assert g.grpc_probe(sid) == GRPC_NO_ERROR
    assert g.grpc_wait(sid) == GRPC_SESSION_FAILED
    assert g.grpc_get_error(sid) == GRPC_SESSION_FAILED
    assert isinstance(g.grpc_get_exception(sid)[1], gridrpc.CallCancelled)
    assert g.grpc_get_result(sid) == (GRPC_SESSION_FAILED, None)
    assert sed_of(tree, "solo").stats["cancelled"] == cancelled_before + 1
    assert sed_load(tree, "solo") == (0, 0)                     # nothing left on the SeD
    t0 = time.monotonic()                                       # the single slot is free at once
    assert g.grpc_call(handle("sleep", "solo"), 0.01) == (GRPC_NO_ERROR, 0.01)
    assert time.monotonic() - t0 < FAST


def test_cancel_queued_call_removes_it_from_the_queue(init, tree):
    h = handle("sleep", "solo")
    running = async_call(h, LONG)
    queued = async_call(h, LONG)
    wait_load(tree, "solo", 1, 1)
    assert g.grpc_cancel(queued) == GRPC_NO_ERROR
    assert g.grpc_wait(queued) == GRPC_SESSION_FAILED
    assert isinstance(g.grpc_get_exception(queued)[1], gridrpc.CallCancelled)
    assert sed_load(tree, "solo") == (1, 0)                     # removed, the other still running
    assert g.grpc_probe(running) == GRPC_NOT_COMPLETED
    assert g.grpc_cancel(running) == GRPC_NO_ERROR
    wait_load(tree, "solo", 0, 0)
    t0 = time.monotonic()
    assert g.grpc_call(h, 0.01) == (GRPC_NO_ERROR, 0.01)
    assert time.monotonic() - t0 < FAST


def test_cancel_completed_session_keeps_its_result(init):
    sid = async_call(handle("add"), 2, 2)
    assert g.grpc_wait(sid) == GRPC_NO_ERROR
    assert g.grpc_cancel(sid) == GRPC_NO_ERROR
    assert g.grpc_get_result(sid) == (GRPC_NO_ERROR, 4)
    assert g.grpc_get_error(sid) == GRPC_NO_ERROR


def test_cancel_all(init, tree):
    slow = [async_call(handle("sleep", s), LONG) for s in ("solo", "solo", "sed-1-1", "sed-1-2")]
    done = async_call(handle("add"), 1, 1)
    t0 = time.monotonic()
    assert g.grpc_wait(done) == GRPC_NO_ERROR
    took = time.monotonic() - t0
    try:
        wait_load(tree, "solo", 1, 1)
    except Timeout as e:    # say where each call is: the sessions' states and errors, where add ran
        states = [(g.grpc_probe(s), g.grpc_get_exception(s)) for s in slow]
        from gridrpc.grpc import state as st
        call = st.current.sessions[done].call
        ran = (call.server, list(getattr(call, "attempts", ())), getattr(call, "timing", None))
        raise Timeout(f"{e}; add(1, 1) took {took:.2f}s on {ran}; sessions {states}") from None
    t0 = time.monotonic()
    assert g.grpc_cancel_all() == GRPC_NO_ERROR
    assert time.monotonic() - t0 < 2 * FAST
    assert all(g.grpc_probe(s) == GRPC_NO_ERROR for s in slow)
    assert g.grpc_wait_all() == GRPC_SESSION_FAILED
    assert all(g.grpc_get_error(s) == GRPC_SESSION_FAILED for s in slow)
    assert g.grpc_get_result(done) == (GRPC_NO_ERROR, 2)
    for name in ("solo", "sed-1-1", "sed-1-2"):
        assert sed_load(tree, name) == (0, 0)
    assert g.grpc_cancel_all() == GRPC_NO_ERROR                 # nothing to cancel


def test_finalize_stops_running_work(config, tree):
    assert g.grpc_initialize(config) == GRPC_NO_ERROR
    async_call(handle("sleep", "solo"), LONG)
    async_call(handle("sleep", "solo"), LONG)
    wait_load(tree, "solo", 1, 1)
    t0 = time.monotonic()
    assert g.grpc_finalize() == GRPC_NO_ERROR
    assert time.monotonic() - t0 < 2 * FAST
    wait_load(tree, "solo", 0, 0, timeout=FAST)


def test_finalize_stops_a_blocking_call_in_another_thread(config, tree):
    assert g.grpc_initialize(config) == GRPC_NO_ERROR
    h = handle("sleep", "solo")
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("call", g.grpc_call(h, LONG)))
    t.start()
    wait_load(tree, "solo", 1, 0)
    assert g.grpc_finalize() == GRPC_NO_ERROR
    t.join(FAST)
    assert not t.is_alive()
    assert box["call"] == (GRPC_NOT_INITIALIZED, None)
    wait_load(tree, "solo", 0, 0, timeout=FAST)


# -- error reporting ------------------------------------------------------------------------------

def test_get_error(init):
    long_sid = async_call(handle("sleep", "solo"), LONG)
    assert g.grpc_get_error(long_sid) == GRPC_NO_ERROR                    # interop error 3: pending
    ok = async_call(handle("add"), 1, 1)
    fid = async_call(handle("fail"), "boom")
    died = async_call(handle("exit"), 1)
    assert g.grpc_wait_and([ok, fid, died]) == GRPC_SESSION_FAILED
    assert g.grpc_get_error(ok) == GRPC_NO_ERROR
    assert g.grpc_get_error(fid) == GRPC_SESSION_FAILED
    assert g.grpc_get_error(died) == GRPC_SESSION_FAILED
    code, exc = g.grpc_get_exception(fid)
    assert code == GRPC_NO_ERROR and isinstance(exc, gridrpc.RemoteError)
    assert exc.remote_type == "RuntimeError" and "boom" in str(exc) and exc.remote_traceback
    assert isinstance(g.grpc_get_exception(died)[1], gridrpc.WorkerDied)
    assert g.grpc_get_exception(ok) == (GRPC_NO_ERROR, None)
    assert g.grpc_get_error(GRPC_SESSIONID_VOID) == GRPC_INVALID_SESSION_ID  # interop error 4
    assert g.grpc_cancel(long_sid) == GRPC_NO_ERROR


def test_session_error_codes_follow_the_cause(init, tree):
    """A function removed from a bound server after the handle was made:
    FUNCTION_NOT_FOUND as the session's cause, SESSION_FAILED from the wait."""
    h = handle("add", "adder")
    sed = sed_of(tree, "adder")
    tree.lt.call(sed.remove_service, "add")
    try:
        assert g.grpc_call(h, 1, 2) == (GRPC_FUNCTION_NOT_FOUND, None)
        sid = async_call(h, 1, 2)
        assert g.grpc_wait(sid) == GRPC_SESSION_FAILED
        assert g.grpc_get_error(sid) == GRPC_FUNCTION_NOT_FOUND
        assert isinstance(g.grpc_get_exception(sid)[1], gridrpc.ServiceNotFound)
    finally:
        from gridrpc.examples import services
        tree.lt.call(sed.add_service, "add", services.add)
    assert g.grpc_call(h, 1, 2) == (GRPC_NO_ERROR, 3)


def test_get_last_error(init):
    assert g.grpc_get_last_error() == GRPC_NO_ERROR
    assert g.grpc_function_handle_default("nope")[0] == GRPC_FUNCTION_NOT_FOUND
    assert g.grpc_get_last_error() == GRPC_FUNCTION_NOT_FOUND
    assert g.grpc_get_last_error() == GRPC_FUNCTION_NOT_FOUND            # reading does not reset
    g.grpc_error_string(GRPC_NO_ERROR)
    g.grpc_get_failed_sessionid()
    g.grpc_get_error(12345678)
    assert g.grpc_get_last_error() == GRPC_FUNCTION_NOT_FOUND            # reporting functions aside
    assert g.grpc_call(handle("add"), 1, 1) == (GRPC_NO_ERROR, 2)
    assert g.grpc_get_last_error() == GRPC_NO_ERROR


def test_get_last_error_is_per_thread(init):
    h = handle("fail")
    box = {}

    def other():
        box["call"] = g.grpc_call(h, "x")
        box["last"] = g.grpc_get_last_error()
    t = threading.Thread(target=other)
    t.start()
    t.join(30)
    assert box == {"call": (GRPC_SESSION_FAILED, None), "last": GRPC_SESSION_FAILED}
    assert g.grpc_get_last_error() == GRPC_NO_ERROR


def test_get_failed_sessionid(init):
    assert g.grpc_get_failed_sessionid() == (GRPC_NO_ERROR, GRPC_SESSIONID_VOID)   # interop error 5
    fail, add = handle("fail"), handle("add")
    failed = [async_call(fail, f"#{i}") for i in range(3)]
    good = [async_call(add, i, i) for i in range(2)]
    g.grpc_wait_all()                                                            # and ignore errors
    got = []
    while True:                                                                  # interop error 7
        code, sid = g.grpc_get_failed_sessionid()
        assert code == GRPC_NO_ERROR
        if sid == GRPC_SESSIONID_VOID:
            break
        got.append(sid)
        assert len(got) <= 3
    assert sorted(got) == sorted(failed)
    assert not set(got) & set(good)
    assert g.grpc_get_failed_sessionid() == (GRPC_NO_ERROR, GRPC_SESSIONID_VOID)


# -- vanished server --------------------------------------------------------------------------------

def test_vanished_server_async(init, tree):
    sed = tree.add_sed("doomed-1", tree.las[0].address)
    tree.wait_registered()
    h = handle("sleep", "doomed-1")
    sid = async_call(h, LONG)
    wait_load(tree, "doomed-1", 1, 0)
    tree.stop_sed(sed)
    t0 = time.monotonic()
    assert g.grpc_wait(sid) == GRPC_SESSION_FAILED                    # ping_timeout is 1.5 s
    assert time.monotonic() - t0 < 3 * FAST
    assert g.grpc_get_error(sid) == GRPC_COMMUNICATION_FAILED
    assert g.grpc_get_failed_sessionid() == (GRPC_NO_ERROR, sid)
    # the handle stays bound to the dead server: the next call fails too, no silent re-routing
    assert g.grpc_call(h, 0.01) == (GRPC_COMMUNICATION_FAILED, None)
    wait_for(lambda: "doomed-1" not in tree.registered_seds(), 10, "doomed-1 dropped from the tree")
    assert g.grpc_function_handle_init("doomed-1", "sleep") == (GRPC_SERVER_NOT_FOUND, None)


def test_vanished_server_sync(init, tree):
    sed = tree.add_sed("doomed-2", tree.las[0].address)
    tree.wait_registered()
    h = handle("sleep", "doomed-2")
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("call", g.grpc_call(h, LONG)))
    t.start()
    wait_load(tree, "doomed-2", 1, 0)
    tree.stop_sed(sed)
    t.join(3 * FAST)
    assert not t.is_alive()
    assert box["call"] == (GRPC_COMMUNICATION_FAILED, None)


# -- threads ------------------------------------------------------------------------------------

def test_threads_share_the_module(init):
    h = handle("add")
    errors: list = []
    barrier = threading.Barrier(8)

    def worker(k):
        try:
            barrier.wait()
            for i in range(5):
                assert g.grpc_call(h, k, i) == (GRPC_NO_ERROR, k + i)
                sid = async_call(h, k, 100 * i)
                assert g.grpc_wait(sid) == GRPC_NO_ERROR
                assert g.grpc_get_result(sid) == (GRPC_NO_ERROR, k + 100 * i)
                hk = handle("echo")
                assert g.grpc_call(hk, [k, i]) == (GRPC_NO_ERROR, [k, i])
                assert g.grpc_function_handle_destruct(hk) == GRPC_NO_ERROR
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []


def test_wait_any_from_several_threads_returns_each_session_once(init):
    h = handle("echo")
    sids = [async_call(h, i) for i in range(40)]
    got: list[int] = []
    lock = threading.Lock()

    def consumer():
        while True:
            code, sid = g.grpc_wait_any()
            if code == GRPC_NONE_COMPLETED:
                return
            assert code == GRPC_NO_ERROR
            with lock:
                got.append(sid)
    threads = [threading.Thread(target=consumer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(got) == sorted(sids)                      # each exactly once
    for i, sid in enumerate(sids):
        assert g.grpc_get_result(sid) == (GRPC_NO_ERROR, i)


# -- optional-computation extensions ---------------------------------------------------------------

def test_discover(init, tree):
    code, servers = g.grpc_discover("add", 10)
    assert code == GRPC_NO_ERROR
    names = [s.name for s in servers]
    assert set(names) == {"sed-1-1", "sed-1-2", "adder"} and len(names) == 3
    assert all(isinstance(s, gridrpc.ServerInfo) and s.address and s.estimation for s in servers)
    code, one = g.grpc_discover("add", 1)
    assert code == GRPC_NO_ERROR and len(one) == 1
    code, sleepers = g.grpc_discover("sleep", 10)
    assert code == GRPC_NO_ERROR and {s.name for s in sleepers} == {"sed-1-1", "sed-1-2", "solo"}
    assert g.grpc_discover("no_such_function", 3) == (GRPC_FUNCTION_NOT_FOUND, None)
    assert g.grpc_discover("add", 0) == (GRPC_OTHER_ERROR_CODE, None)
    assert g.grpc_discover("add", "3") == (GRPC_OTHER_ERROR_CODE, None)


def test_set_optional(init, tree):
    h = handle("sleep", "solo")
    assert not h.optional
    assert g.grpc_function_handle_set_optional(h) == GRPC_NO_ERROR
    assert h.optional
    sid = async_call(h, LONG)
    wait_load(tree, "solo", 1, 0)
    sed = sed_of(tree, "solo")
    assert tree.lt.call(lambda: [c.optional for c in sed.calls.values()]) == [True]
    assert g.grpc_cancel(sid) == GRPC_NO_ERROR
    assert g.grpc_function_handle_set_optional(h, False) == GRPC_NO_ERROR
    sid = async_call(h, LONG)
    wait_load(tree, "solo", 1, 0)
    assert tree.lt.call(lambda: [c.optional for c in sed.calls.values()]) == [False]
    assert g.grpc_cancel(sid) == GRPC_NO_ERROR
    assert g.grpc_function_handle_set_optional(None) == GRPC_INVALID_FUNCTION_HANDLE
    assert g.grpc_function_handle_destruct(h) == GRPC_NO_ERROR
    assert g.grpc_function_handle_set_optional(h) == GRPC_INVALID_FUNCTION_HANDLE


def test_optional_default_handle_runs(init):
    h = handle("add")
    assert g.grpc_function_handle_set_optional(h) == GRPC_NO_ERROR
    assert g.grpc_call(h, 20, 1) == (GRPC_NO_ERROR, 21)                 # FCFS SeDs run it
