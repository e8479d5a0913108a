"""The provider interface of the cloud SeD: what it asks of a cloud.

:class:`CloudProvider` (a ``typing.Protocol``) has the five operations the
cloud SeD needs: ``create``, ``list`` (by tag), ``get``, ``destroy`` and
``wait_running``, over two plain records, :class:`VMSpec` (what to start) and
:class:`VM` (a snapshot of one instance). Errors are :class:`CloudError` (a
:class:`gridrpc.errors.GridRPCError`), with subclasses for bad credentials,
an unreachable endpoint, an unknown image and a timeout, so the caller can
tell "retry later" from "fix the configuration". :func:`price_per_call` turns
VM time into money the way clouds bill it.

No I/O and no libcloud here; the implementation is
:class:`~gridrpc.sed.cloud.libcloud_ec2.LibcloudProvider`, chosen by
:func:`~gridrpc.sed.cloud.provider.make_provider`.
"""
from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from gridrpc.errors import GridRPCError

__all__ = [
    "CloudError", "CloudAuthError", "CloudUnreachable", "UnknownImage", "CloudTimeout",
    "VMSpec", "VM", "TERMINAL_STATES", "CloudProvider", "price_per_call",
]


# --------------------------------------------------------------------------- errors

class CloudError(GridRPCError):
    """A cloud API call failed. ``code`` is the provider's error code when
    there is one (e.g. ``"InvalidAMIID.NotFound"``)."""

    def __init__(self, message: str, *, code: str | None = None):
        super().__init__(message)
        self.code = code


class CloudAuthError(CloudError):
    """Missing, wrong or expired credentials. Retrying will not help."""


class CloudUnreachable(CloudError):
    """The endpoint refused the connection or did not answer in time."""


class UnknownImage(CloudError):
    """The image (AMI) does not exist or is not visible to this account."""


class CloudTimeout(CloudError, TimeoutError):
    """A VM did not reach the wanted state in time."""


# --------------------------------------------------------------------------- data

@dataclass(frozen=True, slots=True, kw_only=True)
class VMSpec:
    """What to start. ``tags`` are set atomically at creation (so an instance
    is never visible untagged); ``name`` becomes the ``Name`` tag;
    ``terminate_on_shutdown``: powering the VM off from inside terminates it
    (no stopped instance left behind)."""

    image: str
    instance_type: str
    key_name: str | None = None
    security_group: str | None = None
    user_data: str = ""
    tags: dict[str, str] = field(default_factory=dict, hash=False)
    name: str = "gridrpc-vm"
    # a shutdown from inside the VM terminates it (EC2 InstanceInitiatedShutdownBehavior)
    terminate_on_shutdown: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class VM:
    """A snapshot of one instance. ``state`` is the provider's own word
    (EC2: ``pending``, ``running``, ``shutting-down``, ``terminated``,
    ``stopping``, ``stopped``)."""

    id: str
    state: str
    private_ip: str | None = None
    public_ip: str | None = None
    tags: dict[str, str] = field(default_factory=dict, hash=False)
    launched_at: _dt.datetime | None = None


TERMINAL_STATES = frozenset({"terminated", "shutting-down", "stopping", "stopped"})


@runtime_checkable
class CloudProvider(Protocol):
    """The five operations the cloud SeD needs. Implementations are blocking
    (call them through ``asyncio.to_thread`` from a runtime) and thread-safe."""

    def create(self, spec: VMSpec) -> VM: ...

    def list(self, tag_filter: Mapping[str, str]) -> list[VM]:
        """Instances carrying all of ``tag_filter``'s tags; terminated ones
        are left out."""
        ...

    def get(self, vm_id: str) -> VM | None: ...

    def destroy(self, vm_id: str) -> None:
        """Terminate; a no-op for an instance already gone or unknown."""
        ...

    def wait_running(self, vm_id: str, timeout: float) -> VM: ...


# --------------------------------------------------------------------------- pricing

def price_per_call(run_seconds: float, price_per_hour: float,
                   billing_granularity_s: float = 1, *, minimum_s: float = 0) -> float:
    """Price of ``run_seconds`` of one VM billed at ``price_per_hour``.

    Time is rounded up to whole ``billing_granularity_s`` units (1 for EC2's
    per-second billing, 3600 for hourly clouds), after applying a minimum
    billed time ``minimum_s`` (EC2 Linux bills at least 60 s).
    """
    if run_seconds < 0 or price_per_hour < 0 or minimum_s < 0:
        raise ValueError("run_seconds, price_per_hour and minimum_s must be >= 0")
    if billing_granularity_s <= 0:
        raise ValueError("billing_granularity_s must be > 0")
    seconds = max(run_seconds, minimum_s)
    # round() first so that 0.3/0.1 == 2.9999999999999996 does not bill 4 units
    units = math.ceil(round(seconds / billing_granularity_s, 9))
    return units * billing_granularity_s * price_per_hour / 3600.0
