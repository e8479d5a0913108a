"""pytest fixture for a private Grid Engine cell (see tests/sge_cluster.py).

Import it in a test module::

    from tests.conftest_sge import sge_cluster  # noqa: F401

Module-scoped: one private cell per test module, started in ~3 s, torn down
(jobs deleted, daemons and job processes ended) when the module's tests are
done. When Grid Engine is not installed it skips -- or fails under
``GRIDRPC_REQUIRE_REAL`` (tests/requirements.py), naming what is missing and
how to install it (``scripts/install-test-deps``).
"""
from __future__ import annotations

import pytest

from tests.requirements import require
from tests.sge_cluster import PrivateSge

__all__ = ["sge_cluster", "require_sge", "private_sge"]


def require_sge() -> None:
    require("sge")


def private_sge(tmp_path_factory, name: str = "s1", **kwargs):
    """Yield a started :class:`PrivateSge` (a generator for module fixtures)."""
    require_sge()
    with PrivateSge(tmp_path_factory.mktemp(f"sge-{name}-"), name=name, **kwargs) as cell:
        yield cell


@pytest.fixture(scope="module")
def sge_cluster(tmp_path_factory):
    """A private Grid Engine cell: queue ``all.q`` of 8 slots on this host,
    parallel environment ``smp``."""
    yield from private_sge(tmp_path_factory)
