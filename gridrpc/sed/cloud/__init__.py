"""The cloud SeD's VM layer: a small provider interface and its libcloud
implementation (EC2 API; AWS or moto). See ``docs/cloud.md``."""
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
]
