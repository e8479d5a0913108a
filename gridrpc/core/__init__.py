"""The pure core of gridrpc: no I/O, no clock, no sockets.

Every state machine here takes ``now`` (seconds, float) and, where it needs
randomness, a seeded ``random.Random``; it returns what the runtime should do.
"""
