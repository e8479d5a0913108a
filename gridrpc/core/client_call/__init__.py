"""The client side of one call to a SeD, as a sans-IO state machine (pure).

- :mod:`.machine`: :class:`CallMachine`, the phases of a call and what moves them;
- :mod:`.vocabulary`: its phases, policy and error, the events a driver feeds it and the actions it returns;
- :mod:`.rediscovery`: discovery of the servers and retries after a transient failure;
- :mod:`.replies`: a SeD's reply as the event the machine takes.
"""
