"""YAML with line numbers, for deployment files (:mod:`gridrpc.deploy.schema`):
:func:`load_yaml` remembers the line of every key and value (PyYAML's node
marks) and the duplicate keys YAML would silently merge;
:func:`yaml_error_text` says where a syntax error is."""
from __future__ import annotations

from typing import Any

import yaml

__all__ = ["Loc", "Lines", "load_yaml", "yaml_error_text"]

Loc = tuple  # path inside the data: ("seds", 0, "port")


class Lines:
    """Line (1-based) of each key and value of a YAML document, by path."""

    def __init__(self) -> None:
        self.keys: dict[Loc, int] = {}
        self.values: dict[Loc, int] = {}
        self.duplicates: list[tuple[Loc, int, int]] = []     # (path, line, first line): YAML keeps the last

    def line(self, loc: Loc) -> int | None:
        """The line of the deepest known prefix of ``loc``: the key's line for
        a mapping entry (``port: 55x55``), the item's for a list item."""
        loc = tuple(loc)
        while True:
            if loc in self.keys:
                return self.keys[loc]
            if loc in self.values:
                return self.values[loc]
            if not loc:
                return None
            loc = loc[:-1]


def load_yaml(text: str, filename: str) -> tuple[Any, Lines]:
    """Parse ``text`` (named ``filename`` in errors); returns (data, lines).
    A syntax error raises ``yaml.YAMLError`` whose marks name ``filename``."""
    loader = yaml.SafeLoader(text)
    loader.name = filename
    lines = Lines()
    try:
        node = loader.get_single_node()
        if node is None:
            return None, lines
        data = loader.construct_document(node)

        def walk(n, path: Loc) -> None:
            lines.values[path] = n.start_mark.line + 1
            if isinstance(n, yaml.MappingNode):
                for k, v in n.value:
                    try:
                        key = loader.construct_object(k, deep=True)
                    except yaml.YAMLError:
                        continue
                    if isinstance(key, (list, dict)):
                        continue
                    if path + (key,) in lines.keys:
                        lines.duplicates.append((path + (key,), k.start_mark.line + 1, lines.keys[path + (key,)]))
                        continue
                    lines.keys[path + (key,)] = k.start_mark.line + 1
                    walk(v, path + (key,))
            elif isinstance(n, yaml.SequenceNode):
                for i, v in enumerate(n.value):
                    walk(v, path + (i,))

        walk(node, ())
        return data, lines
    finally:
        loader.dispose()


def yaml_error_text(exc: yaml.YAMLError, filename: str) -> str:
    """``FILE:LINE: not valid YAML: problem (context)`` for a syntax error."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{filename}:{mark.line + 1}" if mark is not None else filename
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    ctx_mark = getattr(exc, "context_mark", None)
    extra = ""
    if context:
        extra = f" ({context}" + (f" at line {ctx_mark.line + 1}" if ctx_mark is not None else "") + ")"
    return f"{where}: not valid YAML: {problem}{extra}"
