"""Configuration of a cloud SeD: one frozen dataclass, parsed once.

The same keys are read from a deployment file's ``kind: cloud`` SeD entry,
from ``gridrpc sed --cloud-config FILE.yaml`` and from ``--cloud KEY=VALUE``
flags (see ``docs/cloud.md``). :func:`parse_cloud_config` validates them and
raises :class:`~gridrpc.errors.ConfigError` with a clear message; it never
needs libcloud. Secrets are refused: credentials come from the environment or
``~/.aws/credentials`` (``profile`` selects a section), never from here.

The user data of a VM is rendered here too (:func:`render_user_data`): a
``/bin/sh`` script that starts a regular ``gridrpc sed`` registering with the
cloud SeD.
"""
from __future__ import annotations

import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ...errors import ConfigError
from ..services import split_spec_options
from .credentials import secret_keys

POLICIES = ("per-call", "pool")
ORPHAN_ACTIONS = ("adopt", "terminate")


@dataclass(frozen=True, slots=True, kw_only=True)
class CloudConfig:
    """Everything a cloud SeD needs besides its name and parent.

    Provider (read by :func:`gridrpc.sed.cloud.make_provider`): ``provider``,
    ``region``, ``endpoint``, ``profile``, ``timeout`` (s per API request).
    VMs: ``image``, ``instance_type``, ``key_name``, ``security_group``,
    ``tags`` (extra tags), ``services`` (``module:function`` specs the image
    offers). Policy: ``policy`` (``per-call`` | ``pool``), ``min_vms``,
    ``max_vms``, ``idle_timeout``, ``boot_timeout``, ``grow_threshold``,
    ``retries``, ``vm_max_concurrent``. Cost: ``price_per_hour``,
    ``billing_granularity`` and ``billing_minimum`` (s). Estimation priors:
    ``boot_time`` and ``runtime_guess`` (s), replaced by measurements.
    Restart: ``orphans`` (``adopt`` | ``terminate``). Network: ``vm_listen``
    (address the cloud SeD binds for its VMs), ``vm_advertise`` (the address
    written into the user data, if different). VM side: ``python``,
    ``setup`` (shell lines run first), ``teardown`` (shell lines run after the
    SeD exits), ``vm_args`` (extra ``gridrpc sed`` arguments),
    ``vm_orphan_timeout``. ``poll_interval``: how often the provider's list
    is checked against what the cloud SeD believes.
    """

    # provider
    provider: str = "ec2"
    region: str | None = None
    endpoint: str | None = None
    profile: str | None = None
    timeout: float = 10.0
    # the VMs
    image: str = ""
    instance_type: str = ""
    key_name: str | None = None
    security_group: str | None = None
    tags: dict = field(default_factory=dict, hash=False)
    services: tuple[str, ...] = ()
    # policy
    policy: str = "per-call"
    min_vms: int = 0
    max_vms: int = 4
    idle_timeout: float = 300.0
    boot_timeout: float = 600.0
    grow_threshold: float | None = None
    retries: int = 1
    vm_max_concurrent: int = 1
    # cost and priors
    price_per_hour: float = 0.0
    billing_granularity: float = 1.0
    billing_minimum: float = 60.0
    boot_time: float = 60.0
    runtime_guess: float = 1.0
    # restart, network, VM side
    orphans: str = "adopt"
    vm_listen: str | None = None
    vm_advertise: str | None = None
    python: str = "python3"
    setup: str = ""
    teardown: str = ""
    vm_args: tuple[str, ...] = ()
    vm_orphan_timeout: float = 120.0
    poll_interval: float = 10.0

    def provider_config(self) -> dict:
        """The keys :func:`gridrpc.sed.cloud.make_provider` reads."""
        return {"provider": self.provider, "region": self.region, "endpoint": self.endpoint,
                "profile": self.profile, "timeout": self.timeout}

    @property
    def capacity(self) -> int:
        """Calls the cloud SeD runs at once: ``max_vms * vm_max_concurrent``
        (per-call: ``max_vms``, one call per VM)."""
        return self.max_vms * (self.vm_max_concurrent if self.policy == "pool" else 1)


CLOUD_KEYS = frozenset(f.name for f in fields(CloudConfig))
_FLOAT_KEYS = {"timeout", "idle_timeout", "boot_timeout", "grow_threshold", "price_per_hour",
               "billing_granularity", "billing_minimum", "boot_time", "runtime_guess",
               "vm_orphan_timeout", "poll_interval"}
_INT_KEYS = {"min_vms", "max_vms", "retries", "vm_max_concurrent"}
_STR_KEYS = {"provider", "region", "endpoint", "profile", "image", "instance_type", "key_name",
             "security_group", "policy", "orphans", "vm_listen", "vm_advertise", "python",
             "setup", "teardown"}


def parse_cloud_config(data: Mapping[str, Any], *, what: str = "cloud SeD",
                       ignore: frozenset | set = frozenset()) -> CloudConfig:
    """Validate ``data`` (a deployment entry or a ``--cloud-config`` file) into
    a :class:`CloudConfig`. Keys in ``ignore`` (e.g. the deployment's ``name``,
    ``parent``) are skipped; any other unknown key is an error."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{what}: the cloud configuration must be a mapping")
    secrets = secret_keys(data)
    if secrets:
        raise ConfigError(
            f"{what}: credentials do not belong in configuration files (found "
            f"{', '.join(secrets)}); set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or use "
            "~/.aws/credentials (select a section with 'profile')")
    unknown = sorted(str(k) for k in data if k not in CLOUD_KEYS and k not in ignore)
    if unknown:
        raise ConfigError(f"{what}: unknown cloud keys {', '.join(unknown)}; known: "
                          f"{', '.join(sorted(CLOUD_KEYS))}")
    kw: dict[str, Any] = {}
    for key, value in data.items():
        if key not in CLOUD_KEYS:
            continue
        if value is None:
            if key in ("region", "endpoint", "profile", "key_name", "security_group",
                       "grow_threshold", "vm_listen", "vm_advertise"):
                kw[key] = None
            continue
        if key in _FLOAT_KEYS:
            kw[key] = _number(value, key, what)
        elif key in _INT_KEYS:
            if isinstance(value, bool) or not isinstance(value, int):
                if isinstance(value, str) and value.strip().isdigit():
                    value = int(value)
                else:
                    raise ConfigError(f"{what}: {key} must be a whole number, not {value!r}")
            kw[key] = value
        elif key in _STR_KEYS:
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise ConfigError(f"{what}: {key} must be a string, not {value!r}")
            kw[key] = str(value)
        elif key == "services":
            kw[key] = _str_tuple(value, key, what)
            for spec in kw[key]:
                try:
                    split_spec_options(spec)    # [name=]module:function[,idempotent=false]...
                except ConfigError as exc:
                    raise ConfigError(f"{what}: services: {exc}") from None
        elif key == "vm_args":
            kw[key] = tuple(shlex.split(value)) if isinstance(value, str) else _str_tuple(value, key, what)
        elif key == "tags":
            if not isinstance(value, Mapping):
                raise ConfigError(f"{what}: tags must be a mapping of strings")
            kw[key] = {str(k): str(v) for k, v in value.items()}
    cfg = CloudConfig(**kw)
    _check(cfg, what)
    return cfg


def _number(value: Any, key: str, what: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{what}: {key} must be a number of seconds, not {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what}: {key} must be a number, not {value!r}") from None
    if not math.isfinite(v):
        raise ConfigError(f"{what}: {key} must be finite, not {value!r}")
    return v


def _str_tuple(value: Any, key: str, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{what}: {key} must be a list of strings")
    return tuple(value)


def _check(c: CloudConfig, what: str) -> None:
    from .provider import provider_problem      # provider.py imports this module
    problem = provider_problem(c.provider)
    if problem is not None:
        raise ConfigError(f"{what}: provider: {problem}")
    if c.policy not in POLICIES:
        raise ConfigError(f"{what}: policy must be one of {', '.join(POLICIES)}, not {c.policy!r}")
    if c.orphans not in ORPHAN_ACTIONS:
        raise ConfigError(f"{what}: orphans must be one of {', '.join(ORPHAN_ACTIONS)}, "
                          f"not {c.orphans!r}")
    if not c.image:
        raise ConfigError(f"{what}: 'image' (the AMI id with gridrpc installed) is required")
    if not c.instance_type:
        raise ConfigError(f"{what}: 'instance_type' (e.g. t3.micro) is required")
    if c.max_vms < 1:
        raise ConfigError(f"{what}: max_vms must be >= 1")
    if not 0 <= c.min_vms <= c.max_vms:
        raise ConfigError(f"{what}: min_vms must be between 0 and max_vms ({c.max_vms})")
    if c.policy == "per-call" and c.min_vms:
        raise ConfigError(f"{what}: min_vms applies to policy 'pool' only (per-call boots one "
                          "VM per call)")
    if c.retries < 0:
        raise ConfigError(f"{what}: retries must be >= 0")
    if c.vm_max_concurrent < 1:
        raise ConfigError(f"{what}: vm_max_concurrent must be >= 1")
    for key in ("timeout", "boot_timeout", "idle_timeout", "billing_granularity", "poll_interval",
                "vm_orphan_timeout"):
        if getattr(c, key) <= 0:
            raise ConfigError(f"{what}: {key} must be > 0")
    for key in ("price_per_hour", "billing_minimum", "boot_time", "runtime_guess"):
        if getattr(c, key) < 0:
            raise ConfigError(f"{what}: {key} must be >= 0")
    if c.grow_threshold is not None and c.grow_threshold < 0:
        raise ConfigError(f"{what}: grow_threshold must be >= 0 (or null: the learnt boot time)")
    for key in ("vm_listen", "vm_advertise"):
        v = getattr(c, key)
        if v is not None and "://" not in v:
            raise ConfigError(f"{what}: {key} must be an address such as tcp://0.0.0.0:7000")


# --------------------------------------------------------------------------- user data

USER_DATA_MARK = "# gridrpc-cloud-vm"


def vm_command(*, vm_name: str, parent: str, services: tuple[str, ...] | list[str],
               hb_interval: float, hb_timeout: float, orphan_timeout: float,
               max_concurrent: int = 1, extra_args: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The ``gridrpc sed`` arguments a VM runs (after ``python -m gridrpc``);
    ``--host`` is added by the script (the VM's own address)."""
    cmd = ["sed", "--name", vm_name, "--parent", parent, "--port", "0",
           "--hb-interval", f"{hb_interval:g}", "--hb-timeout", f"{hb_timeout:g}",
           "--orphan-timeout", f"{orphan_timeout:g}", "--max-concurrent", str(max_concurrent)]
    for s in services:
        cmd += ["--service", s]
    return cmd + list(extra_args)


def render_user_data(*, vm_name: str, owner: str, command: list[str], python: str = "python3",
                     setup: str = "", teardown: str = "") -> str:
    """A ``/bin/sh`` user-data script starting the VM's SeD.

    ``GRIDRPC_PYTHON`` and ``GRIDRPC_HOST`` in the environment override the
    interpreter and the address to bind (the tests' hypervisor runs this very
    script on loopback with them); otherwise the first address of
    ``hostname -I`` is bound. Without ``teardown`` the SeD replaces the shell
    (``exec``), so the script's PID is the SeD's.
    """
    args = " ".join(shlex.quote(a) for a in command)
    lines = ["#!/bin/sh", f"{USER_DATA_MARK} {vm_name} (cloud SeD {owner})",
             "# Starts a gridrpc SeD that registers with its cloud SeD; see docs/cloud.md."]
    if setup.strip():
        lines += ["set -e", setup.rstrip(), "set +e"]
    lines += [f'PY="${{GRIDRPC_PYTHON:-{shlex.quote(python)}}}"',
              'HOST="${GRIDRPC_HOST:-$(hostname -I 2>/dev/null | awk \'{print $1}\')}"',
              'HOST="${HOST:-0.0.0.0}"']
    run = f'"$PY" -m gridrpc {args} --host "$HOST"'
    if teardown.strip():
        lines += [run, teardown.rstrip()]
    else:
        lines.append("exec " + run)
    return "\n".join(lines) + "\n"


def cloud_cli_args(options: Mapping[str, Any]) -> list[str]:
    """``--cloud KEY=VALUE`` flags for the cloud keys of a deployment entry
    (``services`` excepted: they travel as ``--service``). Values are JSON,
    which ``gridrpc sed`` reads back as YAML."""
    import json
    out: list[str] = []
    for key in sorted(CLOUD_KEYS - {"services"}):
        if key in options:
            value = options[key]
            if isinstance(value, tuple):
                value = list(value)
            out += ["--cloud", f"{key}={json.dumps(value)}"]
    return out
