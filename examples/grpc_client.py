#!/usr/bin/env python3
"""A GridRPC client ported from C (DIET / Ninf-G style) to ``gridrpc.grpc``.

Run it against the local deployment::

    gridrpc deploy up deployments/local.yaml
    python examples/grpc_client.py                  # MA at tcp://127.0.0.1:5555
    python examples/grpc_client.py --config client.toml
    gridrpc deploy down deployments/local.yaml

Each step names the C call it replaces. Exit status 0 when every step
behaved as the standard says.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

from gridrpc.grpc import (GRPC_NO_ERROR, GRPC_NONE_COMPLETED, GRPC_NOT_COMPLETED, GRPC_SESSION_FAILED,
                          GRPC_SESSIONID_VOID, grpc_call, grpc_call_async, grpc_cancel, grpc_discover,
                          grpc_error_string, grpc_finalize, grpc_function_handle_default,
                          grpc_function_handle_destruct, grpc_function_handle_init, grpc_get_error,
                          grpc_get_failed_sessionid, grpc_get_result, grpc_initialize, grpc_probe,
                          grpc_wait, grpc_wait_all, grpc_wait_any, grpc_wait_any_until)


def check(what: str, code, expected=GRPC_NO_ERROR) -> None:
    """Like the C idiom ``if (err != GRPC_NO_ERROR) { fprintf(stderr, ...); exit(1); }``."""
    if code != expected:
        print(f"  FAILED {what}: {grpc_error_string(code)} (expected {grpc_error_string(expected)})",
              file=sys.stderr)
        grpc_finalize()
        sys.exit(1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", help="TOML configuration file (default: one written for --ma)")
    ap.add_argument("--ma", default="tcp://127.0.0.1:5555", help="Master Agent address")
    ap.add_argument("--calls", type=int, default=6, help="asynchronous calls in step 3")
    args = ap.parse_args()

    config = args.config
    if config is None:                                   # the C client's "client.cfg"
        fd, config = tempfile.mkstemp(suffix=".toml", prefix="grpc-client-")
        with os.fdopen(fd, "w") as fh:
            fh.write(f'master_agent = "{args.ma}"\nping_interval = 0.5\nping_timeout = 3.0\n')

    # grpc_initialize(argv[1])
    code = grpc_initialize(config)
    if code != GRPC_NO_ERROR:
        print(f"grpc_initialize({config}): {grpc_error_string(code)}", file=sys.stderr)
        return 1
    try:
        # 1. grpc_function_handle_default(&h, "add"); grpc_call(&h, x, y, &z);
        code, add = grpc_function_handle_default("add")
        check("grpc_function_handle_default(add)", code)
        code, z = grpc_call(add, 20, 22)
        check("grpc_call(add)", code)
        print(f"1. grpc_call(add, 20, 22) -> {z}")
        assert z == 42

        # 2. a matrix product: DIET's diet_matrix_set(...) + diet_call(profile)
        a = np.arange(6.0).reshape(2, 3)
        b = np.arange(6.0).reshape(3, 2)
        code, dgemm = grpc_function_handle_default("dgemm")
        check("grpc_function_handle_default(dgemm)", code)
        code, c = grpc_call(dgemm, a, b, 0.5)
        check("grpc_call(dgemm)", code)
        print(f"2. grpc_call(dgemm, a, b, 0.5) -> {c.tolist()}")
        assert np.allclose(c, 0.5 * a @ b)

        # 3. task farming: grpc_call_async(&h, &id[i], ...) in a loop, then grpc_wait_any(&id)
        code, sleep = grpc_function_handle_default("sleep")
        check("grpc_function_handle_default(sleep)", code)
        t0 = time.monotonic()
        ids = []
        for i in range(args.calls):
            code, sid = grpc_call_async(sleep, 0.2 + 0.05 * i)
            check("grpc_call_async(sleep)", code)
            ids.append(sid)
        order = []
        for _ in ids:
            code, sid = grpc_wait_any()
            check("grpc_wait_any", code)
            order.append(sid)
        assert sorted(order) == sorted(ids)
        results = [grpc_get_result(sid)[1] for sid in ids]
        print(f"3. {len(ids)} x grpc_call_async(sleep) done in {time.monotonic() - t0:.2f}s, "
              f"completion order {order}, results {results}")

        # 4. grpc_function_handle_init(&h, server, "add"): bound to one SeD, no discovery per call
        code, servers = grpc_discover("add", 10)
        check("grpc_discover(add)", code)
        print(f"4. servers offering add, best first: {[s.name for s in servers]}")
        code, bound = grpc_function_handle_init(servers[-1].name, "add")
        check("grpc_function_handle_init", code)
        code, z = grpc_call(bound, 1, 2)
        check("grpc_call(bound add)", code)
        print(f"   grpc_call on {bound.server_name} -> {z}")
        check("grpc_function_handle_destruct", grpc_function_handle_destruct(bound))

        # 5. errors: a service that raises; grpc_wait_all, grpc_get_failed_sessionid, grpc_get_error
        code, fail = grpc_function_handle_default("fail")
        check("grpc_function_handle_default(fail)", code)
        code, bad = grpc_call_async(fail, "raised on purpose")
        check("grpc_call_async(fail)", code)
        code, good = grpc_call_async(add, 1, 1)
        check("grpc_call_async(add)", code)
        check("grpc_wait_all", grpc_wait_all(), GRPC_SESSION_FAILED)
        code, failed = grpc_get_failed_sessionid()
        check("grpc_get_failed_sessionid", code)
        assert failed == bad
        assert grpc_get_failed_sessionid() == (GRPC_NO_ERROR, GRPC_SESSIONID_VOID)
        print(f"5. session {bad} failed: grpc_get_error -> {grpc_error_string(grpc_get_error(bad))}; "
              f"session {good} -> {grpc_get_result(good)[1]}")

        # 6. grpc_cancel: the SeD kills the worker running the call and is free at once
        code, servers = grpc_discover("sleep", 10)
        check("grpc_discover(sleep)", code)
        single = [s for s in servers if s.estimation.get("max_concurrent") == 1] or servers
        code, solo = grpc_function_handle_init(single[0].name, "sleep")
        check("grpc_function_handle_init(sleep)", code)
        code, sid = grpc_call_async(solo, 60.0)
        check("grpc_call_async(sleep 60)", code)
        check("grpc_wait_any_until(0.5)", grpc_wait_any_until(0.5)[0], GRPC_NONE_COMPLETED)  # running
        check("grpc_probe", grpc_probe(sid), GRPC_NOT_COMPLETED)
        t0 = time.monotonic()
        check("grpc_cancel", grpc_cancel(sid))
        check("grpc_wait(cancelled)", grpc_wait(sid), GRPC_SESSION_FAILED)
        code, value = grpc_call(solo, 0.01)                   # the single slot is free again
        check("grpc_call after cancel", code)
        print(f"6. grpc_cancel stopped a 60 s call on {solo.server_name} and the next call there "
              f"finished {time.monotonic() - t0:.2f}s later (grpc_wait(cancelled) -> "
              f"{grpc_error_string(GRPC_SESSION_FAILED)})")

        for h in (add, dgemm, sleep, fail, solo):
            check("grpc_function_handle_destruct", grpc_function_handle_destruct(h))
    finally:
        # grpc_finalize()
        grpc_finalize()
        if args.config is None:
            os.unlink(config)
    print("all GridRPC steps OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
