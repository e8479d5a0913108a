"""Header frames kept after their send hold only their own bytes.

orjson returns its output in the buffer it wrote into (4 KiB for a
200-byte header, 8 MiB for 1 MB). A SeD keeps every answer for duplicates
(up to 200,000): a long-running SeD grew by 4.6 KB per call (610 MB after
120,000 calls) and spent ~8 % of its CPU zeroing fresh pages. Measured
with tracemalloc, which sees the allocations themselves (``len`` and
``sys.getsizeof`` do not).
"""
import inspect
import tracemalloc

import gridrpc
from gridrpc.core import messages as m
from gridrpc.core.messages import MsgType
from gridrpc.testing import LocalTree


def _traced(fn):
    tracemalloc.start()
    try:
        kept = fn()
        return kept, tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def test_a_dumped_header_holds_about_its_length():
    header = m.make(MsgType.RESULT, "c-0123456789abcdef", value=3, server="s1",
                    timing={"received": 1.0, "started": 2.0, "ended": 3.0})
    kept, used = _traced(lambda: [m.dumps(header) for _ in range(1000)])
    n = len(kept[0])
    assert n < 200
    # bytes object overhead ~33 bytes, the list's slot 8: far below orjson's 4 KiB buffer
    assert used < 1000 * (n + 120), f"1000 headers of {n} bytes hold {used} bytes"


def test_a_large_header_is_not_kept_with_its_buffer():
    kept, used = _traced(lambda: m.dumps({"v": 1, "type": "result", "id": "x", "value": "a" * 1_000_000}))
    assert len(kept) > 1_000_000
    assert used < 1.2 * len(kept), f"a {len(kept)}-byte header holds {used} bytes"


def test_a_sed_keeps_answers_for_duplicates_at_their_size():
    """The answers a SeD keeps (its result cache) after 1,500 calls: their memory,
    as tracemalloc attributes it to the header's serialisation."""
    with LocalTree(las=0, seds_under_ma=1, http=False, sed_options={"isolation": "inline"}) as t:
        sed = t.seds[0]
        with gridrpc.Client(t.ma_address) as c:
            h = c.handle("add", server=t.sed_names()[0])
            assert h(1, 2) == 3
            tracemalloc.start(4)
            try:
                for i in range(1500):
                    assert h(i, 1) == i + 1
                snap = tracemalloc.take_snapshot()
            finally:
                tracemalloc.stop()
        stats = sed.lifecycle.statistics()
        assert stats["answers"] >= 1500
        lines, first = inspect.getsourcelines(m.dumps)
        in_dumps = sum(s.size for s in snap.statistics("traceback")
                       if any(f.filename.endswith("core/messages.py") and first <= f.lineno < first + len(lines)
                              for f in s.traceback))
    # ~250 bytes of header each (plus the client's own frames); orjson's buffers held 4 KiB each
    assert in_dumps < 1500 * 1024, f"{in_dumps / 1500:.0f} bytes per call kept from header serialisation"
