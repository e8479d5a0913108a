"""Daemons (run_daemon) take their start-up objects out of the cyclic GC (gridrpc._run.settle_gc)."""


def test_daemons_take_their_start_up_objects_out_of_the_gc():
    import gc
    from gridrpc._run import settle_gc
    before = gc.get_freeze_count()
    try:
        settle_gc()
        assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()
