"""The vocabulary of the cloud SeD's VM pool (:mod:`.policy`): the actions
it returns to the runtime, its configuration, and what it knows about each VM
and each call. Plain data, no behaviour."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CreateVM", "DestroyVM", "Dispatch", "FailCall", "PoolCall", "PoolConfig", "VMState"]


# --------------------------------------------------------------------------- actions

@dataclass(frozen=True, slots=True)
class CreateVM:
    name: str


@dataclass(frozen=True, slots=True)
class DestroyVM:
    name: str
    vm_id: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class Dispatch:
    call_id: str
    vm: str


@dataclass(frozen=True, slots=True)
class FailCall:
    """Give the call up. ``kind`` is the wire error kind the client gets:
    ``communication`` (VM failures used up the retries: the client may move
    the call), ``unavailable`` (the cloud SeD cannot start VMs at all: an
    unknown image, bad credentials; the call never ran), ``server_lost`` (a
    non-idempotent call's VM failed after the call was sent to it: it is not
    run again)."""
    call_id: str
    message: str
    kind: str = "communication"


# --------------------------------------------------------------------------- state

@dataclass(frozen=True, slots=True, kw_only=True)
class PoolConfig:
    policy: str = "per-call"            # "per-call" | "pool"
    min_vms: int = 0
    max_vms: int = 4
    vm_slots: int = 1                   # calls at once on one VM
    idle_timeout: float = 300.0
    boot_timeout: float = 600.0
    grow_threshold: float | None = None  # None: the learnt boot time
    retries: int = 1
    boot_time: float = 60.0             # prior, replaced by measurements (EWMA)
    boot_alpha: float = 0.3
    price_per_hour: float = 0.0
    billing_granularity: float = 1.0
    billing_minimum: float = 60.0
    create_backoff: float = 5.0
    create_backoff_max: float = 60.0

    def __post_init__(self) -> None:
        if self.policy not in ("per-call", "pool"):
            raise ValueError(f"unknown cloud policy {self.policy!r}")
        if self.max_vms < 1 or not 0 <= self.min_vms <= self.max_vms or self.vm_slots < 1:
            raise ValueError("need 0 <= min_vms <= max_vms, max_vms >= 1, vm_slots >= 1")


@dataclass(slots=True)
class VMState:
    name: str
    requested: float                    # when CreateVM was emitted (or adoption began)
    id: str | None = None
    state: str = "creating"             # creating | booting | ready | doomed
    address: str | None = None
    ready_at: float | None = None
    idle_since: float = 0.0
    calls: set = field(default_factory=set)
    served: int = 0
    claim: str | None = None            # the waiting call this VM was started for
    adopted: bool = False


@dataclass(slots=True)
class PoolCall:
    """A call the pool holds: waiting for a VM, or sent to one."""
    id: str
    tcomp: float
    submitted: float
    attempts: int = 0                   # VM failures charged to this call
    idempotent: bool = True             # False: never re-run once sent to a VM
    vm: str | None = None
    dispatched_at: float | None = None
