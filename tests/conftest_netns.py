"""The ``netns_cluster`` fixture: three namespace hosts with sshd (see tests/netns.py).

Import it explicitly in a test module::

    from tests.conftest_netns import netns_cluster  # noqa: F401
"""
from __future__ import annotations

import pytest

from tests.netns import NetnsCluster, skip_unless_root_netns


@pytest.fixture(scope="module")
def netns_cluster():
    reason = skip_unless_root_netns()
    if reason:
        pytest.skip(f"network-namespace cluster unavailable: {reason}")
    with NetnsCluster(3) as cluster:
        yield cluster
