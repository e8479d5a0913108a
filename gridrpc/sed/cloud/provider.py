"""Cloud providers for the cloud SeD: start, list and stop virtual machines.

The cloud SeD only needs five operations, described by :class:`CloudProvider`
(a ``typing.Protocol``): ``create``, ``list`` (by tag), ``get``, ``destroy``
and ``wait_running``. :class:`LibcloudProvider` implements them with Apache
Libcloud's EC2 driver; it works against AWS and against moto's EC2 server
(the tests). OpenStack is not implemented yet (see :func:`make_provider`).

Credentials never come from deployment files: :func:`resolve_aws_credentials`
reads the environment, then ``~/.aws/credentials`` (as the AWS CLI does).

Errors are :class:`CloudError` (a :class:`gridrpc.errors.GridRPCError`), with
subclasses for bad credentials, an unreachable endpoint, an unknown image and
a timeout, so the caller can tell "retry later" from "fix the configuration".

Where things are::

    provider_api.py    the interface: CloudProvider, VMSpec, VM, errors, price_per_call
    credentials.py     Credentials, resolve_aws_credentials
    libcloud_ec2.py    LibcloudProvider (EC2 API on AWS or moto)
    provider.py        this module: make_provider / PROVIDERS, and every name above
"""
from __future__ import annotations

from collections.abc import Mapping

from gridrpc.errors import GridRPCError  # noqa: F401 - re-exported

from .credentials import Credentials, resolve_aws_credentials, secret_keys
from .libcloud_ec2 import LibcloudProvider
from .provider_api import (  # noqa: F401 - re-exported
    TERMINAL_STATES, VM, CloudAuthError, CloudError, CloudProvider, CloudTimeout, CloudUnreachable,
    UnknownImage, VMSpec, price_per_call)

__all__ = [
    "VM", "VMSpec", "CloudProvider", "LibcloudProvider", "Credentials",
    "CloudError", "CloudAuthError", "CloudUnreachable", "UnknownImage", "CloudTimeout",
    "resolve_aws_credentials", "make_provider", "price_per_call", "PROVIDERS", "provider_problem",
]


def _make_ec2(config: Mapping) -> CloudProvider:
    return LibcloudProvider("ec2", region=config.get("region"), endpoint=config.get("endpoint"),
                            profile=config.get("profile"),
                            timeout=float(config.get("timeout", 10.0)))


_OPENSTACK_NOT_IMPLEMENTED = (
    "cloud provider 'openstack' is not implemented yet: libcloud's OpenStack driver "
    "needs flavor and security-group lookups and client-side metadata filtering, and "
    "nothing here can test it; use provider 'ec2' (OpenStack's EC2 API also works)")


def _make_openstack(config: Mapping) -> CloudProvider:
    raise CloudError(_OPENSTACK_NOT_IMPLEMENTED)


PROVIDERS = {"ec2": _make_ec2, "openstack": _make_openstack}


def provider_problem(name: str) -> str | None:
    """Why a cloud SeD cannot use provider ``name`` (unknown, or reserved and
    not implemented), or None. Read when a configuration is parsed, so a bad
    provider is refused before anything starts; needs no libcloud."""
    factory = PROVIDERS.get(str(name).lower())
    if factory is None:
        return f"unknown cloud provider {name!r}; known: {', '.join(sorted(PROVIDERS))}"
    if factory is _make_openstack:
        return _OPENSTACK_NOT_IMPLEMENTED
    return None


def make_provider(config: Mapping) -> CloudProvider:
    """Build a provider from a deployment file's ``cloud`` section.

    Keys read: ``provider`` (``"ec2"``; ``"openstack"`` is reserved),
    ``region``, ``endpoint``, ``profile`` (a section of ~/.aws/credentials),
    ``timeout`` (seconds per API request). Other keys are left to the caller.
    Secrets are refused: credentials come from the environment or
    ~/.aws/credentials, never from a deployment file.
    """
    secrets = secret_keys(config)
    if secrets:
        raise CloudError(
            f"credentials do not belong in deployment files (found {', '.join(secrets)}); "
            "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or use ~/.aws/credentials "
            "(select a section with 'profile')")
    name = str(config.get("provider", "ec2")).lower()
    try:
        factory = PROVIDERS[name]
    except KeyError:
        raise CloudError(f"unknown cloud provider {name!r}; known: "
                         f"{', '.join(sorted(PROVIDERS))}") from None
    return factory(config)
