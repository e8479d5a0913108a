"""Operator plugins, loaded once when an element starts.

A message may only *name* a policy (an aggregator); the class behind the name
comes from what this element's own configuration registered at start: the
built-ins, the ``gridrpc.aggregators`` entry-point group of installed
packages, and the classes the operator lists (``gridrpc ma --plugin
pkg.mod:Class``, or the deployment file's ``plugins: {aggregators: [...]}``).
Nothing here ever sees a value that came from the network.
"""
from __future__ import annotations

import importlib
import logging
from importlib.metadata import entry_points
from typing import Iterable

from .core.aggregators import AGGREGATORS, register_aggregator
from .errors import ConfigError

log = logging.getLogger(__name__)
ENTRY_POINT_GROUP = "gridrpc.aggregators"


def _load_class(target: str) -> type:
    mod, sep, attr = target.partition(":")
    if not sep or not mod or not attr:
        raise ConfigError(f"plugin {target!r}: expected 'package.module:Class'")
    try:
        obj = importlib.import_module(mod)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load plugin {target!r}: {exc}") from exc
    if not isinstance(obj, type):
        raise ConfigError(f"plugin {target!r} is not a class")
    return obj


def load_aggregator_plugins(targets: Iterable[str] = (), *, entry_points_too: bool = True) -> list[str]:
    """Register the operator's aggregator classes; returns their names.
    ConfigError names the plugin that cannot be loaded."""
    names = []
    if entry_points_too:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                cls = ep.load()
                register_aggregator(cls)
                names.append(cls.name)
            except Exception as exc:  # noqa: BLE001 - a broken installed package must not stop the agent
                log.warning("aggregator entry point %s could not be loaded: %s", ep.value, exc)
    for target in targets:
        cls = _load_class(target)
        try:
            register_aggregator(cls)
        except ValueError as exc:
            raise ConfigError(f"plugin {target!r}: {exc}") from exc
        names.append(cls.name)
    if names:
        log.info("aggregator plugins registered: %s (all: %s)", ", ".join(names), ", ".join(sorted(AGGREGATORS)))
    return names
