"""The SeD runtime's calls, mixins of :class:`~gridrpc.sed.server.SeD`.

- :mod:`.receive`: receive, check, answer duplicates, queue, acknowledge, cancel, ping;
- :mod:`.run`: run them on the execution back-end and answer them.
"""
