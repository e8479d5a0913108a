"""``gridrpc sed --cloud-config FILE.yaml [--cloud KEY=VALUE ...]``: build a
:class:`~gridrpc.sed.cloud.sed.CloudSeD` from the command line.

The file holds the keys of :class:`~gridrpc.sed.cloud.config.CloudConfig`
(the same as a deployment file's ``kind: cloud`` entry); each ``--cloud
KEY=VALUE`` overrides one, its value read as YAML (``max_vms=4``,
``services=[a:b, c:d]``, ``endpoint=http://127.0.0.1:5000``). ``--service``
flags add to ``services``. This module registers the ``cloud`` kind
(:mod:`gridrpc.sed.backends.registry`): these flags, that deployment kind
and its command line.
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

import yaml

from ...errors import ConfigError
from ..backends.registry import BackendKind, register_kind
from .config import CLOUD_KEYS, cloud_cli_args, parse_cloud_config

log = logging.getLogger(__name__)


def add_cloud_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cloud-config", metavar="FILE.yaml",
                   help="run a cloud SeD: calls run on VMs it starts (see docs/cloud.md)")
    p.add_argument("--cloud", action="append", default=[], metavar="KEY=VALUE",
                   help="a cloud SeD setting (repeatable; overrides --cloud-config), "
                        "e.g. --cloud policy=pool --cloud max_vms=4")


def wants_cloud(a: argparse.Namespace) -> bool:
    return bool(getattr(a, "cloud_config", None) or getattr(a, "cloud", None))


def cloud_settings(a: argparse.Namespace) -> dict:
    data: dict = {}
    if a.cloud_config:
        path = Path(a.cloud_config)
        try:
            loaded = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read the cloud configuration {path}: {exc}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the cloud configuration must be a mapping")
        data.update(loaded)
    for kv in a.cloud:
        key, sep, value = kv.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--cloud expects KEY=VALUE, got {kv!r}")
        try:
            data[key.strip()] = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError:
            data[key.strip()] = value
    services = list(data.get("services") or [])
    if isinstance(data.get("services"), str):
        services = [data["services"]]
    for s in getattr(a, "service", []) or []:
        if s not in services:
            services.append(s)
    if getattr(a, "examples", False):
        from ...examples.services import ALL
        services += [f"gridrpc.examples.services:{s}" for s in ALL
                     if f"gridrpc.examples.services:{s}" not in services]
    data["services"] = services
    return data


def make_cloud_sed(a: argparse.Namespace, address: str, hb: dict):
    """The CloudSeD the ``gridrpc sed`` arguments ``a`` describe."""
    from .sed import CloudSeD
    config = parse_cloud_config(cloud_settings(a), what=f"cloud SeD {a.name}")
    if not config.services:
        raise ConfigError(f"cloud SeD {a.name}: give the services of the image "
                          "(--service MODULE:FUNC or 'services:' in the cloud configuration)")
    ignored = [flag for flag, value, default in (
        ("--replicas", a.replicas, 1), ("--workers", a.workers, None), ("--queue", a.queue, "fcfs"),
        ("--max-concurrent", a.max_concurrent, 1), ("--isolation", a.isolation, "process"))
        if value != default]
    if ignored:
        log.warning("cloud SeD %s: %s ignored (calls run on the VMs: see max_vms and "
                    "vm_max_concurrent)", a.name, ", ".join(ignored))
    return CloudSeD(a.name, a.parent, config=config, address=address,
                    orphan_timeout=a.orphan_timeout, max_message_size=a.max_message_size,
                    result_cache_bytes=a.result_cache_bytes, **hb)


def check_cloud_entry(settings, what: str) -> None:
    """Check the cloud settings of a deployment file's ``kind: cloud`` entry
    (ConfigError; unknown keys are named by the cloud parser)."""
    parse_cloud_config(settings, what=what)


def cloud_entry_args(settings, what: str) -> list[str]:
    """``gridrpc sed`` arguments of a deployment file's ``kind: cloud`` entry."""
    return cloud_cli_args(settings)


#: estimation tags of cloud SeDs besides the standard ones (VMPool.estimate)
ESTIMATION_TAGS = frozenset({"boot_time", "price", "price_per_hour", "policy", "max_vms", "num_vms_running",
                             "num_vms_booting", "num_vms_busy", "calls_on_vms", "calls_waiting_for_vm"})

register_kind(BackendKind(name="cloud", summary="calls on VMs the SeD starts and stops", backends=("cloud",),
                          server_type="cloud", tags=ESTIMATION_TAGS, selected=wants_cloud,
                          add_arguments=add_cloud_arguments,
                          build=make_cloud_sed, keys=CLOUD_KEYS, names_unknown_keys=True,
                          check_entry=check_cloud_entry, entry_args=cloud_entry_args))
