"""A finished call leaves nothing behind that holds its data: 8 MB echoes in
a row keep the client's memory flat (a call <-> flight reference cycle kept
every result until the cyclic GC ran, and made each round trip 3x slower)."""
import gc

import numpy as np
import psutil

import gridrpc
from gridrpc.testing import LocalTree


def test_results_are_freed_without_the_cyclic_gc():
    with LocalTree(las=0, seds_under_ma=1, http=False, sed_options={"isolation": "inline"}) as t:
        with gridrpc.Client(t.ma_address) as c:
            h = c.handle("echo", server=t.sed_names()[0])
            a = np.random.default_rng(0).random(1 << 20)          # 8 MB
            for _ in range(3):
                h(a)
            gc.disable()
            try:
                rss0 = psutil.Process().memory_info().rss
                for _ in range(30):
                    assert h(a)[-1] == a[-1]
                grown = psutil.Process().memory_info().rss - rss0
            finally:
                gc.enable()
    assert grown < 60 * 2**20, f"memory grew by {grown >> 20} MB over 30 calls of 8 MB"
