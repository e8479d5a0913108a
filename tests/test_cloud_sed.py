"""The cloud SeD against the real EC2 API (moto on loopback).

Every "VM" is real in the sense that matters here: the fake hypervisor
(tests/hypervisor.py) watches the EC2 API and, for each running instance,
runs the instance's *user data script* — the one the cloud SeD wrote — with
``sh``, which starts a real ``python -m gridrpc sed`` process on loopback; it
kills that process (by PID) when the instance is terminated, or when a test
says the VM dies. The MA, the local SeDs and the cloud SeDs run in this
process on a background loop (one test runs the cloud SeD as a
``gridrpc sed --cloud-config`` subprocess).

After every test, the fixture checks the provider's instance list: no
instance may be left pending or running (no leaked VM), and no VM process
may survive.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import gridrpc
from gridrpc.examples import services as ex
from gridrpc.master_agent import MasterAgent
from gridrpc.sed.cloud import LibcloudProvider, VMSpec, parse_cloud_config
from gridrpc.sed.cloud.config import USER_DATA_MARK, render_user_data, vm_command
from gridrpc.sed.cloud.sed import OWNER_TAG, VM_TAG, CloudSeD
from gridrpc.sed.server import SeD
from gridrpc.testing import LoopThread, wait_for
from tests.conftest_cloud import moto_ec2  # noqa: F401
from tests.hypervisor import FakeHypervisor
from tests.proc_tree import free_port

pytestmark = [pytest.mark.cloud, pytest.mark.real, pytest.mark.timeout(90)]

HB = {"hb_interval": 0.5, "hb_timeout": 4.0}
SERVICES = [f"gridrpc.examples.services:{s}" for s in ("add", "sleep", "echo", "wc")]


class CloudWorld:
    """MA (+ local SeDs, cloud SeDs) on a loop thread, a fake hypervisor
    running the VMs' user data, and a leak check at the end."""

    def __init__(self, moto, tmp: Path, *, boot_delay: float = 0.0) -> None:
        self.moto, self.tmp = moto, tmp
        self.provider = LibcloudProvider(endpoint=moto.endpoint, region=moto.region, timeout=5)
        self.procs: dict[str, subprocess.Popen] = {}
        self.hv = FakeHypervisor(LibcloudProvider(endpoint=moto.endpoint, region=moto.region, timeout=5),
                                 self._vm_boots, self._vm_stops, poll_interval=0.1,
                                 boot_delay=boot_delay)
        self.lt = LoopThread("cloud-test-loop")
        self.seds: list[SeD] = []
        self.clients: list[gridrpc.Client] = []
        self.hv.start()
        self.ma = self.lt.run(MasterAgent(name="MA", address="tcp://127.0.0.1:0", **HB).start())

    # -- the VMs ----------------------------------------------------------------------
    def _vm_boots(self, vm):
        ud = self.hv.user_data(vm.id)
        if not ud or USER_DATA_MARK not in ud:
            return None                 # an image that runs nothing of ours
        script = self.tmp / f"{vm.id}.sh"
        script.write_text(ud)
        with open(self.tmp / f"{vm.id}.log", "wb") as log:
            # its own session: the VM's process group holds everything the VM runs
            # (the SeD and its forked workers), and goes down with it
            p = subprocess.Popen(["sh", str(script)], stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True,
                                 env=dict(os.environ, GRIDRPC_PYTHON=sys.executable,
                                          GRIDRPC_HOST="127.0.0.1", GRIDRPC_LOG="INFO"))
        self.procs[vm.id] = p
        return p

    @staticmethod
    def _vm_stops(vm, p):
        if p is not None:
            _power_off(p)               # a VM that powers off (or crashes) does not say goodbye

    def wait_terminated(self, vm_id: str, timeout: float = 15) -> None:
        """Terminations run in the background: wait for the API to say so."""
        wait_for(lambda: self.provider.get(vm_id).state == "terminated", timeout,
                 f"instance {vm_id} terminated")

    def live_instances(self, owner: str | None = None) -> list:
        return [vm for vm in self.provider.list({OWNER_TAG: owner} if owner else {})
                if vm.state not in ("terminated", "shutting-down")]

    # -- the tree -----------------------------------------------------------------------
    def cloud_sed(self, name: str, parent: str | None = None, **cfg) -> CloudSeD:
        settings = {"endpoint": self.moto.endpoint, "region": self.moto.region,
                    "image": self.moto.ami_id, "instance_type": "t3.micro", "services": SERVICES,
                    "boot_time": 1.0, "boot_timeout": 20.0, "billing_minimum": 0,
                    "poll_interval": 0.5, "vm_orphan_timeout": 20, **cfg}
        sed = CloudSeD(name, parent or self.ma.address, config=parse_cloud_config(settings), **HB)
        self.lt.run(sed.start())
        self.seds.append(sed)
        return sed

    def local_sed(self, name: str, services=("add",), price: float | None = None) -> SeD:
        sed = SeD(name, self.ma.address, isolation="inline", **HB)
        for s in services:
            est = (lambda vec, args, p=price: {"price": p}) if price is not None else None
            sed.add_service(s, getattr(ex, s), estimate=est)
        self.lt.run(sed.start())
        self.seds.append(sed)
        return sed

    def wait_registered(self, *names: str, timeout: float = 15) -> None:
        def registered():
            return set(names) <= set(self.lt.call(lambda: list(self.ma.registry.children)))
        wait_for(registered, timeout, f"{names} registered at the MA")

    def client(self, **kw) -> gridrpc.Client:
        c = gridrpc.Client(self.ma.address, **{"timeout": 60, "ping_interval": 0.5,
                                               "ping_timeout": 5.0, **kw})
        self.clients.append(c)
        return c

    def stats(self, sed: CloudSeD) -> dict:
        return self.lt.call(lambda: sed.policy.statistics())

    def wait_stats(self, sed: CloudSeD, pred, timeout: float = 20, what: str = "") -> dict:
        wait_for(lambda: pred(self.stats(sed)), timeout, what or "cloud SeD state")
        return self.stats(sed)

    def close(self) -> None:
        for c in self.clients:
            c.close()
        try:
            for s in reversed(self.seds):
                self.lt.run(s.aclose(), timeout=60)
            self.lt.run(self.ma.aclose())
            # every VM terminated, and so every VM process gone
            try:
                self.hv.wait_for(lambda: not self.hv.started, timeout=15)
            except TimeoutError:
                pass                    # reported just below, with the instances
            leaked = self.live_instances()
            for vm in leaked:           # clean up for the next test, then fail this one
                self.provider.destroy(vm.id)
            assert leaked == [], f"leaked instances: {leaked}"
        finally:
            self.hv.stop()
            for p in self.procs.values():
                _power_off(p)
            self.lt.close()
        # nothing a VM started survives it
        wait_for(lambda: not any(_group_alive(p.pid) for p in self.procs.values()), 10,
                 "every VM's processes gone")

    def max_concurrent_vms(self) -> int:
        up = peak = 0
        for kind, _ in list(self.hv.events):
            if kind == "start":
                up += 1
                peak = max(peak, up)
            elif kind in ("stop", "die"):
                up -= 1
        return peak


def _power_off(p: subprocess.Popen) -> None:
    """Kill the VM's process group (its id is the PID we started), then reap."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(10)


def _group_alive(pgid: int) -> bool:
    """Any live (not zombie) process left in the group?"""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


@pytest.fixture
def world(moto_ec2, tmp_path):  # noqa: F811
    w = CloudWorld(moto_ec2, tmp_path)
    try:
        yield w
    finally:
        w.close()


# =========================================================================== per-call

def test_per_call_each_call_runs_on_its_own_vm_destroyed_after(world, tmp_path):
    cloud = world.cloud_sed("cloud-1", policy="per-call", max_vms=2, price_per_hour=3.6)
    world.wait_registered("cloud-1")
    with world.client() as c:
        [s] = c.discover("add")
        est = s.estimation
        assert s.name == "cloud-1" and est["server_type"] == "cloud"
        assert est["num_vms_running"] == 0 and est["num_vms_booting"] == 0
        # no VM is up: the earliest finish includes a boot
        assert est["est_wait"] == pytest.approx(1.0) and est["boot_time"] == 1.0
        assert est["eft"] >= time.time() + 1.0
        assert est["price"] == pytest.approx(0.002)      # (1 s boot + 1 s run) at 3.6/h

        call = c.submit("add", 2, 3)
        assert call.result(60) == 5
        assert call.server == "cloud-1"
        assert call.timing["vm"]["started"] is not None   # it ran on the VM's SeD
        [vm_id] = world.hv.wait_event("stop", 1, timeout=15)
        world.wait_terminated(vm_id)
        assert world.live_instances() == []
        attr = world.moto.boto3_client().describe_instance_attribute(
            InstanceId=vm_id, Attribute="instanceInitiatedShutdownBehavior")
        assert attr["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
        assert b"SeD cloud-1-" in (tmp_path / f"{vm_id}.log").read_bytes()

        # binary data and files cross the relay unchanged
        a = np.arange(6, dtype=">f8").reshape(2, 3)
        back = c.call("echo", a)
        assert back.dtype == np.dtype(">f8") and np.array_equal(back, a)
        f = tmp_path / "words.txt"
        f.write_text("one two\nthree\n")
        assert c.call("wc", gridrpc.File(f)) == {"lines": 2, "words": 3, "bytes": 14}

        # three calls at once, max_vms 2: never more than two VMs
        calls = [c.submit("sleep", 0.5) for _ in range(3)]
        assert [x.result(60) for x in calls] == [0.5] * 3
    st = world.wait_stats(cloud, lambda s: s["destroyed"] == 6, what="6 VMs destroyed")
    assert st["created"] == 6 and st["dispatched"] == 6 and st["vms"] == []
    assert world.max_concurrent_vms() <= 2
    assert 0 < st["boot_time"] < 20 and st["boot_samples"] == 6   # learnt


def test_cancel_stops_the_call_on_the_vm(world):
    per_call = world.cloud_sed("cloud-1", policy="per-call")
    pool = world.cloud_sed("pool-1", policy="pool", min_vms=1, max_vms=1)
    world.wait_registered("cloud-1", "pool-1")
    world.wait_stats(pool, lambda s: s["num_vms_running"] == 1, what="the pool's VM up")
    with world.client() as c:
        # per-call: the call's VM is destroyed with it
        call = c.submit("sleep", 30, server="cloud-1")
        world.wait_stats(per_call, lambda s: s["calls_on_vms"] == 1, what="call running on a VM")
        assert call.cancel()
        with pytest.raises(gridrpc.CallCancelled):
            call.result(15)
        world.wait_stats(per_call, lambda s: s["destroyed"] == 1 and s["vms"] == [],
                         what="the call's VM destroyed")
        # pool: the VM stays, and its SeD really stopped the call (one slot: the next
        # call would otherwise wait 30 s behind it)
        call = c.submit("sleep", 30, server="pool-1")
        world.wait_stats(pool, lambda s: s["calls_on_vms"] == 1, what="call running on the pool VM")
        assert call.cancel()
        with pytest.raises(gridrpc.CallCancelled):
            call.result(15)
        t0 = time.monotonic()
        assert c.call("add", 1, 2, server="pool-1", timeout=15) == 3
        assert time.monotonic() - t0 < 10
    st = world.stats(pool)
    assert st["created"] == 1 and st["vms"][0]["served"] == 1


# =========================================================================== pool

def test_pool_grows_under_load_and_shrinks_when_idle(world):
    cloud = world.cloud_sed("pool-1", policy="pool", min_vms=1, max_vms=3, idle_timeout=1.5,
                            grow_threshold=0.5, runtime_guess=8.0)
    world.wait_registered("pool-1")
    world.wait_stats(cloud, lambda s: s["num_vms_running"] == 1, what="the min_vms VM up")
    assert world.stats(cloud)["created"] == 1
    with world.client() as c:
        [s] = c.discover("sleep")
        assert s.estimation["est_wait"] == 0 and s.estimation["num_vms_running"] == 1
        calls = [c.submit("sleep", 2.0) for _ in range(3)]
        # each call would wait ~8 s for the busy VM: the pool grows to max_vms
        st = world.wait_stats(cloud, lambda s: s["created"] == 3, what="pool grown to 3 VMs")
        assert [x.result(60) for x in calls] == [2.0] * 3
    assert world.max_concurrent_vms() == 3
    assert world.stats(cloud)["dispatched"] == 3
    # idle for idle_timeout: back to min_vms
    st = world.wait_stats(cloud, lambda s: s["num_vms_running"] == 1 and s["destroyed"] == 2,
                          timeout=15, what="pool shrunk to 1 VM")
    world.hv.wait_event("stop", 2, timeout=10)
    assert len(world.live_instances("pool-1")) == 1


# =========================================================================== failures

def test_vm_that_never_boots_is_terminated_and_the_call_goes_elsewhere(world):
    world.local_sed("local-1", ["add"])
    cloud = world.cloud_sed("cloud-1", policy="per-call", boot_timeout=2.5, retries=0)
    world.hv.never_boot(nth=1)
    world.wait_registered("local-1", "cloud-1")
    cloud_first = {"name": "priority", "params": {"order": [["boot_time", "max"]]}}
    with world.client() as c:
        assert [s.name for s in c.discover("add", aggregator=cloud_first)] == ["cloud-1", "local-1"]
        t0 = time.monotonic()
        call = c.submit("add", 1, 2, aggregator=cloud_first)
        assert call.result(30) == 3
        assert call.server == "local-1"                      # the client failed over
        assert time.monotonic() - t0 >= 2.5
    [vm_id] = world.hv.ids("never_boot")
    world.wait_terminated(vm_id)
    st = world.stats(cloud)
    assert st["boot_timeouts"] == 1 and st["calls_failed"] == 1 and st["vms"] == []


def test_vm_dying_mid_call_is_replaced_and_the_call_retried(world):
    cloud = world.cloud_sed("cloud-1", policy="per-call", retries=1)
    world.wait_registered("cloud-1")
    with world.client() as c:
        call = c.submit("sleep", 2.0)
        world.wait_stats(cloud, lambda s: s["calls_on_vms"] == 1, what="call running on a VM")
        [vm_id] = world.hv.ids("start")
        world.hv.die(vm_id)                                 # the VM crashes mid-call
        assert call.result(60) == 2.0
        assert call.server == "cloud-1"
    st = world.wait_stats(cloud, lambda s: s["destroyed"] == 2, what="both VMs destroyed")
    assert st["vm_failures"] == 1 and st["created"] == 2 and st["calls_failed"] == 0
    world.wait_terminated(vm_id)


def test_non_idempotent_call_whose_vm_dies_mid_call_ends_in_server_lost_and_never_runs_twice(world):
    # retries=3: the cloud SeD would re-run an idempotent call on new VMs three times
    cloud = world.cloud_sed("cloud-1", policy="per-call", retries=3, services=[
        "gridrpc.examples.services:add", "gridrpc.examples.services:sleep,idempotent=false"])
    world.wait_registered("cloud-1")
    with world.client() as c:
        [s] = c.discover("sleep")
        assert s.name == "cloud-1" and s.idempotent is False      # the cloud SeD says so
        call = c.submit("sleep", 5.0)
        world.wait_stats(cloud, lambda s: s["calls_on_vms"] == 1, what="call running on a VM")
        [vm_id] = world.hv.ids("start")
        world.hv.die(vm_id)                                 # the VM crashes mid-call
        with pytest.raises(gridrpc.ServerLost) as info:
            call.result(30)
        assert info.value.server == "cloud-1" and info.value.call_id == call.id
        assert "not idempotent" in str(info.value) and "cloud-1" in str(info.value)
    st = world.wait_stats(cloud, lambda s: s["destroyed"] == 1, what="the dead VM destroyed")
    # it ran on one VM only: no second VM was started for it
    assert st["dispatched"] == 1 and st["created"] == 1 and st["calls_failed"] == 1
    assert st["vm_failures"] == 1 and st["vms"] == []
    # (a retry is decided with the failure, in the same step: its VM would be counted above)
    assert world.hv.ids("start") == [vm_id]
    world.wait_terminated(vm_id)


def test_unknown_image_fails_the_call_within_seconds_naming_the_image(world):
    # moto validates AMIs as AWS does (tests/moto_ec2.py): RunInstances answers InvalidAMIID.NotFound
    bad = "ami-00000000deadbeef1"
    cloud = world.cloud_sed("cloud-1", policy="per-call", image=bad, retries=3)
    world.wait_registered("cloud-1")
    with world.client() as c:
        for _ in range(2):                 # the first call causes the create; the next meets the failure
            t0 = time.monotonic()
            with pytest.raises(gridrpc.NoServerAvailable) as info:
                c.call("add", 1, 2, timeout=60)
            elapsed = time.monotonic() - t0
            print(f"\n[unknown image] call failed after {elapsed:.2f} s: {info.value}")
            assert elapsed < 10
            assert bad in str(info.value) and "cloud-1" in str(info.value)
    st = world.stats(cloud)
    assert st["create_failures"] == 1 and st["created"] == 1 and st["vms"] == []
    assert world.live_instances() == []


def test_unknown_image_call_fails_over_to_another_server(world):
    world.local_sed("local-1", ["add"])
    world.cloud_sed("cloud-1", policy="per-call", image="ami-00000000deadbeef1")
    world.wait_registered("local-1", "cloud-1")
    cloud_first = {"name": "priority", "params": {"order": [["boot_time", "max"]]}}
    with world.client() as c:
        call = c.submit("add", 1, 2, aggregator=cloud_first)
        assert call.result(10) == 3 and call.server == "local-1"


# =========================================================================== cost

def test_least_cost_with_a_cap_chooses_between_local_and_cloud(world):
    world.local_sed("local-1", ["add"], price=0.05)         # on-premise chargeback per call
    cheap = world.cloud_sed("cloud-1", policy="per-call", price_per_hour=3.6)    # ~0.002/call
    world.cloud_sed("cloud-2", policy="per-call", price_per_hour=360.0)          # ~0.2/call
    world.wait_registered("local-1", "cloud-1", "cloud-2")
    with world.client() as c:
        ranked = c.discover("add", aggregator="least_cost")
        assert [s.name for s in ranked] == ["cloud-1", "local-1", "cloud-2"]
        assert ranked[0].estimation["price"] < ranked[1].estimation["price"] < ranked[2].estimation["price"]
        capped = {"name": "least_cost", "params": {"max_cost": 0.1}}
        assert [s.name for s in c.discover("add", aggregator=capped)] == ["cloud-1", "local-1"]
        call = c.submit("add", 4, 5, aggregator=capped)
        assert call.result(60) == 9 and call.server == "cloud-1"
        assert world.stats(cheap)["dispatched"] == 1
        # nothing is cheap enough: no server, and no VM started for nothing
        with pytest.raises(gridrpc.NoServerAvailable):
            c.call("add", 1, 1, aggregator={"name": "least_cost", "params": {"max_cost": 0.0005}})
    world.hv.wait_event("stop", 1, timeout=15)
    assert len(world.hv.ids("seen")) == 1


# =========================================================================== restart

def test_restarted_pool_adopts_its_vms_and_terminates_broken_ones(world):
    listen = f"tcp://127.0.0.1:{free_port()}"
    cmd = vm_command(vm_name="pool-1-old-1", parent=listen, services=SERVICES, orphan_timeout=20, **HB)
    spec = dict(image=world.moto.ami_id, instance_type="t3.micro")
    # a previous pool-1 left two VMs: one whose SeD comes up, one that never will
    old1 = world.provider.create(VMSpec(**spec, name="pool-1-old-1",
                                        user_data=render_user_data(vm_name="pool-1-old-1", owner="pool-1",
                                                                   command=cmd),
                                        tags={OWNER_TAG: "pool-1", VM_TAG: "pool-1-old-1"}))
    old2 = world.provider.create(VMSpec(**spec, name="pool-1-old-2",
                                        tags={OWNER_TAG: "pool-1", VM_TAG: "pool-1-old-2"}))
    other = world.provider.create(VMSpec(**spec, name="not-ours", tags={OWNER_TAG: "someone-else"}))
    world.hv.wait_for(lambda: old1.id in world.hv.started, timeout=15)
    log = world.tmp / f"{old1.id}.log"                      # old-1's SeD is up, waiting for its parent
    wait_for(lambda: b"READY" in log.read_bytes(), 30, "the old VM's SeD serving")
    cloud = world.cloud_sed("pool-1", policy="pool", min_vms=1, max_vms=2, vm_listen=listen,
                            boot_timeout=3.0, orphans="adopt")
    world.wait_registered("pool-1")
    st = world.wait_stats(cloud, lambda s: s["num_vms_running"] == 1 and s["boot_timeouts"] == 1,
                          what="old-1 adopted and old-2 timed out")
    assert st["adopted"] == 2 and st["created"] == 0
    assert [v["name"] for v in st["vms"]] == ["pool-1-old-1"]
    world.wait_terminated(old2.id)
    with world.client() as c:
        assert c.call("add", 20, 22) == 42
    assert world.stats(cloud)["vms"][0]["served"] == 1
    assert world.provider.get(old1.id).state == "running"
    # not ours: untouched (and cleaned up by the test, not the cloud SeD)
    assert world.provider.get(other.id).state == "running"
    world.provider.destroy(other.id)


def test_cloud_sed_process_from_a_config_file_terminates_its_vms_on_sigterm(world, tmp_path):
    orphan = world.provider.create(VMSpec(image=world.moto.ami_id, instance_type="t3.micro",
                                          name="cloud-cli-old", tags={OWNER_TAG: "cloud-cli"}))
    cfg = tmp_path / "cloud.yaml"
    cfg.write_text(f"""
provider: ec2
endpoint: {world.moto.endpoint}
region: {world.moto.region}
image: {world.moto.ami_id}
instance_type: t3.micro
policy: pool
min_vms: 2
max_vms: 2
orphans: terminate
boot_time: 1
poll_interval: 0.5
services: [gridrpc.examples.services:add]
""")
    ready = tmp_path / "cloud-cli.ready"
    log = open(tmp_path / "cloud-cli.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gridrpc", "sed", "--name", "cloud-cli", "--parent", world.ma.address,
         "--port", "0", "--hb-interval", "0.5", "--hb-timeout", "4", "--ready-file", str(ready),
         "--cloud-config", str(cfg), "--cloud", "price_per_hour=0.5",
         "--service", "gridrpc.examples.services:sleep"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: ready.exists() or proc.poll() is not None, 30, "cloud SeD process ready")
        assert proc.poll() is None, (tmp_path / "cloud-cli.log").read_text()
        assert world.provider.get(orphan.id).state == "terminated"     # found and terminated
        world.wait_registered("cloud-cli")
        world.hv.wait_event("start", 2, timeout=20)
        with world.client() as c:
            [s] = c.discover("sleep")
            assert s.estimation["server_type"] == "cloud" and s.estimation["price_per_hour"] == 0.5
            assert c.call("add", 1, 2) == 3
        assert len(world.live_instances("cloud-cli")) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert world.live_instances("cloud-cli") == []
        world.hv.wait_event("stop", 2, timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
    info = json.loads(ready.read_text())
    assert info["name"] == "cloud-cli"
