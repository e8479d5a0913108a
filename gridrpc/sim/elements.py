"""The simulated elements: thin drivers of the *real* core objects.

- :class:`AgentNode` drives :class:`gridrpc.core.agent.machine.AgentState` (with the
  real :class:`~gridrpc.core.agent.roles.MasterRole` / ``LocalRole``, the
  registry, the discovery table and the aggregators): what the asyncio
  driver ``gridrpc/runtime/agent.py`` does with sockets, it does with
  simulated messages.
- :class:`SedNode` is a SeD process holding replicas: each replica a real
  :class:`~gridrpc.core.queue.SedScheduler` (FCFS, ethic, ...) and
  :class:`~gridrpc.core.estimation.RunTimePredictor`, the process's calls in
  one real :class:`~gridrpc.core.sed_calls.SedCalls`; estimation vectors from
  :func:`~gridrpc.core.estimation.scheduler_tags`, as the SeD runtime.
- :class:`ClientNode` holds users; each call is a real
  :class:`~gridrpc.core.client_call.machine.CallMachine`.

Headers are the real wire headers (``gridrpc.core.messages.make``), passed
as dicts (no JSON). Every message received is a job on the receiving
process: its CPU cost is ``msg[kind] * (1 + messages sent) + item[kind] *
(items received and sent)`` (items: estimation vectors, replica names,
subtree elements), plus ``wakeup[kind]`` if the process was idle, from the
calibration (:mod:`gridrpc.sim.model`).

Layout: :mod:`gridrpc.sim.node` (what every element shares: jobs, their CPU
cost), :mod:`gridrpc.sim.agent_node`, :mod:`gridrpc.sim.sed_node`,
:mod:`gridrpc.sim.client_node`; every name is importable from here.
"""
from __future__ import annotations

from .agent_node import AgentNode
from .client_node import ClientNode, User
from .node import Node, Out, items, size
from .sed_node import Replica, SedNode

__all__ = ["AgentNode", "ClientNode", "Node", "Out", "Replica", "SedNode", "User", "items", "size"]
