"""The plain SeD's kind (``kind: sed``, the default): calls run in worker
processes or inline (``--isolation``), on this host. Its flags
(``--max-concurrent``, ``--queue``, ``--replicas``, ``--workers``,
``--isolation``...) are ``gridrpc sed``'s own; see :mod:`.registry`."""
from __future__ import annotations

import argparse

from ...errors import ConfigError
from .registry import DEFAULT_KIND, BackendKind, register_kind

__all__ = ["make_plain_sed", "service_specs", "add_service_specs"]


def service_specs(a: argparse.Namespace, *, skip: tuple[str, ...] = ()) -> list[str]:
    """The ``--service`` specs of ``gridrpc sed`` arguments, with every
    example service (but those in ``skip``) when ``--examples`` is given."""
    specs = list(getattr(a, "service", None) or [])
    if getattr(a, "examples", False):
        from ...examples.services import ALL
        specs += [f"gridrpc.examples.services:{s}" for s in ALL if s not in skip]
    return specs


def add_service_specs(sed, specs: list[str]) -> None:
    """Offer each ``[NAME=]MODULE:FUNC[,idempotent=false][,on_orphan=kill]`` spec on ``sed``."""
    from ..services import split_spec_options
    for spec in specs:
        spec, options = split_spec_options(spec)
        name, _, target = spec.rpartition("=")
        sed.add_service(name or target.rsplit(":", 1)[-1], target, **options)


def make_plain_sed(a: argparse.Namespace, address: str, common: dict):
    """The plain SeD that the ``gridrpc sed`` arguments ``a`` describe."""
    from ..server import SeD
    specs = service_specs(a)
    if not specs:
        raise ConfigError("give at least one --service MODULE:FUNC (or --examples)")
    opts = {}
    if a.kill_grace is not None:
        opts["kill_grace"] = a.kill_grace
    if a.gather is not None:
        opts["gather"] = a.gather
    d = SeD(a.name, a.parent, address=address, max_concurrent=a.max_concurrent, queue=a.queue,
            replicas=a.replicas, workers=a.workers, isolation=a.isolation, prestart_workers=a.prestart_workers,
            max_message_size=a.max_message_size, orphan_timeout=a.orphan_timeout,
            max_arg_bytes_per_user=a.max_arg_bytes_per_user,
            result_cache_bytes=a.result_cache_bytes, orphan_call_timeout=a.orphan_call_timeout,
            queue_options=opts, **common)
    add_service_specs(d, specs)
    return d


register_kind(BackendKind(name=DEFAULT_KIND, summary="calls in worker processes or inline, on this host",
                          backends=("process", "inline"), server_type="serial", build=make_plain_sed))
