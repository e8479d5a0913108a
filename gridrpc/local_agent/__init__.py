"""The Local Agent: an inner node of the tree (forwards discoveries, aggregates answers)."""
from .agent import LocalAgent  # noqa: F401
