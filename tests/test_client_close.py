"""Closing a client with calls in flight: every call ends with a clear error,
nothing is left pending on the loop (no "Task was destroyed" noise)."""
import subprocess
import sys
import textwrap


def test_close_with_calls_in_flight_is_quiet():
    code = textwrap.dedent('''
        import asyncio, gridrpc
        from gridrpc.testing import LocalTree
        with LocalTree(las=1, seds_per_la=1, http=False) as t:
            async def main():
                async with gridrpc.AsyncClient(t.ma_address) as c:
                    calls = [c.submit_nowait("sleep", 5) for _ in range(3)]
                    await asyncio.sleep(0.3)
                return calls
            calls = asyncio.run(main())
            print("async", [type(c.exception(0)).__name__ for c in calls])
            c = gridrpc.Client(t.ma_address)
            k = c.submit("sleep", 5)
            c.close()
            print("sync", type(k.exception(1)).__name__)
    ''')
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "async ['CommunicationError', 'CommunicationError', 'CommunicationError']" in r.stdout
    assert "sync CommunicationError" in r.stdout
    for noise in ("Task was destroyed", "unhandled exception", "was never retrieved"):
        assert noise not in r.stderr, r.stderr


def test_close_just_after_a_discovery_gave_up_is_quiet():
    """A discovery cancelled (as a call's timeout ends it) and the client
    closed before the discovery's task ran again: ``aclose`` fails the
    pending answer with "client closed"; the request that gave up consumes
    it, and asyncio has no "Future exception was never retrieved" to log
    when the future is collected (``gridrpc call`` printed it on stderr)."""
    import asyncio
    import gc

    import gridrpc
    from tests.proc_tree import free_port

    logged = []

    async def main():
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: logged.append(ctx))
        c = gridrpc.AsyncClient(f"tcp://127.0.0.1:{free_port()}", discovery_timeout=30)   # nobody there
        await c.start()
        ask = asyncio.ensure_future(c.discover("add"))
        await asyncio.sleep(0.05)          # it waits for the MA's answer
        assert c._pending, "the discovery should be waiting for an answer"
        ask.cancel()
        await c.aclose()                    # fails the answer before ``ask`` runs its cancellation
        await asyncio.gather(ask, return_exceptions=True)
        del ask
        gc.collect()
        await asyncio.sleep(0)

    asyncio.run(main())
    gc.collect()
    assert not [ctx.get("message") for ctx in logged], logged


def test_ctrl_c_during_a_blocking_call_cancels_it_on_its_server():
    """A blocking ``Client.call`` waits on a lock the call's future releases:
    Ctrl-C (KeyboardInterrupt) interrupts the wait at once, and the call is
    cancelled on its SeD rather than left running."""
    import os
    import signal
    import threading
    import time

    import gridrpc
    from gridrpc.testing import LocalTree, wait_for
    with LocalTree(las=0, seds_under_ma=1, http=False) as t, gridrpc.Client(t.ma_address) as c:
        sed = t.seds[0]
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))      # a real Ctrl-C
        timer.start()
        t0 = time.monotonic()
        try:
            c.call("sleep", 30)
            raise AssertionError("the call was not interrupted")
        except KeyboardInterrupt:
            pass
        finally:
            timer.cancel()
        assert time.monotonic() - t0 < 5
        wait_for(lambda: t.lt.call(lambda: sed.stats["cancelled"]) >= 1, 10, "the call cancelled on the SeD")
        assert c.call("add", 1, 2) == 3            # the client goes on
