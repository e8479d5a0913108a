"""The cloud SeD: a SeD whose calls run on virtual machines it starts and stops.

To the tree it is one SeD (``server_type: cloud``): it registers with its
parent with the services of the VM image, answers discovery with an
estimation vector that includes the price of a call, the learnt boot time
and the VMs running and booting, and accepts calls. It runs none itself: its
execution back-end is :class:`~gridrpc.sed.cloud.vms.CloudVMs` (the VMs, the
relay of each call to a VM's SeD; see that module and ``docs/cloud.md``).
Everything else (queue, duplicates, pings, cancel, parent link, estimation
entry point) is the plain SeD runtime's.
"""
from __future__ import annotations

from ...core.sed_calls import DEFAULT_RESULT_CACHE_BYTES
from ..server import SeD
from ..services import split_spec_options
from .config import CloudConfig
from .provider import CloudProvider
from .vms import OWNER_TAG, RUN_TAG, VM_TAG, CloudVMs

__all__ = ["CloudSeD", "CloudVMs", "OWNER_TAG", "VM_TAG", "RUN_TAG"]


class CloudSeD(SeD):
    """A SeD running its calls on cloud VMs. ``provider`` defaults to
    ``make_provider(config.provider_config())`` (built in a thread at start)."""

    def __init__(self, name: str, parent: str | None = None, *, config: CloudConfig,
                 provider: CloudProvider | None = None, address: str = "tcp://127.0.0.1:0",
                 hb_interval: float = 1.0, hb_timeout: float = 3.0,
                 orphan_timeout: float | None = None, seed: int | None = None,
                 max_message_size: int | None = None, ack_timeout: float = 10.0,
                 result_cache_bytes: int = DEFAULT_RESULT_CACHE_BYTES, **common) -> None:
        extra = {} if max_message_size is None else {"max_message_size": max_message_size}
        super().__init__(name, parent, address=address, max_concurrent=config.capacity, queue="fcfs",
                         replicas=1, hb_interval=hb_interval, hb_timeout=hb_timeout,
                         orphan_timeout=orphan_timeout, seed=seed, result_cache_bytes=result_cache_bytes,
                         execution=CloudVMs(name, config, provider, ack_timeout=ack_timeout), **extra, **common)
        for spec in config.services:
            self.add_image_service(spec)

    def add_image_service(self, spec: str) -> None:
        """Offer a service of the image (``[name=]module:function[,idempotent=false]
        [,on_orphan=...]``, as ``gridrpc sed --service``; the VMs get the same
        spec). If the module is not importable here, the service is still
        offered, without argument checks: only the VMs run it."""
        spec, options = split_spec_options(spec)
        name, _, target = spec.rpartition("=")
        self.add_service(name or target.rsplit(":", 1)[-1], target, **options)

    # the cloud back-end's settings and state, as attributes of the SeD
    @property
    def config(self) -> CloudConfig:
        return self.execution.config

    @property
    def provider(self) -> CloudProvider | None:
        return self.execution.provider

    @property
    def policy(self):
        """The pure VM policy (:class:`~gridrpc.sed.cloud.policy.VMPool`)."""
        return self.execution.policy

    @property
    def ack_timeout(self) -> float:
        return self.execution.ack_timeout

    @property
    def run_token(self) -> str:
        return self.execution.run_token

    @property
    def vm_agent(self):
        return self.execution.vm_agent

    @property
    def vm_parent(self) -> str | None:
        return self.execution.vm_parent

    @property
    def events(self) -> list[tuple[float, str, str]]:
        return self.execution.events
