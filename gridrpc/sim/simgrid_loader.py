"""Import SimGrid's Python module (``simgrid``) for the SimGrid engine of
``gridrpc sim`` (:mod:`gridrpc.sim.simgrid_engine`).

Where it comes from, in order:

1. ``import simgrid`` as usual: an environment where SimGrid's module is on
   the path (a virtual environment with it, a Python of the distribution).
2. The file named by ``GRIDRPC_SIMGRID_MODULE`` (the path of a
   ``simgrid.cpython-*.so``).
3. The Debian/Ubuntu package ``python3-simgrid`` (``apt-get install -y
   python3-simgrid``): one extension module,
   ``/usr/lib/python3/dist-packages/simgrid.cpython-<ver>-<arch>.so``, built
   for the distribution's Python. When this Python has the same version and
   ABI (the extension suffix matches), that one file is loaded by its path
   (``importlib.util.spec_from_file_location``) and registered as
   ``sys.modules["simgrid"]``.

Why the single file and not the directory: adding
``/usr/lib/python3/dist-packages`` to ``sys.path`` (or a ``.pth`` file
pointing at it) would put every Debian Python package in front of or behind
this interpreter's own, with versions built for another Python (numpy,
zmq...): imports would change for the whole program. Loading one extension
module by path changes nothing else.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["DEBIAN_DIRS", "SimGridMissing", "candidates", "load_simgrid"]

#: where the Debian package puts the extension module
DEBIAN_DIRS = ("/usr/lib/python3/dist-packages",)

INSTALL_HINT = ("SimGrid's Python module was not found: install it with `apt-get install -y python3-simgrid` "
                "(Debian/Ubuntu; its Python must match this one: "
                f"{sys.version_info.major}.{sys.version_info.minor}), or point GRIDRPC_SIMGRID_MODULE at a "
                "simgrid.cpython-*.so built for this Python (docs/simulation.md, 'The SimGrid engine')")


class SimGridMissing(ImportError):
    """SimGrid's Python module cannot be imported by this interpreter."""


def candidates() -> list[Path]:
    """The extension files that could be SimGrid's module for this Python,
    in the order they are tried (the environment variable's first)."""
    out = []
    env = os.environ.get("GRIDRPC_SIMGRID_MODULE")
    if env:
        out.append(Path(env))
    for d in DEBIAN_DIRS:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            p = Path(d) / f"simgrid{suffix}"
            if p.is_file() and p not in out:
                out.append(p)
    return out


def load_simgrid() -> ModuleType:
    """SimGrid's module, imported once per process (see the module's docstring)."""
    mod = sys.modules.get("simgrid")
    if mod is not None:
        return mod
    try:
        import simgrid                   # noqa: PLC0415 - on the path: used as it is
        return simgrid
    except ImportError:
        pass
    tried = []
    for path in candidates():
        if not path.is_file():
            tried.append(f"{path} (no such file)")
            continue
        spec = importlib.util.spec_from_file_location("simgrid", path)
        if spec is None or spec.loader is None:
            tried.append(f"{path} (not an extension module)")
            continue
        mod = importlib.util.module_from_spec(spec)
        sys.modules["simgrid"] = mod
        try:
            spec.loader.exec_module(mod)
        except ImportError as exc:       # built for another Python
            del sys.modules["simgrid"]
            tried.append(f"{path} ({exc})")
            continue
        return mod
    raise SimGridMissing(INSTALL_HINT + (f"; tried: {'; '.join(tried)}" if tried else ""))
