"""The SeD (server daemon) and its execution back-ends (worker processes,
batch schedulers, clouds)."""
from .server import SeD  # noqa: F401
