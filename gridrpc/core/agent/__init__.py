"""The agent state machine (pure): what a Master or Local Agent does.

- :mod:`.machine`: :class:`AgentState` and :class:`AgentConfig` (with the vocabulary, roles and
  budget rules the runtimes use, importable from it too);
- :mod:`.vocabulary`: the events it takes and the actions it returns;
- :mod:`.roles`: Master or Local role, and the discovery budget rule;
- :mod:`.discovery`: discovery and the pushed view of the subtree;
- :mod:`.catalogue`: what an agent shows of itself (catalogue, flattened subtree, statistics);
- :mod:`.federation`: discoveries forwarded to peer master agents.
"""
