"""The Master Agent: root of the tree, entry point of clients, HTTP status API."""
from .agent import MasterAgent  # noqa: F401
