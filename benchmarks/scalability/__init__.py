"""Scalability study of gridrpc trees: ``python -m benchmarks.scalability``
(see :mod:`benchmarks.scalability.study` and docs/scalability.md)."""
