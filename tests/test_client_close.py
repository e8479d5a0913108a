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
