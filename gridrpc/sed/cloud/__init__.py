"""The cloud SeD (``sed.py``: :class:`CloudSeD`), its pure VM policy
(``policy.py``), its configuration and VM user data (``config.py``), its
back-end (``vms.py``, relaying calls to the VMs' SeDs with
:mod:`gridrpc.sed.backends.relay`) and the provider layer beneath (``provider.py``:
a small interface and its libcloud implementation, EC2 API on AWS or moto).
See ``docs/cloud.md``."""
from gridrpc.sed.cloud.config import CloudConfig, parse_cloud_config, render_user_data
from gridrpc.sed.cloud.policy import PoolConfig, VMPool
from gridrpc.sed.cloud.provider import (
    PROVIDERS,
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

__all__ = [
    "PROVIDERS", "VM", "VMSpec", "CloudProvider", "LibcloudProvider", "Credentials",
    "CloudError", "CloudAuthError", "CloudUnreachable", "UnknownImage", "CloudTimeout",
    "make_provider", "price_per_call", "resolve_aws_credentials",
    "CloudConfig", "parse_cloud_config", "render_user_data", "PoolConfig", "VMPool", "CloudSeD",
]


def __getattr__(name):          # CloudSeD pulls in the SeD runtime: import it on first use
    if name == "CloudSeD":
        from gridrpc.sed.cloud.sed import CloudSeD
        return CloudSeD
    raise AttributeError(name)
