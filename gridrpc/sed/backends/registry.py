"""The kinds of SeD, registered by name: one seam for execution back-ends.

A *kind* is a SeD whose calls run on one family of execution back-ends
(:class:`~gridrpc.sed.backends.ExecutionBackend`): ``sed`` (worker processes
or inline: the plain SeD), ``batch`` (a job per call, or pilots) and
``cloud`` (VMs). A :class:`BackendKind` brings everything the rest of the
package needs to know about it:

- its deployment-file kind (``seds[i].kind``, its :attr:`~BackendKind.name`),
  the keys such an entry may hold besides the common SeD keys and the check
  of their values (:attr:`~BackendKind.check_entry`: its own config parser);
- its ``gridrpc sed`` flags (:attr:`~BackendKind.add_arguments`), whether
  parsed arguments ask for it (:attr:`~BackendKind.selected`) and the SeD
  they describe (:attr:`~BackendKind.build`);
- the ``gridrpc sed`` arguments of a deployment entry of that kind
  (:attr:`~BackendKind.entry_args`: what ``gridrpc deploy`` runs);
- its estimation tags: ``server_type`` and the :attr:`~BackendKind.tags`
  its SeDs add to the standard ones (what aggregators may rank by);
- the names its back-ends give what they say about a call in a reply's
  ``backend`` field (its :attr:`~BackendKind.backends`).

``gridrpc sed`` (:mod:`gridrpc.cli.daemons`), the deployment-file check
(:mod:`gridrpc.deploy.schema`) and the deployment runner
(:mod:`gridrpc.deploy.runner`) read this registry, so a new execution
back-end is one module calling :func:`register_kind` (imported before the
parser is built or the file read) plus its tests::

    register_kind(BackendKind(name="mpi", summary="calls as mpirun commands", backends=("mpi",),
                              server_type="parallel", tags=frozenset({"mpi_ranks"}),
                              selected=lambda a: bool(a.mpi_hosts),
                              add_arguments=add_mpi_arguments, build=make_mpi_sed,
                              keys=frozenset({"mpi_hosts"}), check_entry=check_mpi_entry,
                              entry_args=mpi_entry_args))

The built-in kinds are registered by the modules of :data:`BUILTIN`,
imported on first use, so listing names imports nothing.
"""
from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError

__all__ = ["BackendKind", "register_kind", "unregister_kind", "get_kind", "kind_names", "kinds", "kind_for_args", "DEFAULT_KIND",
           "BUILTIN"]

#: the kind of a ``gridrpc sed`` that asks for no other and of a deployment entry without ``kind:``
DEFAULT_KIND = "sed"

#: built-in kinds: name -> module that registers it. The order is the order of precedence
#: when ``gridrpc sed`` arguments select several kinds (``--batch`` wins over ``--cloud``).
BUILTIN: dict[str, str] = {"sed": "gridrpc.sed.backends.plain", "batch": "gridrpc.sed.batch.cli",
                           "cloud": "gridrpc.sed.cloud.cli"}


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendKind:
    """A registered kind of SeD.

    ``build(args, address, common)`` returns the SeD that ``gridrpc sed``
    arguments ``args`` describe, bound at ``address``; ``common`` holds the
    keywords every SeD takes (heartbeats, security, access, data). It raises
    :class:`~gridrpc.errors.ConfigError` on bad settings.

    ``selected(args)`` tells whether ``gridrpc sed`` arguments ask for this
    kind (None: the default kind, chosen when no other is).
    ``add_arguments(parser)`` adds its flags to ``gridrpc sed``'s parser (the
    flags every SeD has are the parser's own).

    Deployment entries: ``keys`` are the keys of its own (they may repeat
    common SeD keys, e.g. ``services``); unknown keys are reported by the
    deployment check unless ``names_unknown_keys`` (then ``check_entry`` gets
    them and names them). ``check_entry(settings, what)`` raises ConfigError
    on bad values; ``entry_args(settings, what)`` gives the ``gridrpc sed``
    arguments reproducing them. ``settings`` is the entry's keys of this
    kind plus those no SeD has (see :meth:`settings`).

    ``backends`` names its execution back-ends; each says what it did with a
    call under its own name in the reply's ``backend`` field (a batch job's
    id, state and nodes; a VM's name). ``tags`` are the estimation tags its
    SeDs put in their vectors besides
    :data:`~gridrpc.core.estimation.STANDARD_TAGS` (``tests/test_backend_kinds.py``
    checks that the built-in kinds declare exactly those they send)."""
    name: str
    summary: str
    backends: tuple[str, ...]
    server_type: str
    build: Callable[[argparse.Namespace, str, dict], Any]
    tags: frozenset[str] = frozenset()
    selected: Callable[[argparse.Namespace], bool] | None = None
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    keys: frozenset[str] = frozenset()
    names_unknown_keys: bool = False
    check_entry: Callable[[Mapping[str, Any], str], None] | None = None
    entry_args: Callable[[Mapping[str, Any], str], list[str]] | None = None

    def settings(self, entry: Mapping[str, Any], common: frozenset[str] | set[str]) -> dict:
        """The keys of a deployment ``entry`` that are this kind's: its own
        ``keys`` and any key that is not one of the ``common`` SeD keys."""
        return {k: v for k, v in entry.items() if k in self.keys or k not in common}


_REGISTRY: dict[str, BackendKind] = {}


def register_kind(kind: BackendKind) -> BackendKind:
    """Make *kind* available as ``kind: <name>`` in deployment files and add
    its flags to ``gridrpc sed``."""
    if not kind.name or not kind.name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"SeD kind name {kind.name!r}: letters, digits, _ and - only")
    if kind.name in ("ma", "la"):
        raise ValueError(f"SeD kind name {kind.name!r} is an agent's kind")
    _REGISTRY[kind.name] = kind
    return kind


def unregister_kind(name: str) -> None:
    """Forget the kind registered as *name* (tests that register their own)."""
    _REGISTRY.pop(name, None)


def kind_names() -> list[str]:
    """Every kind name, built-in or registered: the built-in ones first."""
    return list(BUILTIN) + sorted(set(_REGISTRY) - set(BUILTIN))


def get_kind(name: str, *, what: str = "SeD") -> BackendKind:
    """The kind registered as *name*; ConfigError listing the known ones."""
    if name not in _REGISTRY and name in BUILTIN:
        importlib.import_module(BUILTIN[name])
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"{what}: unknown kind {name!r}; known: {', '.join(kind_names())}") from None


def kinds() -> list[BackendKind]:
    """Every kind (built-in ones imported), in :func:`kind_names` order."""
    return [get_kind(name) for name in kind_names()]


def kind_for_args(args: argparse.Namespace) -> BackendKind:
    """The kind that ``gridrpc sed`` arguments ask for: the first kind whose
    ``selected`` says so, else :data:`DEFAULT_KIND`."""
    for kind in kinds():
        if kind.selected is not None and kind.selected(args):
            return kind
    return get_kind(DEFAULT_KIND)
