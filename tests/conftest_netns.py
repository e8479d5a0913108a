"""The ``netns_cluster`` fixture: three namespace hosts with sshd (see tests/netns.py).

Import it explicitly in a test module::

    from tests.conftest_netns import netns_cluster  # noqa: F401

Without root, network namespaces or sshd the tests using it skip -- or fail
under ``GRIDRPC_REQUIRE_REAL`` (tests/requirements.py).
"""
from __future__ import annotations

import pytest

from tests.netns import NetnsCluster
from tests.requirements import require


@pytest.fixture(scope="module")
def netns_cluster():
    require("netns", "sshd")
    with NetnsCluster(3) as cluster:
        yield cluster
