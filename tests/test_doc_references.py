"""Every documentation page the package's code and docstrings point to
(``docs/....md``) exists, so ``help(gridrpc)`` and error messages never send
a reader to a missing page."""
from __future__ import annotations

import re
from pathlib import Path

import gridrpc

ROOT = Path(gridrpc.__file__).parent
REPO = ROOT.parent
DOC = re.compile(r"\bdocs/[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.(?:md|png)\b")


def test_every_docs_page_named_in_the_package_exists():
    named = {(ref, str(path.relative_to(REPO))) for path in ROOT.rglob("*.py")
             for ref in DOC.findall(path.read_text())}
    assert any(ref == "docs/gridrpc-api.md" for ref, _ in named)      # the package docstring's
    missing = sorted(f"{where}: {ref}" for ref, where in named if not (REPO / ref).is_file())
    assert not missing, "pages named but missing:\n" + "\n".join(missing)
