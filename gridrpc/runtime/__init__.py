"""Runtimes shared by the daemons: the lifecycle every daemon has
(gridrpc.runtime.lifecycle) and the pure state machines of gridrpc.core
wired to sockets and timers (gridrpc.runtime.agent for the agents)."""
