"""Service table of a SeD: callables with their metadata, argument checks, and
loading ``module:function`` specs from the command line."""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ConfigError, InvalidArgument

import numbers

_SIMPLE = {int: (numbers.Integral,), float: (numbers.Real,), str: (str,), bool: (bool,), bytes: (bytes,),
           complex: (numbers.Complex,), list: (list,), dict: (dict,), tuple: (tuple, list)}


@dataclass
class Service:
    name: str
    fn: Callable
    doc: str = ""
    params: list[dict] = field(default_factory=list)
    estimate: Callable[[dict, list], dict | None] | None = None
    signature: inspect.Signature | None = None
    aggregator: Any = None          # default aggregator for this service (name or spec)

    def describe(self) -> dict:
        d = {"name": self.name, "doc": self.doc, "params": self.params}
        if self.aggregator is not None:
            d["aggregator"] = self.aggregator
        return d

    def check(self, args: list, kwargs: dict) -> None:
        """Wrong number or type of arguments -> InvalidArgument, before queueing."""
        if self.signature is None:
            return
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidArgument(f"{self.name}{self.signature}: {exc}") from None
        for pname, value in bound.arguments.items():
            ann = self.signature.parameters[pname].annotation
            kind = self.signature.parameters[pname].kind
            if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                continue
            ok_types = _SIMPLE.get(ann)
            if ok_types is None:
                continue
            if not isinstance(value, ok_types) or (isinstance(value, bool) and ann in (int, float, complex)):
                raise InvalidArgument(f"{self.name}: argument {pname!r} must be {ann.__name__}, "
                                      f"got {type(value).__name__} ({value!r:.60})")


def make_service(name: str | None, fn: Callable, *, doc: str | None = None,
                 estimate: Callable | None = None, aggregator: Any = None) -> Service:
    if not callable(fn):
        raise ConfigError(f"service {name!r}: {fn!r} is not callable")
    try:
        sig = inspect.signature(fn, eval_str=True)   # resolve "int" under `from __future__ import annotations`
    except (TypeError, ValueError, NameError):
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            sig = None
    params = []
    if sig is not None:
        for p in sig.parameters.values():
            ann = p.annotation
            params.append({"name": p.name,
                           "type": getattr(ann, "__name__", str(ann)) if ann is not inspect.Parameter.empty else "any",
                           "default": None if p.default is inspect.Parameter.empty else repr(p.default),
                           "kind": p.kind.name.lower()})
    return Service(name=name or fn.__name__, fn=fn, doc=doc if doc is not None else (inspect.getdoc(fn) or ""),
                   params=params, estimate=estimate, signature=sig,
                   aggregator=aggregator if aggregator is not None else getattr(fn, "__gridrpc_aggregator__", None))


def load_spec(spec: str) -> Service:
    """``[name=]package.module:function`` -> Service."""
    name = None
    if "=" in spec:
        name, spec = spec.split("=", 1)
    if ":" not in spec:
        raise ConfigError(f"service spec {spec!r}: expected 'package.module:function' (optionally 'name=...')")
    mod, _, attr = spec.partition(":")
    try:
        obj = importlib.import_module(mod)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError, TypeError) as exc:   # "" / ".rel" module names
        raise ConfigError(f"cannot load service {spec!r}: {exc}") from exc
    estimate = getattr(obj, "__gridrpc_estimate__", None)
    return make_service(name or attr.split(".")[-1], obj, estimate=estimate)
