"""pytest fixtures for a private Slurm (see tests/slurm_cluster.py).

Import them in a test module::

    from tests.conftest_slurm import slurm_cluster, slurm_cluster2  # noqa: F401

Both are module-scoped: one private cluster per test module, started in ~1 s,
torn down (jobs cancelled, daemons ended) when the module's tests are done.
When Slurm/munge are not installed they skip -- or fail under
``GRIDRPC_REQUIRE_REAL`` (see tests/requirements.py), naming what is missing
and how to install it (``scripts/install-test-deps``).
"""
from __future__ import annotations

import pytest

from tests.batch_clusters import SlurmCluster
from tests.requirements import require

__all__ = ["slurm_cluster", "slurm_cluster2", "require_slurm"]


def require_slurm() -> None:
    """Skip (or, under GRIDRPC_REQUIRE_REAL, fail) the calling test when the
    Slurm daemons or client commands are absent: ``require("slurm")``."""
    require("slurm")


def _cluster(tmp_path_factory, name: str, **kwargs):
    require_slurm()
    workdir = tmp_path_factory.mktemp(f"slurm-{name}-", numbered=True)
    with SlurmCluster(workdir, name=name, **kwargs) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    """A private Slurm ``SlurmCluster(name="c1")`` (a ``PrivateSlurm`` with the
    questions of tests/batch_clusters.py): node ``c1node1``,
    partition ``debug`` (default, unlimited) plus ``short`` (MaxTime 30 min)."""
    yield from _cluster(tmp_path_factory, "c1", cpus=2,
                        extra_conf="PartitionName=short Nodes={node} MaxTime=30:00 State=UP")


@pytest.fixture(scope="module")
def slurm_cluster2(tmp_path_factory):
    """A second, independent private Slurm (``name="c2"``, node ``c2node1``),
    to run side by side with ``slurm_cluster``."""
    yield from _cluster(tmp_path_factory, "c2", cpus=2)
