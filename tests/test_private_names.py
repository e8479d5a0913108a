"""No module of gridrpc imports another module's private names (``_name``):
what a module shares is public in it, so each name lives in one place and a
module's private helpers can change without breaking others."""
from __future__ import annotations

import ast
from pathlib import Path

import gridrpc

ROOT = Path(gridrpc.__file__).parent


def _private_imports(root: Path = ROOT) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                for alias in node.names:
                    name = alias.name
                    if name.startswith("_") and not (name.startswith("__") and name.endswith("__")):
                        out.append(f"{path.relative_to(root.parent)}:{node.lineno}: "
                                   f"from {'.' * node.level}{node.module or ''} import {name}")
    return out


def test_no_module_imports_another_modules_private_names():
    found = _private_imports()
    assert not found, "private names imported across modules (make them public where they are defined):\n" + \
        "\n".join(found)


def test_the_scan_sees_a_private_import(tmp_path):
    """The scan itself finds ``from .x import _y`` (relative and absolute),
    and leaves ``__future__`` and dunder names alone."""
    pkg = tmp_path / "gridrpc"
    pkg.mkdir()
    (pkg / "a.py").write_text("from __future__ import annotations\nfrom .b import _hidden, public, __version__\n")
    (pkg / "c.py").write_text("from gridrpc.b import _other\n")
    assert _private_imports(pkg) == ["gridrpc/a.py:2: from .b import _hidden",
                                     "gridrpc/c.py:1: from gridrpc.b import _other"]
