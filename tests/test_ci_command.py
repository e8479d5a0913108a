"""CI runs exactly the README's test command, and that command installs the
Debian packages of every real component the tests need (a fresh machine has
no Slurm, munge, sshd, Grid Engine, OAR or SimGrid)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: the packages each component of tests/requirements.py comes from
PACKAGES = {
    "slurm": {"slurmctld", "slurmd", "slurm-client", "munge"},
    "sge": {"gridengine-master", "gridengine-exec", "gridengine-client", "gridengine-common"},
    "oar": {"oar-server", "oar-server-pgsql", "oar-node", "oar-user", "oar-user-pgsql", "postgresql"},
    "sshd": {"openssh-server", "openssh-client"},
    "netns": {"iproute2", "util-linux", "mount"},
    "chromium": {"chromium"},
    "processes": {"procps"},
    "simgrid": {"python3-simgrid"},
}


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    section = readme.split("Test (installs", 1)[1]
    command = re.search(r"```sh\n(.+?)\n```", section, re.S).group(1).strip()
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(rf"^exec {re.escape(command)}$", ci, re.M), (command, ci)


def test_the_test_command_installs_every_component():
    run_tests = (REPO / "scripts" / "run-tests").read_text()
    assert "scripts/install-test-deps" in run_tests
    script = (REPO / "scripts" / "install-test-deps").read_text()
    listed = set(re.search(r"PACKAGES=\((.+?)\)", script, re.S).group(1).split())
    missing = {c: sorted(p - listed) for c, p in PACKAGES.items() if p - listed}
    assert not missing, missing


def test_a_module_runs_whole_on_one_lane(request):
    """Under scripts/run-tests' lanes (-n N --dist loadgroup) a test's id
    names its lane (tests/conftest.py), so the module's tests share one
    worker and its fixtures. pytest-xdist writes that name into the test's
    id, which pytest 9.2 no longer reads: its tests would be spread over the
    workers (hence pytest<9.2 in the test extras)."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("only under -n N --dist loadgroup (scripts/run-tests)")
    assert request.node.nodeid.endswith("@tests.test_ci_command"), request.node.nodeid
