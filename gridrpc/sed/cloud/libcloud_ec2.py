"""The libcloud EC2 provider: :class:`LibcloudProvider` implements
:class:`~gridrpc.sed.cloud.provider_api.CloudProvider` with Apache Libcloud's
EC2 driver. It works against AWS and against moto's EC2 server (the tests);
two fixes of libcloud's reply parsing (below) make moto's replies readable.

libcloud is an optional dependency (``pip install gridrpc[cloud]``): it is
imported when a provider is built, not when this module is.
"""
from __future__ import annotations

import base64
import contextlib
import datetime as _dt
import logging
import os
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping

from .credentials import Credentials, resolve_aws_credentials
from .provider_api import (TERMINAL_STATES, VM, CloudAuthError, CloudError, CloudTimeout,
                           CloudUnreachable, UnknownImage, VMSpec)

# the provider's log lines keep the name they always had
log = logging.getLogger("gridrpc.sed.cloud.provider")

__all__ = ["LibcloudProvider"]


_AUTH_CODES = frozenset({"AuthFailure", "InvalidClientTokenId", "SignatureDoesNotMatch",
                         "UnrecognizedClientException", "OptInRequired",
                         "InvalidAccessKeyId", "ExpiredToken", "RequestExpired",
                         "UnauthorizedOperation"})
_NOT_FOUND_CODES = frozenset({"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"})


class _APIError(Exception):
    """An EC2 error reply, with its code(s); translated by ``_translate``."""

    def __init__(self, status: int, code: str | None, message: str):
        super().__init__(message)
        self.status, self.code = status, code


def _ec2_classes():
    """Build the libcloud driver subclass lazily (libcloud is an optional
    dependency: ``pip install gridrpc[cloud]``)."""
    from libcloud.compute.drivers import ec2
    from libcloud.utils.py3 import ET

    # libcloud parses every EC2 reply with NAMESPACE "http://ec2.amazonaws.com/
    # doc/2016-11-15/" (trailing slash), which AWS sends. moto sends the same
    # URI *without* the slash; XML namespaces are compared as strings, so every
    # findall() misses and list_nodes() silently returns []. We rewrite that one
    # namespace, and only when a reply carries it: replies from AWS (slash
    # present) go through untouched.
    moto_ns = 'xmlns="%s"' % ec2.NAMESPACE.rstrip("/")
    libcloud_ns = 'xmlns="%s"' % ec2.NAMESPACE

    class _EC2Response(ec2.EC2Response):
        def parse_body(self):
            if isinstance(self.body, str) and moto_ns in self.body:
                self.body = self.body.replace(moto_ns, libcloud_ns, 1)
            return super().parse_body()

        def parse_error(self):
            # libcloud's EC2Response.parse_error looks up un-namespaced
            # "Errors/Error" with exactly two children. moto's errors are
            # namespaced (or carry a third <Type> child for auth errors), which
            # made libcloud report an empty message or a ValueError. Read the
            # code and message by local name instead; this also works for AWS.
            codes, messages = [], []
            try:
                root = ET.XML(self.body)
            except Exception:
                root = None
            if root is not None:
                for el in root.iter():
                    if el.tag.rsplit("}", 1)[-1] != "Error":
                        continue
                    parts = {c.tag.rsplit("}", 1)[-1]: (c.text or "") for c in el}
                    codes.append(parts.get("Code", ""))
                    messages.append(f"{parts.get('Code', '')}: {parts.get('Message', '')}")
            text = "; ".join(messages) or f"HTTP {self.status} {self.error}: {self.body[:200]}"
            raise _APIError(int(self.status), codes[0] if codes else None, text)

    class _EC2Connection(ec2.EC2Connection):
        responseCls = _EC2Response

    class _EC2Driver(ec2.EC2NodeDriver):
        connectionCls = _EC2Connection

    return _EC2Driver, ec2


def _parse_endpoint(endpoint: str) -> tuple[bool, str, int]:
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CloudError(f"bad cloud endpoint {endpoint!r}: expected http(s)://host[:port]")
    if parts.path not in ("", "/"):
        raise CloudError(f"bad cloud endpoint {endpoint!r}: a path is not supported")
    secure = parts.scheme == "https"
    try:
        port = parts.port or (443 if secure else 80)
    except ValueError as exc:
        raise CloudError(f"bad cloud endpoint {endpoint!r}: {exc}") from exc
    return secure, parts.hostname, port


def _first(values) -> str | None:
    return values[0] if values else None


class LibcloudProvider:
    """:class:`CloudProvider` over Apache Libcloud (EC2 for now).

    ``endpoint`` is ``None`` for AWS itself, or a URL such as
    ``"http://127.0.0.1:5000"`` for an EC2-compatible API (moto in tests).
    ``timeout`` bounds every HTTP request, so a dead endpoint fails in
    ``timeout`` seconds with :class:`CloudUnreachable`. Calls are serialised by
    a lock (libcloud connections are not thread-safe).
    """

    def __init__(self, provider: str = "ec2", *, region: str | None = None,
                 endpoint: str | None = None, profile: str | None = None,
                 credentials: Credentials | None = None, timeout: float = 10.0):
        if provider != "ec2":
            raise CloudError(f"LibcloudProvider supports provider='ec2' only, not {provider!r}")
        self.provider = provider
        self.region = (region or os.environ.get("AWS_REGION")
                       or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1")
        self.endpoint = endpoint
        self.timeout = float(timeout)
        self._creds = credentials or resolve_aws_credentials(profile=profile)
        self._lock = threading.Lock()
        driver_cls, self._ec2 = _ec2_classes()
        kwargs: dict = {"region": self.region, "timeout": self.timeout,
                        # SigV4 always. AWS accepts it everywhere (SigV2 is
                        # legacy), and moto_server *needs* it: its single port
                        # serves every AWS service and picks the service from
                        # the SigV4 credential scope in the Authorization header;
                        # a SigV2 request (signature in the query string) falls
                        # through to S3 and DescribeInstances gets a bucket list.
                        "signature_version": "4"}
        if self._creds.token:
            kwargs["token"] = self._creds.token
        if endpoint is not None:
            secure, host, port = _parse_endpoint(endpoint)
            kwargs.update(secure=secure, host=host, port=port)
        try:
            self._driver = driver_cls(self._creds.access_key, self._creds.secret_key, **kwargs)
        except Exception as exc:  # bad region name etc.
            raise CloudError(f"cannot set up the EC2 driver ({self._where()}): {exc}") from exc

    def __repr__(self) -> str:
        return f"LibcloudProvider({self.provider!r}, {self._where()})"

    def _where(self) -> str:
        return f"region {self.region}, endpoint {self.endpoint or 'AWS'}"

    # ------------------------------------------------------------------ errors
    @contextlib.contextmanager
    def _translate(self, what: str) -> Iterator[None]:
        import requests
        from libcloud.common.exceptions import BaseHTTPError
        from libcloud.common.types import InvalidCredsError, LibcloudError, MalformedResponseError
        where = self._where()
        try:
            with self._lock:
                yield
        except CloudError:
            raise
        except _APIError as exc:
            if exc.code in _AUTH_CODES or exc.status in (401, 403):
                raise CloudAuthError(f"{what}: bad credentials ({self._creds.source}; {where}): "
                                     f"{exc}", code=exc.code) from exc
            if exc.code and exc.code.startswith("InvalidAMIID"):
                raise UnknownImage(f"{what}: unknown image ({where}): {exc}",
                                   code=exc.code) from exc
            raise CloudError(f"{what} failed ({where}): {exc}", code=exc.code) from exc
        except InvalidCredsError as exc:
            raise CloudAuthError(f"{what}: bad credentials ({self._creds.source}; {where}): "
                                 f"{exc}") from exc
        except requests.exceptions.Timeout as exc:
            raise CloudUnreachable(f"{what}: no answer from {where} within "
                                   f"{self.timeout:g} s") from exc
        except (requests.exceptions.ConnectionError, ConnectionError) as exc:
            raise CloudUnreachable(f"{what}: cannot connect to {where}: {exc}") from exc
        except (BaseHTTPError, LibcloudError, MalformedResponseError) as exc:
            raise CloudError(f"{what} failed ({where}): {exc}") from exc

    # ------------------------------------------------------------------ conversions
    def _to_vm(self, node) -> VM:
        state = node.extra.get("status") or str(node.state)
        return VM(id=node.id, state=state, private_ip=_first(node.private_ips),
                  public_ip=_first(node.public_ips), tags=dict(node.extra.get("tags") or {}),
                  launched_at=node.created_at)

    def _node(self, vm_id: str):
        from libcloud.compute.base import Node
        return Node(id=vm_id, name=None, state=None, public_ips=[], private_ips=[],
                    driver=self._driver)

    # ------------------------------------------------------------------ the protocol
    def create(self, spec: VMSpec) -> VM:
        from libcloud.compute.base import NodeImage, NodeSize
        if not spec.image or not spec.instance_type:
            raise CloudError("VMSpec needs an image and an instance_type")
        d = self._driver
        with self._translate(f"create VM {spec.name!r} from image {spec.image}"):
            node = d.create_node(
                name=spec.name,
                image=NodeImage(id=spec.image, name=None, driver=d),
                size=NodeSize(id=spec.instance_type, name=spec.instance_type, ram=None,
                              disk=None, bandwidth=None, price=None, driver=d),
                ex_keyname=spec.key_name or None,
                ex_security_groups=[spec.security_group] if spec.security_group else None,
                ex_userdata=spec.user_data or None,
                ex_metadata=dict(spec.tags),
                ex_terminate_on_shutdown=bool(spec.terminate_on_shutdown),
            )
        vm = self._to_vm(node)
        log.info("created VM %s (%s, %s) state=%s", vm.id, spec.image, spec.instance_type,
                 vm.state)
        return vm

    def list(self, tag_filter: Mapping[str, str], *,
             include_terminated: bool = False) -> list[VM]:
        filters = {f"tag:{k}": str(v) for k, v in tag_filter.items()}
        with self._translate(f"list VMs tagged {dict(tag_filter)}"):
            nodes = self._driver.list_nodes(ex_filters=filters or None)
        vms = [self._to_vm(n) for n in nodes]
        if not include_terminated:
            vms = [vm for vm in vms if vm.state != "terminated"]
        far_past = _dt.datetime.min.replace(tzinfo=_dt.timezone.utc)
        return sorted(vms, key=lambda vm: (vm.launched_at or far_past, vm.id))

    def get(self, vm_id: str) -> VM | None:
        try:
            with self._translate(f"describe VM {vm_id}"):
                nodes = self._driver.list_nodes(ex_node_ids=[vm_id])
        except CloudError as exc:
            if exc.code in _NOT_FOUND_CODES:
                return None
            raise
        return self._to_vm(nodes[0]) if nodes else None

    def destroy(self, vm_id: str) -> None:
        try:
            with self._translate(f"terminate VM {vm_id}"):
                self._driver.destroy_node(self._node(vm_id))
        except CloudError as exc:
            if exc.code in _NOT_FOUND_CODES:
                log.debug("terminate %s: already gone (%s)", vm_id, exc.code)
                return
            raise
        log.info("terminated VM %s", vm_id)

    def wait_running(self, vm_id: str, timeout: float, *, poll_interval: float = 0.5) -> VM:
        deadline = time.monotonic() + timeout
        while True:
            vm = self.get(vm_id)
            if vm is None:
                raise CloudError(f"VM {vm_id} does not exist ({self._where()})")
            if vm.state == "running":
                return vm
            if vm.state in TERMINAL_STATES:
                raise CloudError(f"VM {vm_id} is {vm.state}, it will not run")
            left = deadline - time.monotonic()
            if left <= 0:
                raise CloudTimeout(f"VM {vm_id} not running after {timeout:g} s "
                                   f"(state {vm.state})")
            time.sleep(min(poll_interval, left))

    # ------------------------------------------------------------------ extras
    def user_data(self, vm_id: str) -> str | None:
        """The user data an instance was started with (None if it has none or
        is unknown). Not part of :class:`CloudProvider`: the cloud SeD never
        needs it, test hypervisors and debugging do."""
        params = {"Action": "DescribeInstanceAttribute", "InstanceId": vm_id,
                  "Attribute": "userData"}
        try:
            with self._translate(f"read user data of VM {vm_id}"):
                root = self._driver.connection.request(self._driver.path, params=params).object
        except CloudError as exc:
            if exc.code in _NOT_FOUND_CODES:
                return None
            raise
        for el in root.iter():
            if el.tag.rsplit("}", 1)[-1] == "value" and el.text:
                return base64.b64decode(el.text).decode("utf-8", errors="replace")
        return None
