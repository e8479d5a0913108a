"""The SimGrid engine of ``gridrpc sim`` (gridrpc/sim/simgrid_engine.py,
simgrid_clock.py, simgrid_cpu.py, simgrid_isolate.py, simgrid_sites.py,
simgrid_site_platform.py, simgrid_site_data.py, simgrid_cli.py), on real SimGrid (Debian's
python3-simgrid, loaded by gridrpc/sim/simgrid_loader.py): the loader, the
engine's clock, CPU and links against figures computed from the platform
file, the built-in and SimGrid engines on a one-host platform (within
10 %), and two federated sites with data moved over the WAN."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.requirements import require

pytestmark = [pytest.mark.real, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parent.parent
ONE_HOST = str(ROOT / "deployments/sim/one-host.xml")
TWO_SITES = str(ROOT / "deployments/sim/two-sites.xml")


@pytest.fixture(autouse=True)
def _simgrid():
    require("simgrid")


def _seconds(text: str) -> float:
    units = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}
    for u in ("ms", "us", "ns", "s"):
        if text.endswith(u):
            return float(text[: -len(u)]) * units[u]
    return float(text)


def _bytes_per_s(text: str) -> float:
    for u, f in (("GBps", 1e9), ("MBps", 1e6), ("kBps", 1e3), ("Bps", 1.0)):
        if text.endswith(u):
            return float(text[: -len(u)]) * f
    return float(text)


def _wan() -> tuple[float, float]:
    link = next(e for e in ET.parse(TWO_SITES).iter("link") if e.get("id") == "wan")
    return _seconds(link.get("latency")), _bytes_per_s(link.get("bandwidth"))


# -- the loader ------------------------------------------------------------------------
def test_loader_imports_only_simgrids_module():
    from gridrpc.sim.simgrid_loader import candidates, load_simgrid
    mod = load_simgrid()
    assert hasattr(mod, "Engine") and hasattr(mod, "Mailbox")
    assert load_simgrid() is mod                                    # once per process
    assert "/usr/lib/python3/dist-packages" not in sys.path         # no whole directory added
    if Path(mod.__file__).parent == Path("/usr/lib/python3/dist-packages"):
        assert Path(mod.__file__) in candidates()


def test_loader_reports_how_to_install(tmp_path):
    code = ("import sys; sys.modules['simgrid'] = None\n"          # `import simgrid` fails as if absent
            "import gridrpc.sim.simgrid_loader as l\n"
            "l.DEBIAN_DIRS = ()\n"
            "try:\n    l.load_simgrid()\nexcept l.SimGridMissing as e:\n    print('MISSING', e)\n"
            "from gridrpc.cli import main\n"
            f"print('RC', main(['sim', 'run', '--seds', '2', '--engine', 'simgrid', '--platform', {ONE_HOST!r}]))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRIDRPC_SIMGRID_MODULE": str(tmp_path / "nope.so")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert "MISSING" in out.stdout, out.stderr
    assert "apt-get install -y python3-simgrid" in out.stdout and "nope.so" in out.stdout
    assert "RC 2" in out.stdout and "apt-get install -y python3-simgrid" in out.stderr     # the CLI says it too


# -- the engine: clock, CPU, links ---------------------------------------------------------
PLATFORM = """<?xml version='1.0'?>
<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">
<platform version="4.1">
  <zone id="z" routing="Full">
    <host id="a" speed="{speed_a}" core="1"/>
    <host id="b" speed="1Gf" core="1"/>
    <link id="l" bandwidth="{bw}Bps" latency="{lat}s"/>
    <route src="a" dst="b"><link_ctn id="l"/></route>
  </zone>
</platform>
"""


def _engine_figures(platform: str, cpu: str = "slice") -> dict:
    """Timers set from outside and inside actors, one job's CPU on host a, one
    message a -> b, two processes' jobs on the one core of host b, measured
    on SimGrid's clock."""
    from gridrpc.sim.model import Costs
    from gridrpc.sim.node import Node
    from gridrpc.sim.simgrid_engine import SgWorld

    got: dict = {"timers": [], "arrived": None}

    class Echo(Node):
        kind = "client"

        def handle(self, src, dst, h, out):
            got["arrived"] = self.world.sim.now
            got["size"] = h.get("size")

    costs = Costs.zero()
    w = SgWorld(platform, placement={"sender": "a", "receiver": "b"}, costs=costs, seed=1, cpu=cpu)
    sender = Echo(w, "sender", w.sg_host("a"))
    receiver = Echo(w, "receiver", w.sg_host("b"))
    w.routes[b"receiver"] = receiver
    w.sim.at(0.3, lambda: got["timers"].append(("c", w.sim.now)))
    w.sim.at(0.1, lambda: (got["timers"].append(("a", w.sim.now)),
                           w.sim.after(0.05, lambda: got["timers"].append(("b", w.sim.now)))))

    class Job:
        cost = 0.5                          # seconds of the calibration host's CPU

        def __init__(self):
            got["job_start"] = w.sim.now

        def complete(self):
            got["job_end"] = w.sim.now
            w.transmit_all(sender, [(b"sender", b"receiver", {"type": "data", "id": "x", "size": 100_000})])
    w.sim.at(1.0, sender.proc.submit, Job)

    def long_job(name):
        class Long:
            cost = 0.2

            def complete(self):
                got.setdefault("ends", {})[name] = w.sim.now
        return Long
    for name in ("p1", "p2"):                  # two processes of host b (one core), a job each at t = 2
        other = Echo(w, name, w.sg_host("b"))
        w.sim.at(2.0, other.proc.submit, long_job(name))
    w.sim.run(until=5.0)
    got["now"] = w.sim.now
    got["busy_a"] = w.hosts["a"].busy_time
    try:
        SgWorld(platform)
    except RuntimeError as exc:
        got["second"] = str(exc)
    return got


@pytest.mark.parametrize("cpu", ["slice", "fair"])
def test_engine_timers_cpu_and_links_follow_the_platform(tmp_path, cpu):
    from gridrpc.sim.node import HEADER_BYTES
    from gridrpc.sim.simgrid_isolate import run_isolated
    speed, bw, lat = 2e9, 1e6, 0.005
    p = tmp_path / "p.xml"
    p.write_text(PLATFORM.format(speed_a=f"{speed:g}f", bw=f"{bw:g}", lat=lat))
    got = run_isolated(_engine_figures, str(p), cpu, timeout=120)
    assert [n for n, _ in got["timers"]] == ["a", "b", "c"]
    assert [t for _, t in got["timers"]] == pytest.approx([0.1, 0.15, 0.3], abs=1e-9)
    assert got["job_start"] == pytest.approx(1.0, abs=1e-9)
    assert got["job_end"] - got["job_start"] == pytest.approx(0.5 * 1e9 / speed, rel=1e-6)  # twice as fast
    assert got["busy_a"] == pytest.approx(0.5 * 1e9 / speed, rel=1e-6)
    wire = HEADER_BYTES + 100_000                  # the data message's payload travels with it
    assert got["arrived"] - got["job_end"] == pytest.approx(lat + wire / bw, rel=1e-3)
    assert got["now"] == pytest.approx(5.0)
    assert "one SimGrid engine per process" in got["second"]
    ends = sorted(got["ends"].values())
    if cpu == "slice":                  # one core: one job, then the other (as the built-in engine)
        assert ends == pytest.approx([2.2, 2.4], abs=1e-9)
    else:                               # SimGrid's sharing: both at half speed
        assert ends == pytest.approx([2.4, 2.4], abs=1e-9)


# -- the two engines on one host ---------------------------------------------------------
@pytest.mark.parametrize("shape,seds", [("flat", 1), ("L2-2", 10)])
def test_one_host_platform_agrees_with_the_builtin_engine(shape, seds):
    """``gridrpc sim run``'s figures on deployments/sim/one-host.xml (one host,
    two cores at the calibration speed) within 10 % of the built-in engine's
    (docs/simulation.md, "The SimGrid engine")."""
    from gridrpc.sim.simgrid_cli import measure_tree
    b = measure_tree("builtin", shape, seds, users=8, rounds=60, seconds=0.5)
    s = measure_tree("simgrid", shape, seds, users=8, rounds=60, seconds=0.5, platform=ONE_HOST)
    assert s["engine"] == "simgrid" and b["engine"] == "builtin"
    for key in ("discovery_median_ms", "calls_per_s"):
        assert s[key] == pytest.approx(b[key], rel=0.10), (key, b[key], s[key])
    assert s["ma_busy"] == pytest.approx(b["ma_busy"], rel=0.15)
    assert set(b) <= set(s)


# -- two sites ---------------------------------------------------------------------------
def test_two_sites_federate_and_move_data_over_the_wan():
    from gridrpc.sim.simgrid_cli import measure_tree
    from gridrpc.sim.simgrid_sites import measure_sites, sites_of
    sites = sites_of(TWO_SITES)
    assert list(sites) == ["lyon", "rennes"] and all(len(h) == 4 for h in sites.values())
    lat, bw = _wan()
    size = 1e6
    out = measure_sites(TWO_SITES, "flat", 4, users=2, rounds=10, seconds=1.0, data_size=size)
    lyon, rennes = out["sites"]["lyon"], out["sites"]["rennes"]
    # solve is offered at lyon only: rennes' discoveries go to lyon's MA and back over the WAN
    assert lyon["forwarded"] == 0 and rennes["forwarded"] > 0
    assert rennes["discovery_median_ms"] >= 2 * lat * 1e3
    assert lyon["discovery_median_ms"] < 2 * lat * 1e3
    assert out["discovery_failures"] == 0 and out["call_failures"] == 0
    assert out["calls_by_service"].get("solve", 0) > 0 and out["calls_by_service"].get("produce", 0) > 0
    # rennes' users keep their data at rennes and solve at lyon: the SeD at lyon fetches it
    assert out["wan_transfers"] > 0
    assert out["wan_bytes"] == pytest.approx(out["wan_transfers"] * size)
    assert out["wan_transfer_median_ms"] >= (lat + size / bw) * 1e3
    assert out["transfer_median_ms"] <= out["wan_transfer_median_ms"]      # the others stay in a site
    one = measure_tree("builtin", "flat", 1, users=1, rounds=5, seconds=0.05)
    assert set(one) - {"shape"} <= set(out)         # the built-in engine's figures, and more


def test_cli_runs_the_simgrid_engine():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = ["--seds", "2", "--rounds", "20", "--users", "2"]
    outs = {}
    for engine in ("builtin", "simgrid"):
        cmd = [sys.executable, "-m", "gridrpc", "sim", "run", *args, "--engine", engine]
        if engine == "simgrid":
            cmd += ["--platform", ONE_HOST, "--seconds", "0.2"]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        outs[engine] = json.loads(r.stdout)
    assert outs["simgrid"]["engine"] == "simgrid" and outs["builtin"]["engine"] == "builtin"
    assert set(outs["builtin"]) <= set(outs["simgrid"])
    assert outs["simgrid"]["discovery_median_ms"] > 0
    r = subprocess.run([sys.executable, "-m", "gridrpc", "sim", "run", *args, "--engine", "simgrid"],
                       capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and "--platform" in (r.stdout + r.stderr)
    # the command: a federated two-site tree, data moved between the sites, sim run's figures
    r = subprocess.run([sys.executable, "-m", "gridrpc", "sim", "run", "--seds", "4", "--users", "2", "--rounds", "10",
                        "--seconds", "1.0", "--engine", "simgrid", "--platform", TWO_SITES],
                       capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    two = json.loads(r.stdout)
    assert set(outs["builtin"]) - {"wall_s"} <= set(two)
    assert set(two["sites"]) == {"lyon", "rennes"} and two["federated_discoveries"] > 0 and two["wan_bytes"] > 0


def _cluster_run(platform: str) -> dict:
    from gridrpc.sim.simgrid_cli import sg_world
    from gridrpc.sim.world import discovery_series, elements_for
    w = sg_world(platform, {"seed": 1})
    w.build(elements_for("L2-2", 8))
    w.wait_registered()
    out = discovery_series(w, rounds=20, warmup=5)
    out["hosts_of"] = {n: node.proc.host.name for n, node in {**w.agents, **w.seds}.items()}
    out["client_host"] = w.clients[0].proc.host.name
    return out


def test_a_cluster_platform_spreads_the_seds_over_its_hosts():
    """One site of several hosts (deployments/sim/cluster-16.xml): agents and
    the client on the first host, SeD processes on the others in turn, every
    discovery crossing the cluster's links (two hops of link + backbone + link)."""
    from gridrpc.sim.simgrid_isolate import run_isolated
    from gridrpc.sim.simgrid_sites import sites_of
    platform = str(ROOT / "deployments/sim/cluster-16.xml")
    hosts = sites_of(platform)["cluster"]
    out = run_isolated(_cluster_run, platform, timeout=300)
    agents = {n: h for n, h in out["hosts_of"].items() if n == "MA" or n.startswith("LA")}
    seds = {n: h for n, h in out["hosts_of"].items() if n not in agents}
    assert set(agents.values()) == {hosts[0]} and out["client_host"] == hosts[0]
    assert len(set(seds.values())) == len(seds) and hosts[0] not in seds.values()
    cl = next(ET.parse(platform).iter("cluster"))
    hop = 2 * _seconds(cl.get("lat")) + _seconds(cl.get("bb_lat"))
    assert out["discoveries"] == 20 and out["discovery_median_ms"] >= 2 * hop * 1e3


def _failing_timer(platform: str) -> None:
    from gridrpc.sim.simgrid_engine import SgWorld
    w = SgWorld(platform)
    w.sim.at(0.1, lambda: 1 / 0)
    w.sim.run(until=1.0)


def test_an_exception_in_an_actor_is_raised_by_run():
    from gridrpc.sim.simgrid_isolate import run_isolated
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        run_isolated(_failing_timer, ONE_HOST, timeout=120)
