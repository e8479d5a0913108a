"""The SeD's lifecycle events: one call's story (queued, started, finished /
failed / cancelled), with user, service, server and durations."""
import gridrpc
from gridrpc.core.events import Event, EventKind
from gridrpc.testing import LocalTree, wait_for


def _story(t, call_id):
    """One call's events as the MA has them (the SeD sends them up every 250 ms)."""
    return t.lt.call(lambda: [e for _, e in t.ma.events.log.story(call_id)])


def test_a_calls_story_is_in_the_seds_events():
    with LocalTree(las=0, seds_under_ma=1, http=False) as t:
        sed = t.seds[0]
        with gridrpc.Client(t.ma_address, user="alice") as c:
            ok = c.submit("add", 1, 2)
            assert ok.result(10) == 3
            bad = c.submit("fail", "boom")
            assert isinstance(bad.exception(10), gridrpc.RemoteError)
            slow = c.submit("sleep", 30)
            wait_for(lambda: any(e.kind is EventKind.CALL_STARTED for e in _story(t, slow.id)), 10,
                     "the slow call started")
            slow.cancel()
        wait_for(lambda: len(_story(t, ok.id)) >= 3 and len(_story(t, bad.id)) >= 3, 10, "events at the MA")
        kinds = [e.kind for e in _story(t, ok.id)]
        assert kinds == [EventKind.CALL_QUEUED, EventKind.CALL_STARTED, EventKind.CALL_FINISHED]
        fin = _story(t, ok.id)[-1]
        assert fin.user == "alice" and fin.service == "add" and fin.server == sed.name
        assert fin.duration is not None and 0 <= fin.duration < 10
        failed = _story(t, bad.id)[-1]
        assert failed.kind is EventKind.CALL_FAILED and "boom" in failed.detail
        wait_for(lambda: _story(t, slow.id)[-1].kind is EventKind.CALL_CANCELLED, 10, "cancel event")
        assert t.lt.call(lambda: sed._load(sed.replicas[sed.name])["policy"]) == "fcfs"
