"""Values as the ``gridrpc`` client commands print them: for people
(:func:`format_value`, :func:`format_number`) and for programs
(:func:`to_json`, ``gridrpc call --json``)."""
from __future__ import annotations

import base64
import json
import math
import os
import sys


def _numpy():
    """numpy if it is imported (a value can only be an array then), else None."""
    return sys.modules.get("numpy")


def format_value(value) -> str:
    """A result as people read it: strings as they are, numbers as Python
    prints them, numpy arrays as numpy prints them (``[0.5 0.5]``),
    containers as JSON (arrays inside as lists), bytes as ``b'...'``."""
    if isinstance(value, str):
        return value
    np = _numpy()
    if np is not None and isinstance(value, np.ndarray):
        return str(value.item()) if value.ndim == 0 else np.array2string(value, separator=" ")
    if np is not None and isinstance(value, np.generic):
        return format_value(value.item())
    if value is None or isinstance(value, (bool, int, float, complex, bytes, bytearray)):
        return repr(value) if not isinstance(value, bytearray) else repr(bytes(value))
    if isinstance(value, (list, tuple, dict)):
        try:
            return json.dumps(value, default=_human_default, ensure_ascii=False)
        except (TypeError, ValueError):
            pass
    import pprint
    return pprint.pformat(value)


def _human_default(v):
    np = _numpy()
    if np is not None and isinstance(v, np.ndarray):
        return v.tolist()
    if np is not None and isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (bytes, bytearray)):
        return repr(bytes(v))
    if isinstance(v, complex):
        return str(v)
    if hasattr(v, "__fspath__"):
        return os.fspath(v)
    raise TypeError(type(v).__name__)


def jsonable(v):
    """Strict JSON for any value a service may return (see ``to_json``)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        if math.isfinite(v):
            return v
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    if isinstance(v, complex):
        return {"real": jsonable(v.real), "imag": jsonable(v.imag)}
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(v)).decode("ascii")}
    np = _numpy()
    if np is not None and isinstance(v, np.ndarray):
        return jsonable(v.tolist())
    if np is not None and isinstance(v, np.generic):
        return jsonable(v.item())
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [jsonable(x) for x in v]
    if hasattr(v, "__fspath__"):
        return os.fspath(v)
    return str(v)


def to_json(value) -> str:
    """A result as strict JSON, for programs (``gridrpc call --json``):
    numpy arrays and tuples as (nested) lists, numpy scalars as numbers,
    bytes as ``{"base64": "..."}``, complex as ``{"real": x, "imag": y}``,
    non-finite floats as the strings ``"NaN"``, ``"Infinity"``,
    ``"-Infinity"`` (as in protobuf's JSON mapping), files as their path."""
    return json.dumps(jsonable(value), allow_nan=False, ensure_ascii=False)


def format_number(v) -> str:
    """A number in a table or a status line, for people: floats to 4
    significant digits (``0.284``, not ``0.28400000000000003``; ``1.235e+04``),
    anything else as ``str`` gives it."""
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (counts of SeDs, users, cores...)."""
    import argparse
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def write_or_print(text: str, path: str | None) -> None:
    """A command's result: written to ``path`` (``-o``/``--output``, with a
    line on stderr saying so) or printed on stdout. ``text`` ends with a
    newline either way."""
    import sys
    from pathlib import Path
    if not text.endswith("\n"):
        text += "\n"
    if path:
        Path(path).write_text(text)
        print(f"wrote {path}", file=sys.stderr)
    else:
        sys.stdout.write(text)
