"""Data held on a SeD by reference: the runtime over :mod:`gridrpc.core.datastore`.

- :mod:`.store`: the configuration, the state (:class:`SedData`) and the ``data_*`` message handlers;
- :mod:`.held_bytes`: where the bytes live (memory or a spill file) and carrying out the store's decisions;
- :mod:`.call_refs`: the references in a call's arguments, resolved before it is queued, and the results
  it keeps;
- :mod:`.fetch`: fetching a reference's bytes from the SeD that holds it.
"""
