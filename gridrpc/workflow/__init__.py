"""Workflows: DAGs of calls whose data moves server to server.

Build one with ordinary Python (``client.submit`` with references and
pending calls as arguments) or with :class:`Workflow` (nodes scheduled with
HEFT, progress reported, a failed node failing only its descendants), or
load one from YAML (:func:`load`; ``gridrpc workflow run FILE``).
"""
from .run import NodeFailed, Workflow, WorkflowResult, load

__all__ = ["Workflow", "WorkflowResult", "NodeFailed", "load"]
