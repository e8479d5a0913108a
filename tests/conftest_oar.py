"""pytest fixture for a private OAR server (see tests/oar_cluster.py).

Import it in a test module::

    from tests.conftest_oar import oar_cluster  # noqa: F401

Module-scoped: one private server per test module (PostgreSQL, OAR's
database, sshd, Almighty), started in a few seconds and torn down (jobs
deleted, processes ended, ``/etc/oar/oar.conf`` put back) when the module's
tests are done. It needs root and the OAR packages: without them it skips --
or fails under ``GRIDRPC_REQUIRE_REAL`` (tests/requirements.py), naming what
is missing and how to install it (``scripts/install-test-deps``).
"""
from __future__ import annotations

import pytest

from tests.oar_cluster import PrivateOar
from tests.requirements import require

__all__ = ["oar_cluster", "require_oar"]


def require_oar() -> None:
    require("oar")


@pytest.fixture(scope="module")
def oar_cluster():
    """A private OAR server: 8 resources (property ``core``) on host ``localhost``."""
    require_oar()
    with PrivateOar(cpus=8) as server:
        yield server
