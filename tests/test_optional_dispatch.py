"""DeadlineAwareDispatcher (run_optional(skip_late=True)), against a fake clock."""
from __future__ import annotations

import itertools

from gridrpc.client.optional import DeadlineAwareDispatcher
from gridrpc.core.dispatcher import Cancel, Finish, OptionalDispatcher, Submit


def _start(cls):
    d = cls([1.0], itertools.repeat(1.0), 10.0, ["s1", "s2"])
    acts = d.start(0.0)
    assert [a.key for a in acts if isinstance(a, Submit)] == ["m0", "o0", "o1"]
    return d


def test_feeds_while_a_call_fits_before_the_deadline():
    d = _start(DeadlineAwareDispatcher)
    assert d.on_done("m0", True, 1.0, started=0.0) == []
    assert d.estimate == 1.0
    acts = d.on_done("o0", True, 2.0, started=1.0)
    assert acts == [Submit("o2", "s1", 1.0, True)]          # same server; 2 + 1 <= 10


def test_stops_feeding_when_the_next_call_would_end_late():
    d = _start(DeadlineAwareDispatcher)
    d.on_done("m0", True, 1.0, started=0.0)
    assert d.on_done("o0", True, 9.5, started=8.5) == []   # 9.5 + 1 > 10: nothing sent
    assert d.on_tick(10.0) == [Cancel("o1"), Finish()]
    # the plain dispatcher would have sent one more (to be killed at 10)
    p = _start(OptionalDispatcher)
    p.on_done("m0", True, 1.0, started=0.0)
    assert [type(a) for a in p.on_done("o0", True, 9.5, started=8.5)] == [Submit]


def test_without_an_estimate_behaves_like_the_parent():
    d = _start(DeadlineAwareDispatcher)
    assert d.estimate is None
    assert [type(a) for a in d.on_done("o0", True, 9.9)] == [Submit]      # no started time: no estimate
