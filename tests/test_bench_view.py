"""The discovery-from-view benchmark rows (benchmarks/view.py, issue #12) run
end to end on real processes in --quick mode and return sane numbers. No
timing asserts (a benchmark, not a test): structure, the answer sources,
the herd spread over servers, nothing left running."""
import psutil
import pytest

from benchmarks import report, view
from benchmarks.procs import Procs


def _lat(d):
    assert d["n"] > 0 and 0 < d["min_ms"] <= d["median_ms"] <= d["p99_ms"], d


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_view_rows_quick_end_to_end():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    res: dict = {}
    with Procs(hb=(1.0, view.SILENT_HB_TIMEOUT)) as procs:
        res.update(view.run_tree_rows(procs, {"view_discovery_4", "view_staleness", "view_silent"}, True,
                                      silent=("sed",)))
    with Procs() as procs:
        res.update(view.run_herd(procs, True))
    with Procs() as procs:
        res["view_scale_500"] = view.run_scale(procs, 100, True, las=2)    # small: the path, not the size

    d = res["view_discovery_4"]
    _lat(d["view"]), _lat(d["fanout"])
    assert d["view"]["answers"]["view"] > 0 and d["fanout"]["answers"]["view"] == 0

    herd = res["view_herd"]
    for mode in ("view", "fanout"):
        rounds = herd[mode]["rounds"]
        assert rounds and all(sum(r["per_server"].values()) == view.HERD_CLIENTS for r in rounds)
        assert herd[mode]["servers_used"]["max"] > 1            # the herd used more than one server
        assert herd[mode]["completion_s"]["min"] >= view.HERD_SLEEP
    assert herd["view"]["answers"]["view"] > 0 and herd["fanout"]["answers"]["view"] == 0

    st = res["view_staleness"]
    for mode in ("view", "fanout"):
        assert st[mode]["trials"] and all(t["polls"] > 0 for t in st[mode]["trials"])
        assert st[mode]["busy_seen_ms"] is not None          # X seen busy at least once in some trial

    si = res["view_silent"]["sed"]
    assert si["frozen"].startswith("sed-")
    for mode in ("view", "fanout"):
        _lat(si[mode]["alive"]), _lat(si[mode]["frozen"])
        assert isinstance(si[mode]["added_median_ms"], float)

    sc = res["view_scale_500"]
    assert sc["seds"] == 100
    _lat(sc["view"]), _lat(sc["fanout"])
    assert sc["view"]["answers"]["view"] > 0

    targets = {t["key"]: t for t in report.evaluate(res)}
    assert targets["view_stale_50ms"]["status"] in ("PASS", "SHORT")
    text = report.view_table(res, report.evaluate(res), {"view_scale_2000": "not in --quick"})
    assert "| herd:" in text and "view_scale_2000 | skipped" in text
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def test_view_group_selected():
    """``--only view`` selects the rows; ``gridrpc`` includes them. No process started."""
    from benchmarks import suite
    assert suite.select("view") == set(view.ITEMS)
    assert set(view.ITEMS) <= suite.select("gridrpc")
