import signal

import pytest

from gridrpc.testing import LocalTree
from tests import requirements

# Markers of the real-component tier (pyproject.toml), and the fixtures that
# put a test in it whatever its module declares.
REAL_MARKERS = ("real", "slurm", "sge", "oar", "netns", "cloud")
FIXTURE_MARKERS = {"slurm_cluster": "slurm", "slurm_cluster2": "slurm", "sge_cluster": "sge",
                   "oar_cluster": "oar", "netns_cluster": "netns", "moto_ec2": "cloud"}


def pytest_report_header(config):
    must = requirements.required()
    if not must:
        return (f"real-component tier: missing components skip ({requirements.ENV} unset; "
                "scripts/run-tests sets it)")
    return (f"real-component tier: required ({requirements.ENV}: {', '.join(sorted(must))}); "
            "a test needing a missing one fails")


#: markers of the tests that mostly wait for a batch scheduler: under
#: ``-n N --dist loadgroup`` their modules form one lane, run by one worker
#: while the others run the rest (scripts/run-tests)
SCHEDULER_MARKERS = ("slurm", "sge", "oar")


# a wrapper: its part before ``yield`` runs before every plain implementation, whatever their
# order (pytest-xdist's worker reads the groups in its own, and names each test after its group)
@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, marker in FIXTURE_MARKERS.items():
            if fixture in getattr(item, "fixturenames", ()):
                if not item.get_closest_marker(marker):
                    item.add_marker(marker)
                if not item.get_closest_marker("real"):
                    item.add_marker("real")
    if getattr(config.option, "loadgroup", False):        # an xdist worker under --dist loadgroup
        _lanes(items)
    return (yield)


def _lanes(items) -> None:
    """Give every test an xdist group: its module (so a module's fixtures are
    made once, on one worker), or ``schedulers`` for every module with a
    test that needs Slurm, Grid Engine or OAR: those wait on the schedulers
    more than they compute, and run one after the other beside the rest."""
    scheduler_modules = {item.module.__name__ for item in items
                         if any(item.get_closest_marker(m) for m in SCHEDULER_MARKERS)}
    for item in items:
        module = item.module.__name__
        item.add_marker(pytest.mark.xdist_group("schedulers" if module in scheduler_modules else module))


def _is_real(item) -> bool:
    return any(item.get_closest_marker(m) for m in REAL_MARKERS)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Safety net under GRIDRPC_REQUIRE_REAL: a real-component test may not
    skip (whatever skipped it: a skip that bypasses tests/requirements.py, an
    importorskip...), except opt-in measurements (requirements.opt_in)."""
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or hasattr(report, "wasxfail") or not requirements.strict() or not _is_real(item):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if requirements.OPT_IN_PREFIX in reason:
        return
    component = requirements.component_of(reason)
    if component is not None and component not in requirements.required():
        return          # GRIDRPC_REQUIRE_REAL lists some components, not this one
    report.outcome = "failed"
    report.longrepr = (f"real-component test skipped while {requirements.ENV} is set: {reason}\n"
                       "Route the skip through tests/requirements.py require(...) or make the component "
                       f"available ({requirements.INSTALL}).")


@pytest.fixture(scope="session", autouse=True)
def _ctrl_c_raises():
    """Python's own Ctrl-C handler for the session: the tests that press
    Ctrl-C (a real SIGINT) expect KeyboardInterrupt, as a user at a terminal
    gets it, also when the suite was started as a background job of a shell,
    which ignores SIGINT in its children."""
    before = signal.getsignal(signal.SIGINT)
    if before is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture(scope="module")
def tree():
    """An in-process tree: MA -> 2 LAs -> 2 SeDs each, example services, HTTP on."""
    with LocalTree(las=2, seds_per_la=2) as t:
        yield t


@pytest.fixture
def proc_tree(tmp_path):
    from tests.proc_tree import ProcTree
    with ProcTree(tmp_path) as pt:
        yield pt


@pytest.fixture
def secure_site(tmp_path):
    """MA -> sed-1 (example services) as processes under CURVE, with element
    and user keys (tests/security_site.py), stopped after the test."""
    from tests.security_site import Site
    s = Site(tmp_path, True)
    try:
        yield s
    finally:
        s.close()
