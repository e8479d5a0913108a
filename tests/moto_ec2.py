"""moto's EC2 API on loopback, as a subprocess, for the cloud tests.

    with MotoEC2() as moto:
        provider = LibcloudProvider(endpoint=moto.endpoint, region=moto.region)
        provider.create(VMSpec(image=moto.ami_id, instance_type="t3.micro"))

The server listens on 127.0.0.1 only. ``start()`` sets fake credentials in
``os.environ`` (``AWS_ACCESS_KEY_ID=testing`` ...) and ``stop()`` restores the
previous values; ``stop()`` terminates only the process ``start()`` started.
"""
from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_EC2_METADATA_DISABLED": "true",
}
# removed while the fake credentials are in place, so nothing real leaks in
_CLEARED_ENV = ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoEC2:
    """One ``python -m moto.server`` on 127.0.0.1:<free port>.

    ``ami_validation``: unknown AMIs are rejected (``InvalidAMIID.NotFound``),
    as on AWS (moto accepts any AMI id by default).
    ``auth``: moto checks credentials against its IAM (none exist), so every
    request fails with ``AuthFailure`` — for testing bad-credential handling.
    ``set_env``: put the fake credentials into ``os.environ`` while running.
    """

    region = "us-east-1"

    def __init__(self, *, ami_validation: bool = True, auth: bool = False,
                 set_env: bool = True, start_timeout: float = 30.0):
        self.ami_validation = ami_validation
        self.auth = auth
        self.set_env = set_env
        self.start_timeout = start_timeout
        self.port: int | None = None
        self.ami_id: str | None = None
        self.log_path: str | None = None
        self._proc: subprocess.Popen | None = None
        self._saved_env: dict[str, str | None] | None = None
        self._log = None

    # ---------------------------------------------------------------- lifecycle
    @property
    def endpoint(self) -> str:
        if self.port is None:
            raise RuntimeError("MotoEC2 is not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> "MotoEC2":
        if self._proc is not None:
            return self
        if self.set_env:
            self._saved_env = {k: os.environ.get(k) for k in (*FAKE_ENV, *_CLEARED_ENV)}
            for k in _CLEARED_ENV:
                os.environ.pop(k, None)
            os.environ.update(FAKE_ENV)
        atexit.register(self.stop)
        try:
            last_error = ""
            for _attempt in range(3):  # the free port may be taken meanwhile
                if self._spawn(_free_port()):
                    break
                last_error = self._log_tail()
                self._drop_log()
            else:
                raise RuntimeError(f"moto server did not start: {last_error}")
            if not self.auth:
                self.ami_id = self._pick_ami()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, port: int) -> bool:
        env = dict(os.environ)
        for k in _CLEARED_ENV:
            env.pop(k, None)
        env.update(FAKE_ENV)
        if self.ami_validation:
            env["MOTO_ENABLE_AMI_VALIDATION"] = "true"
        if self.auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
        fd, self.log_path = tempfile.mkstemp(prefix="moto-ec2-", suffix=".log")
        self._log = os.fdopen(fd, "wb")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self.port = port
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:  # exited: port taken, import error...
                self._reap()
                return False
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/data.json",
                                            timeout=1.0) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        self._reap()
        raise RuntimeError(f"moto server not answering after {self.start_timeout:g} s: "
                           f"{self._log_tail()}")

    def _pick_ami(self) -> str:
        # also warms moto's EC2 backend up (loading its ~1,000 AMIs takes seconds)
        client = self.boto3_client()
        images = client.describe_images(
            Owners=["amazon"], Filters=[{"Name": "name", "Values": ["amzn-ami-hvm-*"]}]
        )["Images"] or client.describe_images(Owners=["amazon"])["Images"]
        if not images:
            raise RuntimeError("moto offers no default AMI")
        return sorted(img["ImageId"] for img in images)[0]

    def _log_tail(self) -> str:
        try:
            with open(self.log_path or "", "rb") as f:
                return f.read()[-2000:].decode(errors="replace")
        except OSError:
            return ""

    def _reap(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def _drop_log(self) -> None:
        if self.log_path:
            try:
                os.unlink(self.log_path)
            except OSError:
                pass
            self.log_path = None

    def stop(self) -> None:
        """Terminate the server we started (only that PID); restore the env."""
        self._reap()
        self.port = None
        self._drop_log()
        if self._saved_env is not None:
            for k, v in self._saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            self._saved_env = None
        atexit.unregister(self.stop)

    def __enter__(self) -> "MotoEC2":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---------------------------------------------------------------- helpers
    def reset(self) -> None:
        """Forget every resource (``POST /moto-api/reset``). Default AMIs stay,
        with the same ids."""
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST",
                                     data=b"")
        with urllib.request.urlopen(req, timeout=10) as r:
            if r.status != 200:
                raise RuntimeError(f"moto reset failed: HTTP {r.status}")

    def boto3_client(self, service: str = "ec2"):
        """A boto3 client on this server (independent of gridrpc's code, to
        check what the provider did)."""
        import boto3
        return boto3.client(service, endpoint_url=self.endpoint, region_name=self.region,
                            aws_access_key_id=FAKE_ENV["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=FAKE_ENV["AWS_SECRET_ACCESS_KEY"])
