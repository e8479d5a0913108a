"""The ``moto_ec2`` fixture: moto's EC2 API on loopback, reset before each test.

Not a conftest.py (not loaded automatically); a test module imports it:

    from tests.conftest_cloud import moto_ec2  # noqa: F401

One moto server serves the whole pytest session (starting one and loading its
AMIs costs ~3 s); it is started on first use and stopped at the end of the
session (and at interpreter exit if pytest dies first). Every test gets it
freshly reset, so no instance survives from one test to the next.
Without moto[server] or libcloud the tests skip -- or fail under
``GRIDRPC_REQUIRE_REAL`` (tests/requirements.py).
"""
from __future__ import annotations

import pytest

from tests.moto_ec2 import MotoEC2
from tests.requirements import require

_server: MotoEC2 | None = None


def _session_server(config: pytest.Config) -> MotoEC2:
    global _server
    if _server is None or _server.pid is None:
        server = MotoEC2().start()
        config.add_cleanup(server.stop)
        _server = server
    return _server


@pytest.fixture
def moto_ec2(request: pytest.FixtureRequest) -> MotoEC2:
    """A running :class:`tests.moto_ec2.MotoEC2`, reset before the test.

    Function-scoped on top of a session-wide server, so that importing this
    one name is enough (a session fixture it depended on would also have to
    be imported by every test module)."""
    require("moto", "libcloud")
    server = _session_server(request.config)
    server.reset()
    return server
