"""Discrete-event simulation of gridrpc trees on the *real* pure core.

:mod:`~gridrpc.sim.engine` (clock, hosts and cores, links),
:mod:`~gridrpc.sim.elements` (agents, SeD processes and clients driving
``core.agent.machine``, ``core.sed_calls``/``core.queue``, ``core.estimation``,
``core.client_call.machine``), :mod:`~gridrpc.sim.world` (shapes, placement, workloads,
measurements), :mod:`~gridrpc.sim.model` (costs, service times),
:mod:`~gridrpc.sim.calibrate` (fit the costs from stored measurements),
:mod:`~gridrpc.sim.validate` (predicted vs measured), :mod:`~gridrpc.sim.cli`
(``gridrpc sim``); the same elements on SimGrid (``--engine simgrid``):
:mod:`~gridrpc.sim.simgrid_engine` (the world, messages over the platform's
links) with :mod:`~gridrpc.sim.simgrid_clock` (clock, timers),
:mod:`~gridrpc.sim.simgrid_cpu` (hosts, cores, the processes' actors) and
:mod:`~gridrpc.sim.simgrid_isolate` (one engine per child process);
:mod:`~gridrpc.sim.simgrid_sites` (several sites, federation) with
:mod:`~gridrpc.sim.simgrid_site_platform` (the platform's sites) and
:mod:`~gridrpc.sim.simgrid_site_data` (data kept and moved);
:mod:`~gridrpc.sim.simgrid_loader`. See docs/simulation.md.
"""
from .model import Costs, ServiceModel
from .world import World, closed_loop, discovery_series, elements_for, open_clients

__all__ = ["Costs", "ServiceModel", "World", "closed_loop", "discovery_series", "elements_for", "open_clients"]
