"""The cloud provider layer (gridrpc.sed.cloud) and the test fixtures it relies
on: moto's EC2 server (tests/moto_ec2.py) and the fake hypervisor
(tests/hypervisor.py).

Pure tests (pricing, credentials lookup, factory, hypervisor over an in-memory
cloud) run everywhere; the ones against moto are marked ``cloud`` and ``real``.
"""
from __future__ import annotations

import base64
import datetime as dt
import os
import socket
import threading
import time

import pytest

from gridrpc.errors import GridRPCError
from gridrpc.sed.cloud import (
    VM,
    CloudAuthError,
    CloudError,
    CloudProvider,
    CloudTimeout,
    CloudUnreachable,
    Credentials,
    LibcloudProvider,
    UnknownImage,
    VMSpec,
    make_provider,
    price_per_call,
    resolve_aws_credentials,
)
from tests.conftest_cloud import moto_ec2  # noqa: F401
from tests.hypervisor import FakeHypervisor
from tests.moto_ec2 import MotoEC2

OWNER = "gridrpc:owner"
FAKE = Credentials(access_key="testing", secret_key="testing", source="test")


def cloud(cls):
    """Mark a test class as needing moto (selected with ``-m cloud``)."""
    return pytest.mark.real(pytest.mark.cloud(cls))


# =========================================================================== pure

def test_price_per_call():
    assert price_per_call(3600, 0.5) == pytest.approx(0.5)
    assert price_per_call(1.2, 3.6) == pytest.approx(0.002)          # 2 s billed
    assert price_per_call(0, 3.6) == 0
    assert price_per_call(0.3, 3600, 0.1) == pytest.approx(0.3)      # no float over-billing
    assert price_per_call(10, 3.6, 3600) == pytest.approx(3.6)       # hourly cloud
    assert price_per_call(3601, 1.0, 3600) == pytest.approx(2.0)
    assert price_per_call(5, 3.6, minimum_s=60) == pytest.approx(0.06)
    for bad in [(-1, 1.0), (1, -1.0)]:
        with pytest.raises(ValueError):
            price_per_call(*bad)
    with pytest.raises(ValueError):
        price_per_call(1, 1.0, 0)


def test_credentials_from_env_win_over_file(tmp_path):
    f = tmp_path / "credentials"
    f.write_text("[default]\naws_access_key_id = FILEKEY\naws_secret_access_key = FILESECRET\n")
    env = {"AWS_ACCESS_KEY_ID": "ENVKEY", "AWS_SECRET_ACCESS_KEY": "ENVSECRET",
           "AWS_SESSION_TOKEN": "TOK", "AWS_SHARED_CREDENTIALS_FILE": str(f)}
    c = resolve_aws_credentials(environ=env)
    assert (c.access_key, c.secret_key, c.token) == ("ENVKEY", "ENVSECRET", "TOK")
    assert "ENVSECRET" not in repr(c) and "TOK" not in repr(c)
    # an explicit profile means the file
    c = resolve_aws_credentials(profile="default", environ=env)
    assert (c.access_key, c.secret_key, c.token) == ("FILEKEY", "FILESECRET", None)


def test_credentials_from_file_profiles(tmp_path):
    f = tmp_path / "credentials"
    f.write_text("[default]\naws_access_key_id = D\naws_secret_access_key = DS\n"
                 "[grid]\naws_access_key_id = G\naws_secret_access_key = GS\n"
                 "aws_session_token = GT\n[broken]\naws_access_key_id = B\n")
    env = {"AWS_SHARED_CREDENTIALS_FILE": str(f)}
    assert resolve_aws_credentials(environ=env).access_key == "D"
    assert resolve_aws_credentials(environ={**env, "AWS_PROFILE": "grid"}).token == "GT"
    assert resolve_aws_credentials(profile="grid", environ=env).secret_key == "GS"
    with pytest.raises(CloudAuthError, match=r"\[broken\].*lacks"):
        resolve_aws_credentials(profile="broken", environ=env)
    with pytest.raises(CloudAuthError, match=r"\[nope\]"):
        resolve_aws_credentials(profile="nope", environ=env)


def test_credentials_home_file_and_missing(tmp_path):
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text(
        "[default]\naws_access_key_id = H\naws_secret_access_key = HS\n")
    assert resolve_aws_credentials(environ={"HOME": str(tmp_path)}).access_key == "H"
    with pytest.raises(CloudAuthError, match="AWS_ACCESS_KEY_ID"):
        resolve_aws_credentials(environ={"HOME": str(tmp_path / "empty")})


def test_make_provider_refuses_secrets_and_unknown_providers():
    with pytest.raises(CloudError, match="deployment files.*secret_key"):
        make_provider({"provider": "ec2", "secret_key": "x"})
    with pytest.raises(CloudError, match="aws_access_key_id"):
        make_provider({"aws_access_key_id": "x", "key_name": "mykey"})
    with pytest.raises(CloudError, match="not implemented"):
        make_provider({"provider": "openstack"})
    with pytest.raises(CloudError, match="unknown cloud provider 'gce'"):
        make_provider({"provider": "gce"})
    assert issubclass(CloudError, GridRPCError)
    assert issubclass(CloudTimeout, TimeoutError)


def test_libcloud_provider_setup_errors():
    for bad in ["127.0.0.1:5000", "ftp://h/", "http://h:5000/some/path", "http://h:99999"]:
        with pytest.raises(CloudError, match="bad cloud endpoint"):
            LibcloudProvider(endpoint=bad, credentials=FAKE)
    with pytest.raises(CloudError, match="ec2"):
        LibcloudProvider("openstack", credentials=FAKE)
    p = LibcloudProvider(endpoint="http://127.0.0.1:1", region="eu-west-1", credentials=FAKE)
    assert isinstance(p, CloudProvider)
    assert "eu-west-1" in repr(p) and "testing" not in repr(p)


class MemoryCloud:
    """An in-memory CloudProvider: enough to unit-test the hypervisor."""

    def __init__(self):
        self.vms: dict[str, VM] = {}
        self.fail_next_list = 0
        self._n = 0
        self._lock = threading.Lock()

    def create(self, spec: VMSpec) -> VM:
        with self._lock:
            self._n += 1
            vm = VM(id=f"i-{self._n:04d}", state="running", tags=dict(spec.tags),
                    launched_at=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
                    + dt.timedelta(seconds=self._n))
            self.vms[vm.id] = vm
            return vm

    def list(self, tag_filter):
        with self._lock:
            if self.fail_next_list:
                self.fail_next_list -= 1
                raise CloudUnreachable("simulated outage")
            return [vm for vm in self.vms.values() if vm.state != "terminated"
                    and all(vm.tags.get(k) == v for k, v in tag_filter.items())]

    def get(self, vm_id):
        return self.vms.get(vm_id)

    def destroy(self, vm_id):
        with self._lock:
            if vm_id in self.vms:
                self.vms[vm_id] = VM(id=vm_id, state="terminated")

    def wait_running(self, vm_id, timeout):
        return self.vms[vm_id]

    def user_data(self, vm_id):
        return f"user data of {vm_id}"


def _recorder():
    started, stopped = [], []

    def on_start(vm):
        started.append(vm.id)
        return f"handle-{vm.id}"

    def on_stop(vm, handle):
        stopped.append((vm.id, handle, vm.state))

    return started, stopped, on_start, on_stop


def test_hypervisor_start_stop_on_memory_cloud():
    cloud_ = MemoryCloud()
    assert isinstance(cloud_, CloudProvider)
    started, stopped, on_start, on_stop = _recorder()
    spec = VMSpec(image="ami-x", instance_type="t", tags={OWNER: "me"})
    other = cloud_.create(VMSpec(image="ami-x", instance_type="t", tags={OWNER: "other"}))
    with FakeHypervisor(cloud_, on_start, on_stop, poll_interval=0.02,
                        tag_filter={OWNER: "me"}) as hv:
        a, b = cloud_.create(spec), cloud_.create(spec)
        hv.wait_event("start", 2)
        assert sorted(started) == [a.id, b.id] and other.id not in started
        assert hv.started == {a.id: f"handle-{a.id}", b.id: f"handle-{b.id}"}
        assert hv.user_data(a.id) == f"user data of {a.id}"
        cloud_.destroy(a.id)
        hv.wait_event("stop", 1)
        assert stopped == [(a.id, f"handle-{a.id}", "terminated")]
    # stop() stops what is still started, with its handle
    assert stopped[1] == (b.id, f"handle-{b.id}", "running")
    assert started == [a.id, b.id] and len(stopped) == 2


def test_hypervisor_boot_delay_never_boot_die_and_outage():
    cloud_ = MemoryCloud()
    started, stopped, on_start, on_stop = _recorder()
    spec = VMSpec(image="ami-x", instance_type="t")
    hv = FakeHypervisor(cloud_, on_start, on_stop, poll_interval=0.02, boot_delay=0.3,
                        never_boot_nth=[2])
    with hv:
        t0 = time.monotonic()
        first = cloud_.create(spec)
        second = cloud_.create(spec)
        hv.wait_event("start", 1)
        assert time.monotonic() - t0 >= 0.3
        assert started == [first.id]
        assert hv.ids("never_boot") == [second.id]
        # a VM destroyed during its boot delay is never started
        third = cloud_.create(spec)
        hv.wait_event("seen", 3)
        cloud_.destroy(third.id)
        hv.wait_event("cancel", 1)
        # a listing outage stops nothing
        cloud_.fail_next_list = 3
        hv.wait_event("poll_error", 3)
        assert hv.started.keys() == {first.id}
        # a VM that dies is stopped at once and not restarted
        hv.die(first.id)
        assert stopped == [(first.id, f"handle-{first.id}", "running")]
        hv.never_boot(nth=5)
        fourth, fifth = cloud_.create(spec), cloud_.create(spec)
        hv.wait_event("never_boot", 2)
        hv.wait_event("start", 2)
        assert started == [first.id, fourth.id]
        assert hv.ids("never_boot") == [second.id, fifth.id]
        assert cloud_.get(first.id).state == "running"   # the API still says so
    assert [s[0] for s in stopped] == [first.id, fourth.id]
    assert third.id not in started
    assert ("die", first.id) in hv.events


def test_hypervisor_on_start_failure_is_recorded():
    cloud_ = MemoryCloud()
    stopped = []

    def on_start(vm):
        raise RuntimeError("image broken")

    with FakeHypervisor(cloud_, on_start, lambda vm, h: stopped.append(vm.id),
                        poll_interval=0.02) as hv:
        vm = cloud_.create(VMSpec(image="ami-x", instance_type="t"))
        hv.wait_event("start_failed", 1)
        assert hv.started == {}
    assert stopped == [] and hv.ids("start_failed") == [vm.id]


# =========================================================================== moto

@pytest.fixture
def provider(moto_ec2):  # noqa: F811
    p = LibcloudProvider(endpoint=moto_ec2.endpoint, region=moto_ec2.region, timeout=10)
    yield p
    leaked = [vm.id for vm in p.list({}) if vm.state != "terminated"]
    assert leaked == [], f"instances left running: {leaked}"


def _spec(moto, owner="sed-a", **kw):
    return VMSpec(image=moto.ami_id, instance_type="t3.micro", name=f"{owner}-vm",
                  tags={OWNER: owner, "gridrpc:role": "sed"}, **kw)


@cloud
class TestLibcloudProviderOnMoto:
    def test_create_with_tags_and_user_data(self, moto_ec2, provider):  # noqa: F811
        user_data = "#!/bin/sh\nexec gridrpc sed --parent tcp://10.0.0.1:5555 # é\n"
        vm = provider.create(_spec(moto_ec2, user_data=user_data))
        try:
            assert vm.id.startswith("i-") and vm.state in ("pending", "running")
            assert vm.private_ip and vm.tags[OWNER] == "sed-a"
            assert vm.tags["Name"] == "sed-a-vm"
            assert vm.launched_at is not None and vm.launched_at.tzinfo is not None
            # read back independently of our code
            ec2 = moto_ec2.boto3_client()
            attr = ec2.describe_instance_attribute(InstanceId=vm.id, Attribute="userData")
            assert base64.b64decode(attr["UserData"]["Value"]).decode() == user_data
            desc = ec2.describe_instances(InstanceIds=[vm.id])["Reservations"][0]["Instances"][0]
            tags = {t["Key"]: t["Value"] for t in desc["Tags"]}
            assert tags[OWNER] == "sed-a" and tags["gridrpc:role"] == "sed"
            assert desc["ImageId"] == moto_ec2.ami_id and desc["InstanceType"] == "t3.micro"
            assert provider.user_data(vm.id) == user_data
            got = provider.get(vm.id)
            assert got is not None and got.id == vm.id and got.tags == vm.tags
        finally:
            provider.destroy(vm.id)

    def test_list_only_our_instances(self, moto_ec2, provider):  # noqa: F811
        ours = [provider.create(_spec(moto_ec2, "sed-a")) for _ in range(2)]
        theirs = provider.create(_spec(moto_ec2, "sed-b"))
        untagged = moto_ec2.boto3_client().run_instances(
            ImageId=moto_ec2.ami_id, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
        try:
            listed = provider.list({OWNER: "sed-a"})
            assert sorted(vm.id for vm in listed) == sorted(vm.id for vm in ours)
            assert [vm.id for vm in provider.list({OWNER: "sed-b"})] == [theirs.id]
            assert provider.list({OWNER: "nobody"}) == []
            assert len(provider.list({OWNER: "sed-a", "gridrpc:role": "sed"})) == 2
            assert len(provider.list({})) == 4
        finally:
            for vm_id in [*(vm.id for vm in ours), theirs.id, untagged]:
                provider.destroy(vm_id)

    def test_destroy_is_idempotent(self, moto_ec2, provider):  # noqa: F811
        vm = provider.create(_spec(moto_ec2))
        provider.destroy(vm.id)
        provider.destroy(vm.id)
        provider.destroy("i-0123456789abcdef0")     # never existed
        assert provider.get(vm.id).state == "terminated"
        assert provider.list({OWNER: "sed-a"}) == []
        assert [v.id for v in provider.list({OWNER: "sed-a"}, include_terminated=True)] == [vm.id]
        assert provider.get("i-0123456789abcdef0") is None
        assert provider.user_data("i-0123456789abcdef0") is None

    def test_wait_running(self, moto_ec2, provider):  # noqa: F811
        vm = provider.create(_spec(moto_ec2))
        try:
            running = provider.wait_running(vm.id, timeout=10)
            assert running.state == "running" and running.private_ip == vm.private_ip
        finally:
            provider.destroy(vm.id)
        with pytest.raises(CloudError, match="terminated"):
            provider.wait_running(vm.id, timeout=5)
        with pytest.raises(CloudError, match="does not exist"):
            provider.wait_running("i-0123456789abcdef0", timeout=5)

    def test_unknown_image(self, moto_ec2, provider):  # noqa: F811
        spec = VMSpec(image="ami-00000000deadbeef0", instance_type="t3.micro")
        with pytest.raises(UnknownImage, match="ami-00000000deadbeef0") as info:
            provider.create(spec)
        assert info.value.code == "InvalidAMIID.NotFound"

    def test_make_provider_from_config(self, moto_ec2):  # noqa: F811
        p = make_provider({"provider": "ec2", "endpoint": moto_ec2.endpoint,
                           "region": moto_ec2.region, "timeout": 5, "image": "ignored"})
        assert isinstance(p, CloudProvider) and p.list({}) == []


@cloud
class TestProviderErrors:
    def test_refused_endpoint_fails_fast(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]       # closed again: nobody listens there
        p = LibcloudProvider(endpoint=f"http://127.0.0.1:{port}", credentials=FAKE, timeout=2)
        t0 = time.monotonic()
        with pytest.raises(CloudUnreachable, match="cannot connect"):
            p.list({})
        assert time.monotonic() - t0 < 2

    def test_silent_endpoint_times_out(self):
        with socket.socket() as s:          # accepts connections, never answers
            s.bind(("127.0.0.1", 0))
            s.listen(8)
            p = LibcloudProvider(endpoint=f"http://127.0.0.1:{s.getsockname()[1]}",
                                 credentials=FAKE, timeout=1)
            t0 = time.monotonic()
            with pytest.raises(CloudUnreachable, match="within 1 s"):
                p.create(VMSpec(image="ami-x", instance_type="t3.micro"))
            assert time.monotonic() - t0 < 3

    def test_bad_credentials(self):
        with MotoEC2(auth=True, set_env=False) as moto:
            p = LibcloudProvider(endpoint=moto.endpoint, credentials=FAKE, timeout=10)
            with pytest.raises(CloudAuthError, match="bad credentials") as info:
                p.list({})
            assert info.value.code == "AuthFailure"
            pid = moto.pid
        assert moto.pid is None
        with pytest.raises(ProcessLookupError):   # our server is gone
            os.kill(pid, 0)


@cloud
class TestHypervisorOnMoto:
    def test_start_and_stop_follow_run_and_terminate(self, moto_ec2, provider):  # noqa: F811
        started, stopped, on_start, on_stop = _recorder()
        with FakeHypervisor(moto_ec2.endpoint, on_start, on_stop, poll_interval=0.1,
                            tag_filter={OWNER: "sed-a"}) as hv:
            vm = provider.create(_spec(moto_ec2, user_data="role=sed"))
            other = provider.create(_spec(moto_ec2, "sed-b"))
            try:
                hv.wait_event("start", 1)
                assert started == [vm.id]
                assert hv.user_data(vm.id) == "role=sed"
            finally:
                provider.destroy(vm.id)
                provider.destroy(other.id)
            hv.wait_event("stop", 1)
            assert stopped == [(vm.id, f"handle-{vm.id}", "terminated")]
        assert other.id not in started and len(stopped) == 1

    def test_boot_delay_and_never_boot(self, moto_ec2, provider):  # noqa: F811
        started, stopped, on_start, on_stop = _recorder()
        boot_at: dict[str, float] = {}

        def timed_start(vm):
            boot_at[vm.id] = time.monotonic()
            return on_start(vm)

        hv = FakeHypervisor(provider, timed_start, on_stop, poll_interval=0.1,
                            boot_delay=0.5, tag_filter={OWNER: "sed-a"})
        with hv:
            t0 = time.monotonic()
            first = provider.create(_spec(moto_ec2))
            hv.wait_event("start", 1)
            hv.never_boot(nth=2)
            second = provider.create(_spec(moto_ec2))
            hv.wait_event("never_boot", 1)
            try:
                assert boot_at[first.id] - t0 >= 0.5
                assert hv.ids("never_boot") == [second.id]
                assert provider.get(second.id).state == "running"
                hv.die(first.id)
                assert stopped == [(first.id, f"handle-{first.id}", "running")]
            finally:
                provider.destroy(first.id)
                provider.destroy(second.id)
        assert started == [first.id] and len(stopped) == 1
