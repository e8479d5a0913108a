"""The cloud SeD's pure parts: the VM policy (per-call and pool), its
estimation (price, boot time, eft), the configuration and user data, and the
``kind: cloud`` deployment entry turned into ``gridrpc sed`` arguments.
No sockets, no clock, no moto."""
from __future__ import annotations

import subprocess

import pytest

from gridrpc.errors import ConfigError
from gridrpc.sed.cloud.config import (USER_DATA_MARK, CloudConfig, cloud_cli_args,
                                      parse_cloud_config, render_user_data, vm_command)
from gridrpc.sed.cloud.policy import CreateVM, DestroyVM, Dispatch, FailCall, PoolConfig, VMPool


def kinds(actions):
    return [type(a).__name__ for a in actions]


def only(actions, cls):
    return [a for a in actions if isinstance(a, cls)]


def per_call(**kw) -> VMPool:
    return VMPool(PoolConfig(policy="per-call", **{"max_vms": 2, "boot_time": 10.0, **kw}))


def pool(**kw) -> VMPool:
    return VMPool(PoolConfig(policy="pool", **{"min_vms": 1, "max_vms": 3, "boot_time": 10.0,
                                               "idle_timeout": 60.0, **kw}))


def boot(p: VMPool, name: str, now: float, vm_id: str | None = None) -> list:
    """create + register one VM; returns the actions of the registration."""
    p.vm_created(name, vm_id or f"i-{name}", now)
    return p.vm_registered(name, f"tcp://10.0.0.1:{len(name)}", now)


# =========================================================================== per-call

def test_per_call_one_fresh_vm_per_call_destroyed_after():
    p = per_call()
    assert p.start(0) == []
    acts = p.submit("c1", 0, tcomp=5)
    assert acts == [CreateVM("vm-1")]
    assert p.vm_created("vm-1", "i-1", 1) == []
    assert p.vm_registered("vm-1", "tcp://a", 12) == [Dispatch("c1", "vm-1")]
    assert p.boot_time == pytest.approx(12)              # first sample replaces the prior
    assert p.counts()["calls_on_vms"] == 1
    assert p.call_done("c1", 20) == [DestroyVM("vm-1", "i-1", "call done")]
    assert p.vms == {} and p.calls == {}
    # the next call gets a new VM, never the old one
    assert p.submit("c2", 21) == [CreateVM("vm-2")]
    boot(p, "vm-2", 25)
    assert p.boot_time == pytest.approx(0.7 * 12 + 0.3 * 4)   # EWMA


def test_per_call_respects_max_vms_and_replaces_finished_vms():
    p = per_call(max_vms=2)
    assert kinds(p.submit("a", 0) + p.submit("b", 0) + p.submit("c", 0)) == ["CreateVM", "CreateVM"]
    assert list(p.pending) == ["a", "b", "c"]
    assert boot(p, "vm-1", 5) == [Dispatch("a", "vm-1")]
    assert boot(p, "vm-2", 5) == [Dispatch("b", "vm-2")]
    acts = p.call_done("a", 9)
    assert acts == [DestroyVM("vm-1", "i-vm-1", "call done"), CreateVM("vm-3")]
    assert boot(p, "vm-3", 12) == [Dispatch("c", "vm-3")]


def test_per_call_cancel_while_booting_destroys_the_vm():
    p = per_call()
    p.submit("a", 0)
    # cancelled before the create request even returned: destroyed once it has an id
    assert p.cancel("a", 1) == []
    assert p.vms["vm-1"].state == "doomed"
    assert p.vm_created("vm-1", "i-1", 2) == [DestroyVM("vm-1", "i-1", "no longer needed")]
    assert p.vms == {}
    # cancelled while booting: destroyed at once
    p.submit("b", 3)
    p.vm_created("vm-2", "i-2", 4)
    assert p.cancel("b", 5) == [DestroyVM("vm-2", "i-2", "its call no longer needs it")]
    # cancelled while running on its VM: the VM goes too
    p.submit("c", 6)
    boot(p, "vm-3", 8)
    assert p.cancel("c", 9) == [DestroyVM("vm-3", "i-vm-3", "call cancelled")]
    assert p.vms == {} and not p.pending


def test_per_call_vm_booted_for_a_cancelled_call_serves_the_next_one():
    p = per_call(max_vms=1)
    p.submit("a", 0)
    p.submit("b", 0)                     # waits: max_vms reached
    p.vm_created("vm-1", "i-1", 1)
    assert p.cancel("a", 2) == []       # b claims the booting VM instead
    assert p.vms["vm-1"].claim == "b"
    assert p.vm_registered("vm-1", "tcp://x", 3) == [Dispatch("b", "vm-1")]


def test_boot_timeout_retries_then_fails_the_call():
    p = per_call(boot_timeout=30, retries=1)
    p.submit("a", 0)
    p.vm_created("vm-1", "i-1", 1)
    assert p.next_wakeup(1) == 30
    assert p.tick(29) == []
    acts = p.tick(30)
    assert acts == [DestroyVM("vm-1", "i-1", "its SeD did not register within 30 s"), CreateVM("vm-2")]
    p.vm_created("vm-2", "i-2", 31)
    acts = p.tick(60)
    assert kinds(acts) == ["DestroyVM", "FailCall"]
    assert "did not boot within 30 s" in acts[1].message and "after 2 VM failures" in acts[1].message
    assert p.calls == {} and p.vms == {} and p.stats["boot_timeouts"] == 2


def test_vm_failure_mid_call_retries_on_a_new_vm_or_fails():
    p = per_call(retries=1)
    p.submit("a", 0)
    boot(p, "vm-1", 5)
    acts = p.call_failed("a", 7, "VM vm-1 stopped answering")
    assert acts == [DestroyVM("vm-1", "i-vm-1", "failed while running a"), CreateVM("vm-2")]
    assert boot(p, "vm-2", 9) == [Dispatch("a", "vm-2")]
    # the lost-VM notification may come first: the call is then reported by its relay
    assert p.vm_lost("vm-2", 10, "missed its heartbeats") == [
        DestroyVM("vm-2", "i-vm-2", "missed its heartbeats")]
    acts = p.call_failed("a", 10, "VM vm-2 is gone")
    assert acts == [FailCall("a", "VM vm-2 is gone (after 2 VM failures)")]
    assert p.vms == {} and p.calls == {}


def test_create_failures_back_off_and_permanent_ones_fail_at_once():
    p = per_call(retries=3)
    p.submit("a", 0)
    acts = p.vm_create_failed("vm-1", "RequestLimitExceeded", 1)
    assert acts == []                                    # no VM in a tight loop
    assert p.next_wakeup(1) == pytest.approx(6)          # 5 s back-off
    assert p.tick(6) == [CreateVM("vm-2")]
    p.vm_create_failed("vm-2", "RequestLimitExceeded", 7)
    assert p.next_wakeup(7) == pytest.approx(17)          # doubled
    acts = p.tick(17)
    assert acts == [CreateVM("vm-3")]
    acts = p.vm_create_failed("vm-3", "unknown image ami-x", 18, permanent=True)
    assert acts == [FailCall("a", "cannot create a VM: unknown image ami-x", kind="unavailable")]


def test_after_a_permanent_create_failure_calls_fail_at_once_until_the_back_off_ends():
    p = per_call(retries=3)
    assert p.submit("a", 0) == [CreateVM("vm-1")]
    acts = p.vm_create_failed("vm-1", "unknown image ami-x", 1, permanent=True)
    assert acts == [FailCall("a", "cannot create a VM: unknown image ami-x", kind="unavailable")]
    # during the back-off (5 s): no waiting for a create that cannot succeed
    assert p.submit("b", 2) == [FailCall("b", "cannot create a VM: unknown image ami-x", kind="unavailable")]
    assert p.calls == {} and not p.pending and p.stats["calls_failed"] == 2
    # afterwards one create is tried again (the image may exist now)
    assert p.submit("c", 6) == [CreateVM("vm-2")]
    p.vm_created("vm-2", "i-2", 7)
    assert p.vm_registered("vm-2", "tcp://a", 8) == [Dispatch("c", "vm-2")]


def test_a_non_idempotent_call_is_never_retried_once_sent_to_a_vm():
    p = per_call(retries=3)
    p.submit("a", 0, idempotent=False)
    assert boot(p, "vm-1", 5) == [Dispatch("a", "vm-1")]
    acts = p.call_failed("a", 7, "VM vm-1 stopped answering")
    assert kinds(acts) == ["DestroyVM", "FailCall"]          # no CreateVM: not run again
    fail = acts[1]
    assert fail.kind == "server_lost" and fail.call_id == "a"
    assert "vm-1" in fail.message and "not idempotent" in fail.message
    assert p.calls == {} and p.vms == {} and p.stats["dispatched"] == 1
    # an idempotent call in the same situation is retried
    p.submit("b", 8)
    boot(p, "vm-2", 9)
    assert kinds(p.call_failed("b", 10, "VM vm-2 died")) == ["DestroyVM", "CreateVM"]


def test_a_non_idempotent_call_whose_vm_failed_before_it_was_sent_is_retried():
    # its VM never booted, or was gone before the relay sent anything: it never ran
    p = per_call(retries=1, boot_timeout=30)
    p.submit("a", 0, idempotent=False)
    p.vm_created("vm-1", "i-1", 1)
    assert kinds(p.tick(30)) == ["DestroyVM", "CreateVM"]
    assert boot(p, "vm-2", 31) == [Dispatch("a", "vm-2")]
    acts = p.call_failed("a", 32, "VM vm-2 is gone", sent=False)
    assert kinds(acts) == ["DestroyVM", "FailCall"] and acts[1].kind == "communication"


def test_a_vm_that_never_registers_and_no_call_just_goes():
    p = pool(min_vms=1, boot_timeout=20)
    assert p.start(0) == [CreateVM("vm-1")]
    p.vm_created("vm-1", "i-1", 1)
    acts = p.tick(20)
    # destroyed, and the pool (min 1) asks for a replacement
    assert acts == [DestroyVM("vm-1", "i-1", "its SeD did not register within 20 s"), CreateVM("vm-2")]


# =========================================================================== pool

def test_pool_keeps_min_grows_under_load_and_shrinks_when_idle():
    p = pool(min_vms=1, max_vms=3, idle_timeout=60, grow_threshold=None)
    assert p.start(0) == [CreateVM("vm-1")]
    boot(p, "vm-1", 4)                                   # learnt boot time: 4 s
    assert p.submit("a", 5, tcomp=30) == [Dispatch("a", "vm-1")]
    # b would wait ~30 s for vm-1, booting takes ~4 s: grow
    assert p.submit("b", 6, tcomp=30) == [CreateVM("vm-2")]
    # c: vm-2 will serve b, c would wait for vm-1 -> grow again
    assert p.submit("c", 6, tcomp=30) == [CreateVM("vm-3")]
    # d: max_vms reached, it waits
    assert p.submit("d", 6, tcomp=30) == []
    assert boot(p, "vm-2", 10) == [Dispatch("b", "vm-2")]
    assert boot(p, "vm-3", 10) == [Dispatch("c", "vm-3")]
    assert p.call_done("a", 35) == [Dispatch("d", "vm-1")]
    for cid in "bcd":
        p.call_done(cid, 40)
    # idle: shrink to min_vms after idle_timeout, longest idle first
    assert p.next_wakeup(40) == pytest.approx(100)
    assert p.tick(99) == []
    acts = p.tick(100)
    assert kinds(acts) == ["DestroyVM", "DestroyVM"]
    assert {a.name for a in acts} == {"vm-1", "vm-2", "vm-3"} - {next(iter(p.vms))}
    assert len(p.vms) == 1 and p.tick(1000) == []        # never below min_vms


def test_pool_does_not_grow_for_short_calls():
    p = pool(min_vms=1, max_vms=3, vm_slots=2)
    p.start(0)
    boot(p, "vm-1", 10)                                  # boot time 10 s
    assert kinds(p.submit("a", 11, tcomp=1)) == ["Dispatch"]
    assert kinds(p.submit("b", 11, tcomp=1)) == ["Dispatch"]       # second slot
    # c waits ~1 s for a slot: cheaper than a 10 s boot
    assert p.submit("c", 11, tcomp=1) == []
    assert p.call_done("a", 12) == [Dispatch("c", "vm-1")]


def test_pool_grow_threshold_is_configurable():
    p = pool(min_vms=1, max_vms=2, grow_threshold=0.0, boot_time=1.0)
    p.start(0)
    boot(p, "vm-1", 1)
    p.submit("a", 2, tcomp=5)
    assert p.submit("b", 2, tcomp=5) == [CreateVM("vm-2")]
    # a booting VM already covers b: no third VM for the same wait
    assert p.submit("c", 2, tcomp=0.1) == []


def test_pool_adopts_vms_of_a_previous_run():
    p = pool(min_vms=1, boot_timeout=30)
    p.adopt("old-1", "i-old1", 0)
    p.adopt("old-2", "i-old2", 0)
    assert p.start(0) == []                              # min_vms covered by the adopted ones
    assert p.vm_registered("old-1", "tcp://x", 3) == []
    assert p.boot_samples == 0                           # not a boot we measured
    assert p.submit("a", 4) == [Dispatch("a", "old-1")]
    acts = p.tick(30)
    assert acts == [DestroyVM("old-2", "i-old2", "its SeD did not register within 30 s")]


def test_shutdown_destroys_everything():
    p = pool(min_vms=2)
    p.start(0)
    p.vm_created("vm-1", "i-1", 1)
    acts = p.shutdown()
    assert {(a.name, a.vm_id) for a in acts} == {("vm-1", "i-1"), ("vm-2", None)}
    assert p.vms == {} and p.next_wakeup(2) is None
    # a create that returns after the shutdown is destroyed at once
    assert p.vm_created("vm-2", "i-2", 3) == [DestroyVM("vm-2", "i-2", "no longer needed")]


# =========================================================================== estimation

def test_estimate_includes_boot_time_when_no_vm_is_free():
    p = pool(min_vms=1, max_vms=1, boot_time=20)
    p.start(0)
    e = p.estimate(0, 5)
    assert e["est_wait"] == pytest.approx(20) and e["eft"] == pytest.approx(25)
    assert e["num_vms_booting"] == 1 and e["num_vms_running"] == 0 and e["boot_time"] == 20
    boot(p, "vm-1", 20)
    e = p.estimate(20, 5)
    assert e["est_wait"] == 0 and e["num_vms_running"] == 1
    p.submit("a", 20, tcomp=5)
    assert p.estimate(21, 5)["est_wait"] == pytest.approx(4)   # wait for vm-1 (max_vms 1)
    # calls queued in the SeD and not yet in the pool count too
    assert p.estimate(21, 5, ahead=[5])["est_wait"] == pytest.approx(9)


def test_estimate_per_call_always_pays_a_boot():
    p = per_call(max_vms=1, boot_time=10)
    assert p.estimate(0, 2)["est_wait"] == pytest.approx(10)
    p.submit("a", 0, tcomp=2)
    boot(p, "vm-1", 10)
    # at max_vms: wait for a's end (12), then a new VM's boot (22)
    assert p.estimate(10, 2)["est_wait"] == pytest.approx(12)


def test_price_per_call_and_pool():
    pc = per_call(price_per_hour=3.6, boot_time=30, billing_minimum=60)
    assert pc.price(10) == pytest.approx(0.06)               # boot + run < 60 s minimum
    pc = per_call(price_per_hour=3.6, boot_time=30, billing_minimum=0)
    assert pc.price(10) == pytest.approx(0.04)               # 40 s at 0.001/s
    pl = pool(price_per_hour=3.6, vm_slots=2)
    assert pl.price(10) == pytest.approx(0.005)              # the run only, shared by 2 slots
    assert pl.price(0) > 0                                   # never free
    assert pool(price_per_hour=0).price(10) == 0


# =========================================================================== config

BASE = {"image": "ami-12345678", "instance_type": "t3.micro"}


def test_parse_cloud_config_defaults_and_types():
    c = parse_cloud_config({**BASE, "policy": "pool", "min_vms": "1", "max_vms": 3,
                            "price_per_hour": "0.0104", "services": "pkg.mod:f",
                            "vm_args": "--queue fcfs", "tags": {"team": 7}})
    assert isinstance(c, CloudConfig)
    assert (c.policy, c.min_vms, c.max_vms, c.price_per_hour) == ("pool", 1, 3, 0.0104)
    assert c.services == ("pkg.mod:f",) and c.vm_args == ("--queue", "fcfs")
    assert c.tags == {"team": "7"} and c.capacity == 3
    assert c.provider_config() == {"provider": "ec2", "region": None, "endpoint": None,
                                   "profile": None, "timeout": 10.0}


@pytest.mark.parametrize("data, message", [
    ({"instance_type": "t3.micro"}, "'image'"),
    ({**BASE, "policy": "sometimes"}, "policy must be one of"),
    ({**BASE, "max_vms": 0}, "max_vms must be >= 1"),
    ({**BASE, "policy": "pool", "min_vms": 5, "max_vms": 2}, "min_vms must be between"),
    ({**BASE, "min_vms": 1}, "min_vms applies to policy 'pool'"),
    ({**BASE, "boot_timeout": 0}, "boot_timeout must be > 0"),
    ({**BASE, "max_vms": "many"}, "max_vms must be a whole number"),
    ({**BASE, "price_per_hour": "cheap"}, "price_per_hour must be a number"),
    ({**BASE, "flavour": "small"}, "unknown cloud keys flavour"),
    ({**BASE, "aws_secret_access_key": "x"}, "credentials do not belong"),
    ({**BASE, "vm_listen": "0.0.0.0:7000"}, "vm_listen must be an address"),
    ({**BASE, "provider": "azure"}, "provider: unknown cloud provider 'azure'; known: ec2, openstack"),
    ({**BASE, "provider": "openstack"}, "'openstack' is not implemented yet"),
    ({**BASE, "services": ["m:f,idempotent=perhaps"]}, "services: .*unknown option"),
])
def test_parse_cloud_config_errors(data, message):
    with pytest.raises(ConfigError, match=message):
        parse_cloud_config(data)


def test_key_name_is_not_a_secret():
    assert parse_cloud_config({**BASE, "key_name": "my-keypair"}).key_name == "my-keypair"


def test_user_data_starts_a_sed_registering_with_the_cloud_sed(tmp_path):
    cmd = vm_command(vm_name="c-vm-1", parent="tcp://10.0.0.5:7000",
                     services=["gridrpc.examples.services:add", "x=pkg.mod:f g"],
                     hb_interval=1, hb_timeout=3, orphan_timeout=120, max_concurrent=2,
                     extra_args=["--queue", "fcfs"])
    ud = render_user_data(vm_name="c-vm-1", owner="c", command=cmd, python="/opt/venv/bin/python",
                          setup="pip install gridrpc")
    assert ud.startswith("#!/bin/sh\n") and USER_DATA_MARK in ud
    assert "exec \"$PY\" -m gridrpc sed --name c-vm-1 --parent tcp://10.0.0.5:7000" in ud
    assert "'x=pkg.mod:f g'" in ud and "--max-concurrent 2" in ud and "pip install gridrpc" in ud
    # run it with a fake interpreter that prints its arguments
    fake = tmp_path / "py"
    fake.write_text("#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; done\n")
    fake.chmod(0o755)
    script = tmp_path / "ud.sh"
    script.write_text(ud.replace("pip install gridrpc", "true"))
    out = subprocess.run(["sh", str(script)], env={"PATH": "/usr/bin:/bin", "GRIDRPC_PYTHON": str(fake),
                                                   "GRIDRPC_HOST": "10.0.0.9"},
                         capture_output=True, text=True, timeout=10, check=True).stdout.splitlines()
    assert out[:3] == ["-m", "gridrpc", "sed"]
    assert out[out.index("--host") + 1] == "10.0.0.9"
    assert out[out.index("--service", out.index("--service") + 1) + 1] == "x=pkg.mod:f g"
    # with a teardown the SeD does not replace the shell, the teardown runs after it
    ud2 = render_user_data(vm_name="v", owner="c", command=cmd, teardown="shutdown -h now")
    assert "exec " not in ud2 and ud2.rstrip().endswith("shutdown -h now")


# =========================================================================== deployment

def test_deployment_cloud_entry_becomes_sed_arguments(tmp_path):
    from gridrpc.cli import build_parser
    from gridrpc.deploy import spec as dspec
    from gridrpc.deploy.runner import Deployment
    from gridrpc.sed.cloud.cli import cloud_settings
    data = {"master_agent": {"name": "MA", "port": 5555},
            "seds": [{"name": "cloud-1", "parent": "MA", "kind": "cloud", "provider": "ec2",
                      "region": "eu-west-1", "image": "ami-0abc", "instance_type": "t3.small",
                      "key_name": "grid", "security_group": "gridrpc", "policy": "pool",
                      "min_vms": 1, "max_vms": 4, "idle_timeout": 600, "price_per_hour": 0.0208,
                      "boot_timeout": 300, "setup": "cd /opt\nsource venv/bin/activate",
                      "services": ["gridrpc.examples.services:add"]}]}
    spec = dspec.parse(data)
    e = spec.element("cloud-1")
    dep = Deployment(spec, state_dir=tmp_path)
    dep.addresses["MA"] = "tcp://127.0.0.1:5555"
    cmd = dep.command(e)
    assert cmd[1:4] == ["-m", "gridrpc", "sed"]
    a = build_parser().parse_args(cmd[3:])
    cfg = parse_cloud_config(cloud_settings(a))
    assert (cfg.region, cfg.image, cfg.instance_type, cfg.key_name, cfg.security_group) == (
        "eu-west-1", "ami-0abc", "t3.small", "grid", "gridrpc")
    assert (cfg.policy, cfg.min_vms, cfg.max_vms, cfg.idle_timeout, cfg.boot_timeout) == (
        "pool", 1, 4, 600, 300)
    assert cfg.price_per_hour == 0.0208 and cfg.setup == "cd /opt\nsource venv/bin/activate"
    assert cfg.services == ("gridrpc.examples.services:add",)
    # bad cloud entries are refused when the file is read, before anything starts
    bad = {**data, "seds": [dict(data["seds"][0], policy="whenever")]}
    with pytest.raises(ConfigError, match="SeD cloud-1: policy must be one of"):
        dspec.parse(bad)
    bad = {**data, "seds": [dict(data["seds"][0], secret_key="x")]}
    with pytest.raises(ConfigError, match="credentials do not belong"):
        dspec.parse(bad)
    # the cloud keys are only accepted on kind: cloud entries
    plain = {**data, "seds": [{"name": "s", "parent": "MA", "examples": True, "max_vms": 3}]}
    with pytest.raises(ConfigError, match="unknown keys max_vms"):
        dspec.parse(plain)


def test_cloud_cli_args_round_trip():
    args = cloud_cli_args({"image": "ami-1", "vm_args": ("--queue", "fcfs"), "endpoint": None,
                           "services": ["a:b"], "name": "ignored"})
    assert args == ["--cloud", "endpoint=null", "--cloud", "image=\"ami-1\"",
                    "--cloud", "vm_args=[\"--queue\", \"fcfs\"]"]


def test_shipped_cloud_deployment_file_is_valid():
    from pathlib import Path

    from gridrpc.deploy import spec as dspec
    path = Path(__file__).resolve().parents[1] / "deployments" / "cloud.yaml"
    spec = dspec.load(path)
    clouds = [e for e in spec.elements if e.options.get("kind") == "cloud"]
    assert [e.name for e in clouds] == ["ec2-per-call", "ec2-pool"]
    pool_cfg = parse_cloud_config({k: v for k, v in clouds[1].options.items()
                                   if k not in ("kind",)})
    assert (pool_cfg.policy, pool_cfg.min_vms, pool_cfg.max_vms, pool_cfg.capacity) == ("pool", 1, 6, 12)
