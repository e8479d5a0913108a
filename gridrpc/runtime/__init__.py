"""Runtimes shared by the daemons: the pure state machines of gridrpc.core
wired to sockets and timers (gridrpc.runtime.agent for the agents)."""
